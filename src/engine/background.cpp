// SPDX-License-Identifier: MIT
// The progress thread's view of a connection: what needs it, and its rounds over one.

#include "connection.h"
#include "connection_detail.h"

#include <rdma/fi_cm.h>

#include "clock.h"
#include "progress.h"

namespace rstream {

bool Connection::needsBackgroundLocked() const
{
    // The accepting side must answer the peer even before the application looks at it, and
    // a connect completes in the background as the kernel's does.
    if ((state_ == State::Accepting || state_ == State::Connecting) && !error_)
        return true;
    if (error_ || closed_ || state_ != State::Connected)
        return closing_ && !closed_;
    // Data held for the cork waits for its timer, not for the progress thread's rounds.
    return (tx_.unsent() > 0 && !corkHeld_) || tx_.inFlight() > 0 || !txOps_.empty() ||
           local_.due() || txOps_.injectPending() || (shutWr_ && !shutWrSent_) || closing_ ||
           kaAckOwed_ || unmappedOwed_ || !windows_.recordsEmpty();
}

bool Connection::onlyLeftSendsPendingLocked() const
{
    // Injects, and writes whose sends the kernel took whole (their completions are queued for
    // the next pass), left the provider: nothing is held back that a pass would have to push.
    const bool sentWhole = txOps_.head() >= untakenNext_;
    return (txOps_.injectPending() || !txOps_.empty()) && sentWhole && tx_.unsent() == 0 &&
           state_ == State::Connected && !error_ && !closing_ && !local_.due() && !kaAckOwed_ &&
           !unmappedOwed_ && !(shutWr_ && !shutWrSent_) && windows_.recordsEmpty();
}

bool Connection::waitsForPeerLocked() const
{
    return state_ == State::Connected && !error_ && !closed_ && !closing_ && tx_.unsent() > 0 &&
           !peer_.canSendData() && tx_.inFlight() == 0 && txOps_.empty() &&
           !txOps_.injectPending() && !local_.due() && !kaAckOwed_ && !unmappedOwed_ &&
           windows_.recordsEmpty() && !(shutWr_ && !shutWrSent_);
}

void Connection::watch()
{
    if (!watched_ && needsBackgroundLocked()) {
        watched_ = true;
        // Sends the kernel took whole leave the thread nothing to do before the application
        // has been quiet for kInjectIdleNs (backgroundProgress()).
        const int64_t noneBefore =
            !closing_ && onlyLeftSendsPendingLocked()
                ? appProgressNs_.load(std::memory_order_relaxed) + kInjectIdleNs
                : 0;
        ProgressThread::instance().watch(this, noneBefore);
    }
}

int Connection::backgroundProgress(bool *closedDone, int64_t *recheckNs)
{
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock())
        return kProgressBusy;
    if (shOn_.load(std::memory_order_relaxed) && state_ != State::Accepting) {
        // Nothing of a same-host connection needs the thread once its setup is done.
        watched_ = false;
        return kProgressDone;
    }
    if (!closing_ && !needsBackgroundLocked()) {
        // The application's own calls took what it left pending (a reply's completion, reaped
        // by the pass that took the next request): unwatched, without a look of this thread's.
        // Kept watched while the application was recent, a server answering a request a
        // millisecond had the thread wake each millisecond for as long as it ran; looked at
        // once it was not, nginx with 200 clients had it make a pass and an fi_trywait (five
        // system calls) for most of its requests.
        watched_ = false;
        return kProgressDone;
    }
    const int64_t idleNs = onlyLeftSendsPendingLocked() ? kInjectIdleNs : kAppIdleNs;
    const int64_t quietAtNs = appProgressNs_.load(std::memory_order_relaxed) + idleNs;
    if (nowNs() < quietAtNs && !closing_) {
        // Nothing to do before the application can have gone quiet. Looking every millisecond
        // until then only finds it still recent: a server answering a request a millisecond
        // paid a wake-up of this thread per request for nothing.
        *recheckNs = quietAtNs;
        return kProgressLater;
    }
    progressLocked(false);
    flushLocked(true);
    if (txOps_.injectPending() && txOps_.empty() && state_ == State::Connected && !error_ &&
        !closed_) {
        // The application has gone quiet after injected writes: a KEEPALIVE's completion tells
        // when the provider has handed them over; until then the fd is watched for them.
        sendWordLocked(wire::encodeCtrl(wire::Ctrl::Keepalive));
    }
    if (unverified_) {
        // The signal is quiet (quiet_signal.cpp): what this round sent reported its end in the
        // call (or the pass registers its POLLOUT), and no signal would wake this thread for it.
        processCqLocked();
        wakeSleepersLocked();
    }
    if (closing_) {
        bool delivered = tx_.unsent() == 0 && disconnectSent_ && txOps_.empty();
        if (delivered)
            delivered_.store(true, std::memory_order_release);
        // After DISCONNECT is delivered the endpoint lingers until the peer acknowledges it by
        // shutting its own endpoint down, so credit returns still in flight find a reader
        // instead of a reset that could cost the peer the DISCONNECT itself.
        bool acked = peerGone_ || peerClosed_;
        if ((delivered && acked) || error_ || closed_ || nowNs() >= closeDeadlineNs_) {
            if (!closed_ && ep_) {
                fi_shutdown(ep_, 0);
                closed_ = true;
            }
            *closedDone = true;
            watched_ = false;
            return kProgressDone;
        }
        return kProgressMore;
    }
    if (needsBackgroundLocked()) {
        // A thread asleep in waitFor() wakes on the wait fd itself; the timer is only a bound.
        if (appSleeping_.load(std::memory_order_relaxed) > 0)
            return kProgressBusy;
        // Only the peer's credit can move what is left, and nothing is in flight that the
        // provider might need pushing: sleep until a word arrives (a peer that withholds
        // credit must not keep the thread polling, for this and every other connection).
        if (waitsForPeerLocked() && rearmLocked() == 0)
            return kProgressIdle;
        return kProgressMore;
    }
    watched_ = false;
    (void)rearmLocked(); // resets the wait fd's signal: the passive set need not look at it
    return kProgressDone;
}

} // namespace rstream
