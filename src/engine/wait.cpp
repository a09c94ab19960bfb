// SPDX-License-Identifier: MIT
// Waiting and readiness: arming the wait fd, sleepers and waiters.

#include "connection.h"
#include "connection_detail.h"

#include <algorithm>
#include <cerrno>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <rdma/fi_cm.h>

#include "clock.h"
#include "kernel.h"
#include "signals_held.h"

namespace rstream {

namespace {
// Each thread that sleeps in waitFor() has an eventfd of its own. A thread that changes what a
// sleeper waits for writes to the sleeper's eventfd: reading a CQ resets its wait fd, so the
// provider's own signal cannot be relied on to reach every sleeper.
class WakeFd
{
public:
    ~WakeFd()
    {
        if (fd_ >= 0)
            sys::close(fd_);
    }
    // Made on first use; -errno when it cannot be (EMFILE at the descriptor limit).
    int fd()
    {
        if (fd_ < 0) {
            const int r = sys::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
            if (r < 0)
                return r;
            fd_ = r;
        }
        return fd_;
    }
    void drain() const
    {
        uint64_t v;
        while (sys::read(fd_, &v, sizeof(v)) > 0) {
        }
    }
    // In a fork child the forking thread's eventfd is still the parent's (fork shares open
    // files): the parent or a sibling child could drain a wake-up meant for this process. The
    // child makes one of its own.
    void forgetAfterFork()
    {
        if (fd_ >= 0)
            sys::close(fd_);
        fd_ = -1;
    }

private:
    int fd_ = -1;
};

thread_local WakeFd tWakeFd;
[[maybe_unused]] const int gForkHandlers =
    pthread_atfork(nullptr, nullptr, [] { tWakeFd.forgetAfterFork(); });
} // namespace

int Connection::wait(int events, int timeoutMs)
{
    return waitFor(events, deadlineFor(timeoutMs));
}

int Connection::waitFor(int events, int64_t deadlineNs, bool progressed)
{
    int64_t missNs = 0, spinEnd = 0;
    SignalsHeld held; // from the first look that finds nothing (signals_held.h)
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t capNs =
        spinCapNs(events, settings_.pollUs, &roomRate_, bytesSent(), tx_.tail - tx_.done);
    for (;;) {
        if (shOn_.load(std::memory_order_relaxed)) {
            lock.unlock();
            return shWaitFor(events, deadlineNs);
        }
        if (!progressed)
            progressLocked();
        progressed = false;
        int ready = 0;
        if ((events & kReadable) && peekRecvLocked() != -EAGAIN)
            ready |= kReadable;
        if ((events & kWritable) && peekSendLocked() != 0)
            ready |= kWritable;
        if ((events & kSendDrained) && (tx_.tail == tx_.done || peekSendLocked() < 0))
            ready |= kSendDrained;
        if ((events & kWindowWritable) && (peekSendLocked() < 0 || canWriteWindowLocked()))
            ready |= kWindowWritable;
        if ((events & kWithdrawn) &&
            (withdrawalsAnswered_ >= withdrawalsQueued_ || !peerMayWriteLocked()))
            ready |= kWithdrawn;
        if (ready) {
            if (missNs)
                spin_.record(nowNs() - missNs, capNs, spinEnd - missNs);
            return ready;
        }
        if (!ep_)
            return -ENOTCONN;
        int64_t now = 0;
        const WaitStep step = spinStepLocked(lock, deadlineNs, capNs, &missNs, &spinEnd, &now);
        if (step == WaitStep::TimedOut)
            return 0;
        held.hold();
        if (step == WaitStep::Again)
            continue;
        // Writes the kernel took whole may have left the fd armed with their completions
        // queued, which a wait for room or for the drain needs taken before it sleeps.
        if (quietSignal_ && (events & (kWritable | kSendDrained | kWindowWritable)) &&
            !txOps_.empty())
            unverified_ = true;
        if (armLocked(true) == -EAGAIN) {
            processEqLocked();
            continue;
        }
        int64_t until = deadlineNs;
        if (state_ == State::Connecting && (!until || connectDeadlineNs_ < until))
            until = connectDeadlineNs_;
        pollfd pfd[2] = {{waitFd_, POLLIN, 0}, {}};
        if (const int r = sleepLocked(lock, pfd, 1, until, now, held); r < 0)
            return r;
    }
}

Connection::WaitStep Connection::spinStepLocked(std::unique_lock<std::mutex> &lock,
                                                int64_t deadlineNs, int64_t capNs, int64_t *missNs,
                                                int64_t *spinEnd, int64_t *now)
{
    *now = nowNs();
    if (!*missNs) {
        // The spin is learnt from this connection's earlier waits (AdaptiveSpin), which start at
        // the first look that finds nothing.
        *missNs = *now;
        const int64_t window = spin_.windowNs(capNs);
        *spinEnd = *now + window;
        spinChosenNs_.store(spinChosenNs_.load(std::memory_order_relaxed) +
                                static_cast<uint64_t>(window),
                            std::memory_order_relaxed);
    }
    if (deadlineNs && *now >= deadlineNs) {
        // Only a timeout past the cap says something (a zero timeout is a look, not a wait).
        if (*now - *missNs > capNs)
            spin_.record(*now - *missNs, capNs, *spinEnd - *missNs);
        return WaitStep::TimedOut;
    }
    if (*now < *spinEnd) {
        lock.unlock();
        sched_yield();
        lock.lock();
        return WaitStep::Again;
    }
    return WaitStep::Sleep;
}

int Connection::sleepLocked(std::unique_lock<std::mutex> &lock, pollfd *fds, int n, int64_t untilNs,
                            int64_t nowNs, SignalsHeld &held)
{
    const int wakeFd = tWakeFd.fd();
    if (wakeFd < 0)
        return wakeFd; // a connect at the descriptor limit says EMFILE, as one made there would
    fds[n] = {wakeFd, POLLIN, 0};
    timespec timeout{};
    if (untilNs) {
        const int64_t ms = std::max<int64_t>(0, (untilNs - nowNs + 999999) / 1000000);
        timeout = {static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1000000};
    }
    sleepers_.push_back(wakeFd);
    appSleeping_.fetch_add(1, std::memory_order_relaxed);
    lock.unlock();
    int r;
    {
        // Also runs when pthread_cancel unwinds out of poll(): a cancelled thread's eventfd
        // must not stay registered (its number would be reused).
        struct Unregister
        {
            std::unique_lock<std::mutex> &lock;
            std::vector<int> &sleepers;
            std::atomic<int> &sleeping;
            int fd;
            ~Unregister()
            {
                if (!lock.owns_lock())
                    lock.lock();
                sleeping.fetch_sub(1, std::memory_order_relaxed);
                auto it = std::find(sleepers.begin(), sleepers.end(), fd);
                if (it != sleepers.end())
                    sleepers.erase(it);
            }
        } unregister{lock, sleepers_, appSleeping_, wakeFd};
        // The result carries its own errno, which ~Unregister's locking may change.
        r = held.beginSleep(wakeFd);
        if (r == 0) {
            r = sys::ppoll(fds, static_cast<nfds_t>(n + 1), untilNs ? &timeout : nullptr,
                           held.sleepMask(nullptr));
            if (held.endSleep())
                r = -EINTR;
        }
    }
    if (fds[n].revents & POLLIN)
        tWakeFd.drain();
    return r == -EINTR ? -EINTR : 0;
}

int Connection::armLocked(bool light)
{
    // light: an application thread's arm, for its own sleep or look; the progress thread's is
    // not (its passive set would find a signal left set every round).
    // On tcp up to 1.17 fi_trywait resets the wait set's signal, then makes a progress pass and
    // reads the CQ and the EQ for emptiness: two epoll_wait calls, per request for a server
    // that answers and looks again. What it would learn is known here without them:
    // - The CQ: the last read found it empty, and the provider sets the signal after each
    //   completion it queues (and for a send it could not finish, whose POLLOUT only a progress
    //   pass registers), so whatever came since makes the fd readable. Only a progress pass
    //   resets the signal, and passes run inside reads and tries, which set cqDrained_ anew.
    // - The EQ: while connected it only reports the endpoint going away, which flushes the
    //   posted receives (always some) with errors first (eqDue_).
    // - The socket's data is in the fd itself; a pass takes all that the socket buffer held.
    // A signal still set only makes the sleep end at once: the look after it resets it.
    const bool lightOk = light && domain_->caps().levelWait && waitSet_ &&
                         state_ == State::Connected && !error_ && !closed_ && rxCount_ > 0 &&
                         !eqDue_;
    if (lightOk && quietSignal_) {
        // The signal is quiet (quiet_signal.cpp): what the last pass saw is known, and a send
        // posted since is verified by one more pass (a CQ read), which registers its POLLOUT
        // if the provider could not finish it. A pass that brings anything fails the arm, as
        // a failed fi_trywait does.
        if (!cqTaken_ || unverified_) {
            const bool before = changed_;
            changed_ = false;
            processCqLocked();
            const bool brought = changed_ || !cqTaken_ || error_ || eqDue_;
            changed_ = changed_ || before;
            if (brought) {
                wakeSleepersLocked();
                return -EAGAIN;
            }
        }
        armed_.store(true, std::memory_order_release);
        return 0;
    }
    if (lightOk && cqDrained_) {
        armed_.store(true, std::memory_order_release);
        return 0;
    }
    // The CQ and the EQ share the wait set: one try covers both (naming both tried the set
    // twice, each try a progress pass over both, on tcp four epoll_wait calls an arm). Without
    // a wait set each is tried (verbs arms the CQ's notification there).
    fid *fids[2] = {&cq_->fid, &eq_->fid};
    if (waitSet_)
        fids[0] = &waitSet_->fid;
    int ret = fi_trywait(domain_->fabric(), fids, waitSet_ ? 1 : 2);
    // A try that succeeded found both empty after its pass; one that failed may have left
    // completions queued behind a signal it reset.
    cqDrained_ = cqTaken_ = ret == 0;
    if (ret == 0)
        unverified_ = false; // the try registered a send's POLLOUT as a pass does
    if (ret == -FI_EAGAIN)
        return -EAGAIN;
    if (ret == 0) {
        eqDue_ = false;
        armed_.store(true, std::memory_order_release);
    }
    return ret ? fiErr(ret) : 0;
}

bool Connection::takePendingLocked()
{
    // Something is pending that the last look did not take: the EQ is read only now and then
    // while connected, and the CQ's read drives the provider, which may report the endpoint going
    // away on the EQ read before it. Takes it all; sleepers are woken if it changed anything.
    changed_ = false;
    processEqLocked();
    processCqLocked();
    if (!changed_)
        return false;
    wakeSleepersLocked();
    return true;
}

int Connection::rearmLocked(bool light)
{
    // The progress thread's arm: it may have taken the wait fd's signal for what only the look
    // after it queued, so it takes that before it sleeps, or pollers would sleep on.
    for (int i = 0; i < 4; i++) {
        const int r = armLocked(light);
        if (r != -EAGAIN)
            return r;
        takePendingLocked();
    }
    return -EAGAIN;
}

void Connection::disarmLocked()
{
    if (armed_.load(std::memory_order_relaxed)) {
        armed_.store(false, std::memory_order_relaxed);
        notifyWatchesLocked();
    }
}

int Connection::arm()
{
    return arm(nullptr);
}

int Connection::arm(uint64_t *seq, bool fdSeen)
{
    std::lock_guard<std::mutex> lock(mutex_);
    int ret;
    if (shOn_.load(std::memory_order_relaxed)) {
        ret = shArmLocked(fdSeen);
    } else if (!ep_ || armed_.load(std::memory_order_relaxed)) {
        ret = 0;
    } else {
        ret = armLocked(true);
        // The caller looks again if what was pending changed anything.
        if (ret == -EAGAIN)
            ret = takePendingLocked() ? -EAGAIN : armLocked(true);
    }
    if (ret == 0 && seq)
        *seq = watchSeq_.load();
    return ret;
}

void Connection::addWaiter(int eventFd)
{
    std::lock_guard<std::mutex> lock(mutex_);
    sleepers_.push_back(eventFd);
}

void Connection::removeWaiter(int eventFd)
{
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = std::find(sleepers_.begin(), sleepers_.end(), eventFd);
    if (it != sleepers_.end())
        sleepers_.erase(it);
}

void Connection::addWatch(std::shared_ptr<WatchSlot> slot)
{
    std::lock_guard<std::mutex> lock(mutex_);
    watches_.push_back(std::move(slot));
}

void Connection::removeWatch(const WatchSlot *slot)
{
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = std::find_if(watches_.begin(), watches_.end(),
                           [slot](const auto &w) { return w.get() == slot; });
    if (it != watches_.end())
        watches_.erase(it);
}

void Connection::notifyWatchesLocked()
{
    // Sequentially consistent, as the poller's parking (store parked, then read the sequence):
    // either it sees this move and does not park, or this sees the slot parked and marks it.
    watchSeq_.fetch_add(1);
    for (auto &w : watches_)
        if (w->parked.load() && w->parked.exchange(false))
            w->marks->mark(w->key);
}

ssize_t Connection::peekRecv()
{
    std::lock_guard<std::mutex> lock(mutex_);
    progressLocked();
    if (shOn_.load(std::memory_order_relaxed)) {
        ssize_t r, s;
        shPeekLocked(&r, &s);
        return r;
    }
    return peekRecvLocked();
}

ssize_t Connection::peekSend()
{
    std::lock_guard<std::mutex> lock(mutex_);
    progressLocked();
    if (shOn_.load(std::memory_order_relaxed)) {
        ssize_t r, s;
        shPeekLocked(&r, &s);
        return s;
    }
    return peekSendLocked();
}

void Connection::peek(ssize_t *recv, ssize_t *send, uint64_t *ring)
{
    std::lock_guard<std::mutex> lock(mutex_);
    if (ring)
        *ring = shOn_.load(std::memory_order_relaxed) ? sh_->sendRing() : tx_.size;
    if (shOn_.load(std::memory_order_relaxed)) {
        if (state_ == State::Accepting)
            progressLocked();
        shPeekLocked(recv, send);
        // A program that polls without ever sleeping learns of a peer that went as its reads
        // do: the wake-up pipe is read once a millisecond.
        if (*recv == -EAGAIN && LooksWithoutSleep::on() && shNoticeLocked(*recv) != -EAGAIN)
            shPeekLocked(recv, send);
        tLook = WatchLook{this, watchSeq_.load()};
        return;
    }
    if (const uint64_t pass = HintPass::current();
        pass && hintPass_.load(std::memory_order_relaxed) == pass &&
        armed_.load(std::memory_order_relaxed) && quietLocked()) {
        // The progress thread keeps out of the way of an application that looks.
        appProgressNs_.store(nowNs(), std::memory_order_relaxed);
    } else if (state_ == State::Connected && !error_ && readableLocked() > 0 &&
               peekSendLocked() * 3 >= static_cast<ssize_t>(tx_.size) &&
               nowNs() - appProgressNs_.load(std::memory_order_relaxed) < kLookProgressNs) {
        // Readable and writable already, and progress made a moment ago: a progress round
        // could only add to that, at the cost of the provider's poll (an epoll_wait on tcp).
        // A reader of small pieces that polls before each (iperf3 -l 64's server, select and
        // then 64 B) paid one for each. Its recv returns credit on its own.
    } else {
        progressLocked();
        // Nothing left to read: arm, so that the looks until the next event cost no progress.
        // (rearmLocked() takes what arrived meanwhile, and the state is read after it.)
        if (quietLocked() && readableLocked() == 0)
            (void)rearmLocked(true);
    }
    *recv = peekRecvLocked();
    *send = peekSendLocked();
    tLook = WatchLook{this, watchSeq_.load()};
}

bool Connection::quietLocked() const
{
    return state_ == State::Connected && !error_ && !closed_ && !closing_ &&
           (tx_.unsent() == 0 || corkHeld_) && !local_.due() && !kaAckOwed_ && !unmappedOwed_ &&
           !(shutWr_ && !shutWrSent_) && windows_.recordsEmpty();
}

ssize_t Connection::peekRecvLocked() const
{
    if (readableLocked() > 0)
        return static_cast<ssize_t>(readableLocked());
    if (state_ == State::Idle)
        return -ENOTCONN;
    if (error_)
        return error_;
    if (state_ == State::Connecting || state_ == State::Accepting)
        return -EAGAIN;
    if (peerShutWr_ || shutRd_)
        return 0;
    if (peerGone_)
        return -ECONNRESET;
    return -EAGAIN;
}

ssize_t Connection::peekSendLocked() const
{
    if (error_)
        return error_;
    switch (state_) {
    case State::Idle:
    case State::Closed:
        return -ENOTCONN;
    case State::Connecting:
    case State::Accepting:
        return 0;
    case State::Connected:
        break;
    }
    if (shutWr_ || closing_)
        return -EPIPE;
    if (peerClosed_)
        return -EPIPE;
    if (peerGone_)
        return -ECONNRESET;
    return static_cast<ssize_t>(tx_.freeSpace());
}

void Connection::wakeSleepersLocked()
{
    if (changed_) {
        const uint64_t one = 1;
        for (int fd : sleepers_)
            if (sys::write(fd, &one, sizeof(one)) < 0) {
                // Already readable: the sleeper wakes anyway.
            }
        notifyWatchesLocked();
    }
    changed_ = false;
}

} // namespace rstream
