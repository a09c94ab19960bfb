// SPDX-License-Identifier: MIT
// A connection's endpoint: its CQ, EQ and wait set, its memory block and registrations.

#include "connection.h"
#include "connection_detail.h"

#include <algorithm>
#include <cerrno>
#include <sys/epoll.h>
#include <sys/mman.h>

#include "kernel.h"
#include "log.h"

namespace rstream {

int Connection::setup(const fi_info *info)
{
    int ret = domain_ ? 0 : Domain::get(info, settings_.strict, &domain_, true);
    if (ret < 0)
        return ret;
    const ProviderCaps &caps = domain_->caps();
    iwarp_ = settings_.iwarp || caps.iwarp;
    injectSize_ = info->tx_attr->inject_size;
    const uint32_t txCap = std::max<uint32_t>(
        Settings::kMinQueue, std::min<uint32_t>(settings_.txSize, info->tx_attr->size));
    rxCount_ = std::max<uint32_t>(
        4, std::min<uint32_t>(
               {settings_.rxSize, static_cast<uint32_t>(info->rx_attr->size), wire::kMaxSlots}));
    tx_.size = settings_.sendBuf;
    rx_.size = settings_.recvBuf;
    settings_.ioMapSize = std::min(settings_.ioMapSize, wire::kMaxIoMaps);
    // Receive slots only need room for an IOMAP record when the peer may send one.
    slotStride_ = settings_.ioMapSize > 0 ? kRecordSlotBytes : sizeof(uint32_t);
    // Rings grow in place, in areas reserved up front; a provider that pins what is registered
    // (FI_MR_ALLOCATED, verbs) would pin each ring, and one that chooses keys (FI_MR_PROV_KEY)
    // cannot register the next receive ring under the key the peer expects (wire::nextRingKey),
    // so there they keep their size.
    const bool canReserve = !caps.mrAllocated && !caps.provKey;
    bool growSend = canReserve && settings_.sendBufMax > tx_.size;
    bool growRecv = canReserve && settings_.recvBufMax > rx_.size;
    size_t sendOff = 0, recvOff = 0, slotOff = 0, recordOff = 0, ctrlOff = 0;
    void *mem = MAP_FAILED;
    for (;;) {
        sendReserve_ = growSend ? std::max(settings_.sendBufMax, tx_.size) : tx_.size;
        // Each new receive ring follows the previous one, and each is at least twice as big.
        recvReserve_ = growRecv ? rx_.size + 2 * settings_.recvBufMax : rx_.size;
        recvOff = alignUp(sendOff + sendReserve_, 4096);
        slotOff = alignUp(recvOff + recvReserve_, 4096);
        recordOff = alignUp(slotOff + rxCount_ * slotStride_, 64);
        ctrlOff = alignUp(recordOff + kRecordBufs * kRecordSlotBytes, 64);
        memSize_ = alignUp(ctrlOff + txCap * sizeof(uint32_t), 4096);
        mem = mmap(nullptr, memSize_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (mem != MAP_FAILED || (!growSend && !growRecv))
            break;
        // Under strict overcommit the reservation counts in full: keep the sizes instead.
        RS_LOG(Info, "cannot reserve %zu bytes for growing rings: fixed sizes", memSize_);
        growSend = growRecv = false;
    }
    growth_.enable(growRecv, growSend);
    // Not where registered memory is pinned (the pages must stay), nor where a write may land
    // outside our calls into the provider.
    ringRelease_ = settings_.ringIdleMs > 0 && !caps.mrAllocated && caps.placesInCalls;
    if (mem == MAP_FAILED) {
        memSize_ = 0;
        return -ENOMEM;
    }
    mem_ = static_cast<uint8_t *>(mem);
    sendBase_ = mem_ + sendOff;
    recvArea_ = recvBase_ = mem_ + recvOff;
    slotBufs_ = mem_ + slotOff;
    recordBufs_ = mem_ + recordOff;
    ctrlWords_ = reinterpret_cast<uint32_t *>(mem_ + ctrlOff);
    ret = txOps_.init(txCap);
    rxSlots_ = new (std::nothrow) RxSlot[rxCount_]();
    if (ret < 0 || !rxSlots_)
        return -ENOMEM;

    ret = openQueues(caps.waitSets);
    if (ret < 0)
        return ret;

    fi_info *epInfo = fi_dupinfo(info);
    if (!epInfo)
        return -ENOMEM;
    epInfo->tx_attr->size = txOps_.cap();
    epInfo->rx_attr->size = rxCount_;
    ret = fi_endpoint(domain_->domain(), epInfo, ep_.out(), this);
    fi_freeinfo(epInfo);
    if (ret)
        return fiErr(ret);
    ret = fi_ep_bind(ep_, &eq_->fid, 0);
    if (!ret)
        ret = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV);
    if (ret)
        return fiErr(ret);
    ret = registerMemory();
    if (ret < 0)
        return ret;
    ret = fi_enable(ep_);
    if (ret)
        return fiErr(ret);
    for (uint32_t i = 0; i < rxCount_; i++) {
        ret = postReceive(i);
        if (ret < 0)
            return ret;
    }
    return 0;
}

int Connection::openQueues(bool waitSet)
{
    fi_eq_attr eattr{};
    fi_cq_attr cattr{};
    cattr.format = FI_CQ_FORMAT_DATA;
    cattr.size = txOps_.cap() + rxCount_ + 16;
    if (waitSet) {
        // One wait set for both: one fd to sleep on and one fi_trywait to arm.
        fi_wait_attr wattr{};
        wattr.wait_obj = FI_WAIT_FD;
        int ret = fi_wait_open(domain_->fabric(), &wattr, waitSet_.out());
        if (ret)
            return fiErr(ret);
        ret = fi_control(&waitSet_->fid, FI_GETWAIT, &waitFd_);
        if (ret)
            return fiErr(ret);
        eattr.wait_obj = cattr.wait_obj = FI_WAIT_SET;
        eattr.wait_set = cattr.wait_set = waitSet_;
    } else {
        eattr.wait_obj = cattr.wait_obj = FI_WAIT_FD;
    }
    int ret = fi_eq_open(domain_->fabric(), &eattr, eq_.out(), this);
    if (ret)
        return fiErr(ret);
    ret = fi_cq_open(domain_->domain(), &cattr, cq_.out(), this);
    if (ret)
        return fiErr(ret);
    if (waitSet)
        return 0;
    // Without wait sets (verbs) the CQ and the EQ each have a wait fd: an epoll fd of ours
    // holds both, so that the rest of the engine (sleeps, pollers, the progress thread) still
    // sees one fd a connection, readable when either has something.
    int cqFd = -1, eqFd = -1;
    ret = fi_control(&cq_->fid, FI_GETWAIT, &cqFd);
    if (!ret)
        ret = fi_control(&eq_->fid, FI_GETWAIT, &eqFd);
    if (ret)
        return fiErr(ret);
    const int ep = sys::epollCreate1(EPOLL_CLOEXEC);
    if (ep < 0)
        return ep;
    ownWaitFd_ = waitFd_ = ep;
    for (int fd : {cqFd, eqFd}) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.fd = fd;
        ret = sys::epollCtl(ep, EPOLL_CTL_ADD, fd, &ev);
        if (ret < 0)
            return ret;
    }
    return 0;
}

uint64_t Connection::keyOfSize(uint64_t key) const
{
    const size_t size = domain_->caps().keySize;
    return size < 8 ? key & ((uint64_t(1) << (8 * size)) - 1) : key;
}

int Connection::registerRegion(void *buf, size_t len, uint64_t access, fid_mr **mr,
                               const uint64_t *wantKey)
{
    const ProviderCaps &caps = domain_->caps();
    if (auto fault = testRegisterFault.load(std::memory_order_relaxed)) {
        if (int r = fault(len, access); r < 0) {
            *mr = nullptr;
            return r;
        }
    }
    int ret = -FI_ENOKEY;
    for (int attempt = 0; attempt < 16 && ret == -FI_ENOKEY; attempt++) {
        uint64_t key = 0;
        if (wantKey) {
            // A key both ends derive (the next receive ring): one try, it is that key or none.
            if (attempt > 0)
                break;
            key = *wantKey;
        } else if (!caps.provKey) {
            // Keys must not be guessable: a peer may only ever write where it was told to.
            key = keyOfSize(randomKey());
        }
        ret = fi_mr_reg(domain_->domain(), buf, len, access, 0, key, 0, mr, this);
    }
    if (ret) {
        *mr = nullptr;
        return fiErr(ret);
    }
    if (caps.mrEndpoint) {
        ret = fi_mr_bind(*mr, &ep_->fid, 0);
        if (!ret)
            ret = fi_mr_enable(*mr);
        if (ret) {
            fi_close(&(*mr)->fid);
            *mr = nullptr;
            return fiErr(ret);
        }
    }
    return 0;
}

int Connection::registerMemory()
{
    const ProviderCaps &caps = domain_->caps();
    // Only the receive ring in use is remotely writable (and the application's riomap
    // windows): the rest of the area is registered ring by ring as it grows (growth.cpp), so a
    // peer can neither write nor make resident what it was not given.
    int ret = registerRegion(recvArea_, rx_.size, FI_REMOTE_WRITE, remoteMr_.out());
    if (ret < 0)
        return ret;
    if (caps.mrLocal) {
        ret =
            registerRegion(mem_, memSize_, FI_SEND | FI_RECV | FI_WRITE | FI_READ, localMr_.out());
        if (ret < 0)
            return ret;
        localDesc_ = fi_mr_desc(localMr_);
    }
    return 0;
}

int Connection::postReceive(uint32_t index)
{
    // Receives are posted once per slot and reposted as each is consumed, so the queue has
    // room by construction.
    int ret = fi_recv(ep_, slotBufs_ + index * slotStride_, slotStride_, localDesc_, 0,
                      &rxSlots_[index].ctx);
    return ret ? fiErr(ret) : 0;
}

} // namespace rstream
