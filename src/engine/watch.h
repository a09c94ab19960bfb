// SPDX-License-Identifier: MIT
// Pollers' standing registrations with connections (epoll's ready list): a set of many
// connections looks only at those that may have changed, not at every member on every wait.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace rstream {

// Where connections mark the keys of a poller's entries that must be looked at again. Its
// eventfd is readable while marks wait, so that a sleeping poller wakes.
class ReadyMarks
{
public:
    // Null when no eventfd could be had (the poller then looks at every entry, as before).
    static std::shared_ptr<ReadyMarks> create();
    ~ReadyMarks();
    ReadyMarks(const ReadyMarks &) = delete;
    ReadyMarks &operator=(const ReadyMarks &) = delete;
    int fd() const { return fd_; }
    void mark(uint64_t key);
    // Appends the keys marked since the last take to out, and resets the eventfd.
    void take(std::vector<uint64_t> *out);

private:
    explicit ReadyMarks(int fd) : fd_(fd) {}
    std::mutex mutex_;
    std::vector<uint64_t> keys_;
    bool signaled_ = false; // the eventfd was written since the last take
    const int fd_;
};

// One poller entry's registration with one connection (Connection::addWatch). While parked, the
// poller does not look at the entry until its armed wait fd turns readable or the connection
// marks its key (which takes parked back to false, so that it marks once). A connection marks
// its parked slots whenever something may have changed that the poller's last look did not see:
// progress that changed readiness (as for addWaiter's eventfds), and any progress that disarmed
// the wait fd (it no longer signals what comes next). Its watchSeq() moves at each of these,
// marked slot or not: a poller parks an entry only when that did not move between the entry's
// look (WatchLook) and the slot's parking.
struct WatchSlot
{
    WatchSlot(std::shared_ptr<ReadyMarks> m, uint64_t k) : marks(std::move(m)), key(k) {}
    const std::shared_ptr<ReadyMarks> marks;
    const uint64_t key;
    std::atomic<bool> parked{false};
};

// What a look at a connection saw: the connection and its watchSeq() then.
struct WatchLook
{
    const void *conn;
    uint64_t seq;
};

} // namespace rstream
