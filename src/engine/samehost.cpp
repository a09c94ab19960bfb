// SPDX-License-Identifier: MIT
// The same-host link's data path: the rings' copies in and out, checked indices, the rings'
// growth, readiness and wake-ups (the region itself: samehost_region.cpp).

#include "samehost.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <unistd.h>

#include "connection_detail.h"
#include "kernel.h"
#include "log.h"

namespace rstream {

namespace {
// An empty ring starts again at offset 0 once its bytes reach this far into it: a page, so that
// small messages keep to the first two and the rebase costs a store only now and then.
constexpr uint64_t kRebaseAfter = 4096;
// Only for a write of at most this much, as the fabric's rewinds (kRewindMax). A stream's ring
// is read empty whenever its reader catches up: the lines it just read are in the reader's
// cache, and writing them again at once made each store take the line back from the other
// core. iperf3 -P 4 with 64 KiB writes, the two ends on two CPUs, ran at 16 GB/s at most rebasing
// against up to 33 without; 4 KiB writes gained by it (8-9 against 2-8 GB/s).
constexpr uint64_t kRebaseMaxWrite = 16 * 1024;
void storeMax(std::atomic<uint64_t> &a, uint64_t v)
{
    uint64_t cur = a.load(std::memory_order_relaxed);
    // Release: a thread that reads v here reads the peer's word it came from as new or newer.
    while (cur < v &&
           !a.compare_exchange_weak(cur, v, std::memory_order_release, std::memory_order_relaxed)) {
    }
}
} // namespace

void SameHostLink::corrupt(const char *what)
{
    int expected = 0;
    if (err_.compare_exchange_strong(expected, -ECONNRESET)) {
        RS_LOG(Warn, "same-host peer wrote a bad %s: connection reset", what);
        myFlags_.fetch_or(shm::kReset);
        tx_->flags.v.store(myFlags_.load(), std::memory_order_release);
        wakePeer();
    }
}

void SameHostLink::wakePeer()
{
    if (wakeFd_ < 0)
        return;
    // A full pipe already holds a wake-up. Never EPIPE: this end reads the pipe too.
    const char b = 0;
    (void)sys::write(wakeFd_, &b, 1);
}

uint64_t SameHostLink::peerFlags()
{
    const uint64_t f = rx_->flags.v.load(std::memory_order_acquire);
    if (f & ~shm::kKnownFlags) {
        corrupt("flag");
        return 0;
    }
    // Flags are never taken back: what was seen once stays.
    return peerFlagsSeen_.fetch_or(f, std::memory_order_relaxed) | f;
}

size_t SameHostLink::write(const iovec *iov, int iovcnt, size_t skip, size_t len, bool hold)
{
    if (err_.load(std::memory_order_relaxed) || myFlags_.load(std::memory_order_relaxed))
        return 0;
    // What other threads saw is read before the peer's word: a look that stored a newer head
    // after ours was read must not make ours look like a step back.
    const uint64_t seen = txHeadSeen_.load(std::memory_order_acquire);
    const uint64_t tail = txTail_.load(std::memory_order_relaxed);
    const uint64_t head = tx_->head.v.load(std::memory_order_acquire);
    if (head < seen || head > tail) {
        corrupt("head index");
        return 0;
    }
    storeMax(txHeadSeen_, head);
    // Read whole and a page or more past where its bytes last started: the next start at the
    // ring's beginning again (samehost.h). Nothing is held back either (head == tail), so the
    // peer reads no byte of the old placement after this.
    uint64_t size = txSize_.load(std::memory_order_relaxed);
    uint64_t base = txBase_.load(std::memory_order_relaxed);
    const uint64_t growAt = txGrowAt_.load(std::memory_order_relaxed);
    if (rebase_.load(std::memory_order_relaxed) && head == tail && len <= kRebaseMaxWrite &&
        offsetOf(tail, base, txInit_, size, growAt) >= kRebaseAfter) {
        tx_->tail.rebaseAt.store(tail, std::memory_order_relaxed); // before tail (release)
        txBase_.store(base = tail, std::memory_order_relaxed);
    }
    uint64_t max = txMaxTail(head);
    if (max < tail + len && txGrowTo_.load(std::memory_order_relaxed) > txSize_.load()) {
        grow(tail); // full: a bulk writer, or a peer that leaves its bytes unread for now
        max = txMaxTail(head);
    }
    const uint64_t n = std::min<uint64_t>(len, max > tail ? max - tail : 0);
    if (n == 0)
        return 0;
    // Every write after a growth is past its position: the bigger ring's place for it.
    size = txSize_.load(std::memory_order_relaxed);
    const uint64_t off =
        offsetOf(tail, base, txInit_, size, txGrowAt_.load(std::memory_order_relaxed));
    copyRing(txRing_, size, off, iov, iovcnt, skip, n, true);
    txTail_.store(tail + n, std::memory_order_release);
    if (!hold) {
        publish(tail + n);
    } else {
        const uint64_t frame = std::clamp<uint64_t>(size / 4, 4096, 256 * 1024);
        const uint64_t pub = txPublished_.load(std::memory_order_relaxed);
        if (tail + n - pub >= frame)
            publish(pub + (tail + n - pub) / frame * frame);
    }
    return n;
}

uint64_t SameHostLink::txMaxTail(uint64_t head) const
{
    const uint64_t size = txSize_.load(std::memory_order_acquire);
    if (size == txInit_)
        return head + size;
    // Until the peer read past the growth, the bytes before it hold the first ring's place.
    const uint64_t at = txGrowAt_.load(std::memory_order_relaxed);
    return head < at ? at + size - txInit_ : head + size;
}

void SameHostLink::allowGrowth(uint64_t upTo)
{
    const uint64_t to = upTo ? std::min(txCap_, std::bit_ceil(std::max(upTo, shm::kMinRing))) : 0;
    txGrowTo_.store(to > txInit_ ? to : 0, std::memory_order_relaxed);
}

void SameHostLink::grow(uint64_t tail)
{
    // Only ever once, and only from the sender (one at a time): the peer's view of where each
    // byte is rests on a single growth.
    const uint64_t to = txGrowTo_.exchange(0, std::memory_order_relaxed);
    if (to <= txInit_ || txSize_.load(std::memory_order_relaxed) != txInit_)
        return;
    tx_->growAt.v.store(tail, std::memory_order_relaxed);
    // Before any tail past it is published (publish() stores tail with release after this).
    tx_->grownLog2.v.store(std::countr_zero(to), std::memory_order_release);
    txGrowAt_.store(tail, std::memory_order_relaxed);
    txSize_.store(to, std::memory_order_release);
}

bool SameHostLink::adoptRxGrowth()
{
    std::lock_guard<std::mutex> lock(rxGrowMutex_);
    if (rxSize_.load(std::memory_order_relaxed) != rxInit_)
        return true;
    const uint64_t log2 = rx_->grownLog2.v.load(std::memory_order_acquire);
    const uint64_t at = rx_->growAt.v.load(std::memory_order_relaxed);
    const uint64_t head = rxHead_.load(std::memory_order_acquire);
    // An honest peer grew with at most a first ring's worth unread, and this end cannot have
    // read past the growth before taking it on.
    if (log2 >= 63 || (1ull << log2) <= rxInit_ || (1ull << log2) > rxCap_ || at < head ||
        at - head > rxInit_) {
        corrupt("ring growth");
        return false;
    }
    rxGrowAt_.store(at, std::memory_order_relaxed);
    rxSize_.store(1ull << log2, std::memory_order_release);
    return true;
}

uint64_t SameHostLink::rxMaxTail(uint64_t head)
{
    // Called after the tail was read (acquire): a growth published before it is seen here.
    if (rxSize_.load(std::memory_order_acquire) == rxInit_) {
        if (!rx_->grownLog2.v.load(std::memory_order_acquire))
            return head + rxInit_;
        if (!adoptRxGrowth())
            return 0;
    }
    const uint64_t size = rxSize_.load(std::memory_order_acquire);
    const uint64_t at = rxGrowAt_.load(std::memory_order_relaxed);
    return head < at ? at + size - rxInit_ : head + size;
}

void SameHostLink::copyOut(uint64_t head, const iovec *iov, int iovcnt, size_t skip, size_t n)
{
    const uint64_t size = rxSize_.load(std::memory_order_acquire);
    const uint64_t base = rxBase_.load(std::memory_order_relaxed);
    if (size == rxInit_) {
        copyRing(rxRing_, size, offsetOf(head, base, rxInit_, size, 0), iov, iovcnt, skip, n,
                 false);
        return;
    }
    // The bytes before a growth made after the last rebase are in the first ring's place.
    const uint64_t at = rxGrowAt_.load(std::memory_order_relaxed);
    const uint64_t first = head < at && at > base ? std::min<uint64_t>(n, at - head) : 0;
    if (first)
        copyRing(rxRing_, rxInit_, offsetOf(head, base, rxInit_, size, at), iov, iovcnt, skip,
                 first, false);
    if (n > first)
        copyRing(rxRing_, size, offsetOf(head + first, base, rxInit_, size, at), iov, iovcnt,
                 skip + first, n - first, false);
}

void SameHostLink::publish(uint64_t pos)
{
    {
        std::lock_guard<std::mutex> lock(pubMutex_);
        if (pos <= txPublished_.load(std::memory_order_relaxed))
            return;
        txPublished_.store(pos, std::memory_order_relaxed);
        tx_->tail.v.store(pos, std::memory_order_release);
    }
    // Against the reader's store of readerWaiting and its look at tail (both seq_cst).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (tx_->readerWaiting.v.load(std::memory_order_relaxed) &&
        tx_->readerWaiting.v.exchange(0, std::memory_order_acq_rel))
        wakePeer();
}

uint64_t SameHostLink::held() const
{
    return txTail_.load(std::memory_order_acquire) - txPublished_.load(std::memory_order_relaxed);
}

void SameHostLink::flush()
{
    publish(txTail_.load(std::memory_order_acquire));
}

size_t SameHostLink::read(const iovec *iov, int iovcnt, size_t skip, size_t len, bool peek)
{
    if (err_.load(std::memory_order_relaxed))
        return 0;
    const uint64_t seen = rxTailSeen_.load(std::memory_order_acquire); // before tail, as above
    const uint64_t head = rxHead_.load(std::memory_order_relaxed);
    const uint64_t tail = rx_->tail.v.load(std::memory_order_acquire);
    const uint64_t max = rxMaxTail(head);
    if (tail < seen || tail < head || tail > max) {
        corrupt("tail index");
        return 0;
    }
    storeMax(rxTailSeen_, tail);
    // A rebase published with (or before) this tail: stored while the ring was empty, so only
    // at the position this end has read up to.
    if (const uint64_t at = rx_->tail.rebaseAt.load(std::memory_order_relaxed);
        at != rxBase_.load(std::memory_order_relaxed)) {
        if (at != head) {
            corrupt("rebase index");
            return 0;
        }
        rxBase_.store(at, std::memory_order_relaxed);
    }
    const uint64_t n = std::min<uint64_t>(len, tail - head);
    if (n == 0)
        return 0;
    copyOut(head, iov, iovcnt, skip, n);
    if (peek)
        return n;
    rxHead_.store(head + n, std::memory_order_release);
    rx_->head.v.store(head + n, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (const uint64_t want = rx_->writerWaiting.v.load(std::memory_order_relaxed)) {
        // The peer's word: any value only decides when it is woken, and an empty ring (room
        // for all of it) always does. The tail read here is at least what was read above.
        const uint64_t now = rx_->tail.v.load(std::memory_order_acquire);
        const uint64_t limit = rxMaxTail(head + n);
        const uint64_t room = limit > now ? limit - now : 0;
        if ((now <= head + n || room >= std::min(want, rxSize_.load())) &&
            rx_->writerWaiting.v.exchange(0, std::memory_order_acq_rel))
            wakePeer();
    }
    return n;
}

uint64_t SameHostLink::readable() const
{
    const uint64_t head = rxHead_.load(std::memory_order_relaxed);
    const uint64_t tail = rx_->tail.v.load(std::memory_order_acquire);
    return tail > head ? std::min(tail - head, rxCap_) : 0;
}

uint64_t SameHostLink::unreadByPeer() const
{
    const uint64_t head = tx_->head.v.load(std::memory_order_acquire);
    const uint64_t tail = txTail_.load(std::memory_order_relaxed);
    return tail > head ? tail - head : 0;
}

int SameHostLink::failure(uint64_t *flags)
{
    if (const int e = err_.load(std::memory_order_acquire))
        return e;
    *flags = peerFlags();
    if (const int e = err_.load(std::memory_order_acquire))
        return e;
    return (*flags & shm::kReset) ? -ECONNRESET : 0;
}

ssize_t SameHostLink::recvState()
{
    // Flags before tail: the producer publishes its last tail before SHUT_WR.
    uint64_t f = 0;
    if (const int e = failure(&f))
        return e;
    // seen and head before tail (acquire, against the release stores of the threads that moved
    // them), so that an honest tail is never behind either.
    const uint64_t seen = rxTailSeen_.load(std::memory_order_acquire);
    const uint64_t head = rxHead_.load(std::memory_order_acquire);
    const uint64_t tail = rx_->tail.v.load(std::memory_order_acquire);
    // No bound ahead here: head may be behind the receiver's by now (read() checks it).
    if (tail < seen || tail < head) {
        corrupt("tail index");
        return err_.load();
    }
    storeMax(rxTailSeen_, tail);
    if (tail > head)
        return static_cast<ssize_t>(std::min(tail - head, rxCap_));
    if (f & shm::kShutWr)
        return 0;
    if (peerGone_.load(std::memory_order_acquire))
        // A process that ends with bytes it never read resets its connections, as the kernel
        // does; one that read everything closes them.
        return unreadByPeer() ? -ECONNRESET : 0;
    return -EAGAIN;
}

ssize_t SameHostLink::sendState()
{
    uint64_t f = 0;
    if (const int e = failure(&f))
        return e;
    if (myFlags_.load(std::memory_order_relaxed) || (f & shm::kClosed) ||
        peerGone_.load(std::memory_order_acquire))
        return -EPIPE;
    const uint64_t seen = txHeadSeen_.load(std::memory_order_acquire); // before head: see write()
    const uint64_t head = tx_->head.v.load(std::memory_order_acquire);
    const uint64_t tail = txTail_.load(std::memory_order_acquire);
    if (head < seen || head > tail) {
        corrupt("head index");
        return err_.load();
    }
    storeMax(txHeadSeen_, head);
    const uint64_t max = txMaxTail(head);
    return static_cast<ssize_t>(max > tail ? max - tail : 0);
}

bool SameHostLink::observe(uint64_t *rxChanges, uint64_t *txChanges)
{
    const uint64_t f = peerFlags();
    const uint64_t tail = rx_->tail.v.load(std::memory_order_acquire);
    const uint64_t head = tx_->head.v.load(std::memory_order_acquire);
    const bool gone = peerGone_.load(std::memory_order_acquire);
    const int err = err_.load(std::memory_order_acquire);
    bool rx = tail != seenTail_ || f != seenFlags_ || gone != seenGone_ || err != seenErr_;
    bool tx = head != seenHead_ || gone != seenGone_ || err != seenErr_ ||
              (f & shm::kReset) != (seenFlags_ & shm::kReset);
    seenTail_ = tail;
    seenHead_ = head;
    seenFlags_ = f;
    seenGone_ = gone;
    seenErr_ = err;
    if (rx)
        ++*rxChanges;
    if (tx)
        ++*txChanges;
    return rx || tx;
}

bool SameHostLink::drain()
{
    char buf[256];
    bool any = false;
    for (int i = 0; i < 16; i++) {
        wakeReads_.fetch_add(1, std::memory_order_relaxed);
        const ssize_t r = sys::read(sleepFd_, buf, sizeof(buf));
        if (r == -EAGAIN || r == -EINTR)
            break;
        if (r <= 0) {
            peerGone_.store(true, std::memory_order_release);
            return true;
        }
        any = true;
        if (size_t(r) < sizeof(buf))
            break;
    }
    // Read to the end (or to a signal: the bytes left make the fd readable, so the next
    // sleep ends at once and its arm reads them).
    wakeOwed_.store(false, std::memory_order_relaxed);
    return any;
}

int SameHostLink::arm(bool read, uint64_t room, bool *drained, Drain mode, bool roomMatters)
{
    *drained = false;
    if (sleepFd_ < 0)
        return 0;
    // The peer writes a byte only after taking a word of this end's (it clears the word
    // first), or for a change of its flags (which the look below reports): a word this end
    // set and now finds cleared is a byte on its way. Set before the read, a word the peer
    // takes at once is either read here or counted at the next arm.
    bool taken = false;
    if (read) {
        taken = rx_->readerWaiting.v.exchange(1, std::memory_order_seq_cst) == 0 && readWord_;
        readWord_ = true;
    } else if (readWord_ && rx_->readerWaiting.v.load(std::memory_order_acquire) == 0) {
        taken = true;
        readWord_ = false;
    }
    const uint64_t size = txSize_.load(std::memory_order_acquire);
    if (room) {
        const uint64_t want = std::min(room, size);
        taken |= tx_->writerWaiting.v.exchange(want, std::memory_order_seq_cst) == 0 && roomWord_;
        roomWord_ = true;
    } else if (roomWord_ && tx_->writerWaiting.v.load(std::memory_order_acquire) == 0) {
        taken = true;
        roomWord_ = false;
    }
    if (taken)
        wakeOwed_.store(true, std::memory_order_relaxed);
    if (mode == Drain::Always ||
        (mode == Drain::IfOwed && wakeOwed_.load(std::memory_order_relaxed)))
        *drained = drain();
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const uint64_t f = rx_->flags.v.load(std::memory_order_acquire);
    // Room that came, but less than the room this end waits for, is no change to look at: the
    // peer wakes it once there is that much (the word above). A writer waiting for a third of a
    // ring that its peer read 64 B at a time looked again at each read, two reads of its pipes
    // each (iperf3 -l 64: 186,000 a second). Without a wait for room (none wanted, or there is
    // enough already) a head that moved is looked at, as is one out of range (reset there),
    // unless the caller only waits to read (its next send checks the head).
    const uint64_t head = tx_->head.v.load(std::memory_order_acquire);
    const uint64_t tail = txTail_.load(std::memory_order_relaxed);
    const uint64_t max = head <= tail ? txMaxTail(head) : 0;
    const bool roomCame = roomMatters && head != seenHead_ &&
                          (!room || head < seenHead_ || head > tail ||
                           (max > tail ? max - tail : 0) >= std::min(room, size));
    if (rx_->tail.v.load(std::memory_order_acquire) != seenTail_ || roomCame ||
        (seenFlags_ | f) != seenFlags_ || peerGone_.load(std::memory_order_acquire) != seenGone_ ||
        err_.load(std::memory_order_acquire) != seenErr_)
        return -EAGAIN;
    return 0;
}

bool SameHostLink::notice(int64_t nowNs)
{
    if (sleepFd_ < 0 || nowNs - lastNoticeNs_.load(std::memory_order_relaxed) < 1000000)
        return false;
    lastNoticeNs_.store(nowNs, std::memory_order_relaxed);
    // The end of the pipe only shows once the wake-ups before it are read.
    return drain();
}

void SameHostLink::shutWr(bool closed)
{
    flush(); // EOF comes after every byte written
    myFlags_.fetch_or(shm::kShutWr | (closed ? shm::kClosed : 0));
    tx_->flags.v.store(myFlags_.load(), std::memory_order_release);
    wakePeer();
}

void SameHostLink::reset()
{
    myFlags_.fetch_or(shm::kReset);
    tx_->flags.v.store(myFlags_.load(), std::memory_order_release);
    wakePeer();
}

} // namespace rstream
