// SPDX-License-Identifier: MIT
// Ring growth: the receive ring moves to a bigger one the peer switches to; the send ring grows
// in place once empty.

#include "connection.h"
#include "connection_detail.h"

#include <algorithm>

#include "clock.h"

namespace rstream {

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

} // namespace rstream
