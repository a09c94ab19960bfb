// SPDX-License-Identifier: MIT
// poll, select and epoll over a mix of engine sockets and kernel fds.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <unordered_map>
#include <vector>

#include "pollable.h"
#include "spin.h"

namespace rstream {

namespace detail {
// One pass of readiness hints (see Connection::hintFd): the armed wait fds of the connections
// about to be looked at are checked in the same ppoll as the kernel fds, and the looks of the
// pass skip progress on those found quiet. Looks outside a pass make progress as before.
class HintCheck
{
public:
    void add(Pollable &s);
    // Appends the hint fds, in order, to the fds of the caller's ppoll.
    void appendTo(std::vector<pollfd> *fds) const;
    // After that ppoll, with fds where the hint fds begin.
    void apply(const pollfd *fds) const;
    bool empty() const { return fds_.empty(); }
    // For the next pass (and to let the connections go); the vectors keep their memory, so a
    // look allocates nothing.
    void clear();

private:
    std::vector<std::shared_ptr<Connection>> conns_;
    std::vector<pollfd> fds_;
};
} // namespace detail

// Maps an fd to its engine socket, or null for an fd the kernel answers for.
using SocketResolver = std::shared_ptr<Pollable> (*)(int fd);

// poll(2)/ppoll(2): revents filled in, returns the number of ready entries or -errno. Sleeps in
// ppoll on the sockets' wait fds, a per-thread wake-up eventfd and the kernel fds, after a spin
// of spinUs microseconds. timeoutMs < 0 waits forever.
int pollFds(pollfd *fds, nfds_t nfds, int timeoutMs, const sigset_t *mask, SocketResolver resolve,
            int spinUs);

// select(2)/pselect(2) built on pollFds; timeout is updated with the time left, as Linux does.
int selectFds(int nfds, fd_set *readfds, fd_set *writefds, fd_set *exceptfds, timeval *timeout,
              const sigset_t *mask, SocketResolver resolve, int spinUs);

// An epoll instance over engine sockets (emulated: level-triggered, EPOLLET, EPOLLONESHOT)
// and kernel fds (kept in the real epoll fd, which the kernel answers for). It is pollable
// itself, so that an epoll fd inside poll() or another epoll becomes readable as the kernel's
// does.
class EpollSet : public Pollable
{
public:
    explicit EpollSet(int epfd) : epfd_(epfd) {}
    int fd() const { return epfd_; }
    // sock null: fd is a kernel fd and goes to the kernel's epoll.
    int ctl(int op, int fd, const epoll_event *event, const std::shared_ptr<Pollable> &sock);
    int wait(epoll_event *events, int maxevents, int timeoutMs, const sigset_t *mask, int spinUs);
    // Whether an engine socket in the set is ready now (to make the epoll fd look readable).
    bool anyReady();

    // Pollable: readable when a member is ready.
    int pollEvents(int events) override;
    int prepareWait(std::vector<pollfd> *fds, int events) override;
    void addWaiter(int eventFd, std::vector<std::shared_ptr<Connection>> *registered) override;
    uint64_t generation(int) override { return gen_.fetch_add(1, std::memory_order_relaxed); }

private:
    AdaptiveSpin spin_; // wait()'s spin before it sleeps, learnt from this set's waits
    struct Entry
    {
        int fd;
        std::weak_ptr<Pollable> sock;
        uint32_t events;
        epoll_data_t data;
        uint64_t lastGen;
        int lastRev;
        bool disabled; // EPOLLONESHOT fired; waits for EPOLL_CTL_MOD
    };
    // Level-triggered and edge-triggered events of the engine sockets; *kernelReady: whether
    // the kernel's epoll has events to read too.
    int collect(epoll_event *events, int maxevents, bool *kernelReady);
    // Entry i moves to the kernel's epoll if its socket fell back to kernel TCP, or goes if
    // the socket was closed: true when it left entries_ (the last entry takes its place).
    bool migrateLocked(size_t i);
    void migrateAllLocked();
    void eraseLocked(size_t i);
    // The live sockets of the entries not disabled by EPOLLONESHOT.
    // The members, and (when interest is given) the poll events each was added for.
    std::vector<std::shared_ptr<Pollable>> liveMembers(std::vector<short> *interest = nullptr);

    const int epfd_;
    std::mutex mutex_;
    std::vector<Entry> entries_;
    std::unordered_map<int, size_t> index_; // fd -> its entry
    size_t next_ = 0;                       // where the next scan starts, for fairness
    // collect()'s scratch, kept to spare an allocation per look.
    std::vector<std::shared_ptr<Pollable>> members_;
    std::vector<pollfd> lookFds_;
    detail::HintCheck hints_;
    std::atomic<uint64_t> gen_{0};
};

} // namespace rstream
