// SPDX-License-Identifier: MIT
// What the progress thread does for a connection without the application: keepalive, the
// connection deadline, and answering words that arrive while nobody calls.
//
// Keepalive works as TCP's does: once nothing has arrived for the idle time, a KEEPALIVE probe
// goes every interval; the peer's engine answers each with KEEPALIVE_ACK from its own progress
// thread, and any word from the peer resets the count. After count unanswered probes the
// connection fails with ETIMEDOUT. A peer whose process is stopped, or whose host vanished
// without closing its sockets, answers nothing; a peer process that dies is reported earlier by
// the provider (FI_SHUTDOWN).

#include <algorithm>
#include <cerrno>
#include <ctime>

#include "clock.h"
#include "connection.h"
#include "connection_detail.h"
#include "progress.h"

namespace rstream {

int Connection::setKeepalive(bool on, int idleSec, int intervalSec, int count)
{
    if (!KeepaliveTimer::valid(idleSec, intervalSec, count))
        return -EINVAL;
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t now = on ? nowNs() : 0;
    ka_.configure(on, idleSec, intervalSec, count, now);
    if (!on)
        return 0;
    // The timer recomputes the deadline from the new values; until connected, the connection
    // schedules it once established.
    if (state_ == State::Connected && !error_)
        ProgressThread::instance().schedule(this, now);
    return 0;
}

void Connection::keepalive(bool *on, int *idleSec, int *intervalSec, int *count) const
{
    auto *self = const_cast<Connection *>(this);
    std::lock_guard<std::mutex> lock(self->mutex_);
    if (on)
        *on = ka_.on();
    if (idleSec)
        *idleSec = ka_.idleSec();
    if (intervalSec)
        *intervalSec = ka_.intervalSec();
    if (count)
        *count = ka_.count();
}

int64_t Connection::keepaliveLocked(int64_t now)
{
    if (state_ == State::Connecting || state_ == State::Accepting)
        return error_ ? 0 : connectDeadlineNs_;
    if (state_ != State::Connected || error_ || closed_ || closing_ || !ka_.on())
        return 0;
    KeepaliveTimer::Action action;
    const int64_t next = ka_.tick(now, &action);
    if (action == KeepaliveTimer::Action::Fail)
        failLocked(-ETIMEDOUT, "keepalive: the peer stopped answering");
    else if (action == KeepaliveTimer::Action::Probe)
        sendWordLocked(wire::encodeCtrl(wire::Ctrl::Keepalive));
    return next;
}

void Connection::setUserTimeout(unsigned ms)
{
    std::lock_guard<std::mutex> lock(mutex_);
    userTimeoutNs_ = static_cast<int64_t>(ms) * 1000000;
    stallSinceNs_ = 0;
    if (ms && state_ == State::Connected && !error_)
        ProgressThread::instance().schedule(this, nowNs());
}

int64_t Connection::userTimeoutLocked(int64_t now)
{
    if (!userTimeoutNs_ || state_ != State::Connected || error_ || closed_)
        return 0;
    // Progress is any credit or completion (txEvents_); a keepalive from a peer that keeps its
    // credit is none. Data the cork holds waits for us, not for the peer.
    const uint64_t events = txEvents_.load(std::memory_order_relaxed);
    const bool waiting = (tx_.unsent() > 0 && !corkHeld_) || tx_.inFlight() > 0;
    if (!waiting || events != stallEvents_) {
        stallSinceNs_ = waiting ? now : 0;
        stallEvents_ = events;
    } else if (now - stallSinceNs_ >= userTimeoutNs_) {
        failLocked(-ETIMEDOUT, "TCP_USER_TIMEOUT: the peer took no data for that long");
        return 0;
    }
    // Looked at a few times per timeout: it fires between the timeout and 1.25 times it.
    return now + std::clamp<int64_t>(userTimeoutNs_ / 4, 10000000, 1000000000);
}

int64_t Connection::timerTick(int64_t now, bool *watch)
{
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock())
        return now + 1000000; // the application is in a call: look again shortly
    if (shOn_.load(std::memory_order_relaxed) && state_ != State::Accepting) {
        // The link's pipe tells when the peer goes: no keepalive. Corked data and an idle
        // ring have timers.
        return shTimerLocked(now);
    }
    progressLocked(false);
    int64_t next = keepaliveLocked(now);
    if (const int64_t ut = userTimeoutLocked(now); ut && (!next || ut < next))
        next = ut;
    if (const int64_t rt = ringTickLocked(now); rt && (!next || rt < next))
        next = rt;
    // Data still held for the cork (the flush found no credit at its deadline, or it came early).
    if (corkHeld_ && corkSinceNs_ && (!next || corkSinceNs_ + kCorkMaxNs < next))
        next = std::max(now + 1000000, corkSinceNs_ + kCorkMaxNs);
    wakeSleepersLocked();
    if (!watched_ && needsBackgroundLocked()) {
        watched_ = true;
        *watch = true;
    }
    return next;
}

bool Connection::passiveProgress(bool *watch)
{
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock())
        return true; // the application is making progress itself
    if (shOn_.load(std::memory_order_relaxed)) {
        passive_ = false;
        return false;
    }
    // The application made progress on it a moment ago: its own calls, or its sleep on the wait
    // fd, take what arrives. A pass here took it from under them (nginx with 50 clients: 3,000
    // passes a second of this thread's, a tenth of a system call a request). A thread asleep
    // in waitFor() wakes on the wait fd itself, however long ago its last pass: a server
    // blocked in a read for its next request got a pass of this thread's beside its own
    // whenever a round came before its wake-up (most requests on a loaded machine).
    if (nowNs() - appProgressNs_.load(std::memory_order_relaxed) < kPassiveAppNs ||
        appSleeping_.load(std::memory_order_relaxed) > 0)
        return true;
    // One read takes kMaxBatches of the CQ. What arrived while nobody looked (a peer filling the
    // ring while the application reads elsewhere) is taken in this wake-up, not a batch every
    // kPassiveIntervalNs; bounded, so a peer that never stops sending waits for the next round.
    for (int round = 0; round < kPassiveRounds; round++) {
        progressLocked(false);
        if (cqDrained_ || error_ || closed_)
            break;
    }
    // Resets the wait set's signal when nothing is pending, or the fd would stay readable and
    // bring the connection back every round. Sleepers were woken by progressLocked() already.
    (void)rearmLocked();
    if (!watched_ && needsBackgroundLocked()) {
        watched_ = true;
        *watch = true;
    }
    if (error_ || closed_) {
        passive_ = false;
        return false;
    }
    return true;
}

} // namespace rstream
