// SPDX-License-Identifier: MIT
// rstream-perf's raw transport, one connection: its private data, endpoint, rings, credits and
// completions (perf_raw_conn.h says how they work).

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <endian.h>
#include <poll.h>
#include <sched.h>
#include <string>
#include <sys/random.h>
#include <vector>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "configvars.h"
#include "perf_fabric.h"
#include "perf_raw_conn.h"

namespace rstream::perf::raw {

Hello toWire(Hello h)
{
    h.magic = htobe32(h.magic);
    h.version = htobe16(h.version);
    h.msgSize = htobe32(h.msgSize);
    h.ringSize = htobe32(h.ringSize);
    h.ringAddr = htobe64(h.ringAddr);
    h.ringKey = htobe64(h.ringKey);
    h.rxCredits = htobe32(h.rxCredits);
    h.durationMs = htobe32(h.durationMs);
    return h;
}

int fromWire(const void *data, size_t len, Hello *out)
{
    if (len < sizeof(Hello))
        return -EPROTO;
    Hello h;
    memcpy(&h, data, sizeof(h));
    h.magic = be32toh(h.magic);
    h.version = be16toh(h.version);
    h.msgSize = be32toh(h.msgSize);
    h.ringSize = be32toh(h.ringSize);
    h.ringAddr = be64toh(h.ringAddr);
    h.ringKey = be64toh(h.ringKey);
    h.rxCredits = be32toh(h.rxCredits);
    h.durationMs = be32toh(h.durationMs);
    if (h.magic != kMagic || h.version != kVersion || h.msgSize == 0 || h.ringSize == 0 ||
        h.msgSize > h.ringSize || h.ringSize > kMaxRing ||
        (h.test != uint8_t(Test::Bandwidth) && h.test != uint8_t(Test::Latency)))
        return -EPROTO;
    *out = h;
    return 0;
}

namespace {

const char *providerName()
{
    // The raw path has no verbs probing of its own: tcp unless the variable names another.
    const char *env = config::getString("RSTREAM_PROVIDER");
    return env ? env : "tcp";
}

fi_info *makeHints()
{
    fi_info *hints = fi_allocinfo();
    if (!hints)
        return nullptr;
    hints->ep_attr->type = FI_EP_MSG;
    hints->caps = FI_MSG | FI_RMA;
    hints->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
    hints->domain_attr->threading = FI_THREAD_SAFE;
    hints->fabric_attr->prov_name = strdup(providerName());
    return hints;
}

} // namespace

int getInfo(const char *node, const char *service, uint64_t flags, fi_info **out)
{
    fi_info *hints = makeHints();
    if (!hints)
        return -ENOMEM;
    int ret = fi_getinfo(FI_VERSION(1, 17), node, service, flags, hints, out);
    fi_freeinfo(hints);
    if (ret)
        logErr("fi_getinfo", ret);
    return ret;
}

namespace {

void *allocBuffer(size_t len)
{
    void *p = nullptr;
    if (posix_memalign(&p, 4096, len))
        return nullptr;
    memset(p, 0, len);
    return p;
}

} // namespace

RawConn::~RawConn()
{
    closeFid(ep_ ? &ep_->fid : nullptr);
    closeFid(ringMr_ ? &ringMr_->fid : nullptr);
    closeFid(sendMr_ ? &sendMr_->fid : nullptr);
    closeFid(ctrlMr_ ? &ctrlMr_->fid : nullptr);
    closeFid(cq_ ? &cq_->fid : nullptr);
    closeFid(eq_ ? &eq_->fid : nullptr);
    closeFid(domain_ ? &domain_->fid : nullptr);
    free(ring_);
    free(send_);
    free(ctrl_);
    if (info_)
        fi_freeinfo(info_);
}

int RawConn::regMr(void *buf, size_t len, uint64_t access, fid_mr **mr, void **desc)
{
    uint64_t key = 0;
    if (!provKey_) {
        // Requested keys must be unique in the domain; random ones are, and are not guessable.
        if (getrandom(&key, sizeof(key), 0) != sizeof(key))
            return -EIO;
        key &= keyMask_;
    }
    int ret = fi_mr_reg(domain_, buf, len, access, 0, key, 0, mr, nullptr);
    if (ret) {
        logErr("fi_mr_reg", ret);
        return ret;
    }
    if (mrEndpoint_) {
        ret = fi_mr_bind(*mr, &ep_->fid, 0);
        if (!ret)
            ret = fi_mr_enable(*mr);
        if (ret) {
            logErr("fi_mr_bind", ret);
            return ret;
        }
    }
    if (desc)
        *desc = fi_mr_desc(*mr);
    return 0;
}

int RawConn::open(fid_fabric *fabric, fi_info *info, uint32_t ringSize, uint32_t msgSize)
{
    info_ = info;
    uint64_t mrMode = info->domain_attr->mr_mode;
    mrLocal_ = mrMode & FI_MR_LOCAL;
    virtAddr_ = mrMode & FI_MR_VIRT_ADDR;
    provKey_ = mrMode & FI_MR_PROV_KEY;
    mrEndpoint_ = mrMode & FI_MR_ENDPOINT;
    rxCqData_ = info->mode & FI_RX_CQ_DATA;
    if (info->domain_attr->mr_key_size < 8)
        keyMask_ = (uint64_t(1) << (8 * info->domain_attr->mr_key_size)) - 1;
    if (info->domain_attr->cq_data_size < 4) {
        fprintf(stderr, "rstream-perf: raw: provider %s has no 4-byte immediate data\n",
                info->fabric_attr->prov_name);
        return -ENOTSUP;
    }
    injectSize_ = info->tx_attr->inject_size;
    ringSize_ = ringSize;
    msgSize_ = msgSize;

    fabric_ = fabric;
    int ret = fi_domain(fabric, info, &domain_, nullptr);
    if (ret) {
        logErr("fi_domain", ret);
        return ret;
    }
    fi_eq_attr eqAttr = {};
    eqAttr.wait_obj = FI_WAIT_UNSPEC;
    ret = fi_eq_open(fabric, &eqAttr, &eq_, nullptr);
    if (ret) {
        logErr("fi_eq_open", ret);
        return ret;
    }
    size_t txDepth = info->tx_attr->size ? info->tx_attr->size : 64;
    recvCount_ =
        uint32_t(std::min<size_t>(info->rx_attr->size ? info->rx_attr->size : 64, kMaxRecvs));
    if (rxCqData_ && recvCount_ <= kCtrlReserve + 1) {
        fprintf(stderr, "rstream-perf: raw: receive queue too small\n");
        return -ENOTSUP;
    }
    fi_cq_attr cqAttr = {};
    cqAttr.size = txDepth + recvCount_;
    cqAttr.format = FI_CQ_FORMAT_DATA;
    cqAttr.wait_obj = FI_WAIT_FD;
    ret = fi_cq_open(domain_, &cqAttr, &cq_, nullptr);
    if (ret) {
        logErr("fi_cq_open", ret);
        return ret;
    }
    if (fi_control(&cq_->fid, FI_GETWAIT, &waitFd_))
        waitFd_ = -1; // no fd to sleep on: spin
    ret = fi_endpoint(domain_, info, &ep_, nullptr);
    if (ret) {
        logErr("fi_endpoint", ret);
        return ret;
    }
    ret = fi_ep_bind(ep_, &eq_->fid, 0);
    if (!ret)
        ret = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV);
    if (!ret)
        ret = fi_enable(ep_);
    if (ret) {
        logErr("endpoint setup", ret);
        return ret;
    }

    ring_ = static_cast<uint8_t *>(allocBuffer(ringSize_));
    send_ = static_cast<uint8_t *>(allocBuffer(msgSize_));
    ctrl_ = static_cast<uint8_t *>(allocBuffer(8 * (recvCount_ + 1)));
    if (!ring_ || !send_ || !ctrl_)
        return -ENOMEM;
    ret = regMr(ring_, ringSize_, FI_REMOTE_WRITE, &ringMr_, nullptr);
    if (!ret && mrLocal_)
        ret = regMr(send_, msgSize_, FI_WRITE, &sendMr_, &sendDesc_);
    if (!ret && mrLocal_)
        ret = regMr(ctrl_, 8 * (recvCount_ + 1), FI_RECV | FI_SEND, &ctrlMr_, &ctrlDesc_);
    if (ret)
        return ret;

    txCtx_.resize(txDepth);
    for (uint32_t i = 0; i < txDepth; i++)
        txFree_.push_back(uint32_t(txDepth - 1 - i));
    recvCtx_.resize(recvCount_);
    for (uint32_t i = 0; i < recvCount_; i++) {
        ret = postRecv(i);
        if (ret)
            return ret;
    }
    rxCredits_ = rxCqData_ ? recvCount_ - kCtrlReserve : 0;
    batchMsgs_ = rxCqData_ ? std::max<uint32_t>(1, rxCredits_ / 2) : UINT32_MAX;
    return 0;
}

Hello RawConn::localHello(Test test, uint32_t durationMs) const
{
    Hello h = {};
    h.magic = kMagic;
    h.version = kVersion;
    h.test = uint8_t(test);
    h.msgSize = msgSize_;
    h.ringSize = ringSize_;
    h.ringAddr = virtAddr_ ? uint64_t(uintptr_t(ring_)) : 0;
    h.ringKey = fi_mr_key(ringMr_);
    h.rxCredits = rxCredits_;
    h.durationMs = durationMs;
    return h;
}

int RawConn::setPeer(const Hello &peer)
{
    if (peer.msgSize != msgSize_ || peer.msgSize > ringSize_)
        return -EPROTO;
    peerAddr_ = peer.ringAddr;
    peerKey_ = peer.ringKey;
    peerRing_ = peer.ringSize;
    peerCredits_ = peer.rxCredits;
    // Hand space back once a quarter of the ring is free, but early enough that a sender
    // blocked on a message (and the padding before it, less than one message) always has that
    // much in flight: blocked means in flight > ring - 2 * size, and at least one message.
    uint64_t len = msgSize_;
    uint64_t blocked = std::max<uint64_t>(len, len * 2 <= ringSize_ ? ringSize_ - 2 * len + 1 : 0);
    batchBytes_ = uint32_t(std::max<uint64_t>(1, std::min<uint64_t>(ringSize_ / 4, blocked)));
    return 0;
}

int RawConn::waitConnected(const char *what)
{
    alignas(fi_eq_cm_entry) uint8_t buf[sizeof(fi_eq_cm_entry) + 256];
    ssize_t bytes = 0;
    int event = readEvent(eq_, buf, sizeof(buf), kEqTimeoutMs, &bytes);
    if (event < 0) {
        logErr(what, event);
        return event;
    }
    if (event != FI_CONNECTED) {
        fprintf(stderr, "rstream-perf: raw: %s: unexpected event %d\n", what, event);
        return -ECONNREFUSED;
    }
    if (!peerRing_) {
        // The client learns the server's ring from the accept's private data.
        auto *entry = reinterpret_cast<fi_eq_cm_entry *>(buf);
        Hello peer;
        int ret = fromWire(entry->data, size_t(bytes) - sizeof(*entry), &peer);
        if (!ret)
            ret = setPeer(peer);
        if (ret) {
            fprintf(stderr, "rstream-perf: raw: bad private data from the server\n");
            return ret;
        }
    }
    return 0;
}

int RawConn::connect(const Hello &local)
{
    Hello wire = toWire(local);
    int ret = fi_connect(ep_, info_->dest_addr, &wire, sizeof(wire));
    if (ret) {
        logErr("fi_connect", ret);
        return ret;
    }
    return waitConnected("connect");
}

int RawConn::accept(const Hello &local)
{
    Hello wire = toWire(local);
    int ret = fi_accept(ep_, &wire, sizeof(wire));
    if (ret) {
        logErr("fi_accept", ret);
        return ret;
    }
    return waitConnected("accept");
}

int RawConn::postRecv(uint32_t slot)
{
    // Never more receives than the queue holds: a slot is reposted after its completion.
    int ret = int(fi_recv(ep_, ctrl_ + 8 * slot, 8, ctrlDesc_, 0, &recvCtx_[slot]));
    if (ret) {
        logErr("fi_recv", ret);
        return ret;
    }
    return 0;
}

void RawConn::onArrival(uint32_t len)
{
    uint32_t off = uint32_t(rxPos_ % ringSize_);
    uint32_t pad = off + uint64_t(len) > ringSize_ ? ringSize_ - off : 0;
    rxPos_ += pad + len;
    rxBytesOwed_ += pad + len;
    rxMsgsOwed_++;
    arrivals_++;
    bytesIn_ += len;
}

void RawConn::onCtrl(uint32_t imm, uint32_t slot, size_t len)
{
    switch (imm >> kTypeShift) {
    case kTypeCredit:
        txFreed_ += imm & kCreditBytesMax;
        txMsgs_ -= std::min(txMsgs_, (imm >> kCreditMsgsShift) & kCreditMsgsMax);
        break;
    case kTypeFin:
        fin_ = true;
        break;
    case kTypeAck:
        if (len >= 8) {
            uint64_t value;
            memcpy(&value, ctrl_ + 8 * slot, 8);
            ackValue_ = be64toh(value);
            ack_ = true;
        }
        break;
    default:
        break;
    }
}

int RawConn::returnCredits()
{
    // Once a batch is due, everything owed goes back, in as many messages as it takes: a
    // remainder kept back could be exactly what a blocked sender waits for.
    if (rxBytesOwed_ >= batchBytes_ || rxMsgsOwed_ >= batchMsgs_)
        creditsDue_ = true;
    while (creditsDue_ && (rxBytesOwed_ || rxMsgsOwed_)) {
        uint32_t bytes = std::min(rxBytesOwed_, kCreditBytesMax);
        uint32_t msgs = rxCqData_ ? std::min(rxMsgsOwed_, kCreditMsgsMax) : 0;
        uint32_t imm = (kTypeCredit << kTypeShift) | (msgs << kCreditMsgsShift) | bytes;
        int ret = int(fi_injectdata(ep_, nullptr, 0, imm, 0));
        if (ret == -FI_EAGAIN)
            return 0; // the next progress() tries again
        if (ret) {
            logErr("fi_injectdata", ret);
            return ret;
        }
        rxBytesOwed_ -= bytes;
        rxMsgsOwed_ = rxCqData_ ? rxMsgsOwed_ - msgs : 0;
    }
    creditsDue_ = false;
    return 0;
}

int RawConn::cqError()
{
    fi_cq_err_entry err = {};
    if (fi_cq_readerr(cq_, &err, 0) < 0)
        return -EIO;
    // Posted receives are cancelled when the peer disconnects: not worth a message.
    if (err.err == FI_ECANCELED)
        return -ECONNRESET;
    fprintf(stderr, "rstream-perf: raw: completion error: %s\n", fi_strerror(err.err));
    return err.err ? -err.err : -EIO;
}

int RawConn::checkEq()
{
    if (peerGone_)
        return -ECONNRESET;
    alignas(fi_eq_cm_entry) uint8_t buf[sizeof(fi_eq_cm_entry) + 256];
    int event = readEvent(eq_, buf, sizeof(buf), 0, nullptr);
    if (event == -EAGAIN)
        return 0;
    if (event == FI_SHUTDOWN || event < 0) {
        peerGone_ = true;
        return -ECONNRESET;
    }
    return 0;
}

int RawConn::progress()
{
    fi_cq_data_entry entries[16];
    ssize_t n = fi_cq_read(cq_, entries, 16);
    if (n == -FI_EAGAIN) {
        int ret = rxBytesOwed_ || rxMsgsOwed_ ? returnCredits() : 0;
        if (!ret && ++idlePolls_ % kEqPolls == 0)
            ret = checkEq();
        return ret;
    }
    if (n == -FI_EAVAIL)
        return cqError();
    if (n < 0) {
        logErr("fi_cq_read", int(n));
        return int(n);
    }
    idlePolls_ = 0;
    for (ssize_t i = 0; i < n; i++) {
        const fi_cq_data_entry &e = entries[i];
        auto *ctx = static_cast<fi_context2 *>(e.op_context);
        bool isRecv = !recvCtx_.empty() && ctx >= &recvCtx_.front() && ctx <= &recvCtx_.back();
        if ((e.flags & FI_REMOTE_WRITE) && (e.flags & FI_REMOTE_CQ_DATA)) {
            onArrival(uint32_t(e.data));
        } else if (e.flags & FI_RECV) {
            if (!isRecv)
                continue;
            onCtrl(uint32_t(e.data), uint32_t(ctx - &recvCtx_.front()), e.len);
        } else if (ctx) {
            txFree_.push_back(uint32_t(ctx - &txCtx_.front()));
            continue;
        }
        if (isRecv) {
            int ret = postRecv(uint32_t(ctx - &recvCtx_.front()));
            if (ret)
                return ret;
        }
    }
    int ret = returnCredits();
    return ret ? ret : int(n);
}

void RawConn::sleepOnCq()
{
    fid *fids[1] = {&cq_->fid};
    if (waitFd_ < 0 || fi_trywait(fabric_, fids, 1) != FI_SUCCESS)
        return;
    pollfd pfd = {waitFd_, POLLIN, 0};
    poll(&pfd, 1, kSleepMs);
}

int RawConn::progressOrWait()
{
    int ret = progress();
    if (ret) {
        idleSinceNs_ = 0;
        return ret;
    }
    int64_t now = nowNs();
    if (!idleSinceNs_)
        idleSinceNs_ = now;
    if (now - idleSinceNs_ > kSpinNs)
        sleepOnCq();
    else
        sched_yield();
    return 0;
}

int RawConn::tryWrite()
{
    uint32_t len = msgSize_;
    bool inject = len <= injectSize_;
    if (!inject && txFree_.empty())
        return 0;
    uint32_t off = uint32_t(txPos_ % peerRing_);
    uint32_t pad = off + uint64_t(len) > peerRing_ ? peerRing_ - off : 0;
    if (txPos_ - txFreed_ + pad + len > peerRing_)
        return 0;
    if (peerCredits_ && txMsgs_ >= peerCredits_)
        return 0;
    uint64_t target = pad ? 0 : off;
    uint64_t addr = virtAddr_ ? peerAddr_ + target : target;
    ssize_t ret;
    if (inject) {
        ret = fi_inject_writedata(ep_, send_, len, len, 0, addr, peerKey_);
    } else {
        ret = fi_writedata(ep_, send_, len, sendDesc_, len, 0, addr, peerKey_,
                           &txCtx_[txFree_.back()]);
    }
    if (ret == -FI_EAGAIN)
        return 0;
    if (ret) {
        logErr("fi_writedata", int(ret));
        return int(ret);
    }
    if (!inject)
        txFree_.pop_back();
    txPos_ += pad + len;
    if (peerCredits_)
        txMsgs_++;
    return 1;
}

int RawConn::write()
{
    for (;;) {
        int ret = tryWrite();
        if (ret)
            return ret < 0 ? ret : 0;
        ret = progressOrWait();
        if (ret < 0)
            return ret;
    }
}

int RawConn::sendCtrl(uint32_t imm, const void *payload, size_t len)
{
    for (;;) {
        ssize_t ret;
        if (len <= injectSize_) {
            ret = fi_injectdata(ep_, payload, len, imm, 0);
        } else if (txFree_.empty()) {
            ret = -FI_EAGAIN;
        } else {
            uint8_t *src = ctrl_ + 8 * recvCount_;
            memcpy(src, payload, len);
            ret = fi_senddata(ep_, src, len, ctrlDesc_, imm, 0, &txCtx_[txFree_.back()]);
            if (!ret)
                txFree_.pop_back();
        }
        if (ret != -FI_EAGAIN) {
            if (ret)
                logErr("fi_senddata", int(ret));
            return int(ret);
        }
        int err = progressOrWait();
        if (err < 0)
            return err;
    }
}

void RawConn::waitShutdown(int timeoutMs)
{
    int64_t deadline = nowNs() + int64_t(timeoutMs) * 1'000'000;
    // Keep making progress: the last control message may still sit in our queue.
    while (!peerGone_ && nowNs() < deadline) {
        if (progressOrWait() < 0 || checkEq() < 0)
            break;
    }
}

} // namespace rstream::perf::raw
