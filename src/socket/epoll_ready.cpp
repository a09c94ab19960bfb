// SPDX-License-Identifier: MIT
// epoll's ready list: members found with nothing to report are parked, and only the members
// woken since (by their armed fds or their connections' marks) are looked at again.

#include "poller.h"
#include "poller_internal.h"
#include "signals_held.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "log.h"

namespace rstream {

using namespace detail;

namespace {
// The hint epoll's keys that are no entry's (an entry's serial, its key's high half, is >= 1).
constexpr uint64_t kMarksKey = 0;
constexpr uint64_t kKernelKey = 1;
// A member without a connection (a listener) parks on several fds, each registered under
// kParkFdKey + its number (below any entry's key): a wake-up then says which one fired, and
// only that one is armed again at the next parking (its one-shot spent), not all of them.
constexpr uint64_t kParkFdKey = 2;
constexpr uint64_t kEntryKeys = uint64_t(1) << 32;

// How long a member's looks find nothing before it is armed and parked, if its look did not
// arm it: a same-host link's arm makes the peer write a wake-up byte for what it sends next,
// a cost that busy connections (a request every few microseconds) are spared.
constexpr int64_t kParkAfterNs = 50'000;
// In a set of a few active members, a same-host one stays active longer: its look reads shared
// memory (no system call, a few for all of them), while each arm costs its peer a write of a
// wake-up byte for the next message, and this end that byte's read and its fd's registration
// again. A client waiting for the answers on its few connections (wrk's five a thread, each
// answered every 100 us at -c 10) made its server, the busier end, write a byte per answer.
// redis-benchmark's 50 connections (each answered every 100-250 us) were over a limit of 32:
// at 64 its rate rose by a quarter and both ends' CPU per request fell by a fifth. At 128,
// wrk's 100 connections a thread (-c 200) gained nothing and its looks cost it 15 % more CPU.
// Counted as the entries active now (activeCount_), not the keys waiting to be looked at.
constexpr size_t kFewActive = 64;
constexpr int64_t kParkAfterFewNs = 1'000'000;

std::atomic<uint64_t> gForkGeneration{0};
[[maybe_unused]] const int gForkHandler = pthread_atfork(
    nullptr, nullptr, [] { gForkGeneration.fetch_add(1, std::memory_order_relaxed); });
} // namespace

uint64_t forkGeneration()
{
    return gForkGeneration.load(std::memory_order_relaxed);
}

bool EpollSet::readyLocked()
{
    if (hintEp_ >= 0)
        return true;
    std::shared_ptr<ReadyMarks> marks = ReadyMarks::create();
    if (!marks)
        return false;
    const int ep = sys::epollCreate1(EPOLL_CLOEXEC);
    if (ep < 0)
        return false;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kMarksKey; // no entry's key (serials start at 1)
    if (sys::epollCtl(ep, EPOLL_CTL_ADD, marks->fd(), &ev) < 0) {
        sys::close(ep);
        return false;
    }
    // The kernel's epoll inside it too: one epoll_wait then tells a wait both what woke and
    // whether the kernel's epoll has events (a ppoll less per wait). Where the kernel refuses
    // (nesting too deep), a wait asks the kernel's epoll apart.
    ev.data.u64 = kKernelKey;
    kernelNested_ = sys::epollCtl(ep, EPOLL_CTL_ADD, epfd_, &ev) == 0;
    hintEp_ = ep;
    marks_ = std::move(marks);
    return true;
}

void EpollSet::forgetAfterForkLocked()
{
    // The connections are the parent's (the child's copies fail), and their mutexes may have
    // been held by the parent's other threads: they are not touched. A slot left with them is
    // never marked (not parked), and the shared fds are the child's copies to close.
    forkGen_ = forkGeneration();
    active_.clear();
    activeCount_ = 0;
    for (auto &e : entries_) {
        if (e.slot)
            e.slot->parked.store(false);
        e.slot.reset();
        e.conn.reset();
        e.connRaw = nullptr;
        e.looked = false;
        e.hintFd = -1;
        e.hintLasting = false;
        e.edgeSinceLook = false;
        e.parkFds.clear();
        e.armedFds.clear();
        e.firedFds.clear();
        e.parked = false;
        e.fired = false;
        e.idleSinceNs = 0;
        e.active = false;
        setActiveLocked(e, !e.disabled);
        if (e.active)
            active_.push_back(keyOf(e));
    }
    hintOwner_.clear();
    watched_.store(0, std::memory_order_relaxed);
    slept_.clear();
    sleptAll_ = false;
    marks_.reset();
    if (hintEp_ >= 0)
        sys::close(hintEp_);
    hintEp_ = -1;
    kernelNested_ = false;
}

void EpollSet::watchLocked(Entry &e, const std::shared_ptr<Connection> &c)
{
    // A connection at the address of one that has gone is another: watched anew.
    if (e.connRaw == c.get() && !e.conn.expired())
        return;
    unwatchLocked(e);
    if (!readyLocked())
        return; // never parked: looked at by every wait, as before
    e.slot = std::make_shared<WatchSlot>(marks_, keyOf(e));
    c->addWatch(e.slot);
    watched_.fetch_add(1, std::memory_order_relaxed);
    e.conn = c;
    e.connRaw = c.get();
}

void EpollSet::unwatchLocked(Entry &e)
{
    unparkFdsLocked(e);
    if (e.hintFd >= 0) {
        auto own = hintOwner_.find(e.hintFd);
        if (own != hintOwner_.end() && own->second == keyOf(e)) {
            hintOwner_.erase(own);
            // A lasting registration would fire under a key no entry has at every arrival,
            // waking sleeps for nothing: it leaves.
            if (e.hintLasting)
                (void)sys::epollCtl(hintEp_, EPOLL_CTL_DEL, e.hintFd, nullptr);
        }
        // A one-shot one stays in the hint epoll: programs such as redis-benchmark take a
        // socket out of their set and put it back at every request (it has no lasting
        // registration then: a new entry's first parking is one-shot), and the next parking's
        // EPOLL_CTL_MOD finds it there (two system calls saved). Left behind, it fires at most
        // once under a key no entry has, which the wait ignores; it leaves with its file.
        e.hintFd = -1;
        e.hintLasting = false;
    }
    if (e.slot) {
        e.slot->parked.store(false);
        if (auto c = e.conn.lock())
            c->removeWatch(e.slot.get());
        e.slot.reset();
        watched_.fetch_sub(1, std::memory_order_relaxed);
    }
    e.conn.reset();
    e.connRaw = nullptr;
    e.looked = false;
    e.parked = false;
}

void EpollSet::unparkFdsLocked(Entry &e)
{
    const uint64_t key = keyOf(e);
    for (const int fd : e.parkFds) {
        // Only an fd still registered for this entry: a number another entry registered since
        // is that entry's (a closed fd left the hint epoll with its file).
        auto own = hintOwner_.find(fd);
        if (own == hintOwner_.end() || own->second != key)
            continue;
        hintOwner_.erase(own);
        (void)sys::epollCtl(hintEp_, EPOLL_CTL_DEL, fd, nullptr);
    }
    e.parkFds.clear();
    e.armedFds.clear();
    e.firedFds.clear();
}

int EpollSet::parkFdsLocked(Entry &e, bool arm)
{
    if (!arm)
        return 0;
    std::shared_ptr<Pollable> s = e.sock.lock();
    if (!s || !readyLocked())
        return 0;
    parkScratch_.clear();
    const int r = s->parkFds(&parkScratch_);
    if (r < 0 || parkScratch_.empty())
        return r == -EAGAIN ? -EAGAIN : 0;
    const uint64_t key = keyOf(e);
    // An fd another live entry parks on (a dup of the listener in the same set): that one
    // wakes for it, and this one stays active.
    for (const pollfd &p : parkScratch_)
        if (auto own = hintOwner_.find(p.fd); own != hintOwner_.end() && own->second != key)
            if (const Entry *o = findLocked(own->second); o && !o->sock.expired())
                return 0;
    // One-shot, as a connection's: registered while readable, it fires at once. An fd still
    // armed from an earlier parking (it has not fired since) stays as it is. The member's own
    // kernel socket (a listener's queue) stays registered, edge-triggered, as a fabric
    // connection's wait fd does (parkLocked()): it fires for each connection that arrives,
    // and is registered again only when a wake-up of it was taken after the member's last
    // look. A server sleeping between connections re-armed it at each accept, a system call.
    epoll_event ev{};
    for (const pollfd &p : parkScratch_) {
        const bool lasting = p.fd == e.fd && !(e.events & EPOLLONESHOT);
        if (std::find(e.armedFds.begin(), e.armedFds.end(), p.fd) != e.armedFds.end()) {
            auto own = hintOwner_.find(p.fd);
            if (own != hintOwner_.end() && own->second == key && !(lasting && e.edgeSinceLook))
                continue;
            std::erase(e.armedFds, p.fd); // registered for another entry since, or fired
        }
        ev.events = lasting ? EPOLLIN | EPOLLET : EPOLLIN | EPOLLONESHOT;
        ev.data.u64 = kParkFdKey + static_cast<uint32_t>(p.fd);
        int rc = sys::epollCtl(hintEp_, EPOLL_CTL_MOD, p.fd, &ev);
        if (rc == -ENOENT)
            rc = sys::epollCtl(hintEp_, EPOLL_CTL_ADD, p.fd, &ev);
        if (rc < 0) {
            RS_LOG(Debug, "epoll %d: cannot watch fd %d's fd %d: %s", epfd_, e.fd, p.fd,
                   strerror(-rc));
            unparkFdsLocked(e);
            return 0;
        }
        hintOwner_[p.fd] = key;
        if (std::find(e.parkFds.begin(), e.parkFds.end(), p.fd) == e.parkFds.end())
            e.parkFds.push_back(p.fd);
        e.armedFds.push_back(p.fd);
    }
    e.firedFds.clear();
    e.fired = false;
    e.parked = true;
    return 1;
}

bool EpollSet::lookFromWakesLocked(const Entry &e, pollfd *fds, int n)
{
    const uint64_t key = keyOf(e);
    for (int i = 0; i < n; i++) {
        pollfd &p = fds[i];
        auto own = hintOwner_.find(p.fd);
        if (own == hintOwner_.end() || own->second != key)
            return false;
        if (std::find(e.firedFds.begin(), e.firedFds.end(), p.fd) != e.firedFds.end())
            p.revents = static_cast<short>(p.events & POLLIN);
        else if (std::find(e.armedFds.begin(), e.armedFds.end(), p.fd) != e.armedFds.end())
            p.revents = 0;
        else
            return false;
    }
    return true;
}

void EpollSet::quietSinceLookLocked(Entry &e)
{
    // A fabric connection read dry arms without a pass (its recv, quiet_signal.cpp), so a
    // member reported readable is, once the program has read it, armed again on the fd its
    // lasting registration watches. Whatever reached that fd since the member's last look
    // (the look's pass took what came before it) made an edge, which the wake-ups taken before
    // this look would have noted (edgeSinceLook). With none, the look needs no pass: a server
    // paid one per request, at the look after its answer, to find nothing.
    std::shared_ptr<Connection> c = e.conn.lock();
    if (c && !c->sameHost() && c->passHintFd() == e.hintFd)
        c->hintQuiet();
}

int EpollSet::parkLocked(Entry &e, int64_t idleNs)
{
    if (!e.slot && !e.connRaw) // no connection behind it: a listener, or none
        return parkFdsLocked(e, idleNs >= kParkAfterNs);
    if (!e.slot || !e.looked)
        return 0; // its look did not reach its connection
    std::shared_ptr<Connection> c = e.conn.lock();
    if (!c)
        return 0;
    const uint64_t key = keyOf(e);
    const bool sameHost = c->sameHost();
    const bool arm =
        idleNs >= (sameHost && activeCount_ <= kFewActive ? kParkAfterFewNs : kParkAfterNs);
    // Woken by its fd, an entry arms again even if its connection still counts as armed: the
    // look may not have read what made the fd readable (a same-host link's look reads shared
    // memory, not its socket, where the peer's end shows). A fabric one at once (its looks cost
    // the provider's calls); a same-host one when it parks, as the others.
    int fd = e.fired ? -1 : c->hintFd();
    if (fd < 0) {
        if (!arm && !(e.fired && !sameHost))
            return 0;
        const bool fired = e.fired;
        e.fired = false;
        uint64_t seq = 0;
        const int r = c->arm(&seq, fired);
        if (r == -EAGAIN || (r == 0 && seq != e.lookSeq))
            return -EAGAIN; // something came since the look
        if (r < 0 || (fd = c->hintFd()) < 0)
            return 0; // failed or closed: its look reports that
    }
    // Two entries of one connection (a dup in the same set) cannot both register its fd.
    if (auto own = hintOwner_.find(fd); own != hintOwner_.end() && own->second != key) {
        const Entry *o = findLocked(own->second);
        if (o && o->hintFd == fd && !o->conn.expired())
            return 0;
    }
    // A member that parks again on the same fabric wait fd keeps its registration: lasting and
    // edge-triggered, it fires for what arrives while the member is parked, and what arrived
    // before the member's look the look saw. Only a wake-up taken since that look (the look
    // may have missed its cause) has it registered again, which reports the fd if readable
    // now. A busy server's members park once per request: that was an EPOLL_CTL_MOD each.
    // Others register one-shot at each parking: a member's first parking (a program that
    // takes sockets out of its set and puts them back at every request would otherwise pay a
    // removal each time), a same-host link (its fd's readiness is its own byte, kept until
    // read), and the program's one-shot members (not parked once reported).
    const bool lasting = !sameHost && !(e.events & EPOLLONESHOT) && e.hintFd == fd;
    if (!(lasting && e.hintLasting && !e.edgeSinceLook)) {
        epoll_event ev{};
        ev.events = lasting ? EPOLLIN | EPOLLET : EPOLLIN | EPOLLONESHOT;
        ev.data.u64 = key;
        int r = sys::epollCtl(hintEp_, EPOLL_CTL_MOD, fd, &ev);
        if (r == -ENOENT)
            r = sys::epollCtl(hintEp_, EPOLL_CTL_ADD, fd, &ev);
        if (r < 0) {
            RS_LOG(Debug, "epoll %d: cannot watch fd %d's wait fd %d: %s", epfd_, e.fd, fd,
                   strerror(-r));
            return 0;
        }
        if (e.hintFd >= 0 && e.hintFd != fd) {
            auto old = hintOwner_.find(e.hintFd);
            if (old != hintOwner_.end() && old->second == key) {
                hintOwner_.erase(old);
                if (e.hintLasting)
                    (void)sys::epollCtl(hintEp_, EPOLL_CTL_DEL, e.hintFd, nullptr);
            }
        }
        e.hintFd = fd;
        e.hintLasting = lasting;
        hintOwner_[fd] = key;
    }
    // Sequentially consistent, as Connection::notifyWatchesLocked(): either the connection
    // sees the slot parked and marks it, or this sees its sequence move (or its fd disarmed).
    e.slot->parked.store(true);
    if (c->watchSeq() != e.lookSeq || c->hintFd() != fd) {
        e.slot->parked.store(false);
        return -EAGAIN;
    }
    e.parked = true;
    return 1;
}

void EpollSet::takeWakesLocked(bool *kernelReady)
{
    if (sleptAll_ || !slept_.empty()) {
        // What a sleep in the hint epoll returned: when that was all it had, no epoll_wait
        // now (what came since is in the hint epoll for the next wait).
        applyWakesLocked(slept_.data(), static_cast<int>(slept_.size()), kernelReady);
        const bool all = sleptAll_;
        slept_.clear();
        sleptAll_ = false;
        if (all)
            return;
    }
    epoll_event buf[kWakeBatch];
    for (;;) {
        const int k = sys::epollWait(hintEp_, buf, kWakeBatch, 0);
        if (k <= 0)
            return;
        applyWakesLocked(buf, k, kernelReady);
        if (k < kWakeBatch)
            return;
    }
}

int EpollSet::sleepOnHint(int hintEp, int64_t deadlineNs, SignalsHeld &held, const sigset_t *mask)
{
    // A handler run on this thread wakes the sleep through the marks eventfd, which the hint
    // epoll holds (a wake-up with no mark: the look after it finds none).
    // Held for the sleep: its fd stays this one's until the handler can no longer write it.
    std::shared_ptr<ReadyMarks> marks;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        marks = marks_;
    }
    if (int e = held.beginSleep(marks ? marks->fd() : -1); e < 0)
        return e;
    epoll_event buf[kWakeBatch];
    const int r =
        sys::epollPwait(hintEp, buf, kWakeBatch, remainingMs(deadlineNs), held.sleepMask(mask));
    const bool interrupted = held.endSleep();
    if (r < 0)
        return r;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (hintEp_ == hintEp) {
            slept_.assign(buf, buf + r); // taken by the next look even when this one ends EINTR
            sleptAll_ = r < kWakeBatch;
        }
    }
    return interrupted ? -EINTR : 0;
}

bool EpollSet::sleepsAtOnce(int *hintEp)
{
    std::lock_guard<std::mutex> lock(mutex_);
    // A sleep's events not taken yet, or a set forked since its last look: the look first.
    if (hintEp_ < 0 || !kernelNested_ || !slept_.empty() || sleptAll_ ||
        forkGen_ != forkGeneration())
        return false;
    // A member whose socket is gone (closed since its last look) can wake nothing: the look
    // after the sleep drops it.
    for (uint64_t key : active_)
        if (const Entry *e = findLocked(key); e && e->active && !e->disabled && !e->sock.expired())
            return false;
    *hintEp = hintEp_;
    return true;
}

void EpollSet::applyWakesLocked(const epoll_event *buf, int k, bool *kernelReady)
{
    for (int i = 0; i < k; i++) {
        if (buf[i].data.u64 == kKernelKey) {
            *kernelReady = true;
            continue;
        }
        if (buf[i].data.u64 == kMarksKey) {
            marked_.clear();
            marks_->take(&marked_);
            for (uint64_t key : marked_)
                if (Entry *e = findLocked(key); e && !e->disabled)
                    activateLocked(*e);
            continue;
        }
        uint64_t key = buf[i].data.u64;
        if (key >= kParkFdKey && key < kEntryKeys) {
            // A parked fd of a member without a connection: its one-shot is spent.
            const int fd = static_cast<int>(key - kParkFdKey);
            auto own = hintOwner_.find(fd);
            if (own == hintOwner_.end())
                continue;
            key = own->second;
            if (Entry *e = findLocked(key)) {
                if (fd != e->fd || (e->events & EPOLLONESHOT))
                    std::erase(e->armedFds, fd); // not a lasting registration (parkFdsLocked)
                if (std::find(e->firedFds.begin(), e->firedFds.end(), fd) == e->firedFds.end())
                    e->firedFds.push_back(fd);
            }
        }
        Entry *e = findLocked(key);
        if (!e)
            continue;
        e->edgeSinceLook = true;
        if (e->parked && !e->disabled) {
            activateLocked(*e);
            e->fired = true;
        } else if (e->hintLasting && !e->active && e->hintFd >= 0) {
            // Neither parked nor looked at (the program's one-shot fired): its lasting
            // registration would wake sleeps at every arrival until the program re-arms it.
            epoll_event ev{};
            ev.events = EPOLLONESHOT; // disarmed until the next parking
            ev.data.u64 = key;
            (void)sys::epollCtl(hintEp_, EPOLL_CTL_MOD, e->hintFd, &ev);
            e->hintLasting = false;
        }
    }
}

int EpollSet::parkAllLocked(std::vector<std::shared_ptr<Pollable>> *socks,
                            std::vector<short> *interest)
{
    socks->clear();
    interest->clear();
    keep_.clear();
    int result = 0;
    for (uint64_t key : active_) {
        Entry *e = findLocked(key);
        if (!e || !e->active || e->disabled) {
            if (e && e->disabled)
                setActiveLocked(*e, false);
            continue;
        }
        const int r = result == -EAGAIN ? 0 : parkLocked(*e, INT64_MAX);
        if (r == 1) {
            setActiveLocked(*e, false);
            continue;
        }
        keep_.push_back(key);
        if (r == -EAGAIN) {
            result = -EAGAIN;
            continue;
        }
        if (auto s = e->sock.lock()) {
            socks->push_back(std::move(s));
            interest->push_back(static_cast<short>(toPoll(e->events)));
        }
    }
    active_.swap(keep_);
    return result;
}

void EpollSet::activeMembers(std::vector<std::shared_ptr<Pollable>> *socks)
{
    socks->clear();
    std::lock_guard<std::mutex> lock(mutex_);
    for (uint64_t key : active_)
        if (Entry *e = findLocked(key); e && e->active && !e->disabled)
            if (auto s = e->sock.lock())
                socks->push_back(std::move(s));
}

bool EpollSet::unnestKernel()
{
    std::lock_guard<std::mutex> lock(mutex_);
    if (!kernelNested_)
        return false;
    (void)sys::epollCtl(hintEp_, EPOLL_CTL_DEL, epfd_, nullptr);
    kernelNested_ = false;
    // A wait asleep in the hint epoll alone would not see the kernel's events: a mark (of no
    // member) wakes it, and it sleeps on both from then on.
    if (marks_)
        marks_->mark(kMarksKey);
    return true;
}

bool EpollSet::kernelNested()
{
    std::lock_guard<std::mutex> lock(mutex_);
    return kernelNested_;
}

size_t EpollSet::parkedCount()
{
    std::lock_guard<std::mutex> lock(mutex_);
    size_t n = 0;
    for (auto &e : entries_)
        n += e.parked;
    return n;
}

} // namespace rstream
