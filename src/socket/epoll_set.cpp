// SPDX-License-Identifier: MIT
// epoll over engine sockets (emulated: level-triggered, EPOLLET, EPOLLONESHOT) and kernel fds
// (the kernel's epoll fd): look at the members that may be ready, spin, then sleep.

#include "poller.h"
#include "poller_internal.h"
#include "signals_held.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sched.h>

#include "log.h"

namespace rstream {

using namespace detail;

EpollSet::EpollSet(int epfd) : epfd_(epfd), forkGen_(forkGeneration()) {}

EpollSet::~EpollSet()
{
    std::lock_guard<std::mutex> lock(mutex_);
    if (forkGen_ == forkGeneration())
        for (auto &e : entries_)
            unwatchLocked(e);
    if (hintEp_ >= 0)
        sys::close(hintEp_);
}

EpollSet::Entry *EpollSet::findLocked(uint64_t key)
{
    const size_t at = index_.find(static_cast<int>(key & 0xffffffff));
    if (at == FdIndex::npos)
        return nullptr;
    Entry &e = entries_[at];
    return keyOf(e) == key ? &e : nullptr;
}

void EpollSet::activateLocked(Entry &e)
{
    if (e.parked) {
        e.parked = false;
        if (e.slot)
            e.slot->parked.store(false);
    }
    e.idleSinceNs = 0;
    if (!e.active) {
        setActiveLocked(e, true);
        active_.push_back(keyOf(e));
    }
}

int EpollSet::ctl(int op, int fd, const epoll_event *event, const std::shared_ptr<Pollable> &sock)
{
    if (fd == epfd_)
        return -EINVAL;
    std::unique_lock<std::mutex> lock(mutex_);
    // Only this fd's entry may have to move to the kernel first (the others move at the next
    // wait): programs such as redis-benchmark modify their registrations at every request.
    size_t at = index_.find(fd);
    if (at != FdIndex::npos && migrateLocked(at))
        at = FdIndex::npos;
    if (forkGen_ != forkGeneration())
        forgetAfterForkLocked();
    if (!sock || sock->kernelFd() >= 0) {
        lock.unlock();
        epoll_event copy{};
        if (event)
            copy = *event;
        const int kfd = sock ? sock->kernelFd() : fd;
        int r = sys::epollCtl(epfd_, op, kfd, event ? &copy : nullptr);
        // The program's epoll nested as deep as the kernel allows, counting the hint epoll's
        // level above it: that level goes, as it was not the program's.
        if (r == -ELOOP && op == EPOLL_CTL_ADD && unnestKernel())
            r = sys::epollCtl(epfd_, op, kfd, &copy);
        return r;
    }
    if (op != EPOLL_CTL_DEL && !event)
        return -EFAULT;
    // An entry of an earlier socket under this number (closed since) is not this one's.
    Entry *e = nullptr;
    if (at != FdIndex::npos) {
        if (entries_[at].sock.lock() == sock) {
            e = &entries_[at];
        } else {
            eraseLocked(at);
            at = FdIndex::npos;
        }
    }
    switch (op) {
    case EPOLL_CTL_ADD:
        if (e) {
            RS_LOG(Debug, "epoll %d: add of fd %d: already there", epfd_, fd);
            return -EEXIST;
        }
        index_.set(fd, entries_.size());
        entries_.push_back(
            Entry{fd, nextSerial_++, sock, event->events, event->data, ~uint64_t(0), 0, false});
        if (nextSerial_ == 0)
            nextSerial_ = 1; // key 0 is the marks' (see readyLocked())
        active_.push_back(keyOf(entries_.back()));
        activeCount_++; // made active
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
        activateLocked(*e);
        return 0;
    case EPOLL_CTL_DEL:
        if (!e) {
            RS_LOG(Debug, "epoll %d: del of fd %d: not there", epfd_, fd);
            return -ENOENT;
        }
        eraseLocked(at);
        return 0;
    default:
        return -EINVAL;
    }
}

void EpollSet::eraseLocked(size_t i)
{
    // Its key in active_ finds no entry any more, and is dropped at the next look.
    unwatchLocked(entries_[i]);
    setActiveLocked(entries_[i], false);
    index_.erase(entries_[i].fd);
    if (i + 1 != entries_.size()) {
        entries_[i] = std::move(entries_.back());
        index_.set(entries_[i].fd, i);
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

int EpollSet::collect(epoll_event *events, int maxevents, bool *kernelReady)
{
    std::lock_guard<std::mutex> lock(mutex_);
    if (forkGen_ != forkGeneration())
        forgetAfterForkLocked();
    // One pass: what several members share (a switch's upgrade listener) is looked at once,
    // and the look fds of members without a connection (a socket in its switch: its kernel fd)
    // are checked in one system call, not one each. With 1,000 connections switching at once,
    // a wait took two system calls per member, and the switches timed out.
    Connection::HintPass pass;
    // One system call tells whether the kernel's epoll has anything (then epoll_wait reads it)
    // and which parked entries woke: an epoll_wait of the hint epoll, where the kernel's epoll
    // is nested, or a ppoll of both (and the look fds). (The kernel's epoll may hold fds the
    // program added before the set had engine sockets.)
    *kernelReady = true; // epoll_wait reads it (and reports an error)
    if (kernelNested_) {
        *kernelReady = false;
        const timespec zero{0, 0};
        bool woke = true;
        size_t from = 0;
        if (!sleptAll_ && slept_.empty()) {
            // No sleep's events to take, and members to look at by their fds (a socket in its
            // upgrade): the hint epoll in their ppoll says whether anything woke, and only
            // then does an epoll_wait take it. A client's connection is in its upgrade for
            // all of its waits but the last: each of them was an epoll_wait and a ppoll.
            gatherLooksLocked(false, 0);
            if (!lookScratch_.empty()) {
                lookScratch_.insert(lookScratch_.begin(), {hintEp_, POLLIN, 0});
                if (sys::ppoll(lookScratch_.data(), lookScratch_.size(), &zero, nullptr) >= 0) {
                    applyLooksLocked(lookScratch_.data() + 1);
                    woke = lookScratch_[0].revents != 0;
                    from = active_.size();
                }
            }
        }
        if (woke) {
            // The wake-ups before the look: a member they activate (a listener woken by its
            // kernel fd) has its look fds in the one ppoll too, not a system call of its own
            // (and a read of its fabric listener's EQ that its look shows quiet). Members
            // looked at above are not looked at again.
            takeWakesLocked(kernelReady);
            gatherLooksLocked(true, from);
            if (!lookScratch_.empty() &&
                sys::ppoll(lookScratch_.data(), lookScratch_.size(), &zero, nullptr) >= 0)
                applyLooksLocked(lookScratch_.data());
        }
    } else {
        gatherLooksLocked(false, 0);
        // Without a hint epoll yet, its entry is -1, which ppoll skips.
        lookScratch_.insert(lookScratch_.begin(), {{epfd_, POLLIN, 0}, {hintEp_, POLLIN, 0}});
        const timespec zero{0, 0};
        if (sys::ppoll(lookScratch_.data(), lookScratch_.size(), &zero, nullptr) >= 0) {
            *kernelReady = lookScratch_[0].revents != 0;
            bool ignored = false;
            if (lookScratch_[1].revents)
                takeWakesLocked(&ignored);
            applyLooksLocked(lookScratch_.data() + 2);
        }
    }
    lookers_.clear();
    int n = 0;
    // The entries left unlooked (maxevents reached) come first next time, then those looked at:
    // each wait starts where the last one stopped.
    keep_.clear();
    size_t cut = active_.size();
    int64_t now = 0;
    for (size_t k = 0; k < active_.size(); k++) {
        const uint64_t key = active_[k];
        if (n >= maxevents) {
            if (cut == active_.size())
                cut = k;
            continue;
        }
        Entry *e = findLocked(key);
        if (!e || !e->active)
            continue; // gone, or listed twice
        if (e->disabled) {
            setActiveLocked(*e, false);
            continue;
        }
        std::shared_ptr<Pollable> s = e->sock.lock();
        if (!s || s->kernelFd() >= 0) {
            migrateLocked(index_.find(e->fd)); // closed, or fell back to kernel TCP
            continue;
        }
        // The watch first: what changes after the look marks the entry once it is parked. An
        // entry that watches a live connection already asks its socket for its connection only
        // when the look touched another one (or none): then it watches that one and looks
        // again. Asking at every look took two locks and two reference counts for each member
        // of each wait, a seventh of a same-host client's time (wrk, 25 connections a thread).
        // (An address is the watched connection's only while that lives: the weak reference
        // says so, before the look and after it.)
        const bool watching = e->connRaw && !e->conn.expired();
        if (!watching)
            if (std::shared_ptr<Connection> c = s->hintConnection())
                watchLocked(*e, c);
        if (watching && e->looked && e->hintLasting && !e->edgeSinceLook && e->hintFd >= 0)
            quietSinceLookLocked(*e);
        Connection::clearLook();
        e->edgeSinceLook = false; // what fired before this look, the look sees
        looks_.fetch_add(1, std::memory_order_relaxed);
        const int interest = static_cast<int>(toPoll(e->events));
        int rev = s->pollEvents(interest);
        WatchLook look = Connection::lastLook();
        if (watching && (look.conn != e->connRaw || e->conn.expired())) {
            std::shared_ptr<Connection> c = s->hintConnection();
            if (c && (c.get() != e->connRaw || e->conn.expired())) {
                watchLocked(*e, c);
                Connection::clearLook();
                rev = s->pollEvents(interest);
                look = Connection::lastLook();
            }
        }
        e->looked = e->connRaw && look.conn == e->connRaw;
        e->lookSeq = look.seq;
        bool report = rev != 0;
        if (report && (e->events & EPOLLET)) {
            // Edge-triggered: report again only after new progress or a new condition.
            uint64_t gen = s->generation(static_cast<int>(toPoll(e->events)));
            report = gen != e->lastGen || (rev & ~e->lastRev);
            e->lastGen = gen;
            e->lastRev = rev;
        }
        if (report) {
            events[n].events = toEpoll(rev);
            events[n].data = e->data;
            n++;
            e->idleSinceNs = 0;
            if (e->events & EPOLLONESHOT) {
                e->disabled = true;
                setActiveLocked(*e, false);
                continue;
            }
            keep_.push_back(key);
            continue;
        }
        if (!now)
            now = nowNs();
        if (!e->idleSinceNs)
            e->idleSinceNs = now;
        // Connections the look armed park at once; the others once idle for a while (arming a
        // same-host link makes its peer write a wake-up byte for what it sends next).
        if (parkLocked(*e, now - e->idleSinceNs) == 1) {
            setActiveLocked(*e, false);
            continue;
        }
        keep_.push_back(key);
    }
    if (cut < active_.size()) {
        std::vector<uint64_t> next(active_.begin() + static_cast<ptrdiff_t>(cut), active_.end());
        next.insert(next.end(), keep_.begin(), keep_.end());
        keep_.swap(next);
    }
    active_.swap(keep_);
    return n;
}

void EpollSet::gatherLooksLocked(bool fresh, size_t from)
{
    lookScratch_.clear();
    lookers_.clear();
    for (size_t k = 0; k < active_.size(); k++) {
        Entry *e = findLocked(active_[k]);
        // A member whose last look reached a connection has none.
        if (!e || !e->active || e->disabled || e->connRaw)
            continue;
        if (k < from) {
            e->firedFds.clear(); // looked at already: a wake-up since is no answer later
            continue;
        }
        std::shared_ptr<Pollable> s = e->sock.lock();
        if (!s)
            continue;
        const size_t at = lookScratch_.size();
        // Woken by its parked fds just now (a listener's connection came): their wake-ups
        // say what the ppoll would, a system call less per connection accepted. Once only:
        // the fds that fired are armed no more, and the next look asks the kernel. Those are
        // the look's fds one by one (not an epoll of the socket's own standing for them).
        const bool woken = fresh && !e->firedFds.empty();
        const int n = woken ? s->lookFdsEach(&lookScratch_) : s->lookFds(&lookScratch_);
        if (n > 0 && woken && lookFromWakesLocked(*e, &lookScratch_[at], n)) {
            s->lookResults(&lookScratch_[at]);
            lookScratch_.resize(at);
        } else if (n > 0) {
            lookers_.emplace_back(std::move(s), at);
        }
        e->firedFds.clear();
    }
}

void EpollSet::applyLooksLocked(const pollfd *fds)
{
    for (auto &[s, at] : lookers_)
        s->lookResults(fds + at);
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
    // A spin catches what an engine connection (fabric, same-host) delivers without a sleep and
    // a wake-up. A set without one waits for the kernel, as it would without rstream: a spin
    // there is a look (a system call) and a sched_yield at a time, for no gain in its wake-up
    // (a server of short kernel TCP connections spun up to the cap between any two of them).
    // Known once the first look has seen the members.
    int64_t capNs = int64_t(spinUs) * 1000;
    auto settleCap = [&] {
        if (watched_.load(std::memory_order_relaxed) == 0)
            capNs = 0;
    };
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
    std::vector<std::shared_ptr<Pollable>> socks, registered;
    std::vector<short> interest;
    std::vector<pollfd> sleepFds;
    int hintEp = -1;
    bool nested = false;
    // Parks what can park (the others in socks): false when something came since its look.
    auto parkAll = [&]() -> bool {
        std::lock_guard<std::mutex> lock(mutex_);
        if (parkAllLocked(&socks, &interest) == -EAGAIN)
            return false;
        hintEp = hintEp_;
        nested = kernelNested_;
        return true;
    };
    SignalsHeld held;
    // Every member parked and the kernel's epoll nested: all that can end the wait shows in
    // the hint epoll, so a wait that would not spin sleeps in it at once, and its look is the
    // one that takes the sleep's events (kernel TCP's epoll_wait is one call; a look before
    // the sleep was a second, for each request of a server that sleeps between requests).
    // What was there already returns the sleep at once. Such a wait does not teach the spin
    // (it cannot tell what was there from what came): its probes do (AdaptiveSpin).
    bool sleptFirst = false;
    int64_t window = -1; // the spin, when chosen before the first look
    if (timeoutMs != 0 && sleepsAtOnce(&hintEp)) {
        settleCap();
        window = spin_.windowNs(capNs);
    }
    if (window == 0) {
        missed = true;
        spinEnd = start;
        held.hold();
        if (int r = sleepOnHint(hintEp, deadline, held, mask); r < 0)
            return r;
        sleptFirst = true;
    }
    for (;;) {
        int n = check();
        if (n != 0 || timeoutMs == 0) {
            if (n > 0 && missed && !sleptFirst)
                spin_.record(nowNs() - start, capNs, spinEnd - start);
            return n;
        }
        int64_t now = nowNs();
        if (!missed) {
            missed = true;
            settleCap();
            spinEnd = start + (window >= 0 ? window : spin_.windowNs(capNs));
            held.hold();
        }
        if (deadline >= 0 && now >= deadline) {
            if (now - start > capNs)
                spin_.record(now - start, capNs, spinEnd - start);
            return 0;
        }
        if (now < spinEnd) {
            sched_yield();
            continue;
        }
        // Parked, a member is woken by its armed fd or its connection's mark (parking fails
        // when something came since its look): when every member parks and the kernel's epoll
        // is nested, the hint epoll holds all that can end the sleep. One epoll_pwait then,
        // whose events the look after it takes (a registration, a look, a ppoll and the look's
        // epoll_wait after it were four system calls more, for each request of an idle server).
        if (!parkAll())
            continue;
        if (socks.empty() && nested && hintEp >= 0) {
            if (int r = sleepOnHint(hintEp, deadline, held, mask); r < 0)
                return r;
            continue;
        }
        // Some stay active. Register first, then look again, then arm: progress made by another
        // thread after the look writes the eventfd (or marks a parked entry), progress still
        // pending makes arming fail. Only the active entries are registered.
        activeMembers(&registered);
        Waiters waiters(wakeFd);
        waiters.addAll(registered);
        // With no connection holding the eventfd, nothing was registered that the look could
        // have missed: what came since the last one is in the fds the sleep waits on.
        if (waiters.any()) {
            n = check();
            if (n != 0)
                return n;
        }
        if (!parkAll())
            continue;
        // A member that woke during the look and cannot park was not registered: look again.
        auto byAddress = [](const auto &a, const auto &b) { return a.get() < b.get(); };
        std::sort(registered.begin(), registered.end(), byAddress);
        bool unregistered = false;
        for (auto &s : socks)
            if (!std::binary_search(registered.begin(), registered.end(), s, byAddress))
                unregistered = true;
        registered.clear();
        if (unregistered)
            continue;
        // The kernel's epoll even where the hint epoll holds it: another thread's epoll_ctl may
        // take it out of there (unnestKernel()) while this one sleeps.
        sleepFds.clear();
        sleepFds.push_back({epfd_, POLLIN, 0});
        sleepFds.push_back({wakeFd, POLLIN, 0});
        if (hintEp >= 0)
            sleepFds.push_back({hintEp, POLLIN, 0});
        if (int e = held.beginSleep(wakeFd); e < 0)
            return e;
        const int r =
            armAndSleep(socks, interest, &sleepFds, deadline, held.sleepMask(mask), waiters);
        if (held.endSleep())
            return -EINTR;
        if (r < 0)
            return r;
        if (r == 1 && nested && hintEp >= 0 && !sleepFds[0].revents && !sleepFds[2].revents) {
            // Neither the hint epoll nor the kernel's had anything when the sleep ended: the
            // look after it needs no epoll_wait of them (what came since waits for the next).
            std::lock_guard<std::mutex> lock(mutex_);
            if (hintEp_ == hintEp) {
                slept_.clear();
                sleptAll_ = true;
            }
        }
        socks.clear();
    }
}

} // namespace rstream
