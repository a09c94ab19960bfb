// SPDX-License-Identifier: MIT
// poll, select and epoll over engine sockets and kernel fds: spin, then sleep on wait fds.

#include "poller.h"
#include "clock.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "connection.h"
#include "kernel.h"
#include "log.h"

namespace rstream {

namespace {
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
thread_local ThreadWake tWake;
[[maybe_unused]] const int gForkHandlers =
    pthread_atfork(nullptr, nullptr, [] { tWake.forgetAfterFork(); });

// Waiter registrations, undone on every way out (return, exception, pthread_cancel unwind).
class Waiters
{
public:
    explicit Waiters(int fd) : fd_(fd) {}
    ~Waiters() { clear(); }
    void add(Pollable &s) { s.addWaiter(fd_, &conns_); }
    void clear()
    {
        for (auto &c : conns_)
            c->removeWaiter(fd_);
        conns_.clear();
    }

private:
    int fd_;
    std::vector<std::shared_ptr<Connection>> conns_;
};

// -errno on failure (the seam's convention).
int ppollMs(pollfd *fds, nfds_t n, int timeoutMs, const sigset_t *mask)
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

int remainingMs(int64_t deadlineNs)
{
    if (deadlineNs < 0)
        return -1;
    int64_t left = deadlineNs - nowNs();
    if (left <= 0)
        return 0;
    return static_cast<int>(std::min<int64_t>((left + 999999) / 1000000, 1 << 30));
}

// One pass of readiness hints (see Connection::hintFd): the armed wait fds of the connections
// about to be looked at are checked in the same ppoll as the kernel fds, and the looks of the
// pass skip progress on those found quiet. Looks outside a pass make progress as before.
class HintCheck
{
public:
    void add(Pollable &s)
    {
        if (auto c = s.hintConnection()) {
            if (const int fd = c->hintFd(); fd >= 0) {
                conns_.push_back(std::move(c));
                fds_.push_back({fd, POLLIN, 0});
            }
        }
    }
    // Appends the hint fds, in order, to the fds of the caller's ppoll.
    void appendTo(std::vector<pollfd> *fds) { fds->insert(fds->end(), fds_.begin(), fds_.end()); }
    // After that ppoll, with fds where the hint fds begin.
    void apply(const pollfd *fds)
    {
        for (size_t i = 0; i < conns_.size(); i++)
            if (!fds[i].revents)
                conns_[i]->hintQuiet();
    }
    bool empty() const { return fds_.empty(); }

private:
    std::vector<std::shared_ptr<Connection>> conns_;
    std::vector<pollfd> fds_;
};

uint32_t toPoll(uint32_t e)
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

uint32_t toEpoll(int p)
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

} // namespace

int pollFds(pollfd *fds, nfds_t nfds, int timeoutMs, const sigset_t *mask, SocketResolver resolve,
            int spinUs)
{
    if (nfds > 0 && !fds)
        return -EFAULT;
    std::vector<std::shared_ptr<Pollable>> socks(nfds);
    std::vector<pollfd> kfds;
    std::vector<nfds_t> kidx;
    bool any = false;
    for (nfds_t i = 0; i < nfds; i++) {
        fds[i].revents = 0;
        if (fds[i].fd >= 0)
            socks[i] = resolve(fds[i].fd);
        if (socks[i]) {
            any = true;
        } else if (fds[i].fd >= 0) {
            kfds.push_back(fds[i]);
            kidx.push_back(i);
        }
    }
    if (!any) {
        return ppollMs(fds, nfds, timeoutMs, mask);
    }
    const int64_t start = nowNs();
    const int64_t deadline = timeoutMs < 0 ? -1 : start + int64_t(timeoutMs) * 1000000;
    const int64_t spinEnd = start + int64_t(spinUs) * 1000;

    std::vector<pollfd> lookFds; // the kernel fds, then the hint fds
    auto check = [&]() -> int {
        int count = 0;
        Connection::HintPass pass;
        HintCheck hints;
        for (auto &s : socks)
            if (s)
                hints.add(*s);
        if (!kfds.empty() || !hints.empty()) {
            lookFds.assign(kfds.begin(), kfds.end());
            hints.appendTo(&lookFds);
            const timespec zero{0, 0};
            int r = sys::ppoll(lookFds.data(), lookFds.size(), &zero, nullptr);
            if (r < 0)
                return r;
            hints.apply(lookFds.data() + kfds.size());
            for (size_t k = 0; k < kfds.size(); k++) {
                fds[kidx[k]].revents = lookFds[k].revents;
                if (lookFds[k].revents)
                    count++;
            }
        }
        for (nfds_t i = 0; i < nfds; i++) {
            if (socks[i]) {
                fds[i].revents = static_cast<short>(socks[i]->pollEvents(fds[i].events));
                if (fds[i].revents)
                    count++;
            }
        }
        return count;
    };

    const int wakeFd = tWake.fd();
    if (wakeFd < 0)
        return -ENOMEM;
    std::vector<pollfd> sleepFds;
    for (;;) {
        int count = check();
        if (count != 0 || timeoutMs == 0)
            return count;
        int64_t now = nowNs();
        if (deadline >= 0 && now >= deadline)
            return 0;
        if (now < spinEnd) {
            sched_yield();
            continue;
        }
        // Register first, then look again, then arm: progress made by another thread after
        // the look writes the eventfd, progress still pending makes arming fail.
        Waiters waiters(wakeFd);
        for (auto &s : socks)
            if (s)
                waiters.add(*s);
        count = check();
        if (count != 0)
            return count;
        sleepFds.assign(kfds.begin(), kfds.end());
        sleepFds.push_back({wakeFd, POLLIN, 0});
        bool pending = false;
        for (auto &s : socks) {
            if (!s)
                continue;
            if (s->prepareWait(&sleepFds, POLLIN | POLLOUT) == -EAGAIN) {
                pending = true;
                break;
            }
        }
        if (pending)
            continue;
        int r = ppollMs(sleepFds.data(), sleepFds.size(), remainingMs(deadline), mask);
        waiters.clear();
        tWake.drain();
        if (r < 0)
            return r;
    }
}

int selectFds(int nfds, fd_set *readfds, fd_set *writefds, fd_set *exceptfds, timeval *timeout,
              const sigset_t *mask, SocketResolver resolve, int spinUs)
{
    if (nfds < 0 || nfds > FD_SETSIZE)
        return -EINVAL;
    int timeoutMs = -1;
    if (timeout) {
        if (timeout->tv_sec < 0 || timeout->tv_usec < 0)
            return -EINVAL;
        long long ms =
            static_cast<long long>(timeout->tv_sec) * 1000 + (timeout->tv_usec + 999) / 1000;
        timeoutMs = static_cast<int>(std::min<long long>(ms, 1 << 30));
    }
    std::vector<pollfd> pfds;
    for (int fd = 0; fd < nfds; fd++) {
        short ev = 0;
        if (readfds && FD_ISSET(fd, readfds))
            ev |= POLLIN;
        if (writefds && FD_ISSET(fd, writefds))
            ev |= POLLOUT;
        if (exceptfds && FD_ISSET(fd, exceptfds))
            ev |= POLLPRI;
        if (ev)
            pfds.push_back({fd, ev, 0});
    }
    const int64_t start = nowNs();
    int r = pollFds(pfds.data(), pfds.size(), timeoutMs, mask, resolve, spinUs);
    if (timeout) {
        int64_t left = int64_t(timeoutMs) * 1000000 - (nowNs() - start);
        if (left < 0 || r > 0)
            left = std::max<int64_t>(left, 0);
        timeout->tv_sec = left / 1000000000;
        timeout->tv_usec = (left % 1000000000) / 1000;
    }
    if (r < 0)
        return r;
    for (auto &p : pfds)
        if (p.revents & POLLNVAL)
            return -EBADF;
    if (readfds)
        FD_ZERO(readfds);
    if (writefds)
        FD_ZERO(writefds);
    if (exceptfds)
        FD_ZERO(exceptfds);
    int count = 0;
    for (auto &p : pfds) {
        // As the kernel's select: readable includes hang-up and error, writable includes error.
        if ((p.events & POLLIN) && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
            FD_SET(p.fd, readfds);
            count++;
        }
        if ((p.events & POLLOUT) && (p.revents & (POLLOUT | POLLERR))) {
            FD_SET(p.fd, writefds);
            count++;
        }
        if ((p.events & POLLPRI) && (p.revents & POLLPRI)) {
            FD_SET(p.fd, exceptfds);
            count++;
        }
    }
    return count;
}

int EpollSet::ctl(int op, int fd, const epoll_event *event, const std::shared_ptr<Pollable> &sock)
{
    if (fd == epfd_)
        return -EINVAL;
    std::unique_lock<std::mutex> lock(mutex_);
    migrateLocked();
    if (!sock || sock->kernelFd() >= 0) {
        lock.unlock();
        epoll_event copy{};
        if (event)
            copy = *event;
        return sys::epollCtl(epfd_, op, sock ? sock->kernelFd() : fd, event ? &copy : nullptr);
    }
    if (op != EPOLL_CTL_DEL && !event)
        return -EFAULT;
    auto it = std::find_if(entries_.begin(), entries_.end(),
                           [&](const Entry &e) { return e.fd == fd && e.sock.lock() == sock; });
    switch (op) {
    case EPOLL_CTL_ADD: {
        if (it != entries_.end()) {
            RS_LOG(Debug, "epoll %d: add of fd %d: already there", epfd_, fd);
            return -EEXIST;
        }
        Entry e{fd, sock, event->events, event->data, ~uint64_t(0), 0, false};
        entries_.push_back(e);
        return 0;
    }
    case EPOLL_CTL_MOD:
        if (it == entries_.end()) {
            RS_LOG(Debug, "epoll %d: mod of fd %d: not there", epfd_, fd);
            return -ENOENT;
        }
        it->events = event->events;
        it->data = event->data;
        it->lastGen = ~uint64_t(0);
        it->lastRev = 0;
        it->disabled = false;
        return 0;
    case EPOLL_CTL_DEL:
        if (it == entries_.end()) {
            RS_LOG(Debug, "epoll %d: del of fd %d: not there", epfd_, fd);
            return -ENOENT;
        }
        entries_.erase(it);
        return 0;
    default:
        return -EINVAL;
    }
}

void EpollSet::migrateLocked()
{
    // Sockets that fell back to kernel TCP move to the kernel's epoll, registration intact;
    // entries of sockets closed since are dropped, as the kernel drops closed files.
    std::erase_if(entries_, [this](const Entry &e) {
        auto s = e.sock.lock();
        if (!s)
            return true;
        int kfd = s->kernelFd();
        if (kfd < 0)
            return false;
        epoll_event ev{};
        ev.events = e.disabled ? 0 : e.events; // a fired EPOLLONESHOT stays disarmed
        ev.data = e.data;
        if (int r = sys::epollCtl(epfd_, EPOLL_CTL_ADD, kfd, &ev); r < 0)
            RS_LOG(Warn, "epoll: cannot move fd %d to the kernel: %s", kfd, strerror(-r));
        return true;
    });
}

int EpollSet::collect(epoll_event *events, int maxevents, bool *kernelReady)
{
    std::lock_guard<std::mutex> lock(mutex_);
    migrateLocked();
    int n = 0;
    const size_t count = entries_.size();
    if (next_ >= count)
        next_ = 0;
    // One ppoll tells which connections' looks need progress, and whether the kernel's epoll
    // has anything (then epoll_wait reads it).
    Connection::HintPass pass;
    HintCheck hints;
    members_.clear();
    for (auto &e : entries_) {
        members_.push_back(e.disabled ? nullptr : e.sock.lock());
        if (members_.back())
            hints.add(*members_.back());
    }
    *kernelReady = true; // epoll_wait reads it (and reports an error)
    if (!hints.empty()) {
        lookFds_.assign(1, {epfd_, POLLIN, 0});
        hints.appendTo(&lookFds_);
        const timespec zero{0, 0};
        if (sys::ppoll(lookFds_.data(), lookFds_.size(), &zero, nullptr) >= 0) {
            hints.apply(lookFds_.data() + 1);
            *kernelReady = lookFds_[0].revents != 0;
        }
    }
    // Fairness: each scan starts after the last entry reported by the previous one.
    const size_t start = next_;
    for (size_t k = 0; k < count && n < maxevents; k++) {
        size_t i = (start + k) % count;
        Entry &e = entries_[i];
        if (e.disabled)
            continue;
        std::shared_ptr<Pollable> s = std::move(members_[i]);
        if (!s)
            continue;
        int rev = s->pollEvents(static_cast<int>(toPoll(e.events)));
        if (!rev)
            continue;
        if (e.events & EPOLLET) {
            // Edge-triggered: report again only after new progress or a new condition.
            uint64_t gen = s->generation(static_cast<int>(toPoll(e.events)));
            bool fresh = gen != e.lastGen || (rev & ~e.lastRev);
            e.lastGen = gen;
            e.lastRev = rev;
            if (!fresh)
                continue;
        }
        events[n].events = toEpoll(rev);
        events[n].data = e.data;
        n++;
        if (e.events & EPOLLONESHOT)
            e.disabled = true;
        next_ = i + 1;
    }
    return n;
}

bool EpollSet::anyReady()
{
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto &e : entries_) {
        if (e.disabled)
            continue;
        auto s = e.sock.lock();
        if (s && s->pollEvents(static_cast<int>(toPoll(e.events))))
            return true;
    }
    return false;
}

namespace {
// Nested sets are followed a few levels deep at most (the kernel refuses loops with ELOOP).
thread_local int tNesting = 0;
struct Nest
{
    Nest() { tNesting++; }
    ~Nest() { tNesting--; }
    bool tooDeep() const { return tNesting > 4; }
};
} // namespace

int EpollSet::pollEvents(int events)
{
    Nest nest;
    if (nest.tooDeep() || !(events & POLLIN))
        return 0;
    if (anyReady())
        return POLLIN;
    pollfd p{epfd_, POLLIN, 0};
    const timespec zero{0, 0};
    return sys::ppoll(&p, 1, &zero, nullptr) > 0 && (p.revents & POLLIN) ? POLLIN : 0;
}

int EpollSet::prepareWait(std::vector<pollfd> *fds, int)
{
    Nest nest;
    if (nest.tooDeep())
        return 0;
    std::vector<std::shared_ptr<Pollable>> members;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto &e : entries_)
            if (!e.disabled)
                if (auto s = e.sock.lock())
                    members.push_back(std::move(s));
    }
    fds->push_back({epfd_, POLLIN, 0});
    for (auto &s : members)
        if (s->prepareWait(fds, static_cast<int>(POLLIN | POLLOUT)) == -EAGAIN)
            return -EAGAIN;
    return 0;
}

void EpollSet::addWaiter(int eventFd, std::vector<std::shared_ptr<Connection>> *registered)
{
    Nest nest;
    if (nest.tooDeep())
        return;
    std::vector<std::shared_ptr<Pollable>> members;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto &e : entries_)
            if (!e.disabled)
                if (auto s = e.sock.lock())
                    members.push_back(std::move(s));
    }
    for (auto &s : members)
        s->addWaiter(eventFd, registered);
}

int EpollSet::wait(epoll_event *events, int maxevents, int timeoutMs, const sigset_t *mask,
                   int spinUs)
{
    if (maxevents <= 0)
        return -EINVAL;
    if (!events)
        return -EFAULT;
    const int64_t start = nowNs();
    const int64_t deadline = timeoutMs < 0 ? -1 : start + int64_t(timeoutMs) * 1000000;
    const int64_t spinEnd = start + int64_t(spinUs) * 1000;
    auto check = [&]() -> int {
        bool kernelReady = true;
        int n = collect(events, maxevents, &kernelReady);
        if (n < maxevents && kernelReady) {
            int k = sys::epollWait(epfd_, events + n, maxevents - n, 0);
            if (k < 0)
                return n ? n : k;
            n += k;
        }
        return n;
    };
    const int wakeFd = tWake.fd();
    if (wakeFd < 0)
        return -ENOMEM;
    std::vector<std::shared_ptr<Pollable>> socks;
    std::vector<pollfd> sleepFds;
    for (;;) {
        int n = check();
        if (n != 0 || timeoutMs == 0)
            return n;
        int64_t now = nowNs();
        if (deadline >= 0 && now >= deadline)
            return 0;
        if (now < spinEnd) {
            sched_yield();
            continue;
        }
        socks.clear();
        {
            std::lock_guard<std::mutex> lock(mutex_);
            for (auto &e : entries_)
                if (!e.disabled)
                    if (auto s = e.sock.lock())
                        socks.push_back(std::move(s));
        }
        Waiters waiters(wakeFd);
        for (auto &s : socks)
            waiters.add(*s);
        n = check();
        if (n != 0)
            return n;
        sleepFds.clear();
        sleepFds.push_back({epfd_, POLLIN, 0});
        sleepFds.push_back({wakeFd, POLLIN, 0});
        bool pending = false;
        for (auto &s : socks) {
            if (s->prepareWait(&sleepFds, POLLIN | POLLOUT) == -EAGAIN) {
                pending = true;
                break;
            }
        }
        if (pending)
            continue;
        int r = ppollMs(sleepFds.data(), sleepFds.size(), remainingMs(deadline), mask);
        waiters.clear();
        tWake.drain();
        if (r < 0)
            return r;
    }
}

} // namespace rstream
