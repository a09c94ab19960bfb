// SPDX-License-Identifier: MIT
// The data path of a stream connection: its life from creation to close, and what it reports.
//
// Each connection owns one MSG endpoint, a CQ and an EQ that share one wait set (so one fd tells
// about data, space, connection and disconnection), and one memory block: the send ring, the
// receive ring the peer writes into, and small words for iWarp payloads and control sends. Only
// the receive ring is registered for remote access, under a key of its own.
//
// send() copies into the send ring and posts RMA writes with immediate data into the peer's
// receive ring as far as the peer's credits allow; recv() copies out of the receive ring and
// returns space to the peer in batches. Copies run outside the connection's state lock, so one
// thread can send while another receives. See credits.h for flow control and wire.h for the
// format of the words. The connection's concerns live in files of their own: endpoint.cpp,
// handshake.cpp, tx.cpp, rx.cpp, growth.cpp, window.cpp, wait.cpp and keepalive.cpp.

#include "connection.h"
#include "connection_detail.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sys/mman.h>

#include <rdma/fi_cm.h>

#include "clock.h"
#include "kernel.h"
#include "log.h"
#include "progress.h"

namespace rstream {

Connection::Connection(const Settings &settings) : settings_(settings)
{
    live_.fetch_add(1, std::memory_order_relaxed);
}

Connection::~Connection()
{
    live_.fetch_sub(1, std::memory_order_relaxed);
    bool known;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        // A same-host connection may have timers (the setup's deadline, the cork's) with no fd.
        known = watched_ || waitFd_ >= 0 || shOn_.load(std::memory_order_relaxed);
        watched_ = false;
    }
    // Lists, timers and the passive set of the progress thread may all name this connection.
    if (known)
        ProgressThread::instance().forget(this, waitFd_);
    if (ep_ && !closed_ &&
        (state_ == State::Connected || state_ == State::Accepting || state_ == State::Connecting))
        fi_shutdown(ep_, 0);
    freeEndpoint();
}

void Connection::freeEndpoint()
{
    // The endpoint first: no write of the peer's lands in a window or ring once it is gone.
    ep_.reset();
    for (const LocalWindow &w : windows_.local())
        if (w.mr)
            fi_close(&w.mr->fid);
    nextMr_.reset();
    remoteMr_.reset();
    localMr_.reset();
    cq_.reset();
    eq_.reset();
    waitSet_.reset();
    if (ownWaitFd_ >= 0)
        sys::close(ownWaitFd_);
    ownWaitFd_ = -1;
    if (info_)
        fi_freeinfo(info_);
    info_ = nullptr;
    txOps_.reset();
    delete[] rxSlots_;
    rxSlots_ = nullptr;
    rxCount_ = 0;
    if (mem_)
        munmap(mem_, memSize_);
    mem_ = nullptr;
    memSize_ = 0;
}

int Connection::bind(const sockaddr *addr, socklen_t len)
{
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ != State::Idle)
        return -EINVAL;
    if (!addr || len > sizeof(bindAddr_) ||
        (addr->sa_family != AF_INET && addr->sa_family != AF_INET6))
        return -EINVAL;
    std::memcpy(&bindAddr_, addr, len);
    bindLen_ = len;
    return 0;
}

void Connection::failLocked(int err, const char *why)
{
    rxEvents_.fetch_add(1, std::memory_order_relaxed);
    txEvents_.fetch_add(1, std::memory_order_relaxed);
    changed_ = true;
    if (error_)
        return;
    error_ = err;
    RS_LOG(Debug, "connection %p failed: %s (%s)", static_cast<void *>(this), why, strerror(-err));
    if (state_ == State::Connecting || state_ == State::Idle)
        state_ = State::Closed;
    if (ep_ && !closed_) {
        fi_shutdown(ep_, 0);
        closed_ = true;
    }
}

int Connection::shutdown(int how)
{
    if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR)
        return -EINVAL;
    std::lock_guard<std::mutex> lock(mutex_);
    if (shOn_.load(std::memory_order_relaxed))
        return shShutdownLocked(how);
    progressLocked();
    // An accepted connection still finishing its handshake is connected for the application;
    // what it asks for is done once the handshake completes.
    if (state_ != State::Connected && state_ != State::Accepting)
        return -ENOTCONN;
    if (how == SHUT_RD || how == SHUT_RDWR) {
        shutRd_ = true;
        changed_ = true;
    }
    if (how == SHUT_WR || how == SHUT_RDWR) {
        shutWr_ = true;
        changed_ = true;
        flushLocked(true);
        watch();
    }
    wakeSleepersLocked();
    return 0;
}

void Connection::close(std::unique_ptr<Connection> conn)
{
    if (!conn)
        return;
    {
        std::unique_lock<std::mutex> lock(conn->mutex_);
        if (conn->shOn_.load(std::memory_order_relaxed)) {
            // The bytes sent are in the peer's memory already: nothing to deliver later.
            conn->shCloseLocked(false);
            return;
        }
        // The application may free its windows once it has closed the socket, and the
        // connection lives on to deliver what was sent: the peer answers their withdrawal.
        conn->releaseWindowsLocked(lock);
        conn->progressLocked();
        if ((conn->state_ != State::Connected && conn->state_ != State::Accepting) ||
            conn->error_ || conn->closed_)
            return;
        if (conn->readableLocked() > 0 && !conn->shutRd_) {
            // Unread data at close: the kernel resets the connection, and so do we.
            conn->sendWordLocked(wire::encodeCtrl(wire::Ctrl::Reset));
            conn->processCqLocked();
            return;
        }
        conn->closing_ = true;
        conn->shutRd_ = true;
        conn->closeDeadlineNs_ = nowNs() + 30 * int64_t(1000000000);
        conn->flushLocked(true);
        conn->processCqLocked();
        if (conn->watched_) {
            // The progress thread knows it already; adopt() below takes it over.
            conn->watched_ = false;
            ProgressThread::instance().unwatch(conn.get());
        }
        conn->watched_ = true;
    }
    ProgressThread::instance().adopt(std::move(conn));
}

void Connection::abort(std::unique_ptr<Connection> conn)
{
    if (!conn)
        return;
    // The windows' regions are closed by the destructor, after the endpoint: no write lands in
    // them once this returns.
    std::lock_guard<std::mutex> lock(conn->mutex_);
    if (conn->shOn_.load(std::memory_order_relaxed)) {
        conn->shCloseLocked(true);
        return;
    }
    if (conn->state_ == State::Connected && !conn->error_ && !conn->closed_) {
        conn->sendWordLocked(wire::encodeCtrl(wire::Ctrl::Reset));
        conn->processCqLocked();
    }
}

Connection::Info Connection::info()
{
    std::lock_guard<std::mutex> lock(mutex_);
    progressLocked();
    Info i;
    i.connecting = state_ == State::Connecting || state_ == State::Accepting;
    i.connected = state_ == State::Connected && !error_ && !peerGone_;
    i.peerShutWr = peerShutWr_;
    i.shutWr = shutWr_ || closing_;
    i.error = error_;
    i.rttUs = rttUs_;
    i.bytesSent = bytesSent_.load(std::memory_order_relaxed);
    i.bytesReceived = bytesReceived_.load(std::memory_order_relaxed);
    i.sendBuf = static_cast<uint32_t>(tx_.size);
    i.recvBuf = static_cast<uint32_t>(rx_.size);
    i.sendGrowths = growth_.sendGrowths();
    i.recvGrowths = growth_.recvGrowths();
    i.unackedBytes = static_cast<uint32_t>(tx_.unsent() + tx_.inFlight());
    i.probes = ka_.unanswered();
    i.probesSent = ka_.sent();
    if (shOn_.load(std::memory_order_relaxed))
        shInfoLocked(&i);
    return i;
}

bool Connection::flowState(FlowState *out)
{
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock())
        return false;
    if (shOn_.load(std::memory_order_relaxed)) {
        out->state = static_cast<int>(state_);
        out->error = error_;
        out->shutWr = shutWr_;
        out->rttUs = rttUs_;
        shFlowLocked(out);
        return true;
    }
    out->state = static_cast<int>(state_);
    out->error = error_;
    out->shutWr = shutWr_ || closing_;
    out->peerShutWr = peerShutWr_;
    out->rttUs = rttUs_;
    out->sendQueued = tx_.unsent() + tx_.inFlight();
    out->recvQueued = readableLocked();
    out->peerCreditBytes = peer_.ringAvail();
    out->peerCreditSlots = peer_.slots();
    out->owedBytes = local_.ringDue();
    out->owedSlots = local_.slotsDue();
    out->sendBuf = static_cast<uint32_t>(tx_.size);
    out->recvBuf = static_cast<uint32_t>(rx_.size);
    out->ringResident = ringResidentLocked();
    return true;
}

std::string Connection::debugState()
{
    std::lock_guard<std::mutex> lock(mutex_);
    if (shOn_.load(std::memory_order_relaxed))
        return "state=" + std::to_string(static_cast<int>(state_)) +
               " err=" + std::to_string(error_) + " sleepers=" + std::to_string(sleepers_.size()) +
               " " + sh_->debugState();
    char buf[512];
    std::snprintf(
        buf, sizeof(buf),
        "state=%d err=%d rx(w=%llu c=%llu pad=%llu@%llu) tx(tail=%llu posted=%llu done=%llu) "
        "ops=%llu/%llu inflight=%llu inject=%d watched=%d sleepers=%zu peerShutWr=%d "
        "closing=%d closed=%d rings(tx=%llu rx=%llu old=%llu peer=%llu grow=%d/%llu)",
        static_cast<int>(state_), error_, (unsigned long long)rx_.written,
        (unsigned long long)rx_.consumed, (unsigned long long)rx_.padLen,
        (unsigned long long)rx_.padAt, (unsigned long long)tx_.tail, (unsigned long long)tx_.posted,
        (unsigned long long)tx_.done, (unsigned long long)txOps_.head(),
        (unsigned long long)txOps_.next(), (unsigned long long)txOps_.writesInFlight(),
        int(txOps_.injectPending()), int(watched_), sleepers_.size(), int(peerShutWr_),
        int(closing_), int(closed_), (unsigned long long)tx_.size, (unsigned long long)rx_.size,
        (unsigned long long)rxOld_.readable(), (unsigned long long)peer_.ringSize(),
        int(growth_.growSent()), (unsigned long long)growth_.switchTo());
    return buf;
}

int Connection::localAddress(sockaddr_storage *addr, socklen_t *len) const
{
    auto *self = const_cast<Connection *>(this);
    std::lock_guard<std::mutex> lock(self->mutex_);
    if (localLen_ == 0 && ep_) {
        size_t l = sizeof(localAddr_);
        if (fi_getname(&ep_->fid, &self->localAddr_, &l) == 0)
            self->localLen_ = static_cast<socklen_t>(l);
    }
    if (localLen_ == 0) {
        if (bindLen_) {
            std::memcpy(addr, &bindAddr_, bindLen_);
            *len = bindLen_;
            return 0;
        }
        return -ENOTCONN;
    }
    std::memcpy(addr, &localAddr_, localLen_);
    *len = localLen_;
    return 0;
}

int Connection::peerAddress(sockaddr_storage *addr, socklen_t *len) const
{
    auto *self = const_cast<Connection *>(this);
    std::lock_guard<std::mutex> lock(self->mutex_);
    if (state_ != State::Connected && state_ != State::Accepting)
        return -ENOTCONN;
    std::memcpy(addr, &peerAddr_, peerLen_);
    *len = peerLen_;
    return 0;
}

void Connection::allowAfterClose(uint64_t bytes)
{
    std::lock_guard<std::mutex> lock(mutex_);
    closeAllowance_ = bytes;
}

} // namespace rstream
