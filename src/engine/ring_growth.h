// SPDX-License-Identifier: MIT
// Ring growth decisions: when the receiver asks the peer for a bigger ring, when the send ring
// grows, and the GROW/SWITCH exchange in between. Pure logic (time and byte counts in, decisions
// out); the connection moves the memory and sends the words.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>

namespace rstream {

// The growth state of one connection's two rings. Receiver: asks the peer to move to a bigger
// ring when it ran out of credit while the application reads in bulk. Sender: the send ring
// grows, once empty, when it is what holds the application back.
class RingGrowth
{
public:
    // The receive ring grows (x4) when the application read this many rings' worth within the
    // window.
    static constexpr uint64_t kRings = 4;
    static constexpr int64_t kWindowNs = 100'000'000;

    // Whether each ring may grow (its area was reserved up front).
    void enable(bool recv, bool send)
    {
        recv_ = recv;
        send_ = send;
    }
    // Only a peer that answers GROW with SWITCH is asked to follow a growing ring.
    void disableRecv() { recv_ = false; }
    // SO_SNDBUF or SO_RCVBUF set on the connection: that ring keeps its size from now on, as
    // Linux stops autotuning a buffer whose size was set (a GROW already sent still completes).
    void fix(bool send, bool recv)
    {
        if (send) {
            send_ = false;
            sendWanted_ = false;
        }
        if (recv)
            recv_ = false;
    }
    bool recvEnabled() const { return recv_; }
    bool sendEnabled() const { return send_; }

    // Receiver: the application consumed n bytes of a ring of ringSize. true when enough was
    // read to look at recvGrowLog2().
    bool onConsumed(uint64_t n, uint64_t ringSize)
    {
        consumed_ += n;
        return recv_ && consumed_ >= kRings * ringSize;
    }
    // Whether to ask the peer to move to a bigger ring now: the log2 of its size (for GROW), or
    // none. end: where the current ring ends in the receive area of reserve bytes; max: the
    // largest ring wanted; held: the previous ring still holds unread bytes, or the stream is
    // ending.
    std::optional<uint32_t> recvGrowLog2(int64_t now, uint64_t ringSize, uint64_t end,
                                         uint64_t reserve, uint64_t max, bool held)
    {
        // Only for a bulk reader: kRings rings' worth consumed within kWindowNs (a connection
        // trickling requests never grows). One step at a time: the previous ring drained, no
        // GROW unanswered.
        if (now - windowNs_ > kWindowNs) {
            windowNs_ = now;
            consumed_ = 0;
            return std::nullopt;
        }
        if (growSent_ || held)
            return std::nullopt;
        uint64_t want = std::min<uint64_t>(ringSize * 4, max);
        uint32_t log2 = 63 - __builtin_clzll(want);
        uint64_t size = uint64_t(1) << log2;
        if (size <= ringSize || end + size > reserve)
            return std::nullopt;
        return log2;
    }
    // Whether to ask the peer to move to a bigger ring because this one is full of unread bytes
    // (the peer's writes wait for room, and a program that writes before it reads would wait
    // for good): the largest ring up to max that fits, at once, as the kernel's buffers take
    // megabytes before a writer blocks. Same arguments as recvGrowLog2().
    std::optional<uint32_t> recvFullGrowLog2(uint64_t ringSize, uint64_t end, uint64_t reserve,
                                             uint64_t max, bool held) const
    {
        if (!recv_ || growSent_ || held || end > reserve)
            return std::nullopt;
        const uint64_t fit = std::min(max, reserve - end);
        if (fit < 2)
            return std::nullopt;
        const uint32_t log2 = 63 - __builtin_clzll(fit);
        if ((uint64_t(1) << log2) <= ringSize)
            return std::nullopt;
        return log2;
    }
    // The GROW recvGrowLog2() or recvFullGrowLog2() asked for went out at now.
    void onGrowSent(uint32_t log2, int64_t now)
    {
        growSent_ = true;
        growSize_ = uint64_t(1) << log2;
        consumed_ = 0;
        windowNs_ = now;
    }
    bool growSent() const { return growSent_; } // a GROW awaits its SWITCH
    // The peer's SWITCH: the size of the ring it writes from now on, or 0 when no GROW awaited
    // one (the peer broke the protocol).
    uint64_t onSwitch()
    {
        if (!growSent_)
            return 0;
        growSent_ = false;
        recvGrowths_++;
        return growSize_;
    }

    // Sender: the peer's GROW to a ring of 2^log2 bytes. false when malformed: one at a time,
    // and only ever bigger.
    bool onPeerGrow(uint32_t log2, uint64_t peerRingSize)
    {
        const uint64_t size = uint64_t(1) << log2;
        if (switchTo_ || size <= peerRingSize)
            return false;
        switchTo_ = size;
        return true;
    }
    // The size of the peer's next ring while our SWITCH is owed, else 0.
    uint64_t switchTo() const { return switchTo_; }
    void onSwitchSent() { switchTo_ = 0; }

    // A send found space bytes free of the wanted more, in a ring of size (reserve at most)
    // towards a peer ring of peerRingSize. Returns whether the ring is to grow, and so to drain
    // first: the ring holds the application back while the peer's ring has more room, so it
    // grows once its writes completed (blocking senders wait for that).
    bool onSendSpace(uint64_t space, uint64_t wanted, uint64_t size, uint64_t reserve,
                     uint64_t peerRingSize)
    {
        if (space < wanted && send_ && size < reserve && peerRingSize > size)
            sendWanted_ = true;
        return sendWanted_;
    }
    // The send ring's new size when growth is wanted and the ring is empty, else 0.
    uint64_t sendGrowth(bool empty, uint64_t size, uint64_t reserve)
    {
        if (!sendWanted_ || !empty)
            return 0;
        // Empty: nothing in it is referenced, so the ring takes its new size in place.
        sendWanted_ = false;
        uint64_t next = std::min<uint64_t>(size * 4, reserve);
        if (next <= size)
            return 0;
        sendGrowths_++;
        return next;
    }

    uint32_t recvGrowths() const { return recvGrowths_; }
    uint32_t sendGrowths() const { return sendGrowths_; }

private:
    bool recv_ = false; // this end may grow its receive ring (and the peer follows GROW)
    bool send_ = false;
    bool growSent_ = false;
    uint64_t growSize_ = 0;
    uint64_t consumed_ = 0; // bytes read since windowNs_
    int64_t windowNs_ = 0;
    uint64_t switchTo_ = 0;
    bool sendWanted_ = false;
    uint32_t recvGrowths_ = 0;
    uint32_t sendGrowths_ = 0;
};

} // namespace rstream
