// SPDX-License-Identifier: MIT
// The data path of a stream connection.
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
// format of the words.

#include "connection.h"
#include "clock.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <rdma/fi_cm.h>
#include <rdma/fi_rma.h>

#include "crash.h"
#include "log.h"
#include "progress.h"

namespace rstream {

namespace {
// waitFor(): the send ring is empty (it may grow).
constexpr int kSendDrained = 1 << 8;
// The receive ring grows (x4) when the application read this many rings' worth within the
// window.
constexpr uint64_t kGrowRings = 4;
constexpr int64_t kGrowWindowNs = 100'000'000;

int64_t deadlineFor(int timeoutMs)
{
    return timeoutMs < 0 ? 0 : nowNs() + int64_t(timeoutMs) * 1000000;
}

size_t alignUp(size_t v, size_t a)
{
    return (v + a - 1) & ~(a - 1);
}

size_t iovTotal(const iovec *iov, int iovcnt)
{
    size_t total = 0;
    for (int i = 0; i < iovcnt; i++)
        total += iov[i].iov_len;
    return total;
}

// Copies len bytes between a ring region starting at ring offset off and the iovec array,
// starting iovSkip bytes into it. toRing: from the iovecs into the ring.
void copyRing(uint8_t *ring, uint64_t ringSize, uint64_t off, const iovec *iov, int iovcnt,
              size_t iovSkip, size_t len, bool toRing)
{
    int i = 0;
    while (i < iovcnt && iovSkip >= iov[i].iov_len)
        iovSkip -= iov[i++].iov_len;
    while (len > 0 && i < iovcnt) {
        size_t n = std::min<size_t>({len, iov[i].iov_len - iovSkip, ringSize - off});
        uint8_t *user = static_cast<uint8_t *>(iov[i].iov_base) + iovSkip;
        if (toRing)
            std::memcpy(ring + off, user, n);
        else
            std::memcpy(user, ring + off, n);
        len -= n;
        off = (off + n) % ringSize;
        iovSkip += n;
        if (iovSkip == iov[i].iov_len) {
            iovSkip = 0;
            i++;
        }
    }
}

constexpr uint32_t kTxReserve = 2; // queue entries kept for control sends
constexpr uint64_t kCoalesceMax = 16 * 1024;
// A receive slot that can take an IOMAP message: in iWarp mode the word and then the record.
constexpr size_t kRecordMsgBytes = sizeof(uint32_t) + wire::kIoMapRecordSize;
constexpr size_t kRecordSlotBytes = (kRecordMsgBytes + 7) & ~size_t(7);

// Each thread that sleeps in waitFor() has an eventfd of its own. A thread that changes what a
// sleeper waits for writes to the sleeper's eventfd: reading a CQ resets its wait fd, so the
// provider's own signal cannot be relied on to reach every sleeper.
class WakeFd
{
public:
    WakeFd() : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
    ~WakeFd()
    {
        if (fd_ >= 0)
            ::close(fd_);
    }
    int fd() const { return fd_; }
    void drain() const
    {
        uint64_t v;
        while (::read(fd_, &v, sizeof(v)) > 0) {
        }
    }

private:
    int fd_;
};

thread_local WakeFd tWakeFd;
constexpr int kMaxBatches = 8;
constexpr uint32_t kEqInterval = 16;
// The progress thread leaves a connection to the application for this long after the
// application last made progress on it: racing it for the lock and the CQ only costs both
// wake-ups, and on few cores the CPU the application or its peer needs.
constexpr int64_t kAppIdleNs = 1000000;

} // namespace

Connection::Connection(const Settings &settings) : settings_(settings) {}

Connection::~Connection()
{
    bool known;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        known = watched_ || waitFd_ >= 0;
        watched_ = false;
    }
    // Lists, timers and the passive set of the progress thread may all name this connection.
    if (known)
        ProgressThread::instance().forget(this, waitFd_);
    if (ep_) {
        if (!closed_ && (state_ == State::Connected || state_ == State::Accepting ||
                         state_ == State::Connecting))
            fi_shutdown(ep_, 0);
        fi_close(&ep_->fid);
    }
    for (LocalWindow &w : windows_)
        if (w.mr)
            fi_close(&w.mr->fid);
    if (remoteMr_)
        fi_close(&remoteMr_->fid);
    if (localMr_)
        fi_close(&localMr_->fid);
    if (cq_)
        fi_close(&cq_->fid);
    if (eq_)
        fi_close(&eq_->fid);
    if (waitSet_)
        fi_close(&waitSet_->fid);
    if (info_)
        fi_freeinfo(info_);
    delete[] txOps_;
    delete[] rxSlots_;
    if (mem_)
        munmap(mem_, memSize_);
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

int Connection::setup(const fi_info *info)
{
    int ret = domain_ ? 0 : Domain::get(info, settings_.strict, &domain_);
    if (ret < 0)
        return ret;
    const ProviderCaps &caps = domain_->caps();
    iwarp_ = settings_.iwarp || caps.iwarp;
    injectSize_ = info->tx_attr->inject_size;
    txCap_ = std::max<uint32_t>(Settings::kMinQueue,
                                std::min<uint32_t>(settings_.txSize, info->tx_attr->size));
    rxCount_ = std::max<uint32_t>(
        4, std::min<uint32_t>(
               {settings_.rxSize, static_cast<uint32_t>(info->rx_attr->size), wire::kMaxSlots}));
    tx_.size = settings_.sendBuf;
    rx_.size = settings_.recvBuf;
    settings_.ioMapSize = std::min(settings_.ioMapSize, wire::kMaxIoMaps);
    // Receive slots only need room for an IOMAP record when the peer may send one.
    slotStride_ = settings_.ioMapSize > 0 ? kRecordSlotBytes : sizeof(uint32_t);
    // Rings grow in place, in areas reserved up front; a provider that pins what is registered
    // (FI_MR_ALLOCATED, verbs) would pin the whole reservation, so there they keep their size.
    const bool canReserve = !caps.mrAllocated;
    growSend_ = canReserve && settings_.sendBufMax > tx_.size;
    growRecv_ = canReserve && settings_.recvBufMax > rx_.size;
    size_t sendOff = 0, recvOff = 0, slotOff = 0, recordOff = 0, ctrlOff = 0;
    void *mem = MAP_FAILED;
    for (;;) {
        sendReserve_ = growSend_ ? std::max(settings_.sendBufMax, tx_.size) : tx_.size;
        // Each new receive ring follows the previous one, and each is at least twice as big.
        recvReserve_ = growRecv_ ? rx_.size + 2 * settings_.recvBufMax : rx_.size;
        recvOff = alignUp(sendOff + sendReserve_, 4096);
        slotOff = alignUp(recvOff + recvReserve_, 4096);
        recordOff = alignUp(slotOff + rxCount_ * slotStride_, 64);
        ctrlOff = alignUp(recordOff + kRecordBufs * kRecordSlotBytes, 64);
        memSize_ = alignUp(ctrlOff + txCap_ * sizeof(uint32_t), 4096);
        mem = mmap(nullptr, memSize_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (mem != MAP_FAILED || (!growSend_ && !growRecv_))
            break;
        // Under strict overcommit the reservation counts in full: keep the sizes instead.
        RS_LOG(Info, "cannot reserve %zu bytes for growing rings: fixed sizes", memSize_);
        growSend_ = growRecv_ = false;
    }
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
    txOps_ = new (std::nothrow) TxOp[txCap_]();
    rxSlots_ = new (std::nothrow) RxSlot[rxCount_]();
    if (!txOps_ || !rxSlots_)
        return -ENOMEM;

    fi_wait_attr wattr{};
    wattr.wait_obj = FI_WAIT_FD;
    ret = fi_wait_open(domain_->fabric(), &wattr, &waitSet_);
    if (ret)
        return fiErr(ret);
    ret = fi_control(&waitSet_->fid, FI_GETWAIT, &waitFd_);
    if (ret)
        return fiErr(ret);

    fi_eq_attr eattr{};
    eattr.wait_obj = FI_WAIT_SET;
    eattr.wait_set = waitSet_;
    ret = fi_eq_open(domain_->fabric(), &eattr, &eq_, this);
    if (ret)
        return fiErr(ret);
    fi_cq_attr cattr{};
    cattr.format = FI_CQ_FORMAT_DATA;
    cattr.wait_obj = FI_WAIT_SET;
    cattr.wait_set = waitSet_;
    cattr.size = txCap_ + rxCount_ + 16;
    ret = fi_cq_open(domain_->domain(), &cattr, &cq_, this);
    if (ret)
        return fiErr(ret);

    fi_info *epInfo = fi_dupinfo(info);
    if (!epInfo)
        return -ENOMEM;
    epInfo->tx_attr->size = txCap_;
    epInfo->rx_attr->size = rxCount_;
    ret = fi_endpoint(domain_->domain(), epInfo, &ep_, this);
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

int Connection::registerRegion(void *buf, size_t len, uint64_t access, fid_mr **mr)
{
    const ProviderCaps &caps = domain_->caps();
    int ret = -FI_ENOKEY;
    for (int attempt = 0; attempt < 16 && ret == -FI_ENOKEY; attempt++) {
        uint64_t key = 0;
        if (!caps.provKey) {
            // Keys must not be guessable: a peer may only ever write where it was told to.
            key = randomKey();
            if (caps.keySize < 8)
                key &= (uint64_t(1) << (8 * caps.keySize)) - 1;
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
    // Only the receive area is remotely writable (and the application's riomap windows): the
    // whole area, as the rings it will hold are written under the same key.
    int ret = registerRegion(recvArea_, recvReserve_, FI_REMOTE_WRITE, &remoteMr_);
    if (ret < 0)
        return ret;
    if (caps.mrLocal) {
        ret = registerRegion(mem_, memSize_, FI_SEND | FI_RECV | FI_WRITE | FI_READ, &localMr_);
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
        growRecv_ = false;
    local_.init(rx_.size, rxCount_);
    windowIdUsed_.assign(peer.ioMapSize, false);
    peerWindows_.assign(settings_.ioMapSize, PeerWindow{});
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
        uint8_t hello[wire::kHelloSize];
        wire::encodeHello(localHello(), hello);
        ret = checkCmDataSize();
        if (ret < 0) {
            state_ = State::Closed;
            error_ = ret;
            return ret;
        }
        ret = fi_connect(ep_, info_->dest_addr, hello, sizeof(hello));
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

int Connection::checkCmDataSize()
{
    // The hello travels as CM private data, whose size the provider bounds (verbs: 56 bytes in
    // a connection request); one that does not fit would be truncated or refused by the peer.
    size_t max = 0;
    size_t len = sizeof(max);
    int ret = fi_getopt(&ep_->fid, FI_OPT_ENDPOINT, FI_OPT_CM_DATA_SIZE, &max, &len);
    if (ret) {
        RS_LOG(Debug, "provider does not report its CM data size (%s): trying", fi_strerror(-ret));
        return 0;
    }
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

void Connection::progressLocked(bool app)
{
    if (!ep_)
        return;
    if (app)
        appProgressNs_.store(nowNs(), std::memory_order_relaxed);
    // Once connected the EQ only reports the endpoint going away, and reading it costs the tcp
    // provider a progress pass (a system call) of its own: look at it on every kEqInterval-th
    // call only. waitFor() reads it before sleeping, and fi_trywait() covers it.
    if (state_ != State::Connected || ++eqSkips_ >= kEqInterval) {
        eqSkips_ = 0;
        processEqLocked();
    }
    processCqLocked();
    if (state_ == State::Connected && !error_) {
        flushLocked(false);
        sendCreditsLocked();
        if (kaAckOwed_ && !closed_ &&
            sendWordLocked(wire::encodeCtrl(wire::Ctrl::KeepaliveAck)) == 0)
            kaAckOwed_ = false;
    }
    if (rxSeen_) {
        // Only keepalive needs the time of arrival: no clock read otherwise.
        rxSeen_ = false;
        if (kaOn_) {
            lastRxNs_ = nowNs();
            kaUnanswered_ = 0;
        }
    }
    if ((state_ == State::Connecting || (state_ == State::Accepting && !error_)) &&
        nowNs() >= connectDeadlineNs_)
        failLocked(-ETIMEDOUT, "connect timed out");
    wakeSleepersLocked();
}

void Connection::processEqLocked()
{
    alignas(fi_eq_cm_entry) uint8_t buf[sizeof(fi_eq_cm_entry) + 256];
    auto &entry = *reinterpret_cast<fi_eq_cm_entry *>(buf);
    for (;;) {
        uint32_t event = 0;
        ssize_t ret = fi_eq_read(eq_, &event, buf, sizeof(buf), 0);
        if (ret == -FI_EAGAIN)
            return;
        if (ret == -FI_EAVAIL) {
            fi_eq_err_entry err{};
            if (fi_eq_readerr(eq_, &err, 0) < 0)
                return;
            changed_ = true;
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
            if (state_ == State::Connected && !passive_) {
                passive_ = true;
                ProgressThread::instance().addPassive(this, waitFd_);
                if (kaOn_) {
                    lastRxNs_ = nowNs();
                    ProgressThread::instance().schedule(this, lastRxNs_);
                }
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

void Connection::processCqLocked()
{
    fi_cq_data_entry entries[16];
    for (int batch = 0; batch < kMaxBatches; batch++) {
        ssize_t n = fi_cq_read(cq_, entries, 16);
        if (n == -FI_EAGAIN)
            return;
        if (n == -FI_EAVAIL) {
            fi_cq_err_entry err{};
            if (fi_cq_readerr(cq_, &err, 0) < 0)
                return;
            if (err.err != FI_ECANCELED && !closed_ && !peerClosed_) {
                RS_LOG(Debug, "completion error %d (%s), provider error %d, flags %#llx", err.err,
                       fi_strerror(err.err), err.prov_errno,
                       static_cast<unsigned long long>(err.flags));
                failLocked(-ECONNRESET, "completion error");
            }
            // A failed send still returns its queue entry.
            auto *op = static_cast<TxOp *>(err.op_context);
            if (op >= txOps_ && op < txOps_ + txCap_)
                onTxCompleteLocked(op);
            continue;
        }
        if (n < 0) {
            failLocked(fiErr(static_cast<int>(n)), "fi_cq_read failed");
            return;
        }
        for (ssize_t i = 0; i < n; i++) {
            const fi_cq_data_entry &e = entries[i];
            auto *slot = static_cast<RxSlot *>(e.op_context);
            bool isSlot = slot >= rxSlots_ && slot < rxSlots_ + rxCount_;
            // An IOMAP record is copied out before its slot is reposted.
            uint8_t record[wire::kIoMapRecordSize];
            const uint8_t *slotBuf =
                isSlot ? slotBufs_ + size_t(slot - rxSlots_) * slotStride_ : nullptr;
            if (e.flags & FI_REMOTE_CQ_DATA) {
                // Write with immediate (on FI_RX_CQ_DATA providers it consumed a receive) or a
                // send with immediate: zero-length, or an IOMAP record.
                // Only an IOMAP word looks for one: the length other words report is the
                // provider's business (a write's length, on some).
                const bool ioMap = (e.data >> wire::kOpShift) == uint32_t(wire::Op::IoMap);
                bool hasRecord = ioMap && isSlot && (e.flags & FI_RECV) && !(e.flags & FI_RMA) &&
                                 e.len == wire::kIoMapRecordSize &&
                                 slotStride_ >= wire::kIoMapRecordSize;
                if (hasRecord)
                    std::memcpy(record, slotBuf, sizeof(record));
                if (isSlot && postReceive(static_cast<uint32_t>(slot - rxSlots_)) < 0)
                    failLocked(-ECONNRESET, "cannot repost receive");
                if (e.data >> 32) {
                    failLocked(-ECONNRESET, "malformed immediate");
                    continue;
                }
                handleWordLocked(static_cast<uint32_t>(e.data), hasRecord ? record : nullptr);
            } else if ((e.flags & FI_RECV) && isSlot) {
                uint32_t index = static_cast<uint32_t>(slot - rxSlots_);
                uint32_t word;
                std::memcpy(&word, slotBuf, sizeof(word));
                size_t len = e.len;
                bool hasRecord = len == kRecordMsgBytes && slotStride_ >= kRecordMsgBytes;
                if (hasRecord)
                    std::memcpy(record, slotBuf + sizeof(word), sizeof(record));
                if (postReceive(index) < 0)
                    failLocked(-ECONNRESET, "cannot repost receive");
                if (!iwarp_ || (len != sizeof(uint32_t) && !hasRecord)) {
                    failLocked(-ECONNRESET, "unexpected message");
                    continue;
                }
                handleWordLocked(word, hasRecord ? record : nullptr);
            } else {
                auto *op = static_cast<TxOp *>(e.op_context);
                if (op >= txOps_ && op < txOps_ + txCap_) {
                    if (injectPending_ && op->seq > injectSeq_)
                        injectPending_ = false;
                    onTxCompleteLocked(op);
                }
            }
        }
        if (n < 16)
            return;
    }
}

void Connection::handleWordLocked(uint32_t word, const uint8_t *record)
{
    if (error_)
        return;
    auto m = wire::decode(word);
    if (!m) {
        failLocked(-ECONNRESET, "malformed message from peer");
        return;
    }
    if ((m->op == wire::Op::IoMap) != (record != nullptr)) {
        failLocked(-ECONNRESET, "message payload does not match its word");
        return;
    }
    changed_ = true;
    rxSeen_ = true;
    local_.onSlotReposted();
    switch (m->op) {
    case wire::Op::Data: {
        uint64_t off = rx_.offset(rx_.written);
        // The peer may only write where we said there is room, and never across the end.
        if (peerShutWr_ || off + m->len > rx_.size ||
            rx_.written + m->len - local_.reported() > rx_.size) {
            failLocked(-ECONNRESET, "peer wrote outside its credit");
            return;
        }
        rx_.written += m->len;
        rxEvents_.fetch_add(1, std::memory_order_relaxed);
        bytesReceived_.fetch_add(m->len, std::memory_order_relaxed);
        if (closing_) {
            // Data for a closed socket: the kernel answers with a reset, and so do we.
            sendWordLocked(wire::encodeCtrl(wire::Ctrl::Reset));
            failLocked(-ECONNRESET, "data arrived after close");
            return;
        }
        if (shutRd_) {
            // Discarded, as the kernel does after SHUT_RD, so the peer is not blocked.
            rx_.consumed = rx_.written;
            local_.onConsumed(m->len);
        }
        break;
    }
    case wire::Op::Credit:
        txEvents_.fetch_add(1, std::memory_order_relaxed);
        if (peer_.onCredit(m->slots, m->ringUnits) < 0) {
            failLocked(-ECONNRESET, "peer returned more credit than it had");
            return;
        }
        break;
    case wire::Op::Ctrl:
        if (m->ctrl == wire::Ctrl::ShutWr || m->ctrl == wire::Ctrl::Disconnect ||
            m->ctrl == wire::Ctrl::Reset) {
            rxEvents_.fetch_add(1, std::memory_order_relaxed);
            txEvents_.fetch_add(1, std::memory_order_relaxed);
        }
        switch (m->ctrl) {
        case wire::Ctrl::ShutWr:
            peerShutWr_ = true;
            break;
        case wire::Ctrl::Disconnect:
            peerShutWr_ = true;
            peerClosed_ = true;
            // The peer is gone for good: nothing we could send would be read. Shutting the
            // endpoint down is the acknowledgement the peer lingers for; the data already in
            // the ring stays readable.
            if (ep_ && !closed_) {
                fi_shutdown(ep_, 0);
                closed_ = true;
            }
            break;
        case wire::Ctrl::Reset:
            discardReadableLocked();
            failLocked(-ECONNRESET, "reset by peer");
            break;
        case wire::Ctrl::Keepalive:
            kaAckOwed_ = true; // sent by progressLocked(), with credit permitting
            break;
        case wire::Ctrl::KeepaliveAck:
            break; // any word is an answer: rxSeen_
        case wire::Ctrl::Grow:
            onGrowLocked(m->arg);
            break;
        case wire::Ctrl::Switch:
            onSwitchLocked();
            break;
        }
        break;
    case wire::Op::IoMap:
        handleIoMapLocked(m->window, record);
        break;
    }
}

void Connection::handleIoMapLocked(uint32_t id, const uint8_t *record)
{
    // The peer is not trusted: ids, ranges and the table's state are checked, and a peer that
    // breaks the rules is reset. Keys and addresses are the peer's own business (its provider
    // checks them); only their shape is.
    wire::IoMapRecord rec;
    if (id >= peerWindows_.size() ||
        wire::decodeIoMapRecord(record, wire::kIoMapRecordSize, &rec) < 0) {
        failLocked(-ECONNRESET, "malformed window record");
        return;
    }
    PeerWindow &w = peerWindows_[id];
    if (rec.length == 0) {
        if (w.length == 0)
            failLocked(-ECONNRESET, "peer withdrew a window it never announced");
        w = PeerWindow{};
        return;
    }
    if (w.length != 0) {
        failLocked(-ECONNRESET, "peer announced a window id twice");
        return;
    }
    if (!domain_->caps().virtAddr && rec.addr != 0) {
        failLocked(-ECONNRESET, "window address without FI_MR_VIRT_ADDR");
        return;
    }
    // Overlapping windows would make an offset ambiguous.
    for (const PeerWindow &o : peerWindows_) {
        if (o.length && rec.offset < o.offset + o.length && o.offset < rec.offset + rec.length) {
            failLocked(-ECONNRESET, "peer announced overlapping windows");
            return;
        }
    }
    w = rec;
}

void Connection::onTxCompleteLocked(TxOp *op)
{
    txEvents_.fetch_add(1, std::memory_order_relaxed);
    op->done = true;
    changed_ = true;
    while (txHead_ < txNext_) {
        TxOp &head = txOps_[txHead_ % txCap_];
        if (!head.done)
            break;
        if (!RS_CHECK(head.len <= tx_.posted - tx_.done)) {
            failLocked(-ECONNRESET, "internal error");
            return;
        }
        tx_.done += head.len;
        if (head.len)
            writesInFlight_--;
        if (head.record) {
            recordsDone_++; // ops leave in order, and so do the record buffers
            head.record = false;
        }
        head.done = false;
        head.len = 0;
        txHead_++;
    }
}

int Connection::sendWordLocked(uint32_t word)
{
    if (!peer_.canSendCtrl() || txNext_ - txHead_ >= txCap_)
        return -EAGAIN;
    TxOp &op = txOps_[txNext_ % txCap_];
    op.len = 0;
    op.seq = txNext_;
    op.done = false;
    ssize_t ret;
    if (iwarp_) {
        uint32_t &src = ctrlWords_[txNext_ % txCap_];
        src = word;
        ret = fi_send(ep_, &src, sizeof(src), localDesc_, 0, &op.ctx);
    } else {
        ret = fi_senddata(ep_, nullptr, 0, nullptr, word, 0, &op.ctx);
    }
    if (ret == -FI_EAGAIN)
        return -EAGAIN;
    if (ret) {
        failLocked(-ECONNRESET, "send failed");
        return -ECONNRESET;
    }
    txNext_++;
    peer_.onCtrlSent();
    return 0;
}

void Connection::sendCreditsLocked()
{
    if (!local_.due() || !peer_.canSendCtrl())
        return;
    uint32_t word = local_.take();
    if (word && sendWordLocked(word) < 0)
        local_.untake(word);
}

bool Connection::flushRecordsLocked()
{
    // Window records go before any stream data queued after them: data the application sends
    // after riomap() must find the window known at the peer. They take a message slot each,
    // like data, so the slots kept for credits stay free.
    while (!recordQueue_.empty()) {
        if (peer_.slots() <= kReservedSlots || txNext_ - txHead_ + 1 + kTxReserve > txCap_ ||
            recordsPosted_ - recordsDone_ >= kRecordBufs)
            return false;
        const PendingRecord &p = recordQueue_.front();
        const uint32_t word = *wire::encodeIoMap(p.id);
        uint8_t *buf = recordBufs_ + (recordsPosted_ % kRecordBufs) * kRecordSlotBytes;
        TxOp &op = txOps_[txNext_ % txCap_];
        op.len = 0;
        op.seq = txNext_;
        op.done = false;
        ssize_t ret;
        if (iwarp_) {
            std::memcpy(buf, &word, sizeof(word));
            wire::encodeIoMapRecord(p.rec, buf + sizeof(word));
            ret = fi_send(ep_, buf, kRecordMsgBytes, localDesc_, 0, &op.ctx);
        } else {
            wire::encodeIoMapRecord(p.rec, buf);
            ret = fi_senddata(ep_, buf, wire::kIoMapRecordSize, localDesc_, word, 0, &op.ctx);
        }
        if (ret == -FI_EAGAIN)
            return false;
        if (ret) {
            failLocked(-ECONNRESET, "send failed");
            return false;
        }
        op.record = true;
        txNext_++;
        recordsPosted_++;
        peer_.onCtrlSent();
        recordQueue_.pop_front();
    }
    return true;
}

void Connection::flushLocked(bool force, bool uncork)
{
    if (state_ != State::Connected || error_ || closed_)
        return;
    if (switchTo_) {
        // The peer's GROW: SWITCH goes between our last write into its old ring and the first
        // into the new one, which follows the old one in its registration.
        if (sendWordLocked(wire::encodeCtrl(wire::Ctrl::Switch)) < 0)
            return;
        peerRingAddr_ += peer_.ringSize();
        peer_.switchRing(switchTo_);
        switchTo_ = 0;
    }
    if (!flushRecordsLocked())
        return;
    const uint32_t opsPerChunk = iwarp_ ? 2 : 1;
    const uint64_t maxChunk =
        std::clamp<uint64_t>(std::min(peer_.ringSize(), tx_.size) / 4, 4096, 256 * 1024);
    // Small sends coalesce while earlier writes are in flight; the completion flushes them.
    // A send of kCoalesceMax or more is worth a write of its own at once: holding it back
    // costs a CQ poll (a system call on tcp) per send, and the copy into the ring gets cold.
    const uint64_t coalesceBelow = std::min(maxChunk / 2, kCoalesceMax);
    // TCP_CORK and MSG_MORE: full writes only, until the data has waited kCorkMaxNs.
    bool corked = (cork_ || more_) && !uncork && !closing_ && !shutWr_;
    if (corked && corkSinceNs_ && nowNs() - corkSinceNs_ >= kCorkMaxNs)
        corked = false;
    corkHeld_ = false;
    while (tx_.unsent() > 0 && peer_.canSendData() &&
           txNext_ - txHead_ + opsPerChunk + kTxReserve <= txCap_) {
        if (corked && tx_.unsent() < maxChunk) {
            corkHeld_ = true;
            if (!corkSinceNs_) {
                corkSinceNs_ = nowNs();
                ProgressThread::instance().schedule(this, corkSinceNs_ + kCorkMaxNs);
            }
            break;
        }
        if (!force && writesInFlight_ > 0 && tx_.unsent() < coalesceBelow)
            break;
        uint64_t len = std::min({tx_.unsent(), tx_.toEnd(tx_.posted),
                                 peer_.ringSize() - peer_.written() % peer_.ringSize(),
                                 peer_.ringAvail(), maxChunk});
        uint64_t srcOff = tx_.offset(tx_.posted);
        uint64_t dst = peerRingAddr_ + peer_.written() % peer_.ringSize();
        const auto encoded = wire::encodeData(static_cast<uint32_t>(len));
        if (!RS_CHECK(encoded)) {
            failLocked(-ECONNRESET, "internal error");
            return;
        }
        const uint32_t word = *encoded;
        TxOp &op = txOps_[txNext_ % txCap_];
        op.len = len;
        op.seq = txNext_;
        op.done = false;
        ssize_t ret;
        // A write the provider can inject needs no completion: its ring space is free again
        // at once, and nothing wakes either side for it.
        const bool inject = !iwarp_ && len <= injectSize_;
        if (iwarp_) {
            ret = fi_write(ep_, sendBase_ + srcOff, len, localDesc_, 0, dst, peerKey_, &op.ctx);
            if (ret == 0) {
                txNext_++;
                TxOp &note = txOps_[txNext_ % txCap_];
                note.len = 0;
                note.seq = txNext_;
                note.done = false;
                uint32_t &src = ctrlWords_[txNext_ % txCap_];
                src = word;
                // The write is ordered before this send: its completion at the peer means the
                // data is in place.
                do {
                    ret = fi_send(ep_, &src, sizeof(src), localDesc_, 0, &note.ctx);
                    if (ret == -FI_EAGAIN)
                        processCqLocked();
                } while (ret == -FI_EAGAIN && !error_);
                if (ret == 0)
                    txNext_++;
            }
        } else if (inject) {
            ret = fi_inject_writedata(ep_, sendBase_ + srcOff, len, word, 0, dst, peerKey_);
            if (ret == 0)
                txNext_++;
        } else {
            ret = fi_writedata(ep_, sendBase_ + srcOff, len, localDesc_, word, 0, dst, peerKey_,
                               &op.ctx);
            if (ret == 0)
                txNext_++;
        }
        if (ret == -FI_EAGAIN)
            break;
        if (ret) {
            failLocked(-ECONNRESET, "write failed");
            return;
        }
        tx_.posted += len;
        peer_.onDataSent(len);
        writesInFlight_++;
        bytesSent_.fetch_add(len, std::memory_order_relaxed);
        if (inject) {
            injectPending_ = true;
            injectSeq_ = op.seq;
            onTxCompleteLocked(&op);
        }
    }
    if (tx_.unsent() == 0) {
        corkSinceNs_ = 0;
        if (closing_ && !disconnectSent_) {
            if (sendWordLocked(wire::encodeCtrl(wire::Ctrl::Disconnect)) == 0)
                disconnectSent_ = shutWrSent_ = true;
        } else if (shutWr_ && !shutWrSent_) {
            if (sendWordLocked(wire::encodeCtrl(wire::Ctrl::ShutWr)) == 0)
                shutWrSent_ = true;
        }
    }
}

void Connection::maybeGrowRecvLocked()
{
    // Only for a bulk reader: kGrowRings rings' worth consumed within kGrowWindowNs (a
    // connection trickling requests never grows). One step at a time: the previous ring
    // drained, no GROW unanswered.
    const int64_t now = nowNs();
    if (now - growWindowNs_ > kGrowWindowNs) {
        growWindowNs_ = now;
        consumedSinceGrow_ = 0;
        return;
    }
    if (growSent_ || rxOld_.size || closing_ || peerShutWr_ || shutRd_)
        return;
    uint64_t want = std::min<uint64_t>(rx_.size * 4, settings_.recvBufMax);
    uint32_t log2 = 63 - __builtin_clzll(want);
    uint64_t size = uint64_t(1) << log2;
    const uint64_t next = static_cast<uint64_t>(recvBase_ - recvArea_) + rx_.size;
    if (size <= rx_.size || next + size > recvReserve_)
        return;
    auto word = wire::encodeGrow(log2);
    if (!word || sendWordLocked(*word) < 0)
        return;
    growSent_ = true;
    growSize_ = size;
    local_.freezeRing();
    consumedSinceGrow_ = 0;
    growWindowNs_ = now;
}

void Connection::onSwitchLocked()
{
    if (!growSent_) {
        failLocked(-ECONNRESET, "SWITCH without GROW");
        return;
    }
    // Everything written before SWITCH is in the old ring; from here on the peer writes into
    // the new one, which starts right after it.
    rxOld_ = rx_;
    rxOldBase_ = recvBase_;
    recvBase_ += rx_.size;
    rx_ = RecvRing{};
    rx_.size = growSize_;
    local_.switchRing(growSize_);
    growSent_ = false;
    recvGrowths_++;
    if (rxOld_.readable() == 0)
        consumeLocked(0);
}

void Connection::onGrowLocked(uint32_t log2)
{
    const uint64_t size = uint64_t(1) << log2;
    // One at a time, and only ever bigger.
    if (switchTo_ || size <= peer_.ringSize()) {
        failLocked(-ECONNRESET, "malformed GROW from peer");
        return;
    }
    switchTo_ = size;
}

void Connection::maybeGrowSendLocked()
{
    if (!sendGrowWanted_ || tx_.tail != tx_.done)
        return;
    // Empty: nothing in it is referenced, so the ring takes its new size in place.
    sendGrowWanted_ = false;
    uint64_t size = std::min<uint64_t>(tx_.size * 4, sendReserve_);
    if (size > tx_.size) {
        tx_.size = size;
        sendGrowths_++;
    }
}

void Connection::consumeLocked(uint64_t n)
{
    // (Never past what was written: a reset may have discarded the bytes meanwhile.)
    uint64_t old = std::min(n, rxOld_.readable());
    rxOld_.consumed += old;
    if (rxOld_.size && rxOld_.readable() == 0) {
        // The old ring is done with: give its pages back (the peer writes the new one).
        madvise(rxOldBase_, rxOld_.size, MADV_DONTNEED);
        rxOld_ = RecvRing{};
        rxOldBase_ = nullptr;
    }
    uint64_t cur = std::min(n - old, rx_.readable());
    rx_.consumed += cur;
    local_.onConsumed(cur);
    consumedSinceGrow_ += old + cur;
    if (growRecv_ && consumedSinceGrow_ >= kGrowRings * rx_.size)
        maybeGrowRecvLocked();
}

void Connection::discardReadableLocked()
{
    consumeLocked(readableLocked());
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

void Connection::wakeSleepersLocked()
{
    if (changed_) {
        const uint64_t one = 1;
        for (int fd : sleepers_)
            if (::write(fd, &one, sizeof(one)) < 0) {
                // Already readable: the sleeper wakes anyway.
            }
    }
    changed_ = false;
}

bool Connection::needsBackgroundLocked() const
{
    // The accepting side must answer the peer even before the application looks at it, and
    // a connect completes in the background as the kernel's does.
    if ((state_ == State::Accepting || state_ == State::Connecting) && !error_)
        return true;
    if (error_ || closed_ || state_ != State::Connected)
        return closing_ && !closed_;
    // Data held for the cork waits for its timer, not for the progress thread's rounds.
    return (tx_.unsent() > 0 && !corkHeld_) || tx_.inFlight() > 0 || txNext_ != txHead_ ||
           local_.due() || injectPending_ || (shutWr_ && !shutWrSent_) || closing_ || kaAckOwed_ ||
           !recordQueue_.empty();
}

void Connection::watch()
{
    if (!watched_ && needsBackgroundLocked()) {
        watched_ = true;
        ProgressThread::instance().watch(this);
    }
}

int Connection::backgroundProgress(bool *closedDone)
{
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock())
        return kProgressBusy;
    const bool appRecent = nowNs() - appProgressNs_.load(std::memory_order_relaxed) < kAppIdleNs;
    if (appRecent && !closing_)
        return kProgressBusy;
    progressLocked(false);
    flushLocked(true);
    if (injectPending_ && txHead_ == txNext_ && state_ == State::Connected && !error_ && !closed_) {
        // The application has gone quiet after injected writes: a KEEPALIVE's completion tells
        // when the provider has handed them over; until then the fd is watched for them.
        sendWordLocked(wire::encodeCtrl(wire::Ctrl::Keepalive));
    }
    if (closing_) {
        bool delivered = tx_.unsent() == 0 && disconnectSent_ && txHead_ == txNext_;
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
        return appSleeping_.load(std::memory_order_relaxed) > 0 ? kProgressBusy : kProgressMore;
    }
    watched_ = false;
    (void)armLocked(); // resets the wait fd's signal: the passive set need not look at it
    return kProgressDone;
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

ssize_t Connection::peekRecv()
{
    std::lock_guard<std::mutex> lock(mutex_);
    progressLocked();
    return peekRecvLocked();
}

void Connection::peek(ssize_t *recv, ssize_t *send)
{
    std::lock_guard<std::mutex> lock(mutex_);
    progressLocked();
    *recv = peekRecvLocked();
    *send = peekSendLocked();
}

ssize_t Connection::peekSend()
{
    std::lock_guard<std::mutex> lock(mutex_);
    progressLocked();
    return peekSendLocked();
}

int Connection::armLocked()
{
    fid *fids[2] = {&cq_->fid, &eq_->fid};
    int ret = fi_trywait(domain_->fabric(), fids, 2);
    if (ret == -FI_EAGAIN)
        return -EAGAIN;
    return ret ? fiErr(ret) : 0;
}

int Connection::arm()
{
    std::lock_guard<std::mutex> lock(mutex_);
    if (!ep_)
        return 0;
    int ret = armLocked();
    if (ret != -EAGAIN)
        return ret;
    // Something is pending that the last look did not take (the EQ is read only now and then
    // while connected): take it all, and let the caller look again if it changed anything.
    changed_ = false;
    processEqLocked();
    processCqLocked();
    if (changed_) {
        wakeSleepersLocked();
        return -EAGAIN;
    }
    return armLocked();
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

std::string Connection::debugState()
{
    std::lock_guard<std::mutex> lock(mutex_);
    char buf[512];
    std::snprintf(buf, sizeof(buf),
                  "state=%d err=%d rx(w=%llu c=%llu) tx(tail=%llu posted=%llu done=%llu) "
                  "ops=%llu/%llu inflight=%llu inject=%d watched=%d sleepers=%zu peerShutWr=%d "
                  "closing=%d closed=%d rings(tx=%llu rx=%llu old=%llu peer=%llu grow=%d/%llu)",
                  static_cast<int>(state_), error_, (unsigned long long)rx_.written,
                  (unsigned long long)rx_.consumed, (unsigned long long)tx_.tail,
                  (unsigned long long)tx_.posted, (unsigned long long)tx_.done,
                  (unsigned long long)txHead_, (unsigned long long)txNext_,
                  (unsigned long long)writesInFlight_, int(injectPending_), int(watched_),
                  sleepers_.size(), int(peerShutWr_), int(closing_), int(closed_),
                  (unsigned long long)tx_.size, (unsigned long long)rx_.size,
                  (unsigned long long)rxOld_.readable(), (unsigned long long)peer_.ringSize(),
                  int(growSent_), (unsigned long long)switchTo_);
    return buf;
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
    i.sendGrowths = sendGrowths_;
    i.recvGrowths = recvGrowths_;
    i.unackedBytes = static_cast<uint32_t>(tx_.unsent() + tx_.inFlight());
    i.probes = kaUnanswered_;
    i.probesSent = kaSent_;
    return i;
}

bool Connection::flowState(FlowState *out)
{
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock())
        return false;
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
    return true;
}

int Connection::wait(int events, int timeoutMs)
{
    return waitFor(events, deadlineFor(timeoutMs));
}

int Connection::waitFor(int events, int64_t deadlineNs, bool progressed)
{
    const int64_t spinEnd = nowNs() + int64_t(settings_.pollUs) * 1000;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
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
        if (ready)
            return ready;
        if (!ep_)
            return -ENOTCONN;
        int64_t now = nowNs();
        if (deadlineNs && now >= deadlineNs)
            return 0;
        if (now < spinEnd) {
            lock.unlock();
            sched_yield();
            lock.lock();
            continue;
        }
        if (armLocked() == -EAGAIN) {
            processEqLocked();
            continue;
        }
        const int wakeFd = tWakeFd.fd();
        if (wakeFd < 0)
            return -ENOMEM;
        int64_t until = deadlineNs;
        if (state_ == State::Connecting && (!until || connectDeadlineNs_ < until))
            until = connectDeadlineNs_;
        int timeout = -1;
        if (until)
            timeout = static_cast<int>(std::max<int64_t>(0, (until - now + 999999) / 1000000));
        sleepers_.push_back(wakeFd);
        appSleeping_.fetch_add(1, std::memory_order_relaxed);
        lock.unlock();
        pollfd pfd[2] = {{waitFd_, POLLIN, 0}, {wakeFd, POLLIN, 0}};
        int n, saved;
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
            n = ::poll(pfd, 2, timeout);
            saved = errno;
        }
        if (pfd[1].revents & POLLIN)
            tWakeFd.drain();
        if (n < 0 && saved == EINTR)
            return -EINTR;
    }
}

ssize_t Connection::send(const void *buf, size_t len, int flags, int timeoutMs)
{
    iovec iov{const_cast<void *>(buf), len};
    return sendv(&iov, 1, flags, timeoutMs);
}

ssize_t Connection::sendv(const iovec *iov, int iovcnt, int flags, int timeoutMs)
{
    if (iovcnt < 0)
        return -EINVAL;
    const size_t total = iovTotal(iov, iovcnt);
    const int64_t deadline = deadlineFor(timeoutMs);
    std::lock_guard<std::mutex> sendLock(sendMutex_);
    size_t sent = 0;
    for (;;) {
        uint64_t pos, n;
        uint8_t *base;
        uint64_t size;
        bool drain = false;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            // A send without MSG_MORE takes what earlier ones held back with it.
            const bool more = flags & kMore;
            if (more_ != more) {
                more_ = more;
                if (!more)
                    flushLocked(false);
            }
            maybeGrowSendLocked();
            // With room for all of it already, progress can wait for the flush and the next
            // call: a ping-pong saves a CQ poll (a system call on tcp) per message.
            ssize_t space = peekSendLocked();
            if (space < 0 || uint64_t(space) < total - sent) {
                progressLocked();
                maybeGrowSendLocked();
                space = peekSendLocked();
            }
            if (space < 0)
                return sent ? static_cast<ssize_t>(sent) : space;
            if (total == 0)
                return 0;
            // The ring holds the application back while the peer's ring has more room: it
            // grows once its writes completed (blocking senders wait for that).
            if (uint64_t(space) < total - sent && growSend_ && tx_.size < sendReserve_ &&
                peer_.ringSize() > tx_.size)
                sendGrowWanted_ = true;
            drain = sendGrowWanted_ && !(flags & kNonBlock);
            n = drain ? 0 : std::min<uint64_t>(static_cast<uint64_t>(space), total - sent);
            pos = tx_.tail;
            base = sendBase_;
            size = tx_.size;
        }
        if (n == 0) {
            if (flags & kNonBlock)
                return sent ? static_cast<ssize_t>(sent) : -EAGAIN;
            int r = waitFor(drain ? kSendDrained : kWritable, deadline, true);
            if (r < 0)
                return sent ? static_cast<ssize_t>(sent) : r;
            if (r == 0)
                return sent ? static_cast<ssize_t>(sent) : -EAGAIN;
            continue;
        }
        copyRing(base, size, pos % size, iov, iovcnt, sent, n, true);
        {
            std::lock_guard<std::mutex> lock(mutex_);
            tx_.tail += n;
            flushLocked(false);
            // Held back to coalesce behind writes in flight: reap their completions now, as
            // the application may not call again soon.
            if (tx_.unsent() > 0 && !corkHeld_)
                progressLocked();
            watch();
        }
        sent += n;
        if (sent == total || (flags & kNonBlock))
            return static_cast<ssize_t>(sent);
    }
}

ssize_t Connection::recv(void *buf, size_t len, int flags, int timeoutMs)
{
    iovec iov{buf, len};
    return recvv(&iov, 1, flags, timeoutMs);
}

ssize_t Connection::recvv(const iovec *iov, int iovcnt, int flags, int timeoutMs)
{
    if (iovcnt < 0)
        return -EINVAL;
    const size_t total = iovTotal(iov, iovcnt);
    const int64_t deadline = deadlineFor(timeoutMs);
    std::lock_guard<std::mutex> recvLock(recvMutex_);
    size_t copied = 0;
    for (;;) {
        uint64_t n;
        ssize_t state;
        bool progressed = false;
        // The readable bytes: those left in the ring before the last growth, then the current
        // ring's. Taken under the lock; the bytes stay in place until consumed.
        struct Span
        {
            uint8_t *base;
            uint64_t size, off, len;
        } spans[2];
        {
            std::lock_guard<std::mutex> lock(mutex_);
            // Data already reaped is returned without another CQ poll; the next call polls.
            if (readableLocked() == 0) {
                progressLocked();
                progressed = true;
            }
            state = peekRecvLocked();
            n = state > 0 ? std::min<uint64_t>(state, total - copied) : 0;
            spans[0] = {rxOldBase_, rxOld_.size, 0, std::min(n, rxOld_.readable())};
            if (spans[0].len)
                spans[0].off = rxOld_.offset(rxOld_.consumed);
            spans[1] = {recvBase_, rx_.size, 0, n - spans[0].len};
            if (spans[1].len)
                spans[1].off = rx_.offset(rx_.consumed);
            // MSG_PEEK with MSG_WAITALL waits until the whole length can be peeked.
            if ((flags & kPeek) && (flags & kWaitAll) && state > 0 && uint64_t(state) < total)
                n = 0, state = -EAGAIN;
        }
        if (total == 0)
            return state < 0 && state != -EAGAIN ? state : 0;
        if (n == 0) {
            if (state <= 0 && state != -EAGAIN)
                return copied ? static_cast<ssize_t>(copied) : state;
            if ((flags & kNonBlock) || (copied && !(flags & kWaitAll)))
                return copied ? static_cast<ssize_t>(copied) : -EAGAIN;
            int r = waitFor(kReadable, deadline, progressed);
            if (r < 0)
                return copied ? static_cast<ssize_t>(copied) : r;
            if (r == 0)
                return copied ? static_cast<ssize_t>(copied) : -EAGAIN;
            continue;
        }
        for (size_t i = 0, done = 0; i < 2; done += spans[i].len, i++)
            if (spans[i].len)
                copyRing(spans[i].base, spans[i].size, spans[i].off, iov, iovcnt, copied + done,
                         spans[i].len, false);
        if (flags & kPeek)
            return static_cast<ssize_t>(n);
        {
            std::lock_guard<std::mutex> lock(mutex_);
            consumeLocked(n);
            sendCreditsLocked();
            watch();
        }
        copied += n;
        if (copied == total || !(flags & kWaitAll))
            return static_cast<ssize_t>(copied);
    }
}

int Connection::shutdown(int how)
{
    if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR)
        return -EINVAL;
    std::lock_guard<std::mutex> lock(mutex_);
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

void Connection::setCork(bool on)
{
    std::lock_guard<std::mutex> lock(mutex_);
    if (cork_ == on)
        return;
    cork_ = on;
    if (!on) {
        flushLocked(false);
        watch();
    }
}

void Connection::close(std::unique_ptr<Connection> conn)
{
    if (!conn)
        return;
    {
        std::lock_guard<std::mutex> lock(conn->mutex_);
        // The application may free its windows once it has closed the socket.
        conn->releaseWindowsLocked();
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
    std::lock_guard<std::mutex> lock(conn->mutex_);
    conn->releaseWindowsLocked();
    if (conn->state_ == State::Connected && !conn->error_ && !conn->closed_) {
        conn->sendWordLocked(wire::encodeCtrl(wire::Ctrl::Reset));
        conn->processCqLocked();
    }
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
    int ret = Domain::get(connreq, settings_.strict, &domain_);
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
    uint8_t hello[wire::kHelloSize];
    wire::encodeHello(localHello(), hello);
    ret = checkCmDataSize();
    if (ret < 0)
        return ret;
    connectStartNs_ = nowNs();
    ret = fi_accept(ep_, hello, sizeof(hello));
    if (ret)
        return fiErr(ret);
    state_ = State::Accepting;
    // A peer that never completes the handshake must not be progressed forever.
    connectDeadlineNs_ = connectStartNs_ + int64_t(settings_.connectTimeoutMs) * 1000000;
    watch();
    return 0;
}

// riomap windows: ours are registered regions announced to the peer with IOMAP records in the
// stream; the peer's are the records it sent us. riowrite() data goes through the send ring
// (so the caller's buffer is free again at once and needs no registration), as a plain RMA
// write posted behind the stream data before it.

bool Connection::overlapsLocalWindowLocked(uint64_t offset, uint64_t len) const
{
    for (const LocalWindow &w : windows_)
        if (w.mr && offset < w.offset + w.len && w.offset < offset + len)
            return true;
    return false;
}

const Connection::PeerWindow *Connection::findPeerWindowLocked(uint64_t offset, uint64_t len) const
{
    for (const PeerWindow &w : peerWindows_)
        if (w.length && offset >= w.offset && offset - w.offset < w.length &&
            len <= w.length - (offset - w.offset))
            return &w;
    return nullptr;
}

bool Connection::canWriteWindowLocked() const
{
    // Ordered behind everything queued before: stream data and window records all posted.
    return state_ == State::Connected && !error_ && !closed_ && tx_.unsent() == 0 &&
           recordQueue_.empty() && tx_.appendSpan() > 0 &&
           txNext_ - txHead_ + 1 + kTxReserve <= txCap_;
}

void Connection::releaseWindowsLocked()
{
    for (LocalWindow &w : windows_)
        if (w.mr)
            fi_close(&w.mr->fid);
    windows_.clear();
    recordQueue_.clear();
    std::fill(windowIdUsed_.begin(), windowIdUsed_.end(), false);
}

int Connection::mapWindow(void *buf, size_t len, bool remote, off_t offset, off_t *chosen)
{
    constexpr uint64_t kMaxOff = uint64_t(INT64_MAX);
    if (!buf || len == 0 || len > kMaxOff || offset < -1 ||
        (offset >= 0 && len > kMaxOff - uint64_t(offset)))
        return -EINVAL;
    std::lock_guard<std::mutex> lock(mutex_);
    progressLocked();
    if (error_)
        return error_;
    // An accepted connection still finishing its handshake knows the peer's hello already.
    if (state_ != State::Connected && state_ != State::Accepting)
        return -ENOTCONN;
    uint64_t off = reinterpret_cast<uintptr_t>(buf);
    if (offset >= 0) {
        off = uint64_t(offset);
        if (remote && overlapsLocalWindowLocked(off, len))
            return -EINVAL;
    } else if (remote && (off > kMaxOff - len || overlapsLocalWindowLocked(off, len))) {
        // The buffer's address is taken (or out of off_t's range): above every window.
        off = 0;
        for (const LocalWindow &w : windows_)
            if (w.mr)
                off = std::max<uint64_t>(off, alignUp(w.offset + w.len, 4096));
        if (off > kMaxOff - len)
            return -ENOMEM;
    } else if (!remote) {
        off &= kMaxOff;
    }
    windows_.reserve(windows_.size() + 1);
    fid_mr *mr = nullptr;
    uint32_t id = 0;
    if (remote) {
        auto it = std::find(windowIdUsed_.begin(), windowIdUsed_.end(), false);
        if (it == windowIdUsed_.end())
            return -ENOMEM; // the peer's table is full (its RDMA_IOMAPSIZE)
        id = static_cast<uint32_t>(it - windowIdUsed_.begin());
        int ret = registerRegion(buf, len, FI_REMOTE_WRITE, &mr);
        if (ret < 0)
            return ret;
        wire::IoMapRecord rec;
        rec.offset = off;
        rec.length = len;
        rec.addr = domain_->caps().virtAddr ? reinterpret_cast<uintptr_t>(buf) : 0;
        rec.key = fi_mr_key(mr);
        recordQueue_.push_back({id, rec});
        windowIdUsed_[id] = true;
    }
    windows_.push_back({buf, len, off, mr, id});
    flushLocked(false);
    watch();
    *chosen = static_cast<off_t>(off);
    return 0;
}

int Connection::unmapWindow(void *buf, size_t len)
{
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = std::find_if(windows_.begin(), windows_.end(),
                           [&](const LocalWindow &w) { return w.buf == buf && w.len == len; });
    if (it == windows_.end())
        return -EINVAL;
    if (it->mr) {
        // Closed at once: the memory is the application's again. A peer write racing with
        // this fails at the provider, which may reset the connection, as with rsockets.
        fi_close(&it->mr->fid);
        const uint32_t id = it->id;
        windowIdUsed_[id] = false;
        // An announcement still queued is dropped unsent; otherwise the peer is told. The
        // latest queued record of an id in use is its announcement, if any is queued.
        auto last = std::find_if(recordQueue_.rbegin(), recordQueue_.rend(),
                                 [&](const PendingRecord &p) { return p.id == id; });
        if (last != recordQueue_.rend() && last->rec.length != 0)
            recordQueue_.erase(std::next(last).base());
        else if (!error_ && (state_ == State::Connected || state_ == State::Accepting))
            recordQueue_.push_back({id, wire::IoMapRecord{}});
    }
    windows_.erase(it);
    flushLocked(false);
    watch();
    return 0;
}

ssize_t Connection::writeWindow(const void *buf, size_t len, off_t offset, int flags, int timeoutMs)
{
    if (offset < 0 || (len > 0 && !buf))
        return -EINVAL;
    const int64_t deadline = deadlineFor(timeoutMs);
    const auto *src = static_cast<const uint8_t *>(buf);
    std::lock_guard<std::mutex> sendLock(sendMutex_);
    const uint64_t maxChunk = std::clamp<uint64_t>(tx_.size / 4, 4096, 256 * 1024);
    size_t done = 0;
    for (;;) {
        const uint64_t at = uint64_t(offset) + done;
        uint64_t pos = 0, n = 0;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            progressLocked();
            // Stream data held back to coalesce or for the cork goes now: the write must
            // follow it.
            if (tx_.unsent() > 0 || !recordQueue_.empty())
                flushLocked(true, true);
            ssize_t space = peekSendLocked();
            if (space < 0)
                return done ? static_cast<ssize_t>(done) : space;
            if (len == 0)
                return 0;
            if (!findPeerWindowLocked(at, len - done))
                return done ? static_cast<ssize_t>(done) : -EINVAL;
            if (canWriteWindowLocked()) {
                n = std::min<uint64_t>({len - done, tx_.appendSpan(), maxChunk});
                pos = tx_.tail;
            }
        }
        if (n == 0) {
            if (flags & kNonBlock)
                return done ? static_cast<ssize_t>(done) : -EAGAIN;
            int r = waitFor(kWindowWritable, deadline, true);
            if (r < 0)
                return done ? static_cast<ssize_t>(done) : r;
            if (r == 0)
                return done ? static_cast<ssize_t>(done) : -EAGAIN;
            continue;
        }
        // Only this thread appends (sendMutex_), so the span stays ours while unlocked.
        std::memcpy(sendBase_ + tx_.offset(pos), src + done, n);
        {
            std::lock_guard<std::mutex> lock(mutex_);
            // The peer may have withdrawn the window, or the connection failed, meanwhile: look
            // again from the top.
            const PeerWindow *w = findPeerWindowLocked(at, n);
            if (!w || !canWriteWindowLocked() || tx_.tail != pos)
                continue;
            TxOp &op = txOps_[txNext_ % txCap_];
            op.len = n;
            op.seq = txNext_;
            op.done = false;
            ssize_t ret = fi_write(ep_, sendBase_ + tx_.offset(pos), n, localDesc_, 0,
                                   w->addr + (at - w->offset), w->key, &op.ctx);
            if (ret == -FI_EAGAIN) {
                progressLocked();
                continue;
            }
            if (ret) {
                failLocked(-ECONNRESET, "window write failed");
                return done ? static_cast<ssize_t>(done) : -ECONNRESET;
            }
            // Its ring space is released in order with the data around it.
            txNext_++;
            tx_.tail += n;
            tx_.posted += n;
            writesInFlight_++;
            bytesSent_.fetch_add(n, std::memory_order_relaxed);
            watch();
        }
        done += n;
        if (done == len)
            return static_cast<ssize_t>(done);
    }
}

} // namespace rstream
