// SPDX-License-Identifier: MIT
// A connection's handshake: connect, accept, the hellos, and the events of the EQ.

#include "connection.h"
#include "connection_detail.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

#include <rdma/fi_cm.h>

#include "clock.h"
#include "log.h"
#include "progress.h"
#include "samehost_setup.h"
#include "upgrade_wire.h"

namespace rstream {

wire::Hello Connection::localHello() const
{
    wire::Hello h;
    if (iwarp_)
        h.flags |= wire::kFlagIwarp;
    if (domain_->caps().virtAddr) {
        h.flags |= wire::kFlagVirtAddr;
        h.ringAddr = reinterpret_cast<uintptr_t>(recvArea_);
    }
    h.ringKey = fi_mr_key(remoteMr_);
    h.ringSize = static_cast<uint32_t>(rx_.size);
    h.rxSlots = rxCount_;
    h.flags |= wire::kFlagGrow; // this end follows a peer's GROW
    if (settings_.ringRewind)
        h.flags |= wire::kFlagRewind;
    if (settings_.upgrade) {
        h.flags |= wire::kFlagUpgrade;
        h.process = processNonce();
    }
    h.ioMapSize = settings_.ioMapSize;
    return h;
}

int Connection::applyPeerHello(const wire::Hello &peer)
{
    bool virt = domain_->caps().virtAddr;
    if (bool(peer.flags & wire::kFlagVirtAddr) != virt)
        return -EPROTO;
    peerRingAddr_ = peer.ringAddr;
    peerKey_ = peer.ringKey;
    peer_.init(peer.ringSize, peer.rxSlots, wire::creditShift(peer.ringSize));
    // Only a peer that answers GROW with SWITCH is asked to follow a growing ring.
    if (!(peer.flags & wire::kFlagGrow))
        growth_.disableRecv();
    // Rewinds go only to a peer that takes them, and only from an end that takes them too (one
    // switch for both directions).
    peerRewind_ = settings_.ringRewind && (peer.flags & wire::kFlagRewind);
    local_.init(rx_.size, rxCount_);
    windows_.init(peer.ioMapSize, settings_.ioMapSize);
    return 0;
}

int Connection::connect(const sockaddr *addr, socklen_t len, bool nonblock)
{
    {
        std::lock_guard<std::mutex> lock(mutex_);
        switch (state_) {
        case State::Connecting:
            return -EALREADY;
        case State::Connected:
        case State::Accepting:
            return -EISCONN;
        case State::Closed:
            return error_ ? error_ : -EBADF;
        case State::Idle:
            break;
        }
        if (!addr || (addr->sa_family != AF_INET && addr->sa_family != AF_INET6) ||
            len > sizeof(peerAddr_))
            return -EAFNOSUPPORT;
        int ret = getInfo(settings_, bindLen_ ? reinterpret_cast<sockaddr *>(&bindAddr_) : nullptr,
                          bindLen_, addr, len, &info_);
        if (ret < 0)
            return ret == -EADDRNOTAVAIL ? -ENETUNREACH : ret;
        ret = setup(info_);
        if (ret < 0) {
            state_ = State::Closed;
            error_ = ret;
            return ret;
        }
        std::memcpy(&peerAddr_, addr, len);
        peerLen_ = len;
        size_t cmMax = 0;
        ret = checkCmDataSize(&cmMax);
        if (ret < 0) {
            state_ = State::Closed;
            error_ = ret;
            return ret;
        }
        wire::Hello mine = localHello();
        if (settings_.sameHost && cmMax >= wire::kHelloSameHostSize) {
            offerSameHost(&mine);
            shToken_ = mine.token;
        }
        uint8_t hello[wire::kHelloSameHostSize];
        const size_t helloLen = wire::encodeHello(mine, hello);
        ret = fi_connect(ep_, info_->dest_addr, hello, helloLen);
        if (ret) {
            state_ = State::Closed;
            error_ = fiErr(ret);
            return error_;
        }
        state_ = State::Connecting;
        connectStartNs_ = nowNs();
        connectDeadlineNs_ = connectStartNs_ + int64_t(settings_.connectTimeoutMs) * 1000000;
        watch();
        // The deadline holds even when nobody calls: a nonblocking connect is failed by the
        // progress thread, which wakes the application's pollers.
        ProgressThread::instance().schedule(this, connectDeadlineNs_);
    }
    if (nonblock)
        return -EINPROGRESS;
    for (;;) {
        int r = connectResult();
        if (r != -EINPROGRESS)
            return r;
        r = waitFor(kWritable, 0);
        if (r < 0)
            return r;
    }
}

int Connection::checkCmDataSize(size_t *maxOut)
{
    // The hello travels as CM private data, whose size the provider bounds (verbs: 56 bytes in
    // a connection request); one that does not fit would be truncated or refused by the peer.
    size_t max = 0;
    size_t len = sizeof(max);
    int ret = fi_getopt(&ep_->fid, FI_OPT_ENDPOINT, FI_OPT_CM_DATA_SIZE, &max, &len);
    if (ret) {
        RS_LOG(Debug, "provider does not report its CM data size (%s): trying", fi_strerror(-ret));
        *maxOut = wire::kHelloSize;
        return 0;
    }
    *maxOut = max;
    if (max < wire::kHelloSize) {
        RS_LOG(Error,
               "provider %s carries %zu bytes of connection data, the rstream hello needs %zu",
               domain_->caps().name.c_str(), max, wire::kHelloSize);
        return -EMSGSIZE;
    }
    return 0;
}

int Connection::connectResult()
{
    std::lock_guard<std::mutex> lock(mutex_);
    progressLocked();
    if (error_ && state_ != State::Connected)
        return error_;
    switch (state_) {
    case State::Connected:
        return 0;
    case State::Connecting:
    case State::Accepting:
        return -EINPROGRESS;
    case State::Idle:
        return -ENOTCONN;
    case State::Closed:
        return error_ ? error_ : -ENOTCONN;
    }
    return -EINVAL;
}

void Connection::processEqLocked()
{
    disarmLocked(); // as processCqLocked()
    alignas(fi_eq_cm_entry) uint8_t buf[sizeof(fi_eq_cm_entry) + 256];
    auto &entry = *reinterpret_cast<fi_eq_cm_entry *>(buf);
    for (;;) {
        uint32_t event = 0;
        ssize_t ret = fi_eq_read(eq_, &event, buf, sizeof(buf), 0);
        if (ret == -FI_EAGAIN) {
            eqDue_ = false;
            return;
        }
        if (ret == -FI_EAVAIL) {
            fi_eq_err_entry err{};
            uint8_t errData[64];
            err.err_data = errData;
            err.err_data_size = sizeof(errData);
            if (fi_eq_readerr(eq_, &err, 0) < 0)
                return;
            changed_ = true;
            if (state_ == State::Connecting && err.err == ECONNREFUSED && err.err_data &&
                wire::decodeRefusal(err.err_data, err.err_data_size) == wire::RefusalReason::Defer)
                deferred_.store(true, std::memory_order_release);
            if (state_ == State::Connecting) {
                // What the kernel said about the peer's address carries over, as connect(2)
                // reports it; anything else is a refusal.
                int e = err.err;
                failLocked(e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH ||
                                   e == EHOSTDOWN || e == ENETDOWN
                               ? -e
                               : -ECONNREFUSED,
                           "connect failed");
            } else if (!closed_ && !peerClosed_)
                failLocked(-ECONNRESET, "endpoint error");
            else
                peerGone_ = true;
            continue;
        }
        if (ret < 0) {
            failLocked(fiErr(static_cast<int>(ret)), "fi_eq_read failed");
            return;
        }
        changed_ = true;
        if (event == FI_CONNECTED) {
            if (connectStartNs_ && !rttUs_)
                rttUs_ =
                    static_cast<uint32_t>(std::max<int64_t>(1, (nowNs() - connectStartNs_) / 1000));
            if (state_ == State::Connecting) {
                wire::Hello peer;
                size_t dataLen = size_t(ret) > sizeof(entry) ? ret - sizeof(entry) : 0;
                int r = wire::decodeHello(entry.data, dataLen, &peer);
                if (r == 0) {
                    bool peerIwarp = peer.flags & wire::kFlagIwarp;
                    if (iwarp_ && !peerIwarp)
                        r = -EPROTO;
                    iwarp_ = peerIwarp;
                }
                if (r == 0)
                    r = applyPeerHello(peer);
                if (r < 0) {
                    failLocked(-ECONNREFUSED, "peer's hello rejected");
                    continue;
                }
                if (shCollectLocked(peer) < 0) {
                    failLocked(-ECONNREFUSED, "the same-host link the peer sent did not arrive");
                    continue;
                }
                state_ = State::Connected;
                txEvents_.fetch_add(1, std::memory_order_relaxed);
            } else if (state_ == State::Accepting) {
                state_ = State::Connected;
                txEvents_.fetch_add(1, std::memory_order_relaxed);
            }
            if (localLen_ == 0) {
                size_t l = sizeof(localAddr_);
                if (fi_getname(&ep_->fid, &localAddr_, &l) == 0)
                    localLen_ = static_cast<socklen_t>(l);
            }
            if (state_ == State::Connected && shOn_.load(std::memory_order_relaxed)) {
                shConnectedLocked();
            } else if (state_ == State::Connected && !passive_) {
                quietSignalLocked();
                passive_ = true;
                ProgressThread::instance().addPassive(this, waitFd_);
                // The connect deadline is past use: its tick would only wake the thread (4,000
                // endpoints opened in a few seconds woke it every 10 ms for seconds after).
                ProgressThread::instance().reschedule(this, ringTimerArmed_ ? ringDueNs_ : 0);
                if (ka_.on())
                    ProgressThread::instance().schedule(this, ka_.start(nowNs()));
                if (userTimeoutNs_)
                    ProgressThread::instance().schedule(this, nowNs());
            }
        } else if (event == FI_SHUTDOWN) {
            // Everything the peer sent before it went is already in the CQ.
            processCqLocked();
            peerGone_ = true;
            if (state_ == State::Connecting)
                failLocked(-ECONNREFUSED, "peer shut down while connecting");
            else if (!peerShutWr_)
                RS_LOG(Debug, "peer went away without disconnecting");
        }
    }
}

int Connection::startAccept(fi_info *connreq, const wire::Hello &peer, bool *rejectable)
{
    std::lock_guard<std::mutex> lock(mutex_);
    int ret = acceptLocked(connreq, peer);
    // Once the endpoint exists it owns the request: it can no longer be rejected, only dropped
    // with the endpoint.
    *rejectable = ret < 0 && !ep_;
    return ret;
}

int Connection::acceptLocked(fi_info *connreq, const wire::Hello &peer)
{
    info_ = connreq;
    int ret = Domain::get(connreq, settings_.strict, &domain_, true);
    if (ret < 0)
        return ret;
    // What the peer asks for is checked before the endpoint exists, so that it can be refused.
    if (bool(peer.flags & wire::kFlagVirtAddr) != domain_->caps().virtAddr)
        return -EPROTO;
    ret = setup(connreq);
    if (ret < 0)
        return ret;
    if (peer.flags & wire::kFlagIwarp)
        iwarp_ = true;
    ret = applyPeerHello(peer);
    if (ret < 0)
        return ret;
    if (connreq->dest_addr && connreq->dest_addrlen <= sizeof(peerAddr_)) {
        std::memcpy(&peerAddr_, connreq->dest_addr, connreq->dest_addrlen);
        peerLen_ = static_cast<socklen_t>(connreq->dest_addrlen);
    } else {
        size_t l = sizeof(peerAddr_);
        if (fi_getpeer(ep_, &peerAddr_, &l) == 0)
            peerLen_ = static_cast<socklen_t>(l);
    }
    size_t cmMax = 0;
    ret = checkCmDataSize(&cmMax);
    if (ret < 0)
        return ret;
    wire::Hello mine = localHello();
    // Rewinds are offered back only to an end that offered them: one of an earlier version
    // refuses a hello with a flag it does not know.
    if (!(peer.flags & wire::kFlagRewind))
        mine.flags &= ~wire::kFlagRewind;
    if (settings_.sameHost && peer.token && cmMax >= wire::kHelloSameHostSize) {
        // The region goes to the peer's inbox before the answer, so it is there when the
        // answer arrives; declined, the connection stays on the fabric.
        if (acceptSameHost(peer, sameHostRings(settings_), &sh_) == 0) {
            shToken_ = peer.token;
            mine.token = peer.token;
            mine.hostKey = peer.hostKey;
        }
    }
    uint8_t hello[wire::kHelloSameHostSize];
    const size_t helloLen = wire::encodeHello(mine, hello);
    connectStartNs_ = nowNs();
    ret = fi_accept(ep_, hello, helloLen);
    if (ret) {
        sh_.reset();
        return fiErr(ret);
    }
    if (sh_)
        shOn_.store(true, std::memory_order_release);
    state_ = State::Accepting;
    // A peer that never completes the handshake must not be progressed forever.
    connectDeadlineNs_ = connectStartNs_ + int64_t(settings_.connectTimeoutMs) * 1000000;
    watch();
    return 0;
}

} // namespace rstream
