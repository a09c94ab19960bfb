// SPDX-License-Identifier: MIT
// A connection's receive path: the CQ, the words the peer sends, the receive ring and recv().

#include "connection.h"
#include "connection_detail.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sys/mman.h>
#include <utility>

#include <rdma/fi_cm.h>

#include "clock.h"
#include "log.h"

namespace rstream {

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
    // A nonblocking call never waits: no clock read for it (a select() loop's every read).
    const int64_t deadline = deadlineFor(flags & kNonBlock ? -1 : timeoutMs);
    std::lock_guard<std::mutex> recvLock(recvMutex_);
    size_t copied = 0;
    for (;;) {
        if (shOn_.load(std::memory_order_acquire))
            return copied ? static_cast<ssize_t>(copied) : shRecvv(iov, iovcnt, flags, deadline);
        uint64_t n;
        ssize_t state;
        bool progressed = false;
        // The readable bytes: those left in the ring before the last growth, then the current
        // ring's. Taken under the lock; the bytes stay in place until consumed.
        struct Span
        {
            uint8_t *base;
            uint64_t size, off, len;
        } spans[4];
        int nspans = 0;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            // Data already reaped is returned without another CQ poll; the next call polls.
            // A blocking read of a connection left armed (quiet_signal.cpp: read dry, then only
            // sends the kernel took whole) whose spin has learnt to sleep at once: the sleep on
            // the wait fd looks, not a pass that finds nothing first (a paced server's every
            // request). What came meanwhile made the fd readable and ends the sleep at once.
            const bool sleepLooks = !(flags & kNonBlock) && timeoutMs != 0 &&
                                    armed_.load(std::memory_order_relaxed) && quietSignal_ &&
                                    !unverified_ && cqTaken_ && quietLocked() &&
                                    (settings_.pollUs == 0 || spin_.currentNs() == 0);
            // A nonblocking read soon after one that read the ring dry and left it armed (a
            // client that sends, reads until EAGAIN and polls, as memcslap's): EAGAIN without a
            // pass. The pass that brought the last bytes is at most kDryReadNs old, and what
            // came after it makes the armed fd readable for the poll that follows. Once: a
            // reader that reads on without polling gets the pass at its next read.
            const int64_t dryNs = std::exchange(dryReadNs_, 0);
            const bool dryAgain = dryNs && (flags & kNonBlock) &&
                                  armed_.load(std::memory_order_relaxed) && quietLocked() &&
                                  nowNs() - dryNs < kDryReadNs;
            if (readableLocked() == 0 && (sleepLooks || dryAgain)) {
                progressed = true; // the sleep looks, or the EAGAIN needs none
            } else if (readableLocked() == 0) {
                progressLocked();
                progressed = true;
                // Nothing came: armed without a pass of its own (quiet_signal.cpp), so that a
                // poll after this read checks the wait fd instead of making another pass.
                if (readableLocked() == 0)
                    lightArmLocked();
            }
            state = peekRecvLocked();
            n = state > 0 ? std::min<uint64_t>(state, total - copied) : 0;
            // Per ring: the bytes up to a rewind's padding, then those after it (ring.h).
            uint64_t want = n;
            for (auto [base, ring] : {std::pair{rxOldBase_, &rxOld_}, std::pair{recvBase_, &rx_}}) {
                const uint64_t first = std::min(want, ring->readableToPad());
                if (first)
                    spans[nspans++] = {base, ring->size, ring->offset(ring->consumed), first};
                const uint64_t second = std::min(want - first, ring->readableAfterPad());
                if (second)
                    spans[nspans++] = {base, ring->size, 0, second};
                want -= first + second;
            }
            // MSG_PEEK with MSG_WAITALL waits until the whole length can be peeked.
            if ((flags & kPeek) && (flags & kWaitAll) && state > 0 && uint64_t(state) < total)
                n = 0, state = -EAGAIN;
            // The old ring's pages stay while the copy below reads them, even if a RESET on
            // another thread discards its bytes meanwhile: the reader gets the bytes the peer
            // sent, never the zeros of pages handed back.
            rxCopying_ = n > 0;
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
        if (auto hook = testBeforeRecvCopy.load(std::memory_order_relaxed))
            hook(this);
        for (int i = 0, done = 0; i < nspans; done += spans[i].len, i++)
            copyRing(spans[i].base, spans[i].size, spans[i].off, iov, iovcnt, copied + done,
                     spans[i].len, false);
        if (flags & kPeek) {
            std::lock_guard<std::mutex> lock(mutex_);
            rxCopying_ = false;
            consumeLocked(0); // an old ring discarded during the copy goes now
            return static_cast<ssize_t>(n);
        }
        {
            std::lock_guard<std::mutex> lock(mutex_);
            rxCopying_ = false;
            consumeLocked(n);
            sendCreditsLocked();
            // Read dry since the last pass: armed without one (quiet_signal.cpp).
            if (readableLocked() == 0)
                lightArmLocked();
            dryReadNs_ =
                readableLocked() == 0 && armed_.load(std::memory_order_relaxed) ? nowNs() : 0;
            watch();
        }
        copied += n;
        if (copied == total || !(flags & kWaitAll))
            return static_cast<ssize_t>(copied);
    }
}

void Connection::progressLocked(bool app)
{
    // A same-host connection's endpoint only carried the setup.
    if (!ep_ || (state_ == State::Connected && shOn_.load(std::memory_order_relaxed)))
        return;
    // Written under mutex_: a plain increment, no locked instruction on the data path.
    progressCalls_.store(progressCalls_.load(std::memory_order_relaxed) + 1,
                         std::memory_order_relaxed);
    if (app) {
        appProgressNs_.store(nowNs(), std::memory_order_relaxed);
        armRingTimerLocked();
    }
    // Once connected the EQ only reports the endpoint going away, and reading it costs the tcp
    // provider a progress pass (a system call) of its own: the application's calls look at it
    // on every kEqInterval-th call only (waitFor() reads it before sleeping, and fi_trywait()
    // covers it). The progress thread always does: it may have taken the wait fd's signal that
    // the endpoint went away, and then nobody else would look (a poller slept on). Where the
    // endpoint going away flushes the posted receives with errors first (tcp up to 1.17, as
    // the light arm relies on), the CQ's error says when: the EQ is read right after it, and
    // not every kEqInterval-th call (one pass in 16 of a busy server's was that read).
    const bool eqFollowsCq = domain_->caps().levelWait && rxCount_ > 0;
    if (state_ != State::Connected || !app || (!eqFollowsCq && ++eqSkips_ >= kEqInterval)) {
        eqSkips_ = 0;
        processEqLocked();
    }
    processCqLocked();
    if (eqDue_ && state_ == State::Connected && app && eqFollowsCq)
        processEqLocked();
    if (state_ == State::Connected && !error_) {
        flushLocked(false);
        sendCreditsLocked();
        if (kaAckOwed_ && !closed_ &&
            sendWordLocked(wire::encodeCtrl(wire::Ctrl::KeepaliveAck)) == 0)
            kaAckOwed_ = false;
        // Posted after every write into the withdrawn windows (writeWindow() posts under this
        // lock, and looks the window up again first), so it reaches the peer behind them.
        while (unmappedOwed_ && !closed_ &&
               sendWordLocked(wire::encodeCtrl(wire::Ctrl::Unmapped)) == 0)
            unmappedOwed_--;
    }
    // Only keepalive needs the time of arrival: no clock read otherwise.
    if (ka_.takeWord() && ka_.on())
        ka_.onRx(nowNs());
    if ((state_ == State::Connecting || (state_ == State::Accepting && !error_)) &&
        nowNs() >= connectDeadlineNs_)
        failLocked(-ETIMEDOUT, "connect timed out");
    wakeSleepersLocked();
}

void Connection::processCqLocked()
{
    // Reading may take an event that the armed wait fd signalled (on verbs the CQ is then
    // disarmed until the next fi_trywait): the next look makes progress again.
    disarmLocked();
    cqDrained_ = cqTaken_ = false; // until a read finds it empty (armLocked())
    // The read's progress pass registers the POLLOUT of a send left unfinished.
    unverified_ = false;
    fi_cq_data_entry entries[16];
    for (int batch = 0; batch < kMaxBatches; batch++) {
        ssize_t n = fi_cq_read(cq_, entries, 16);
        if (n == -FI_EAGAIN) {
            cqDrained_ = cqTaken_ = true;
            return;
        }
        if (n == -FI_EAVAIL) {
            eqDue_ = true;
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
            if (TxOp *op = txOps_.find(err.op_context))
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
                if (TxOp *op = txOps_.find(e.op_context)) {
                    txOps_.onReported(*op);
                    onTxCompleteLocked(op);
                }
            }
        }
        // A short batch took all the CQ held after the read's progress pass: with the signal
        // quiet, what comes next shows in the socket (quiet_signal.cpp). Not drained as the
        // passive rounds mean it: the socket may hold more than a pass takes.
        if (n < 16) {
            cqTaken_ = true;
            return;
        }
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
    ka_.noteWord();
    local_.onSlotReposted();
    switch (m->op) {
    case wire::Op::Data: {
        if (m->rewind) {
            // The write landed at the start of the ring: the rest of it, from the current
            // position, is padding (ring.h). Only from a peer told it may (our hello), with no
            // padding unread (one at a time), and within its credit with room left after it.
            const uint64_t skip = rx_.offset(rx_.written) ? rx_.toEnd(rx_.written) : 0;
            if (!settings_.ringRewind || rx_.padLen ||
                rx_.written + skip - local_.reported() >= rx_.size) {
                failLocked(-ECONNRESET, "peer rewound the ring beyond its credit");
                return;
            }
            local_.onWritten(skip);
            local_.onConsumed(rx_.pad(skip));
        }
        uint64_t off = rx_.offset(rx_.written);
        // The peer may only write where we said there is room, and never across the end.
        if (peerShutWr_ || off + m->len > rx_.size ||
            rx_.written + m->len - local_.reported() > rx_.size) {
            failLocked(-ECONNRESET, "peer wrote outside its credit");
            return;
        }
        rx_.written += m->len;
        local_.onWritten(m->len);
        rxEvents_.fetch_add(1, std::memory_order_relaxed);
        bytesReceived_.fetch_add(m->len, std::memory_order_relaxed);
        if (closing_ && m->len <= closeAllowance_) {
            // Dropped, as allowAfterClose() asked: the shim's switch count, which the peer sent
            // before it saw the close. A reset for it would cost the peer what it has not read.
            closeAllowance_ -= m->len;
            RS_LOG(Debug, "%u bytes after close dropped (allowed)", m->len);
            local_.onConsumed(rx_.discardAll());
            break;
        }
        if (closing_) {
            // Data for a closed socket: the kernel answers with a reset, and so do we.
            sendWordLocked(wire::encodeCtrl(wire::Ctrl::Reset));
            failLocked(-ECONNRESET, "data arrived after close");
            return;
        }
        if (shutRd_) {
            // Discarded, as the kernel does after SHUT_RD, so the peer is not blocked.
            local_.onConsumed(rx_.discardAll());
        } else if (local_.peerStarved() && growth_.recvEnabled()) {
            // The peer has no room left, and what it wrote is (nearly all) unread: it waits for
            // room the application may only make after it has written (request before reply,
            // both ends writing first). The kernel would have buffered on; a bigger ring lets
            // the peer go on. (Not only when full to the byte: a few bytes read, too few to be
            // owed back, left both ends of a mid-stream switch waiting for each other.)
            maybeGrowRecvLocked(true);
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
            kaReceived_.fetch_add(1, std::memory_order_relaxed);
            break;
        case wire::Ctrl::KeepaliveAck:
            break; // any word is an answer: ka_.noteWord()
        case wire::Ctrl::Grow:
            onGrowLocked(m->arg);
            break;
        case wire::Ctrl::Switch:
            onSwitchLocked();
            break;
        case wire::Ctrl::Unmapped:
            onUnmappedLocked();
            break;
        }
        break;
    case wire::Op::IoMap:
        handleIoMapLocked(m->window, record);
        break;
    }
}

void Connection::consumeLocked(uint64_t n)
{
    // (Never past what was written: a reset may have discarded the bytes meanwhile.)
    uint64_t old = std::min(n, rxOld_.readable());
    rxOld_.consume(old); // (the old ring is credited no more)
    if (rxOld_.size && rxOld_.readable() == 0 && !rxCopying_) {
        // The old ring is done with: give its pages back (the peer writes the new one).
        madvise(rxOldBase_, rxOld_.size, MADV_DONTNEED);
        rxOld_ = RecvRing{};
        rxOldBase_ = nullptr;
    }
    uint64_t cur = std::min(n - old, rx_.readable());
    local_.onConsumed(rx_.consume(cur));
    if (growth_.onConsumed(old + cur, rx_.size))
        maybeGrowRecvLocked();
}

void Connection::discardReadableLocked()
{
    consumeLocked(readableLocked());
}

} // namespace rstream
