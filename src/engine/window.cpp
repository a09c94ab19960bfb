// SPDX-License-Identifier: MIT
// riomap windows: ours are registered regions announced to the peer with IOMAP records in the
// stream; the peer's are the records it sent us. riowrite() data goes through the send ring
// (so the caller's buffer is free again at once and needs no registration), as a plain RMA
// write posted behind the stream data before it.

#include "connection.h"
#include "connection_detail.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <vector>

#include <rdma/fi_rma.h>

#include "clock.h"
#include "log.h"

namespace rstream {

int Connection::mapWindow(void *buf, size_t len, bool remote, off_t offset, off_t *chosen)
{
    constexpr uint64_t kMaxOff = uint64_t(INT64_MAX);
    if (!buf || len == 0 || len > kMaxOff || offset < -1 ||
        (offset >= 0 && len > kMaxOff - uint64_t(offset)))
        return -EINVAL;
    // Windows are the fabric's remote writes; the peer's memory on this host is not shared.
    if (shOn_.load(std::memory_order_acquire))
        return -EOPNOTSUPP;
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
        if (remote && windows_.overlapsLocal(off, len))
            return -EINVAL;
    } else if (remote && (off > kMaxOff - len || windows_.overlapsLocal(off, len))) {
        // The buffer's address is taken (or out of off_t's range): above every window.
        off = windows_.offsetAboveLocal();
        if (off > kMaxOff - len)
            return -ENOMEM;
    } else if (!remote) {
        off &= kMaxOff;
    }
    windows_.reserveLocal();
    fid_mr *mr = nullptr;
    uint32_t id = 0;
    if (remote) {
        if (!windows_.freeId(&id))
            return -ENOMEM; // the peer's table is full (its RDMA_IOMAPSIZE)
        int ret = registerRegion(buf, len, FI_REMOTE_WRITE, &mr);
        if (ret < 0)
            return ret;
        wire::IoMapRecord rec;
        rec.offset = off;
        rec.length = len;
        rec.addr = domain_->caps().virtAddr ? reinterpret_cast<uintptr_t>(buf) : 0;
        rec.key = fi_mr_key(mr);
        windows_.addRemote({buf, len, off, mr, id}, rec);
    } else {
        windows_.addLocal({buf, len, off, mr, id});
    }
    flushLocked(false);
    watch();
    *chosen = static_cast<off_t>(off);
    return 0;
}

int Connection::unmapWindow(void *buf, size_t len)
{
    std::unique_lock<std::mutex> lock(mutex_);
    LocalWindow *w = windows_.findLocal(buf, len);
    if (!w)
        return -EINVAL;
    fid_mr *mr = w->mr;
    withdrawLocked(lock, windows_.removeLocal(w, peerMayWriteLocked()) ? 1 : 0);
    // The peer never knew the window, has answered for it, or can write no more (its endpoint
    // is down): the memory is the application's again.
    if (mr)
        fi_close(&mr->fid);
    return 0;
}

bool Connection::peerMayWriteLocked() const
{
    return (state_ == State::Connected || state_ == State::Accepting) && !error_ && !closed_ && ep_;
}

void Connection::withdrawLocked(std::unique_lock<std::mutex> &lock, uint32_t queued)
{
    if (queued == 0)
        return;
    withdrawalsQueued_ += queued;
    flushLocked(false);
    watch();
    // The provider may still be placing a write the peer posted before it learned of the
    // withdrawal (the tcp provider checks a write's key when its header arrives and then keeps
    // receiving its payload into that memory): only the peer's UNMAPPED, which its provider
    // delivers behind those writes, or an endpoint that is down, says none can land any more.
    const uint64_t want = withdrawalsQueued_;
    const int64_t deadline = deadlineFor(settings_.unmapTimeoutMs);
    while (withdrawalsAnswered_ < want && peerMayWriteLocked()) {
        if (nowNs() >= deadline) {
            RS_LOG(Info, "peer did not answer a window withdrawal within %d ms: reset",
                   settings_.unmapTimeoutMs);
            sendWordLocked(wire::encodeCtrl(wire::Ctrl::Reset));
            failLocked(-ECONNRESET, "window withdrawal unanswered");
            break;
        }
        lock.unlock();
        // (Interrupted by a signal: look again; the memory may not go back before the answer.)
        waitFor(kWithdrawn, deadline);
        lock.lock();
    }
}

ssize_t Connection::writeWindow(const void *buf, size_t len, off_t offset, int flags, int timeoutMs)
{
    if (offset < 0 || (len > 0 && !buf))
        return -EINVAL;
    if (shOn_.load(std::memory_order_acquire))
        return -EINVAL; // no window can exist (mapWindow() refused them)
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
            if (tx_.unsent() > 0 || !windows_.recordsEmpty())
                flushLocked(true, true);
            ssize_t space = peekSendLocked();
            if (space < 0)
                return done ? static_cast<ssize_t>(done) : space;
            if (len == 0)
                return 0;
            if (!windows_.findPeer(at, len - done))
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
            const PeerWindow *w = windows_.findPeer(at, n);
            if (!w || !canWriteWindowLocked() || tx_.tail != pos)
                continue;
            TxOp &op = txOps_.prepare(n);
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
            txOps_.commit();
            noteTxPostedLocked();
            tx_.tail += n;
            tx_.posted += n;
            txOps_.countWrite();
            bytesSent_.fetch_add(n, std::memory_order_relaxed);
            watch();
        }
        done += n;
        if (done == len)
            return static_cast<ssize_t>(done);
    }
}

bool Connection::canWriteWindowLocked() const
{
    // Ordered behind everything queued before: stream data and window records all posted.
    return state_ == State::Connected && !error_ && !closed_ && tx_.unsent() == 0 &&
           windows_.recordsEmpty() && tx_.appendSpan() > 0 && txOps_.hasRoom(1 + kTxReserve);
}

void Connection::releaseWindowsLocked(std::unique_lock<std::mutex> &lock)
{
    // As riounmap() for each: withdrawn in the stream, answered, then closed.
    std::vector<fid_mr *> mrs;
    for (const LocalWindow &w : windows_.local())
        if (w.mr)
            mrs.push_back(w.mr);
    withdrawLocked(lock, windows_.removeAllLocal(peerMayWriteLocked()));
    for (fid_mr *mr : mrs)
        fi_close(&mr->fid);
}

void Connection::handleIoMapLocked(uint32_t id, const uint8_t *record)
{
    const char *why = nullptr;
    const int r = windows_.onPeerRecord(id, record, domain_->caps().virtAddr, &why);
    if (r < 0)
        failLocked(-ECONNRESET, why);
    else if (r == 1)
        unmappedOwed_++; // sent by progressLocked(), behind every write into the window
}

void Connection::onUnmappedLocked()
{
    if (withdrawalsAnswered_ >= withdrawalsSent_) {
        failLocked(-ECONNRESET, "UNMAPPED for no withdrawal");
        return;
    }
    withdrawalsAnswered_++;
}

bool Connection::flushRecordsLocked()
{
    // Window records go before any stream data queued after them: data the application sends
    // after riomap() must find the window known at the peer. They take a message slot each,
    // like data, so the slots kept for credits stay free.
    while (!windows_.recordsEmpty()) {
        if (peer_.slots() <= kReservedSlots || !txOps_.hasRoom(1 + kTxReserve) ||
            recordsPosted_ - recordsDone_ >= kRecordBufs)
            return false;
        const PendingRecord &p = windows_.nextRecord();
        const uint32_t word = *wire::encodeIoMap(p.id);
        uint8_t *buf = recordBufs_ + (recordsPosted_ % kRecordBufs) * kRecordSlotBytes;
        TxOp &op = txOps_.prepare(0);
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
        txOps_.commit();
        noteTxPostedLocked();
        recordsPosted_++;
        if (p.rec.length == 0)
            withdrawalsSent_++;
        peer_.onCtrlSent();
        windows_.popRecord();
    }
    return true;
}

} // namespace rstream
