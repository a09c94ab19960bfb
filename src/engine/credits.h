// SPDX-License-Identifier: MIT
// Flow control: ring-space and receive-slot credits, seen from both ends.
//
// The receiver posts rxSlots receives and owns a ring of ringSize bytes. The sender may write
// into the ring only where the receiver has reported space free, and may send a message only
// against a slot the receiver has reposted. The receiver returns both kinds of credit in one
// CREDIT word, in batches: when half its ring or half its slots are due. The sender keeps
// kReservedSlots slots for CREDIT and CTRL messages, so a credit return always has a slot to
// travel in and the two ends can never wait on each other.
#pragma once

#include <cstdint>

#include "wire.h"

namespace rstream {

constexpr uint32_t kReservedSlots = 2;

// The sender's view of the peer's receive ring and slots.
class PeerCredits
{
public:
    void init(uint64_t ringSize, uint32_t slots, unsigned creditShift)
    {
        ringSize_ = ringSize;
        maxSlots_ = slots;
        slots_ = slots;
        shift_ = creditShift;
        written_ = freed_ = 0;
    }

    uint64_t ringAvail() const { return ringSize_ - (written_ - freed_); }
    uint64_t ringSize() const { return ringSize_; }
    uint64_t written() const { return written_; }
    uint32_t slots() const { return slots_; }
    bool canSendData() const { return slots_ > kReservedSlots && ringAvail() > 0; }
    bool canSendCtrl() const { return slots_ > 0; }
    // A write that rewinds to the start of the peer's ring (wire::kDataRewind) leaves the rest
    // of the ring as padding: these bytes (0 at the start already). The padding takes credit as
    // written bytes do, and comes back once the peer has read up to it and past it.
    uint64_t rewindSkip() const
    {
        const uint64_t off = written_ % ringSize_;
        return off ? ringSize_ - off : 0;
    }
    void onRewind() { written_ += rewindSkip(); }
    // Half the peer's slots or more are out. It returns credit for them once its progress has
    // taken them (LocalCredits::due(), whether or not its application read), so a sender that
    // holds small writes from here on is sure to be given a CREDIT that flushes them.
    bool halfSlotsOut() const { return maxSlots_ - slots_ >= maxSlots_ / 2; }

    void onDataSent(uint64_t len)
    {
        written_ += len;
        slots_--;
    }
    void onCtrlSent() { slots_--; }
    // The peer's ring was replaced by one of newSize bytes, all free (its GROW, our SWITCH).
    void switchRing(uint64_t newSize)
    {
        ringSize_ = newSize;
        shift_ = wire::creditShift(newSize);
        written_ = freed_ = 0;
    }

    // Applies a CREDIT from the peer; -EPROTO when it returns more than was used.
    int onCredit(uint32_t slots, uint32_t ringUnits)
    {
        uint64_t bytes = uint64_t(ringUnits) << shift_;
        if (slots > maxSlots_ - slots_ || bytes > written_ - freed_)
            return -71; // EPROTO
        slots_ += slots;
        freed_ += bytes;
        return 0;
    }

private:
    uint64_t ringSize_ = 0;
    uint64_t written_ = 0; // bytes written into the peer's ring
    uint64_t freed_ = 0;   // bytes the peer reported free again
    uint32_t maxSlots_ = 0;
    uint32_t slots_ = 0;
    unsigned shift_ = 0;
};

// The receiver's bookkeeping of what it owes the peer.
class LocalCredits
{
public:
    void init(uint64_t ringSize, uint32_t slots)
    {
        ringSize_ = ringSize;
        maxSlots_ = slots;
        shift_ = wire::creditShift(ringSize);
        consumed_ = reported_ = written_ = 0;
        slotsDue_ = 0;
        frozen_ = false;
    }

    unsigned shift() const { return shift_; }
    // GROW sent: the current ring is never credited again (the peer leaves it at SWITCH).
    void freezeRing() { frozen_ = true; }
    bool frozen() const { return frozen_; }
    // SWITCH arrived: credits are for the new ring of newSize bytes from now on. Slots still owed
    // stay owed.
    void switchRing(uint64_t newSize)
    {
        ringSize_ = newSize;
        shift_ = wire::creditShift(newSize);
        consumed_ = reported_ = written_ = 0;
        frozen_ = false;
    }

    // A message consumed a receive slot; it has been reposted and is owed back.
    void onSlotReposted() { slotsDue_++; }
    // The application consumed bytes from the ring.
    void onConsumed(uint64_t bytes) { consumed_ += bytes; }
    // The peer wrote bytes into the ring.
    void onWritten(uint64_t bytes) { written_ += bytes; }
    // The peer has used all the ring credit it was given: it cannot write until some returns.
    bool peerStarved() const { return written_ >= reported_ + ringSize_; }

    uint64_t ringDue() const { return frozen_ ? 0 : consumed_ - reported_; }
    uint64_t reported() const { return reported_; }
    uint32_t slotsDue() const { return slotsDue_; }

    // Whether a CREDIT should go now: half the ring or half the slots are owed. (A peer that
    // has used all its credit while less than half is owed back waits for the application to
    // read on, or for the ring to grow, as a TCP sender waits for a window worth announcing.)
    bool due() const { return ringDue() >= ringSize_ / 2 || slotsDue_ >= maxSlots_ / 2; }
    // Whether anything at all is owed (used when flushing eagerly, e.g. on idle).
    bool any() const { return (ringDue() >> shift_) > 0 || slotsDue_ > 0; }

    // Builds the CREDIT word for everything owed and marks it returned. Returns 0 when there is
    // nothing to return.
    uint32_t take()
    {
        uint64_t units = ringDue() >> shift_;
        if (units > wire::kMaxRingUnits)
            units = wire::kMaxRingUnits;
        uint32_t slots = slotsDue_ > wire::kMaxSlots ? wire::kMaxSlots : slotsDue_;
        auto word = wire::encodeCredit(slots, static_cast<uint32_t>(units));
        if (!word)
            return 0;
        reported_ += units << shift_;
        slotsDue_ -= slots;
        return *word;
    }

    // Puts back what take() marked, when the word could not be sent.
    void untake(uint32_t word)
    {
        auto m = wire::decode(word);
        if (!m)
            return;
        reported_ -= uint64_t(m->ringUnits) << shift_;
        slotsDue_ += m->slots;
    }

private:
    uint64_t ringSize_ = 0;
    uint64_t consumed_ = 0;
    uint64_t reported_ = 0;
    uint64_t written_ = 0;
    uint32_t maxSlots_ = 0;
    uint32_t slotsDue_ = 0;
    unsigned shift_ = 0;
    bool frozen_ = false;
};

} // namespace rstream
