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
#include "progress.h"

namespace rstream {

namespace {
constexpr int64_t kSec = 1000000000;

} // namespace

int Connection::setKeepalive(bool on, int idleSec, int intervalSec, int count)
{
    // Linux's bounds for TCP_KEEPIDLE, TCP_KEEPINTVL and TCP_KEEPCNT.
    if (idleSec < 0 || idleSec > 32767 || intervalSec < 0 || intervalSec > 32767 || count < 0 ||
        count > 127)
        return -EINVAL;
    std::lock_guard<std::mutex> lock(mutex_);
    if (idleSec)
        kaIdle_ = idleSec;
    if (intervalSec)
        kaInterval_ = intervalSec;
    if (count)
        kaCount_ = count;
    bool was = kaOn_;
    kaOn_ = on;
    if (!on)
        return 0;
    int64_t now = nowNs();
    if (!was) {
        // As on Linux, the idle time counts from when keepalive is switched on.
        lastRxNs_ = now;
        kaUnanswered_ = 0;
    }
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
        *on = kaOn_;
    if (idleSec)
        *idleSec = kaIdle_;
    if (intervalSec)
        *intervalSec = kaInterval_;
    if (count)
        *count = kaCount_;
}

int64_t Connection::keepaliveLocked(int64_t now)
{
    if (state_ == State::Connecting || state_ == State::Accepting)
        return error_ ? 0 : connectDeadlineNs_;
    if (state_ != State::Connected || error_ || closed_ || closing_ || !kaOn_)
        return 0;
    if (kaUnanswered_ == 0) {
        int64_t due = lastRxNs_ + int64_t(kaIdle_) * kSec;
        if (now < due)
            return due;
    } else {
        int64_t due = lastProbeNs_ + int64_t(kaInterval_) * kSec;
        if (now < due)
            return due;
        if (kaUnanswered_ >= uint32_t(kaCount_)) {
            failLocked(-ETIMEDOUT, "keepalive: the peer stopped answering");
            return 0;
        }
    }
    // A probe that cannot be queued (no credit, no queue entry: the peer returns none) counts
    // as unanswered all the same, as TCP counts probes into a zero window.
    sendWordLocked(wire::encodeCtrl(wire::Ctrl::Keepalive));
    kaUnanswered_++;
    kaSent_++;
    lastProbeNs_ = now;
    return now + int64_t(kaInterval_) * kSec;
}

int64_t Connection::timerTick(int64_t now, bool *watch)
{
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock())
        return now + 1000000; // the application is in a call: look again shortly
    progressLocked();
    int64_t next = keepaliveLocked(now);
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
    progressLocked();
    // Resets the wait set's signal when nothing is pending, or the fd would stay readable and
    // bring the connection back every round. Sleepers were woken by progressLocked() already.
    (void)armLocked();
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
