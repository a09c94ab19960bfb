// SPDX-License-Identifier: MIT
// A connection whose bytes move over a same-host link (samehost.h): its data path, readiness,
// waiting, shutdown and close. The fabric endpoint only carried the setup: once the link is up
// nothing is progressed on it, and it is closed with the connection (a link the preload shim
// set up over its kernel TCP connection has none: adoptSameHost).

#include "connection.h"
#include "connection_detail.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <poll.h>

#include <rdma/fi_cm.h>

#include "clock.h"
#include "kernel.h"
#include "log.h"
#include "progress.h"
#include "samehost_setup.h"
#include "signals_held.h"

namespace rstream {

int Connection::shCollectLocked(const wire::Hello &peer)
{
    if (!shToken_ || peer.token != shToken_)
        return 1; // no offer taken: the fabric carries the connection
    // The region was sent before the peer answered, so it is in the inbox already; the wait only
    // covers a sender descheduled between its two calls.
    int r = collectSameHost(shToken_, 1000, &sh_);
    if (r < 0) {
        RS_LOG(Warn, "same-host: the peer's link did not arrive (%s)", strerror(-r));
        return r;
    }
    shOn_.store(true, std::memory_order_release);
    return 0;
}

int Connection::adoptSameHost(std::unique_ptr<SameHostLink> link, const sockaddr *local,
                              socklen_t llen, const sockaddr *peer, socklen_t plen)
{
    if (!link || llen > sizeof(localAddr_) || plen > sizeof(peerAddr_))
        return -EINVAL;
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ != State::Idle || ep_)
        return -EISCONN;
    std::memcpy(&localAddr_, local, llen);
    localLen_ = llen;
    std::memcpy(&peerAddr_, peer, plen);
    peerLen_ = plen;
    sh_ = std::move(link);
    shOn_.store(true, std::memory_order_release);
    state_ = State::Connected;
    txEvents_.fetch_add(1, std::memory_order_relaxed);
    shConnectedLocked();
    return 0;
}

void Connection::shConnectedLocked()
{
    // Nothing the fabric endpoint reports matters any more (the link's pipe tells when the peer
    // goes), so it is not progressed, armed, or watched.
    armed_.store(false, std::memory_order_relaxed);
    shFd_.store(sh_->fd(), std::memory_order_release);
    // The send ring grows with use as far as the settings let a ring grow, unless its size was
    // set (SO_SNDBUF: sendBufMax is then sendBuf).
    sh_->allowGrowth(settings_.sendBufMax > settings_.sendBuf ? settings_.sendBufMax : 0);
    sh_->allowRebase(settings_.ringRewind);
    changed_ = true;
    wakeSleepersLocked();
    if (userTimeoutNs_) // set before the connection was (shTimerLocked())
        ProgressThread::instance().schedule(this, nowNs());
}

void Connection::shReleaseFabricLocked()
{
    // Called from the application's calls only, never inside a fabric path (those may run on
    // to use the endpoint after the switch): the endpoint, its queues, registrations and rings
    // go, and an idle same-host connection keeps only its link.
    if (!ep_ || state_ != State::Connected)
        return;
    fi_shutdown(ep_, 0);
    freeEndpoint();
    waitFd_ = -1; // closed with its queues: nothing may poll or forget it any more
    armed_.store(false, std::memory_order_relaxed);
    sendBase_ = recvArea_ = recvBase_ = slotBufs_ = recordBufs_ = rxOldBase_ = nullptr;
    ctrlWords_ = nullptr;
    localDesc_ = nullptr;
}

ssize_t Connection::shRecvStateLocked()
{
    if (error_)
        return error_;
    if (state_ == State::Idle || state_ == State::Closed)
        return -ENOTCONN;
    ssize_t r = sh_->recvState();
    if (r == -EAGAIN && shShutRd_.load(std::memory_order_relaxed))
        return 0;
    return r;
}

ssize_t Connection::shNoticeLocked(ssize_t state)
{
    // A program that reads without ever sleeping still learns of a peer that went (a poller's
    // looks do not read: its arm before sleeping does).
    if (state == -EAGAIN && sh_->notice(nowNs())) {
        changed_ = true;
        wakeSleepersLocked();
        state = shRecvStateLocked();
    }
    return state;
}

void Connection::shPeekLocked(ssize_t *recv, ssize_t *send)
{
    shReleaseFabricLocked();
    uint64_t rx = 0, tx = 0;
    if (sh_->observe(&rx, &tx) && shArmed_.exchange(false, std::memory_order_relaxed))
        notifyWatchesLocked(); // a parked poller's entry is no longer armed
    if (rx)
        rxEvents_.fetch_add(rx, std::memory_order_relaxed);
    if (tx)
        txEvents_.fetch_add(tx, std::memory_order_relaxed);
    *recv = shRecvStateLocked();
    *send = error_ ? error_ : sh_->sendState();
    if (*send > 0 && shutWr_)
        *send = -EPIPE;
}

int Connection::shReadyLocked(int events)
{
    if (state_ == State::Accepting || state_ == State::Connecting)
        progressLocked(); // the fabric's answer, until it comes
    ssize_t r, s;
    shPeekLocked(&r, &s);
    int ready = 0;
    if ((events & kReadable) && r != -EAGAIN)
        ready |= kReadable;
    // Writable as poll reports it (a third of the ring free): a blocking send that filled the
    // ring goes on when the kernel's would, not for each small read of the peer's.
    if ((events & kWritable) && (s < 0 || uint64_t(s) >= sh_->writableRoom()))
        ready |= kWritable;
    if ((events & kSendDrained) && (sh_->unreadByPeer() == 0 || s < 0))
        ready |= kSendDrained;
    // Windows need the fabric: nothing to wait for.
    ready |= events & (kWindowWritable | kWithdrawn);
    return ready;
}

int Connection::shArmLocked(bool fdSeen)
{
    if (state_ == State::Accepting)
        return armLocked(); // pollers sleep on the fabric's fd until it answers
    shReleaseFabricLocked();
    bool drained = false;
    const ssize_t space = sh_->sendState();
    // Woken for room only while poll would not report POLLOUT (a third of the ring free).
    const uint64_t room = sh_->writableRoom();
    const uint64_t want = space >= 0 && uint64_t(space) < room ? room : 0;
    // A poller that has not seen the link's fd readable since its last arm (epoll parking a
    // member it did not see woken) reads it only for a wake-up the peer owes.
    using Drain = SameHostLink::Drain;
    const int r = sh_->arm(true, want, &drained, fdSeen ? Drain::Always : Drain::IfOwed);
    if (shArmed_.exchange(r == 0, std::memory_order_relaxed) && r != 0)
        notifyWatchesLocked();
    if (drained) {
        // The bytes read may have been another sleeper's wake-up.
        changed_ = true;
        wakeSleepersLocked();
    }
    return r;
}

int Connection::shWaitFor(int events, int64_t deadlineNs)
{
    int64_t missNs = 0, spinEnd = 0;
    SignalsHeld held; // from the first look that finds nothing (signals_held.h)
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t capNs =
        spinCapNs(events, settings_.pollUs, &roomRate_, bytesSent(), sh_->unreadByPeer());
    for (;;) {
        const int ready = shReadyLocked(events);
        if (ready) {
            if (missNs)
                spin_.record(nowNs() - missNs, capNs, spinEnd - missNs);
            return ready;
        }
        // The spin's looks read the peer's words in shared memory: no system call.
        int64_t now = 0;
        const WaitStep step = spinStepLocked(lock, deadlineNs, capNs, &missNs, &spinEnd, &now);
        if (step == WaitStep::TimedOut)
            return 0;
        held.hold();
        if (step == WaitStep::Again)
            continue;
        // Until the fabric's answer (the accepting end), its fd is slept on too.
        const bool fabric = state_ == State::Accepting || state_ == State::Connecting;
        int r;
        if (fabric) {
            r = armLocked();
        } else {
            bool drained = false;
            // Drained: all of the ring is room again.
            const uint64_t room = (events & kSendDrained) ? sh_->sendRing()
                                  : (events & kWritable)  ? sh_->writableRoom()
                                                          : 0;
            // A wait to read only sleeps through the peer's reads of what this end sent (a
            // server that answered a request would look again when its client took the
            // answer: a second read of the pipe per request).
            r = sh_->arm(events & (kReadable | kSendDrained), room, &drained,
                         SameHostLink::Drain::Always, (events & (kWritable | kSendDrained)) != 0);
            if (drained) {
                changed_ = true;
                wakeSleepersLocked();
            }
        }
        if (r == -EAGAIN)
            continue;
        int64_t until = deadlineNs;
        if (fabric && (!until || connectDeadlineNs_ < until))
            until = connectDeadlineNs_;
        pollfd pfd[3] = {{sh_->fd(), POLLIN, 0}, {waitFd_, POLLIN, 0}, {}};
        if ((r = sleepLocked(lock, pfd, fabric ? 2 : 1, until, now, held)) < 0)
            return r;
    }
}

ssize_t Connection::shSendv(const iovec *iov, int iovcnt, int flags, int64_t deadlineNs)
{
    const size_t total = iovTotal(iov, iovcnt);
    size_t sent = 0;
    for (;;) {
        ssize_t space;
        bool hold;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (state_ == State::Accepting)
                progressLocked();
            shReleaseFabricLocked();
            space = error_ ? error_ : sh_->sendState();
            if (space > 0 && shutWr_)
                space = -EPIPE;
            // TCP_CORK and MSG_MORE hold partial frames back, up to kCorkMaxNs.
            hold = (cork_ || (flags & kMore)) &&
                   !(corkSinceNs_ && nowNs() - corkSinceNs_ >= kCorkMaxNs);
        }
        if (space < 0)
            return sent ? static_cast<ssize_t>(sent) : space;
        if (total == 0)
            return 0;
        // A full ring that may still grow does so at this write (SameHostLink::write()).
        if (space > 0 || (space == 0 && sh_->canGrow())) {
            const size_t n = sh_->write(iov, iovcnt, sent, total - sent, hold);
            sent += n;
            bytesSent_.fetch_add(n, std::memory_order_relaxed);
            {
                std::lock_guard<std::mutex> lock(mutex_);
                if (!ringTimerArmed_ && settings_.ringIdleMs > 0) {
                    // The send ring gives its pages back once the connection is idle.
                    ringTimerArmed_ = true;
                    ringStamp_ = bytesMovedLocked();
                    ringDueNs_ = ringDueAfter(nowNs(), settings_.ringIdleMs);
                    ProgressThread::instance().schedule(this, ringDueNs_);
                }
                if (!sh_->held()) {
                    corkSinceNs_ = 0;
                } else if (!corkSinceNs_) {
                    // The progress thread sends what is still held when its time is up.
                    corkSinceNs_ = nowNs();
                    ProgressThread::instance().schedule(this, corkSinceNs_ + kCorkMaxNs);
                }
            }
            if (sent == total)
                return static_cast<ssize_t>(sent);
            if (n)
                continue;
        }
        if (flags & kNonBlock)
            return sent ? static_cast<ssize_t>(sent) : -EAGAIN;
        const int r = shWaitFor(kWritable, deadlineNs);
        if (r < 0 || r == 0)
            return sent ? static_cast<ssize_t>(sent) : (r < 0 ? r : -EAGAIN);
    }
}

ssize_t Connection::shRecvv(const iovec *iov, int iovcnt, int flags, int64_t deadlineNs)
{
    const size_t total = iovTotal(iov, iovcnt);
    const bool peek = flags & kPeek;
    size_t copied = 0;
    for (;;) {
        ssize_t state;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (state_ == State::Accepting)
                progressLocked();
            shReleaseFabricLocked();
            state = shRecvStateLocked();
            // A read that would sleep learns of a peer that went from its sleep (the pipe ends);
            // one that does not sleep asks now and then (a blocking server that found nothing
            // read the pipe for nothing about once a millisecond: every other request at 1,000
            // a second).
            if (flags & kNonBlock)
                state = shNoticeLocked(state);
        }
        if (state > 0 && total > 0) {
            // MSG_PEEK with MSG_WAITALL waits until the whole length can be peeked.
            if (!(peek && (flags & kWaitAll) && uint64_t(state) < total)) {
                const size_t n = sh_->read(iov, iovcnt, copied, total - copied, peek);
                if (peek)
                    return static_cast<ssize_t>(n);
                copied += n;
                bytesReceived_.fetch_add(n, std::memory_order_relaxed);
                if (copied == total || (n && !(flags & kWaitAll)))
                    return static_cast<ssize_t>(copied);
                if (n)
                    continue;
            }
            state = -EAGAIN;
        }
        if (total == 0)
            return state < 0 && state != -EAGAIN ? state : 0;
        if (state != -EAGAIN)
            return copied ? static_cast<ssize_t>(copied) : state;
        if ((flags & kNonBlock) || (copied && !(flags & kWaitAll)))
            return copied ? static_cast<ssize_t>(copied) : -EAGAIN;
        const int r = shWaitFor(kReadable, deadlineNs);
        if (r < 0 || r == 0)
            return copied ? static_cast<ssize_t>(copied) : (r < 0 ? r : -EAGAIN);
    }
}

int Connection::shShutdownLocked(int how)
{
    if (state_ != State::Connected && state_ != State::Accepting)
        return -ENOTCONN;
    if (how == SHUT_RD || how == SHUT_RDWR) {
        shutRd_ = true;
        shShutRd_.store(true, std::memory_order_relaxed);
    }
    if ((how == SHUT_WR || how == SHUT_RDWR) && !shutWr_) {
        shutWr_ = true;
        sh_->shutWr();
    }
    changed_ = true;
    wakeSleepersLocked();
    return 0;
}

void Connection::shCloseLocked(bool abortive)
{
    if ((state_ == State::Connected || state_ == State::Accepting) && !error_) {
        // Unread data at close resets the connection, as the kernel does.
        if (abortive || (sh_->readable() > 0 && !shutRd_))
            sh_->reset();
        else
            sh_->shutWr(true);
    }
    // The link's fds stay until it is freed (another thread may still be waking the peer): the
    // flags above tell the peer, and a fork child holds no copy of them (forgetAfterFork()).
}

int64_t Connection::shTimerLocked(int64_t now)
{
    int64_t next = 0;
    if (userTimeoutNs_ && state_ == State::Connected && !error_) {
        // TCP_USER_TIMEOUT as over the fabric (userTimeoutLocked()): bytes the peer could read
        // (not the cork's) left unread that long, with no read of its in between, fail the
        // connection (ETIMEDOUT here, a reset for the peer). stallEvents_ holds the peer's read
        // count here: a connection on the link never goes back to the fabric.
        const uint64_t head = sh_->peerReadCount();
        const bool waiting = sh_->unreadByPeer() > sh_->held();
        if (!waiting || head != stallEvents_ || !stallSinceNs_) {
            stallSinceNs_ = waiting ? now : 0;
            stallEvents_ = head;
        } else if (now - stallSinceNs_ >= userTimeoutNs_) {
            failLocked(-ETIMEDOUT,
                       "TCP_USER_TIMEOUT: the same-host peer read nothing for that long");
            sh_->reset();
            wakeSleepersLocked();
            return 0;
        }
        next = now + std::clamp<int64_t>(userTimeoutNs_ / 4, 10000000, 1000000000);
    }
    if (sh_->held() && corkSinceNs_) {
        if (now >= corkSinceNs_ + kCorkMaxNs) {
            sh_->flush();
            corkSinceNs_ = 0;
        } else if (!next || corkSinceNs_ + kCorkMaxNs < next) {
            next = corkSinceNs_ + kCorkMaxNs;
        }
    }
    if (ringTimerArmed_) {
        int64_t due = ringDueNs_;
        if (now >= due) {
            const uint64_t moved = bytesMovedLocked();
            std::unique_lock<std::mutex> send(sendMutex_, std::try_to_lock);
            if (moved != ringStamp_ || !send.owns_lock()) {
                ringStamp_ = moved; // busy: look again after a quiet interval
                due = ringDueNs_ = ringDueAfter(now, settings_.ringIdleMs);
            } else {
                if (sh_->releaseIdleRing())
                    ringReleases_.fetch_add(1, std::memory_order_relaxed);
                ringTimerArmed_ = false; // the next send arms it again
                due = 0;
            }
        }
        if (due && (!next || due < next))
            next = due;
    }
    return next;
}

void Connection::shInfoLocked(Info *i)
{
    ssize_t r, s;
    shPeekLocked(&r, &s);
    i->connected = state_ == State::Connected && r != -ECONNRESET && s != -ECONNRESET;
    i->peerShutWr = r == 0 && !shutRd_;
    i->error = error_ ? error_ : sh_->error();
    i->sendBuf = static_cast<uint32_t>(sh_->sendRing());
    i->recvBuf = static_cast<uint32_t>(sh_->recvRing());
    i->unackedBytes = static_cast<uint32_t>(std::min<uint64_t>(sh_->unreadByPeer(), UINT32_MAX));
}

void Connection::shFlowLocked(FlowState *out)
{
    out->sendQueued = sh_->unreadByPeer();
    out->recvQueued = sh_->readable();
    out->peerCreditBytes = sh_->sendRing() - std::min(sh_->sendRing(), out->sendQueued);
    out->peerCreditSlots = 0;
    out->owedBytes = 0;
    out->owedSlots = 0;
    out->sendBuf = static_cast<uint32_t>(sh_->sendRing());
    out->recvBuf = static_cast<uint32_t>(sh_->recvRing());
    out->ringResident = sh_->residentBytes();
}

} // namespace rstream
