// SPDX-License-Identifier: MIT
// A connection's send path: the send ring, the queue of posted operations, control words, cork.

#include "connection.h"
#include "connection_detail.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <rdma/fi_rma.h>

#include "clock.h"
#include "crash.h"
#include "progress.h"
#include "provider_sends.h"

namespace rstream {

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
    // A nonblocking call never waits: no clock read for it (a select() loop's every read).
    const int64_t deadline = deadlineFor(flags & kNonBlock ? -1 : timeoutMs);
    std::lock_guard<std::mutex> sendLock(sendMutex_);
    size_t sent = 0;
    for (;;) {
        if (shOn_.load(std::memory_order_acquire))
            return sent ? static_cast<ssize_t>(sent) : shSendv(iov, iovcnt, flags, deadline);
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
            drain = growth_.onSendSpace(uint64_t(space), total - sent, tx_.size, sendReserve_,
                                        peer_.ringSize()) &&
                    !(flags & kNonBlock);
            n = drain ? 0 : std::min<uint64_t>(static_cast<uint64_t>(space), total - sent);
            // An empty send ring starts again at its beginning (positions only count: nothing
            // in it is referenced), as the peer's ring does (kDataRewind), so that small
            // messages keep to its first pages.
            if (n > 0 && settings_.ringRewind && tx_.tail == tx_.done && tx_.offset(tx_.tail))
                tx_.tail = tx_.posted = tx_.done = tx_.tail + tx_.toEnd(tx_.tail);
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
            // Less than a third free (no POLLOUT) with writes left armed: a poller waiting for
            // room must make the pass that takes their completions (noteTxPostedLocked()).
            if (quietSignal_ && !unverified_ && !txOps_.empty() && tx_.shortOfRoom()) {
                unverified_ = true;
                disarmLocked();
            }
            // Held back to coalesce behind writes in flight: reap their completions now, as
            // the application may not call again soon.
            if (tx_.unsent() > 0 && !corkHeld_)
                progressLocked();
            else if (!txOps_.empty() && domain_->caps().placesInCalls && reapAfterSendLocked() &&
                     txOps_.head() < untakenNext_) {
                processCqLocked();
                wakeSleepersLocked(); // what the read took, a sleeper's fd no longer shows
            }
            watch();
        }
        sent += n;
        if (sent == total || (flags & kNonBlock))
            return static_cast<ssize_t>(sent);
    }
}

bool Connection::reapAfterSendLocked()
{
    // A provider that sends inside the call (tcp) has queued the completion of a write that
    // went out whole. Left for the application's next call, it got the progress thread's pass
    // a millisecond later whenever that call came later still: a server busy with its other
    // connections (nginx with 50 clients, for 45 % of its answers; the pass also took the
    // client's next request, and the server needed waking for it). A connection written to
    // now and then reaps it at once; one written to steadily (a stream, a ping-pong) leaves it
    // to its next call, which comes soon (reaping after each 64 KiB write cost a stream 30 %).
    // Writes whose sends the kernel was seen to take whole (provider_sends.h) are left to the
    // next call too: the progress thread waits as long for them as for injects
    // (onlyLeftSendsPendingLocked()), and the server's next look, which takes the next request,
    // takes them with it (nginx: a pass a request less).
    const int64_t now = nowNs();
    const bool pause = now - lastSendNs_ >= kAppIdleNs;
    lastSendNs_ = now;
    return pause;
}

void Connection::onTxCompleteLocked(TxOp *op)
{
    txEvents_.fetch_add(1, std::memory_order_relaxed);
    TxOpRing::complete(op);
    changed_ = true;
    while (TxOp *head = txOps_.doneHead()) {
        if (!RS_CHECK(head->len <= tx_.posted - tx_.done)) {
            failLocked(-ECONNRESET, "internal error");
            return;
        }
        if (head->record)
            recordsDone_++; // ops leave in order, and so do the record buffers
        tx_.done += txOps_.release();
    }
}

int Connection::sendWordLocked(uint32_t word)
{
    if (!peer_.canSendCtrl() || !txOps_.hasRoom(1))
        return -EAGAIN;
    TxOp &op = txOps_.prepare(0);
    ssize_t ret;
    // A word the kernel took whole leaves nothing in the provider, as a data write's
    // (flushLocked()): the progress thread need not look before the application has gone
    // quiet. Unseen, each credit return watched its connection at once, and woke the thread
    // if it slept (a server answering 64 B requests on 50 connections: 7-12 wake-ups per 1,000
    // requests, for a look that found the application busy; 0.2-0.5 since).
    bool sentWhole = false;
    {
        ProviderSendScope sends;
        if (iwarp_) {
            uint32_t &src = ctrlWords_[txOps_.nextIndex()];
            src = word;
            ret = fi_send(ep_, &src, sizeof(src), localDesc_, 0, &op.ctx);
        } else {
            ret = fi_senddata(ep_, nullptr, 0, nullptr, word, 0, &op.ctx);
        }
        sentWhole = sends.allTaken();
    }
    if (ret == -FI_EAGAIN)
        return -EAGAIN;
    if (ret) {
        failLocked(-ECONNRESET, "send failed");
        return -ECONNRESET;
    }
    txOps_.commit();
    noteTxPostedLocked(sentWhole);
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

void Connection::flushLocked(bool force, bool uncork)
{
    if (state_ != State::Connected || error_ || closed_)
        return;
    if (const uint64_t switchTo = growth_.switchTo()) {
        // The peer's GROW: SWITCH goes between our last write into its old ring and the first
        // into the new one, which follows the old one in memory, in a registration of its own.
        if (sendWordLocked(wire::encodeCtrl(wire::Ctrl::Switch)) < 0)
            return;
        peerRingAddr_ = domain_->caps().virtAddr ? peerRingAddr_ + peer_.ringSize() : 0;
        peerKey_ = keyOfSize(wire::nextRingKey(peerKey_));
        peer_.switchRing(switchTo);
        growth_.onSwitchSent();
    }
    if (!flushRecordsLocked())
        return;
    const uint32_t opsPerChunk = iwarp_ ? 2 : 1;
    const uint64_t maxChunk =
        std::clamp<uint64_t>(std::min(peer_.ringSize(), tx_.size) / 4, 4096, 256 * 1024);
    // Small sends coalesce while earlier writes are in flight; the completion flushes them.
    // Injected writes have no completion: behind them, small sends coalesce once half the
    // peer's slots are out, and the CREDIT that is then sure to come flushes them (a stream
    // of 64 B writes took a slot, a write and a completion at the peer for each).
    // A send of kCoalesceMax or more is worth a write of its own at once: holding it back
    // costs a CQ poll (a system call on tcp) per send, and the copy into the ring gets cold.
    const uint64_t coalesceBelow = std::min(maxChunk / 2, kCoalesceMax);
    // TCP_CORK and MSG_MORE: full writes only, until the data has waited kCorkMaxNs.
    bool corked = (cork_ || more_) && !uncork && !closing_ && !shutWr_;
    if (corked && corkSinceNs_ && nowNs() - corkSinceNs_ >= kCorkMaxNs)
        corked = false;
    corkHeld_ = false;
    bool postedAny = false;
    while (tx_.unsent() > 0 && peer_.canSendData() && txOps_.hasRoom(opsPerChunk + kTxReserve)) {
        if (corked && tx_.unsent() < maxChunk) {
            corkHeld_ = true;
            if (!corkSinceNs_) {
                corkSinceNs_ = nowNs();
                ProgressThread::instance().schedule(this, corkSinceNs_ + kCorkMaxNs);
            }
            break;
        }
        if (!force && tx_.unsent() < coalesceBelow &&
            (txOps_.writesInFlight() > 0 || peer_.halfSlotsOut()))
            break;
        // Chunks let the peer read and return room while the rest is on its way: that pays
        // only when more is unsent than its ring has room for. What fits goes whole when
        // nothing is in flight: a 16 KiB message to a quiet peer with a 32 KiB ring went as
        // two writes, two completions and, for a reader that wanted all of it, two wake-ups
        // (sockperf's 16 KiB ping-pong at 1.7 x kernel TCP's latency).
        const uint64_t chunk = txOps_.writesInFlight() == 0 && tx_.unsent() <= peer_.ringAvail()
                                   ? std::max(maxChunk, std::min(tx_.unsent(), kWholeWriteMax))
                                   : maxChunk;
        // A write that fits at the start of the peer's ring, past the room it is owed back,
        // goes there (wire.h, kDataRewind), with the rest of the ring as padding: small
        // messages then keep to the ring's first pages, which stay resident and in cache,
        // instead of cycling through all of it (a ring touched whole by a request/response
        // connection kept all its pages for good). A large write only when it would otherwise
        // be cut at the ring's end: streaming, padding would only take room from the next one.
        const uint64_t need = std::min(tx_.unsent(), chunk);
        const uint64_t skip = peerRewind_ ? peer_.rewindSkip() : 0;
        const bool rewind = skip && peer_.ringAvail() > skip && peer_.ringAvail() - skip >= need &&
                            (need <= kRewindMax || need > skip);
        const uint64_t dstOff = rewind ? 0 : peer_.written() % peer_.ringSize();
        // (The padding takes skip bytes of the credit: what is left after it bounds the write.)
        uint64_t len = std::min({tx_.unsent(), tx_.toEnd(tx_.posted), peer_.ringSize() - dstOff,
                                 peer_.ringAvail() - (rewind ? skip : 0), chunk});
        uint64_t srcOff = tx_.offset(tx_.posted);
        uint64_t dst = peerRingAddr_ + dstOff;
        const auto encoded = wire::encodeData(static_cast<uint32_t>(len), rewind);
        if (!RS_CHECK(encoded)) {
            failLocked(-ECONNRESET, "internal error");
            return;
        }
        const uint32_t word = *encoded;
        TxOp &op = txOps_.prepare(len);
        ssize_t ret;
        bool injectLeft = false, writeWhole = false;
        // A write the provider can inject needs no completion: its ring space is free again
        // at once, and nothing wakes either side for it.
        const bool inject = !iwarp_ && len <= injectSize_;
        if (iwarp_) {
            ret = fi_write(ep_, sendBase_ + srcOff, len, localDesc_, 0, dst, peerKey_, &op.ctx);
            if (ret == 0) {
                txOps_.commit();
                TxOp &note = txOps_.prepare(0);
                uint32_t &src = ctrlWords_[txOps_.nextIndex()];
                src = word;
                // The write is ordered before this send: its completion at the peer means the
                // data is in place.
                do {
                    ret = fi_send(ep_, &src, sizeof(src), localDesc_, 0, &note.ctx);
                    if (ret == -FI_EAGAIN)
                        processCqLocked();
                } while (ret == -FI_EAGAIN && !error_);
                if (ret == 0)
                    txOps_.commit();
            }
        } else if (inject) {
            ProviderSendScope sends;
            ret = fi_inject_writedata(ep_, sendBase_ + srcOff, len, word, 0, dst, peerKey_);
            if (ret == 0)
                txOps_.commit();
            injectLeft = sends.allTaken();
        } else {
            ProviderSendScope sends;
            ret = fi_writedata(ep_, sendBase_ + srcOff, len, localDesc_, word, 0, dst, peerKey_,
                               &op.ctx);
            if (ret == 0)
                txOps_.commit();
            writeWhole = sends.allTaken();
        }
        if (ret == -FI_EAGAIN)
            break;
        if (ret) {
            failLocked(-ECONNRESET, "write failed");
            return;
        }
        tx_.posted += len;
        // An inject the kernel took whole has left the provider: nothing of it is to verify
        // or to wait for (provider_sends.h).
        if (!injectLeft)
            noteTxPostedLocked(writeWhole);
        if (rewind) {
            peer_.onRewind();
            rewinds_.fetch_add(1, std::memory_order_relaxed);
        }
        peer_.onDataSent(len);
        txOps_.countWrite();
        bytesSent_.fetch_add(len, std::memory_order_relaxed);
        postedAny = true;
        if (inject) {
            if (!injectLeft)
                txOps_.onInject(op);
            onTxCompleteLocked(&op);
        }
    }
    // The idle timer of the send ring runs from the last bytes sent, whoever sent them: the
    // rest of a send that waited for the peer's credit goes out from the progress thread, after
    // the application's last call (the timer was armed only there, and a 64 KiB send that
    // needed no wait after its first write kept its ring for good).
    if (postedAny)
        armRingTimerLocked();
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

void Connection::setCork(bool on)
{
    std::lock_guard<std::mutex> lock(mutex_);
    if (cork_ == on)
        return;
    cork_ = on;
    if (!on && shOn_.load(std::memory_order_relaxed)) {
        sh_->flush();
        corkSinceNs_ = 0;
        return;
    }
    if (!on) {
        flushLocked(false);
        watch();
    }
}

} // namespace rstream
