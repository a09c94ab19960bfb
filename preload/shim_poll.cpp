// SPDX-License-Identifier: MIT
// The Shim object's poll, select and epoll: the kernel's unless an engine socket takes part.

#include <climits>

#include "shim_object.h"

namespace rstream::shim {

namespace {

// A timespec timeout in milliseconds, rounded up; -1: none; -EINVAL: malformed.
int timespecMs(const timespec *ts)
{
    if (!ts)
        return -1;
    if (ts->tv_sec < 0 || ts->tv_nsec < 0 || ts->tv_nsec >= 1000000000)
        return -EINVAL;
    long long ms = static_cast<long long>(ts->tv_sec) * 1000 + (ts->tv_nsec + 999999) / 1000000;
    return static_cast<int>(std::min<long long>(ms, INT_MAX));
}

int doPoll(pollfd *fds, nfds_t nfds, int timeoutMs, const sigset_t *mask)
{
    return boundary([&]() -> int {
        pthread_testcancel();
        EngineCall ec;
        return pollFds(fds, nfds, timeoutMs, mask, resolvePollable, spinUs());
    });
}

int doSelect(int nfds, fd_set *r, fd_set *w, fd_set *e, timeval *timeout, const sigset_t *mask)
{
    return boundary([&]() -> int {
        pthread_testcancel();
        EngineCall ec;
        return selectFds(nfds, r, w, e, timeout, mask, resolvePollable, spinUs());
    });
}

int doEpollWait(ShimEpoll &set, epoll_event *events, int maxevents, int timeout,
                const sigset_t *mask)
{
    return boundary([&]() -> int {
        pthread_testcancel();
        EngineCall ec;
        return set.wait(events, maxevents, timeout, mask, spinUs());
    });
}

} // namespace

// Whether fd is an engine socket and the caller (ra) the program, which asks only for fds in
// the table.
bool Shim::engineFd(int fd, const void *ra, int &callerChecked)
{
    if (!sockets_.has(fd) && !epolls_.has(fd))
        return false;
    if (callerChecked == 0)
        callerChecked = internalAddress(ra) ? -1 : 1;
    return callerChecked > 0 && pollable(fd);
}

bool Shim::anyEngine(const pollfd *fds, nfds_t nfds, const void *ra)
{
    if (tDepth > 0 || !fds)
        return false;
    int checked = 0;
    for (nfds_t i = 0; i < nfds; i++)
        if (engineFd(fds[i].fd, ra, checked))
            return true;
    return false;
}

bool Shim::anyEngine(int nfds, const fd_set *r, const fd_set *w, const fd_set *e, const void *ra)
{
    if (tDepth > 0 || nfds <= 0)
        return false;
    int checked = 0;
    nfds = std::min(nfds, FD_SETSIZE);
    for (int fd = 0; fd < nfds; fd++) {
        if (!((r && FD_ISSET(fd, r)) || (w && FD_ISSET(fd, w)) || (e && FD_ISSET(fd, e))))
            continue;
        if (engineFd(fd, ra, checked))
            return true;
    }
    return false;
}

// The program's epoll set when an engine socket was ever added to it; null: the kernel's.
std::shared_ptr<ShimEpoll> Shim::engineEpoll(int epfd, const void *ra)
{
    if (tDepth > 0 || !epolls_.has(epfd) || internalAddress(ra))
        return nullptr;
    auto set = epolls_.get(epfd);
    if (!set || !set->engine.load(std::memory_order_acquire))
        return nullptr;
    return set;
}

int Shim::epollCreated(const void *ra, int fd)
{
    if (fd < 0)
        return fd;
    if (internalCall(ra))
        return moveHigh(fd);
    forgetStale(fd);
    const int saved = errno;
    try {
        NoCancel nc;
        EngineCall ec;
        if (shimConfig().enabled)
            epolls_.set(fd, std::make_shared<ShimEpoll>(fd));
    } catch (...) {
        noteInternalError(); // the epoll fd works as the kernel's, without engine sockets
    }
    errno = saved;
    return fd;
}

// ---- poll -------------------------------------------------------------------------------------

// glibc declares poll's and ppoll's fds write-only (access attribute), so GCC takes the events
// the program passes in for uninitialized memory (clang has no such warning).
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

int Shim::poll(const void *ra, pollfd *fds, nfds_t nfds, int timeout)
{
    if (!anyEngine(fds, nfds, ra))
        return real.poll()(fds, nfds, timeout);
    return doPoll(fds, nfds, timeout < 0 ? -1 : timeout, nullptr);
}

int Shim::ppoll(const void *ra, pollfd *fds, nfds_t nfds, const timespec *timeout,
                const sigset_t *mask)
{
    if (!anyEngine(fds, nfds, ra))
        return real.ppoll()(fds, nfds, timeout, mask);
    int ms = timespecMs(timeout);
    if (ms == -EINVAL) {
        errno = EINVAL;
        return -1;
    }
    return doPoll(fds, nfds, ms, mask);
}

// The fortified variants: glibc's contract is an abort through __chk_fail when fds is shorter
// than the compiler saw.
int Shim::poll_chk(const void *ra, pollfd *fds, nfds_t nfds, int timeout, size_t fdslen)
{
    if (fdslen / sizeof(pollfd) < nfds)
        __chk_fail();
    return poll(ra, fds, nfds, timeout);
}

int Shim::ppoll_chk(const void *ra, pollfd *fds, nfds_t nfds, const timespec *timeout,
                    const sigset_t *ss, size_t fdslen)
{
    if (fdslen / sizeof(pollfd) < nfds)
        __chk_fail();
    return ppoll(ra, fds, nfds, timeout, ss);
}

#pragma GCC diagnostic pop

// ---- select -----------------------------------------------------------------------------------

int Shim::select(const void *ra, int nfds, fd_set *r, fd_set *w, fd_set *e, timeval *timeout)
{
    if (!anyEngine(nfds, r, w, e, ra))
        return real.select()(nfds, r, w, e, timeout);
    return doSelect(nfds, r, w, e, timeout, nullptr);
}

int Shim::pselect(const void *ra, int nfds, fd_set *r, fd_set *w, fd_set *e,
                  const timespec *timeout, const sigset_t *mask)
{
    if (!anyEngine(nfds, r, w, e, ra))
        return real.pselect()(nfds, r, w, e, timeout, mask);
    // pselect leaves the timeout alone (unlike select): the poller works on a copy.
    timeval tv{};
    timeval *tvp = nullptr;
    if (timeout) {
        if (timeout->tv_sec < 0 || timeout->tv_nsec < 0 || timeout->tv_nsec >= 1000000000) {
            errno = EINVAL;
            return -1;
        }
        tv.tv_sec = timeout->tv_sec;
        tv.tv_usec = (timeout->tv_nsec + 999) / 1000;
        tvp = &tv;
    }
    return doSelect(nfds, r, w, e, tvp, mask);
}

// ---- epoll ------------------------------------------------------------------------------------

int Shim::epoll_create(const void *ra, int size)
{
    return epollCreated(ra, real.epoll_create()(size));
}

int Shim::epoll_create1(const void *ra, int flags)
{
    return epollCreated(ra, real.epoll_create1()(flags));
}

int Shim::epoll_ctl(const void *ra, int epfd, int op, int fd, epoll_event *event)
{
    if (tDepth > 0 || !epolls_.has(epfd) || internalAddress(ra))
        return real.epoll_ctl()(epfd, op, fd, event);
    auto set = epolls_.get(epfd);
    if (!set)
        return real.epoll_ctl()(epfd, op, fd, event);
    std::shared_ptr<Pollable> sock = pollable(fd);
    if (!sock && !set->engine.load(std::memory_order_acquire))
        return real.epoll_ctl()(epfd, op, fd, event);
    // From now on the set has engine sockets: waits go through the engine's epoll.
    if (sock)
        set->engine.store(true, std::memory_order_release);
    return boundary([&]() -> int {
        NoCancel nc;
        EngineCall ec;
        return set->ctl(op, fd, event, sock);
    });
}

int Shim::epoll_wait(const void *ra, int epfd, epoll_event *events, int maxevents, int timeout)
{
    auto set = engineEpoll(epfd, ra);
    if (!set)
        return real.epoll_wait()(epfd, events, maxevents, timeout);
    return doEpollWait(*set, events, maxevents, timeout < 0 ? -1 : timeout, nullptr);
}

int Shim::epoll_pwait(const void *ra, int epfd, epoll_event *events, int maxevents, int timeout,
                      const sigset_t *mask)
{
    auto set = engineEpoll(epfd, ra);
    if (!set)
        return real.epoll_pwait()(epfd, events, maxevents, timeout, mask);
    return doEpollWait(*set, events, maxevents, timeout < 0 ? -1 : timeout, mask);
}

} // namespace rstream::shim
