// SPDX-License-Identifier: MIT
// What poll and select (poller.cpp) and epoll (epoll_set.cpp) share: the thread's wake-up
// eventfd, waiter registrations, readiness hints and the conversions between poll and epoll.
#pragma once

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <memory>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <vector>

#include "clock.h"
#include "connection.h"
#include "kernel.h"
#include "pollable.h"

namespace rstream::detail {

// The calling thread's wake-up eventfd: connections write it when another thread's progress
// changes readiness (reading a CQ resets the wait fd, so the wait fd alone can miss that).
// Trivially destructible, and closed at thread exit by a pthread key's destructor instead: a
// thread_local with a destructor is registered on first use in each thread through
// __cxa_thread_atexit, which takes the dynamic loader's lock, and libfabric's load holds that
// lock for its whole ~0.3 s (the shim loads it on a thread of its own for a nonblocking connect,
// while the program's event loop polls).
class ThreadWake
{
public:
    int fd()
    {
        if (fd_ < 0) {
            int fd = sys::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
            if (fd < 0)
                return -1;
            fd_ = fd;
            if (const pthread_key_t *k = key())
                pthread_setspecific(*k, reinterpret_cast<void *>(static_cast<intptr_t>(fd) + 1));
        }
        return fd_;
    }
    void drain()
    {
        uint64_t v;
        if (fd_ >= 0)
            (void)sys::read(fd_, &v, sizeof(v)); // -EAGAIN: nothing to drain
    }
    // In a fork child the forking thread's eventfd is still the parent's (fork shares open
    // files): a write meant for one process could be drained by another one sleeping on it (the
    // parent or a sibling child), and the sleeper it was meant for would miss it for good. The
    // child's copy is closed and the child makes one of its own on first use.
    void forgetAfterFork()
    {
        if (fd_ < 0)
            return;
        sys::close(fd_);
        fd_ = -1;
        if (const pthread_key_t *k = key())
            pthread_setspecific(*k, nullptr);
    }

private:
    // The key whose destructor closes a thread's fd; null if none could be had (the fd then
    // stays open after its thread ends).
    static const pthread_key_t *key()
    {
        static pthread_key_t k;
        static const bool ok = pthread_key_create(&k, [](void *v) {
                                   sys::close(static_cast<int>(reinterpret_cast<intptr_t>(v) - 1));
                               }) == 0;
        return ok ? &k : nullptr;
    }

    int fd_ = -1;
};
// Defined in poller.cpp: one per thread for poll, select and epoll alike.
extern thread_local ThreadWake tWake;

// Waiter registrations, undone on every way out (return, exception, pthread_cancel unwind).
class Waiters
{
public:
    explicit Waiters(int fd) : fd_(fd) {}
    ~Waiters() { clear(); }
    // All of one wait's registrations in one pass: what several sockets share (a switch's
    // upgrade listener, whose waiting connections each socket in its switch would register
    // again) is registered once.
    template <typename Socks>
    void addAll(const Socks &socks)
    {
        Connection::HintPass pass;
        for (auto &s : socks)
            if (s)
                s->addWaiter(fd_, &conns_);
    }
    // Whether a connection holds the eventfd (so that its progress may write it).
    bool any() const { return !conns_.empty(); }
    // Whether a registered connection may have changed since the look that left looks (one
    // per socket): its sequence moved, or that look did not reach it. Its progress before the
    // registration wrote no eventfd. Many connections are taken for changed (the search is
    // quadratic), as are all without a sequence to compare.
    bool changedSince(const std::vector<WatchLook> &looks) const
    {
        if (conns_.size() > kCompareMax)
            return true;
        for (auto &c : conns_) {
            const auto it = std::find_if(looks.begin(), looks.end(),
                                         [&](const WatchLook &l) { return l.conn == c.get(); });
            if (it == looks.end() || it->seq != c->watchSeq())
                return true;
        }
        return false;
    }
    void clear()
    {
        for (auto &c : conns_)
            c->removeWaiter(fd_);
        conns_.clear();
    }

private:
    static constexpr size_t kCompareMax = 16;
    int fd_;
    std::vector<std::shared_ptr<Connection>> conns_;
};

// -errno on failure (the seam's convention).
inline int ppollMs(pollfd *fds, nfds_t n, int timeoutMs, const sigset_t *mask)
{
    timespec ts{};
    timespec *tp = nullptr;
    if (timeoutMs >= 0) {
        ts.tv_sec = timeoutMs / 1000;
        ts.tv_nsec = (timeoutMs % 1000) * 1000000L;
        tp = &ts;
    }
    return sys::ppoll(fds, n, tp, mask);
}

inline int remainingMs(int64_t deadlineNs)
{
    if (deadlineNs < 0)
        return -1;
    int64_t left = deadlineNs - nowNs();
    if (left <= 0)
        return 0;
    return static_cast<int>(std::min<int64_t>((left + 999999) / 1000000, 1 << 30));
}

inline uint32_t toPoll(uint32_t e)
{
    uint32_t p = 0;
    if (e & EPOLLIN)
        p |= POLLIN;
    if (e & EPOLLOUT)
        p |= POLLOUT;
    if (e & EPOLLRDHUP)
        p |= POLLRDHUP;
    if (e & EPOLLPRI)
        p |= POLLPRI;
    return p;
}

inline uint32_t toEpoll(int p)
{
    uint32_t e = 0;
    if (p & POLLIN)
        e |= EPOLLIN;
    if (p & POLLOUT)
        e |= EPOLLOUT;
    if (p & POLLRDHUP)
        e |= EPOLLRDHUP;
    if (p & POLLPRI)
        e |= EPOLLPRI;
    if (p & POLLERR)
        e |= EPOLLERR;
    if (p & POLLHUP)
        e |= EPOLLHUP;
    return e;
}

// The last step before a poller sleeps: arms every socket for the poll events the caller wants
// of it (interest, beside socks), appending the fds to sleep on to fds, then sleeps in ppoll
// until one is ready, the deadline (ns, < 0: none) or a signal. 1: the sleep ended (the fds'
// revents say why), 0: something was pending (no sleep), -errno from ppoll.
inline int armAndSleep(const std::vector<std::shared_ptr<Pollable>> &socks,
                       const std::vector<short> &interest, std::vector<pollfd> *fds,
                       int64_t deadlineNs, const sigset_t *mask, Waiters &waiters)
{
    // One pass: what several sockets share (a switch's upgrade listener) is listed once.
    Connection::HintPass pass;
    (void)takePollWakeBy();
    // Only the events asked for: a socket still on kernel TCP (in its switch) lists its kernel
    // fd, and POLLOUT there, always true, woke the sleep at once: a server whose epoll set held
    // sockets in their switch spun a CPU while idle.
    // Where each socket's fds begin, for the first kSleepLooks sockets (sleepResults() is a
    // saving, not a need: no allocation for it).
    constexpr size_t kSleepLooks = 32;
    size_t from[kSleepLooks + 1];
    for (size_t i = 0; i < socks.size(); i++) {
        if (i <= kSleepLooks)
            from[i] = fds->size();
        if (socks[i] && socks[i]->prepareWait(fds, interest[i]) == -EAGAIN)
            return 0;
    }
    // A socket's own step due before the deadline ends the sleep then (pollWakeBy).
    if (const int64_t by = takePollWakeBy(); by > 0 && (deadlineNs < 0 || by < deadlineNs))
        deadlineNs = by;
    const int r = ppollMs(fds->data(), fds->size(), remainingMs(deadlineNs), mask);
    waiters.clear();
    // What the sleep saw of each socket's fds, for its look after it (the same pass's number
    // tells that no other look came in between).
    for (size_t i = 0; r > 0 && i < std::min(socks.size(), kSleepLooks); i++) {
        const size_t end = i + 1 < socks.size() ? from[i + 1] : fds->size();
        if (socks[i] && end > from[i])
            socks[i]->sleepResults(fds->data() + from[i], static_cast<int>(end - from[i]));
    }
    // Drained only when the sleep saw it: a wake-up written after the sleep ended (or one a
    // signal cut short) makes the next sleep return at once, and is drained then.
    const int wakeFd = tWake.fd();
    for (size_t i = 0; r > 0 && i < fds->size(); i++)
        if ((*fds)[i].fd == wakeFd && (*fds)[i].revents) {
            tWake.drain();
            break;
        }
    return r < 0 ? r : 1;
}

} // namespace rstream::detail
