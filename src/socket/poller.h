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
#include "watch.h"

namespace rstream {

class SignalsHeld; // signals_held.h

namespace detail {
// One pass of readiness hints (see Connection::hintFd): the armed wait fds of the connections
// about to be looked at are checked in the same ppoll as the kernel fds, and the looks of the
// pass skip progress on those found quiet. Looks outside a pass make progress as before.
class HintCheck
{
public:
    // fired: wait fds the sleep before this pass saw readable; their connections make
    // progress at their look without a check of the fd first.
    void add(Pollable &s, const std::vector<int> &fired);
    // Appends the hint fds, in order, to the fds of the caller's ppoll.
    void appendTo(std::vector<pollfd> *fds) const;
    // After that ppoll, with fds where the hint fds begin.
    void apply(const pollfd *fds) const;
    // Without it: every hint fd taken for not readable. Only where a sleep on them follows
    // (it ends at once on one that is), and no socket has look fds.
    void applyQuiet() const;
    bool onlyConnections() const { return lookFds_.empty(); }
    bool empty() const { return fds_.empty() && lookFds_.empty(); }
    // Whether all the pass has to check is one socket's look epoll (Pollable::lookIsEpoll).
    bool singleEpoll() const { return fds_.empty() && lookFds_.size() == 1 && epollLook_; }
    // That socket, where singleEpoll(); applySkipped() instead of apply() when its look was
    // left out (Pollable::lookCanWait).
    Pollable *soleLook() const { return looks_.front().first; }
    void applySkipped() const;
    // For the next pass (and to let the connections go); the vectors keep their memory, so a
    // look allocates nothing.
    void clear();

private:
    std::vector<std::shared_ptr<Connection>> conns_;
    std::vector<pollfd> fds_;
    // The sockets with look fds (lookFds()), and where theirs begin after the connections'.
    std::vector<std::pair<Pollable *, size_t>> looks_;
    std::vector<pollfd> lookFds_;
    bool epollLook_ = false; // the last socket's look fds were its look epoll
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
//
// An epoll set's fd -> entry index: a vector for the fds below kFlat, which a program's sockets
// nearly always are, a map above. A wait looks a member up by its fd for every key it takes: with
// 200 members a hash map's lookups were 3 % of a same-host server's time.
class FdIndex
{
public:
    static constexpr size_t npos = ~size_t(0);
    size_t find(int fd) const
    {
        if (fd >= 0 && fd < kFlat)
            return size_t(fd) < flat_.size() ? flat_[fd] : npos;
        const auto it = big_.find(fd);
        return it == big_.end() ? npos : it->second;
    }
    void set(int fd, size_t i)
    {
        if (fd >= 0 && fd < kFlat) {
            if (flat_.size() <= size_t(fd))
                flat_.resize(size_t(fd) + 1, npos);
            flat_[fd] = i;
        } else {
            big_[fd] = i;
        }
    }
    void erase(int fd)
    {
        if (fd >= 0 && fd < kFlat) {
            if (size_t(fd) < flat_.size())
                flat_[fd] = npos;
        } else {
            big_.erase(fd);
        }
    }

private:
    static constexpr int kFlat = 65536;
    std::vector<size_t> flat_;
    std::unordered_map<int, size_t> big_;
};

// Like the kernel's, a wait looks only at members that may be ready, not at every member:
// a member found with nothing to report is parked once its connection is armed (epoll_ready.cpp).
// Its armed wait fd sits in an epoll of the set's own (the hint epoll), one-shot, and its
// connection holds a watch slot that it marks when another thread's progress changes what the
// look saw. Either wakes the member, and only the members awake are looked at.
class EpollSet : public Pollable
{
public:
    explicit EpollSet(int epfd);
    ~EpollSet() override;
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

    // Tests: members looked at by the waits so far, and members parked now.
    uint64_t looks() const { return looks_.load(std::memory_order_relaxed); }
    size_t parkedCount();
    // Tests: the members active now, as parking counts them (kFewActive).
    size_t activeCount()
    {
        std::lock_guard<std::mutex> lock(mutex_);
        return activeCount_;
    }
    // Whether the kernel's epoll is nested in the hint epoll (false until a member is watched).
    bool kernelNested();

private:
    AdaptiveSpin spin_; // wait()'s spin before it sleeps, learnt from this set's waits
    struct Entry
    {
        int fd;
        uint32_t serial; // with fd, the entry's key: a later entry under the same fd differs
        std::weak_ptr<Pollable> sock;
        uint32_t events;
        epoll_data_t data;
        uint64_t lastGen;
        int lastRev;
        bool disabled;           // EPOLLONESHOT fired; waits for EPOLL_CTL_MOD
        bool active = true;      // in active_: every wait looks at it
        bool parked = false;     // woken only through the hint epoll or its watch slot
        bool fired = false;      // woken by its fd: its connection arms again before it parks
        int64_t idleSinceNs = 0; // the first of the looks in a row that found nothing (0: none)
        // The connection its watch slot is registered with, and what its last look saw of it.
        std::weak_ptr<Connection> conn;
        const Connection *connRaw = nullptr;
        std::shared_ptr<WatchSlot> slot;
        bool looked = false; // the last look reached connRaw, and lookSeq is its watchSeq()
        uint64_t lookSeq = 0;
        int hintFd = -1; // the fd registered for it in the hint epoll (-1: none)
        // hintFd is registered edge-triggered and stays so (a fabric connection's wait fd): a
        // parking re-registers it only when it fired since the member's last look.
        bool hintLasting = false;
        bool edgeSinceLook = false; // a wake-up of hintFd was taken after the last look
        // A member without a connection (a listener) parks on the fds it names (parkFds()).
        std::vector<int> parkFds;
        std::vector<int> armedFds; // those of them armed now (their one-shot not spent)
        std::vector<int> firedFds; // those whose wake-up came since its last look
    };
    static uint64_t keyOf(const Entry &e) { return uint64_t(e.serial) << 32 | uint32_t(e.fd); }
    Entry *findLocked(uint64_t key);
    // Level-triggered and edge-triggered events of the engine sockets; *kernelReady: whether
    // the kernel's epoll has events to read too.
    int collect(epoll_event *events, int maxevents, bool *kernelReady);
    // Entry i moves to the kernel's epoll if its socket fell back to kernel TCP, or goes if
    // the socket was closed: true when it left entries_ (the last entry takes its place).
    bool migrateLocked(size_t i);
    void eraseLocked(size_t i);
    // Makes the entry active (looked at by the next wait), unparking it.
    void activateLocked(Entry &e);
    // The live sockets of the entries not disabled by EPOLLONESHOT.
    // The members, and (when interest is given) the poll events each was added for.
    std::vector<std::shared_ptr<Pollable>> liveMembers(std::vector<short> *interest = nullptr);

    // Parking (epoll_ready.cpp).
    // The hint epoll and the marks, made on first need: false when they cannot be had.
    bool readyLocked();
    // After fork the hint epoll and the marks' eventfd are shared with the parent: the child's
    // set starts over with every member active.
    void forgetAfterForkLocked();
    // Registers the entry's watch slot with c (the connection its socket uses now), before its
    // look, so that what changes after the look marks it once parked.
    void watchLocked(Entry &e, const std::shared_ptr<Connection> &c);
    void unwatchLocked(Entry &e);
    // Parks an entry whose look found nothing to report: 1 parked, 0 it stays active, -EAGAIN
    // something changed since its look (look again before sleeping). idleNs: how long its looks
    // have found nothing; once that is long enough (INT64_MAX before a sleep) it arms the
    // connection if the look did not.
    int parkLocked(Entry &e, int64_t idleNs);
    // An active member looked at before whose connection has stayed armed on the fd it is
    // registered with: its look reads the connection as it is (hintQuiet()).
    void quietSinceLookLocked(Entry &e);
    // parkLocked() for a member without a connection (a listener), on the fds it names; only
    // when arm (its look does not arm it).
    int parkFdsLocked(Entry &e, bool arm);
    void unparkFdsLocked(Entry &e);
    // Takes the kernel's epoll out of the hint epoll: true if it was there.
    bool unnestKernel();
    // Takes the wake-ups of parked entries (their fds, their marks) and makes them active;
    // *kernelReady: whether the kernel's epoll, nested in the hint epoll, has events.
    void takeWakesLocked(bool *kernelReady);
    void applyWakesLocked(const epoll_event *buf, int k, bool *kernelReady);
    // wait()'s sleep when nothing but the hint epoll can wake it (every member parked, the
    // kernel's epoll nested, no wake-up registered): one epoll_pwait, whose events the next
    // look takes (slept_). 0, or -errno (-EINTR).
    int sleepOnHint(int hintEp, int64_t deadlineNs, SignalsHeld &held, const sigset_t *mask);
    // Whether a wait may sleep on the hint epoll before its first look (*hintEp): no member is
    // active, the kernel's epoll is nested, and no sleep's events wait to be taken.
    bool sleepsAtOnce(int *hintEp);
    // Before sleeping: every active entry is parked, or listed in socks (with interest) to sleep
    // on as poll does. -EAGAIN: something changed, look again.
    int parkAllLocked(std::vector<std::shared_ptr<Pollable>> *socks, std::vector<short> *interest);
    // collect()'s batched look: the look fds of its active members without a connection, then
    // their results (fds: where the look fds begin in the ppoll's array).
    // fresh: the wake-ups were taken just before (what fired is known, lookFromWakesLocked);
    // from: the active entries before it were looked at already in this wait.
    void gatherLooksLocked(bool fresh, size_t from);
    // A woken listener's look answered from its parked fds: those that fired are readable,
    // those still armed are not (their wake-up would have come with the others). False when
    // a look fd is neither (the ppoll looks then).
    bool lookFromWakesLocked(const Entry &e, pollfd *fds, int n);
    void applyLooksLocked(const pollfd *fds);
    // The live sockets of the active entries (those a sleep may have to wait on as poll does).
    void activeMembers(std::vector<std::shared_ptr<Pollable>> *socks);

    const int epfd_;
    std::mutex mutex_;
    std::vector<Entry> entries_;
    FdIndex index_; // fd -> its entry
    uint32_t nextSerial_ = 1;
    std::vector<uint64_t> active_; // keys of the active entries, in the order they are looked at
    // The entries active now: active_ also holds the keys of entries gone since its last look (a
    // program that deletes and adds its sockets at every request leaves one each time), which
    // counted as members made sets of a few look like many (parkLocked()).
    size_t activeCount_ = 0;
    void setActiveLocked(Entry &e, bool on)
    {
        if (e.active != on)
            on ? activeCount_++ : activeCount_--;
        e.active = on;
    }
    std::vector<uint64_t> keep_; // collect()'s scratch for the next active_
    // Parking: the hint epoll (its key 0 is the marks' eventfd, key 1 the kernel's epoll where
    // it could be nested), the marks, and which entry's key each registered hint fd carries.
    int hintEp_ = -1;
    bool kernelNested_ = false;
    std::shared_ptr<ReadyMarks> marks_;
    std::unordered_map<int, uint64_t> hintOwner_;
    std::vector<uint64_t> marked_; // scratch
    static constexpr int kWakeBatch = 64;
    std::vector<epoll_event> slept_; // the events of the last sleepOnHint(), not taken yet
    bool sleptAll_ = false;          // and they are all it had
    std::vector<pollfd> parkScratch_;
    // collect()'s look fds (Pollable::lookFds) of active members without a connection (a
    // listener, a socket in its switch), checked in its one ppoll; their sockets, and where
    // each one's fds begin.
    std::vector<pollfd> lookScratch_;
    std::vector<std::pair<std::shared_ptr<Pollable>, size_t>> lookers_;
    uint64_t forkGen_;
    std::atomic<uint64_t> looks_{0};
    // Entries whose look reached an engine connection (watched): only a set with one spins.
    std::atomic<int> watched_{0};
    std::atomic<uint64_t> gen_{0};
};

// Moves in each fork child (the sets' own fds are then shared with the parent).
uint64_t forkGeneration();

} // namespace rstream
