// SPDX-License-Identifier: MIT
// Ring growth: the receive ring moves to a bigger one the peer switches to; the send ring grows
// in place once empty.

#include "connection.h"
#include "connection_detail.h"

#include <cstring>

#include "clock.h"
#include "log.h"

namespace rstream {

void Connection::maybeGrowRecvLocked(bool full)
{
    // When to ask is RingGrowth's; the ring after this one follows it in the receive area.
    const int64_t now = nowNs();
    const uint64_t next = static_cast<uint64_t>(recvBase_ - recvArea_) + rx_.size;
    const bool held = rxOld_.size || closing_ || peerShutWr_ || shutRd_;
    const auto log2 =
        full ? growth_.recvFullGrowLog2(rx_.size, next, recvReserve_, settings_.recvBufMax, held)
             : growth_.recvGrowLog2(now, rx_.size, next, recvReserve_, settings_.recvBufMax, held);
    if (!log2)
        return;
    auto word = wire::encodeGrow(*log2);
    if (!word)
        return;
    // The new ring is writable from now on, under the key the peer derives from the current
    // one's; the rest of the area stays unregistered.
    const uint64_t key = keyOfSize(wire::nextRingKey(fi_mr_key(remoteMr_)));
    int ret = registerRegion(recvBase_ + rx_.size, size_t(1) << *log2, FI_REMOTE_WRITE,
                             nextMr_.out(), &key);
    if (ret < 0) {
        // (A key another registration of the domain holds, or no memory to register.)
        RS_LOG(Info, "cannot register a receive ring of %zu bytes (%s): it keeps its size",
               size_t(1) << *log2, strerror(-ret));
        growth_.disableRecv();
        return;
    }
    if (sendWordLocked(*word) < 0) {
        nextMr_.reset();
        return;
    }
    growth_.onGrowSent(*log2, now);
    local_.freezeRing();
}

void Connection::onSwitchLocked()
{
    const uint64_t size = growth_.onSwitch();
    if (!size) {
        failLocked(-ECONNRESET, "SWITCH without GROW");
        return;
    }
    // Everything written before SWITCH is in the old ring; from here on the peer writes into
    // the new one, which starts right after it.
    rxOld_ = rx_;
    rxOldBase_ = recvBase_;
    recvBase_ += rx_.size;
    // The peer writes no more into the old ring (and all it wrote there has landed, ordered
    // before SWITCH): it stops being writable while its bytes are read.
    remoteMr_ = std::move(nextMr_);
    rx_ = RecvRing{};
    rx_.size = size;
    local_.switchRing(size);
    if (rxOld_.readable() == 0)
        consumeLocked(0);
}

void Connection::onGrowLocked(uint32_t log2)
{
    // One at a time, and only ever bigger.
    if (!growth_.onPeerGrow(log2, peer_.ringSize()))
        failLocked(-ECONNRESET, "malformed GROW from peer");
}

void Connection::fixBufferSizes(bool send, bool recv)
{
    std::lock_guard<std::mutex> lock(mutex_);
    growth_.fix(send, recv);
    if (send && sh_)
        sh_->allowGrowth(0);
}

void Connection::maybeGrowSendLocked()
{
    // Once empty: nothing in it is referenced, so the ring takes its new size in place.
    if (const uint64_t size = growth_.sendGrowth(tx_.tail == tx_.done, tx_.size, sendReserve_))
        tx_.size = size;
}

} // namespace rstream
