// SPDX-License-Identifier: MIT
// epoll over engine sockets (emulated: level-triggered, EPOLLET, EPOLLONESHOT) and kernel fds
// (the kernel's epoll fd): spin, then sleep on wait fds.

#include "poller.h"
#include "poller_internal.h"

#include <cerrno>
#include <cstring>
#include <sched.h>

#include "log.h"

namespace rstream {

using namespace detail;

int EpollSet::ctl(int op, int fd, const epoll_event *event, const std::shared_ptr<Pollable> &sock)
{
    if (fd == epfd_)
        return -EINVAL;
    std::unique_lock<std::mutex> lock(mutex_);
    // Only this fd's entry may have to move to the kernel first (the others move at the next
    // wait): programs such as redis-benchmark modify their registrations at every request.
    auto at = index_.find(fd);
    if (at != index_.end() && migrateLocked(at->second))
        at = index_.end();
    if (!sock || sock->kernelFd() >= 0) {
        lock.unlock();
        epoll_event copy{};
        if (event)
            copy = *event;
        return sys::epollCtl(epfd_, op, sock ? sock->kernelFd() : fd, event ? &copy : nullptr);
    }
    if (op != EPOLL_CTL_DEL && !event)
        return -EFAULT;
    // An entry of an earlier socket under this number (closed since) is not this one's.
    Entry *e = nullptr;
    if (at != index_.end()) {
        if (entries_[at->second].sock.lock() == sock) {
            e = &entries_[at->second];
        } else {
            eraseLocked(at->second);
            at = index_.end();
        }
    }
    switch (op) {
    case EPOLL_CTL_ADD:
        if (e) {
            RS_LOG(Debug, "epoll %d: add of fd %d: already there", epfd_, fd);
            return -EEXIST;
        }
        index_[fd] = entries_.size();
        entries_.push_back(Entry{fd, sock, event->events, event->data, ~uint64_t(0), 0, false});
        return 0;
    case EPOLL_CTL_MOD:
        if (!e) {
            RS_LOG(Debug, "epoll %d: mod of fd %d: not there", epfd_, fd);
            return -ENOENT;
        }
        e->events = event->events;
        e->data = event->data;
        e->lastGen = ~uint64_t(0);
        e->lastRev = 0;
        e->disabled = false;
        return 0;
    case EPOLL_CTL_DEL:
        if (!e) {
            RS_LOG(Debug, "epoll %d: del of fd %d: not there", epfd_, fd);
            return -ENOENT;
        }
        eraseLocked(at->second);
        return 0;
    default:
        return -EINVAL;
    }
}

void EpollSet::eraseLocked(size_t i)
{
    index_.erase(entries_[i].fd);
    if (i + 1 != entries_.size()) {
        entries_[i] = std::move(entries_.back());
        index_[entries_[i].fd] = i;
    }
    entries_.pop_back();
}

bool EpollSet::migrateLocked(size_t i)
{
    // A socket that fell back to kernel TCP moves to the kernel's epoll, registration intact;
    // the entry of a socket closed since is dropped, as the kernel drops closed files.
    const Entry &e = entries_[i];
    auto s = e.sock.lock();
    if (s) {
        const int kfd = s->kernelFd();
        if (kfd < 0)
            return false;
        epoll_event ev{};
        ev.events = e.disabled ? 0 : e.events; // a fired EPOLLONESHOT stays disarmed
        ev.data = e.data;
        if (int r = sys::epollCtl(epfd_, EPOLL_CTL_ADD, kfd, &ev); r < 0)
            RS_LOG(Warn, "epoll: cannot move fd %d to the kernel: %s", kfd, strerror(-r));
    }
    eraseLocked(i);
    return true;
}

void EpollSet::migrateAllLocked()
{
    for (size_t i = 0; i < entries_.size();)
        if (!migrateLocked(i))
            i++;
}

int EpollSet::collect(epoll_event *events, int maxevents, bool *kernelReady)
{
    std::lock_guard<std::mutex> lock(mutex_);
    migrateAllLocked();
    int n = 0;
    const size_t count = entries_.size();
    if (next_ >= count)
        next_ = 0;
    // One ppoll tells which connections' looks need progress, and whether the kernel's epoll
    // has anything (then epoll_wait reads it).
    Connection::HintPass pass;
    HintCheck &hints = hints_;
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
    // The scratch holds no socket or connection past the look (a closed one goes at once).
    hints.clear();
    members_.clear();
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

std::vector<std::shared_ptr<Pollable>> EpollSet::liveMembers(std::vector<short> *interest)
{
    std::vector<std::shared_ptr<Pollable>> members;
    if (interest)
        interest->clear();
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto &e : entries_)
        if (!e.disabled)
            if (auto s = e.sock.lock()) {
                members.push_back(std::move(s));
                if (interest)
                    interest->push_back(static_cast<short>(toPoll(e.events)));
            }
    return members;
}

int EpollSet::prepareWait(std::vector<pollfd> *fds, int)
{
    Nest nest;
    if (nest.tooDeep())
        return 0;
    std::vector<short> interest;
    std::vector<std::shared_ptr<Pollable>> members = liveMembers(&interest);
    fds->push_back({epfd_, POLLIN, 0});
    for (size_t i = 0; i < members.size(); i++)
        if (members[i]->prepareWait(fds, interest[i]) == -EAGAIN)
            return -EAGAIN;
    return 0;
}

void EpollSet::addWaiter(int eventFd, std::vector<std::shared_ptr<Connection>> *registered)
{
    Nest nest;
    if (nest.tooDeep())
        return;
    std::vector<std::shared_ptr<Pollable>> members = liveMembers();
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
    const int64_t capNs = int64_t(spinUs) * 1000;
    int64_t spinEnd = 0;
    bool missed = false;
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
    std::vector<short> interest;
    std::vector<pollfd> sleepFds;
    for (;;) {
        int n = check();
        if (n != 0 || timeoutMs == 0) {
            if (n > 0 && missed)
                spin_.record(nowNs() - start, capNs);
            return n;
        }
        int64_t now = nowNs();
        if (!missed) {
            missed = true;
            spinEnd = start + spin_.windowNs(capNs);
        }
        if (deadline >= 0 && now >= deadline) {
            if (now - start > capNs)
                spin_.record(now - start, capNs);
            return 0;
        }
        if (now < spinEnd) {
            sched_yield();
            continue;
        }
        socks = liveMembers(&interest);
        Waiters waiters(wakeFd);
        for (auto &s : socks)
            waiters.add(*s);
        n = check();
        if (n != 0)
            return n;
        sleepFds.clear();
        sleepFds.push_back({epfd_, POLLIN, 0});
        sleepFds.push_back({wakeFd, POLLIN, 0});
        if (int r = armAndSleep(socks, interest, &sleepFds, deadline, mask, waiters); r < 0)
            return r;
    }
}

} // namespace rstream
