// SPDX-License-Identifier: MIT
// Unit tests of flow control: both ends' credit accounting, and a simulated pair of endpoints.

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <deque>
#include <ostream>
#include <random>

#include <gtest/gtest.h>

#include "credits.h"
#include "ring.h"
#include "wire.h"

using namespace rstream;

namespace {

wire::Message decodeCredit(uint32_t word)
{
    auto m = wire::decode(word);
    EXPECT_TRUE(m) << "word 0x" << std::hex << word;
    if (!m)
        return {};
    EXPECT_EQ(m->op, wire::Op::Credit);
    return *m;
}

} // namespace

TEST(PeerCredits, InitialState)
{
    PeerCredits p;
    p.init(4096, 16, 0);
    EXPECT_EQ(p.ringSize(), 4096u);
    EXPECT_EQ(p.ringAvail(), 4096u);
    EXPECT_EQ(p.written(), 0u);
    EXPECT_EQ(p.slots(), 16u);
    EXPECT_TRUE(p.canSendData());
    EXPECT_TRUE(p.canSendCtrl());
}

TEST(PeerCredits, DataConsumesASlotAndRing)
{
    PeerCredits p;
    p.init(4096, 16, 0);
    p.onDataSent(1000);
    EXPECT_EQ(p.slots(), 15u);
    EXPECT_EQ(p.ringAvail(), 3096u);
    EXPECT_EQ(p.written(), 1000u);
    p.onDataSent(3096);
    EXPECT_EQ(p.slots(), 14u);
    EXPECT_EQ(p.ringAvail(), 0u);
    EXPECT_FALSE(p.canSendData()) << "the ring is full";
    EXPECT_TRUE(p.canSendCtrl());
    p.onCtrlSent();
    EXPECT_EQ(p.slots(), 13u);
    EXPECT_EQ(p.ringAvail(), 0u);
    EXPECT_EQ(p.written(), 4096u);
}

TEST(PeerCredits, ReservedSlotsAreForControlOnly)
{
    PeerCredits p;
    p.init(1 << 20, 8, 4);
    for (uint32_t i = 0; i < 8 - kReservedSlots; i++) {
        ASSERT_TRUE(p.canSendData()) << "after " << i << " messages";
        p.onDataSent(1);
    }
    EXPECT_EQ(p.slots(), kReservedSlots);
    EXPECT_FALSE(p.canSendData());
    EXPECT_TRUE(p.canSendCtrl());
    for (uint32_t i = 0; i < kReservedSlots; i++) {
        ASSERT_TRUE(p.canSendCtrl());
        p.onCtrlSent();
    }
    EXPECT_EQ(p.slots(), 0u);
    EXPECT_FALSE(p.canSendCtrl());
    EXPECT_FALSE(p.canSendData());
}

// A sender holds small writes from half the slots out: exactly where the receiver's due()
// returns credit for them (LocalCredits::due(), half its slots), so the CREDIT comes.
TEST(PeerCredits, HalfTheSlotsOutIsWhereTheReceiverReturnsThem)
{
    PeerCredits p;
    p.init(1 << 20, 8, 4);
    LocalCredits l;
    l.init(1 << 20, 8);
    for (int i = 0; i < 3; i++) {
        EXPECT_FALSE(p.halfSlotsOut()) << i << " out";
        p.onDataSent(1);
        l.onSlotReposted();
        EXPECT_FALSE(l.due());
    }
    p.onCtrlSent(); // control messages take slots too
    l.onSlotReposted();
    EXPECT_TRUE(p.halfSlotsOut());
    EXPECT_TRUE(l.due());
    ASSERT_EQ(p.onCredit(4, 0), 0);
    EXPECT_FALSE(p.halfSlotsOut());
}

TEST(PeerCredits, CreditReturnsSlotsAndRingInUnits)
{
    PeerCredits p;
    p.init(1 << 20, 16, 4); // 16-byte units
    p.onDataSent(1 << 20);
    p.onDataSent(0);
    EXPECT_EQ(p.ringAvail(), 0u);
    EXPECT_EQ(p.onCredit(2, 100), 0);
    EXPECT_EQ(p.slots(), 16u);
    EXPECT_EQ(p.ringAvail(), 1600u);
    EXPECT_EQ(p.onCredit(0, 65435), 0);
    EXPECT_EQ(p.ringAvail(), 1600u + 65435u * 16);
    EXPECT_EQ(p.onCredit(0, 2), -EPROTO) << "only 16 bytes outstanding";
    EXPECT_EQ(p.onCredit(0, 1), 0);
    EXPECT_EQ(p.ringAvail(), 1u << 20);
    EXPECT_TRUE(p.canSendData());
}

TEST(PeerCredits, RejectsOverReturnedCredits)
{
    PeerCredits p;
    p.init(4096, 16, 0);
    p.onDataSent(100);
    p.onCtrlSent();
    EXPECT_EQ(-EPROTO, -71);
    EXPECT_EQ(p.onCredit(3, 0), -EPROTO) << "3 slots back, 2 were used";
    EXPECT_EQ(p.onCredit(0, 101), -EPROTO) << "101 bytes back, 100 were written";
    EXPECT_EQ(p.onCredit(3, 101), -EPROTO);
    EXPECT_EQ(p.onCredit(wire::kMaxSlots, 0), -EPROTO);
    // Nothing changed.
    EXPECT_EQ(p.slots(), 14u);
    EXPECT_EQ(p.ringAvail(), 3996u);
    // Exact returns are fine, then nothing more may come back.
    EXPECT_EQ(p.onCredit(2, 100), 0);
    EXPECT_EQ(p.slots(), 16u);
    EXPECT_EQ(p.ringAvail(), 4096u);
    EXPECT_EQ(p.onCredit(1, 0), -EPROTO);
    EXPECT_EQ(p.onCredit(0, 1), -EPROTO);
}

TEST(PeerCredits, RejectsOverReturnInUnits)
{
    PeerCredits p;
    p.init(1 << 20, 16, 4);
    p.onDataSent(100); // 6.25 units
    EXPECT_EQ(p.onCredit(0, 7), -EPROTO);
    EXPECT_EQ(p.onCredit(0, 6), 0);
    EXPECT_EQ(p.ringAvail(), (1u << 20) - 4);
    EXPECT_EQ(p.onCredit(0, 1), -EPROTO) << "4 bytes outstanding, less than a unit";
}

// Ring growth: after GROW the receiver credits only slots; after SWITCH the sender has the whole
// new ring and the receiver counts credit in the new ring's units, still owing its slots.
TEST(RingGrowth, FrozenRingCreditsOnlySlotsAndSwitchStartsTheNewRingEmpty)
{
    PeerCredits p;
    p.init(32768, 16, wire::creditShift(32768));
    LocalCredits l;
    l.init(32768, 16);
    p.onDataSent(32768);
    EXPECT_FALSE(p.canSendData()) << "the whole ring is in use";
    l.onSlotReposted();
    l.freezeRing(); // GROW sent
    l.onConsumed(32768);
    EXPECT_EQ(l.ringDue(), 0u);
    uint32_t word = l.take();
    wire::Message m = decodeCredit(word);
    EXPECT_EQ(m.ringUnits, 0u);
    EXPECT_EQ(m.slots, 1u);
    EXPECT_EQ(p.onCredit(m.slots, m.ringUnits), 0);
    EXPECT_EQ(p.ringAvail(), 0u) << "no ring credit for the old ring";
    p.switchRing(1u << 20); // the sender's SWITCH
    l.onSlotReposted();     // the SWITCH itself took a slot
    l.switchRing(1u << 20);
    EXPECT_EQ(p.ringSize(), 1u << 20);
    EXPECT_EQ(p.ringAvail(), 1u << 20);
    EXPECT_EQ(p.written(), 0u);
    EXPECT_TRUE(p.canSendData());
    EXPECT_FALSE(l.frozen());
    EXPECT_EQ(l.shift(), wire::creditShift(1u << 20));
    EXPECT_EQ(l.slotsDue(), 1u) << "slots owed stay owed across the switch";
    p.onDataSent(1u << 19);
    l.onConsumed(1u << 19);
    EXPECT_TRUE(l.due());
    m = decodeCredit(l.take());
    EXPECT_EQ(uint64_t(m.ringUnits) << l.shift(), 1u << 19);
    EXPECT_EQ(p.onCredit(m.slots, m.ringUnits), 0);
    EXPECT_EQ(p.ringAvail(), 1u << 20);
}

TEST(LocalCredits, InitialState)
{
    LocalCredits l;
    l.init(4096, 16);
    EXPECT_EQ(l.shift(), wire::creditShift(4096));
    EXPECT_EQ(l.ringDue(), 0u);
    EXPECT_EQ(l.slotsDue(), 0u);
    EXPECT_FALSE(l.due());
    EXPECT_FALSE(l.any());
    EXPECT_EQ(l.take(), 0u);
}

// The receiver knows when the peer has used all its ring credit (a few bytes read but too few
// to be owed back count): then the ring grows. Before, only a ring full to the byte did, and a
// reader that had read 9 bytes, against a peer that writes before it reads, hung both ends of a
// mid-stream switch.
TEST(LocalCredits, KnowsWhenThePeerHasNoCreditLeft)
{
    LocalCredits l;
    l.init(32768, 256);
    l.onWritten(32000);
    l.onConsumed(9);
    EXPECT_FALSE(l.peerStarved());
    l.onWritten(768);
    EXPECT_TRUE(l.peerStarved());
    EXPECT_FALSE(l.due()); // 9 bytes: not worth a word of their own
    l.onConsumed(16384);
    ASSERT_TRUE(l.due());
    wire::Message m = decodeCredit(l.take());
    EXPECT_EQ(m.ringUnits, 16393u);
    EXPECT_FALSE(l.peerStarved());
    // The new ring starts with all of it the peer's.
    l.onWritten(16393);
    EXPECT_TRUE(l.peerStarved());
    l.switchRing(65536);
    EXPECT_FALSE(l.peerStarved());
}

TEST(LocalCredits, DueAtHalfTheRing)
{
    LocalCredits l;
    l.init(4096, 16);
    l.onConsumed(2047);
    EXPECT_FALSE(l.due());
    EXPECT_TRUE(l.any());
    l.onConsumed(1);
    EXPECT_TRUE(l.due());
    uint32_t word = l.take();
    wire::Message m = decodeCredit(word);
    EXPECT_EQ(m.ringUnits, 2048u);
    EXPECT_EQ(m.slots, 0u);
    EXPECT_EQ(l.ringDue(), 0u);
    EXPECT_FALSE(l.due());
    EXPECT_FALSE(l.any());
}

TEST(LocalCredits, DueAtHalfTheSlots)
{
    LocalCredits l;
    l.init(4096, 16);
    for (int i = 0; i < 7; i++)
        l.onSlotReposted();
    EXPECT_FALSE(l.due());
    EXPECT_TRUE(l.any());
    l.onSlotReposted();
    EXPECT_TRUE(l.due());
    l.onConsumed(10);
    wire::Message m = decodeCredit(l.take());
    EXPECT_EQ(m.slots, 8u);
    EXPECT_EQ(m.ringUnits, 10u);
    EXPECT_EQ(l.slotsDue(), 0u);
    EXPECT_EQ(l.ringDue(), 0u);
    EXPECT_EQ(l.take(), 0u);
}

TEST(LocalCredits, TakeReturnsWholeUnitsAndKeepsTheRemainder)
{
    LocalCredits l;
    l.init(1 << 20, 64);
    const uint64_t unit = uint64_t(1) << l.shift();
    ASSERT_GT(unit, 1u);
    l.onConsumed(10 * unit + unit - 1);
    l.onSlotReposted();
    wire::Message m = decodeCredit(l.take());
    EXPECT_EQ(m.ringUnits, 10u);
    EXPECT_EQ(m.slots, 1u);
    EXPECT_EQ(l.ringDue(), unit - 1);
    EXPECT_FALSE(l.any()) << "less than a unit is not worth a message";
    EXPECT_EQ(l.take(), 0u);
    EXPECT_EQ(l.ringDue(), unit - 1);
    l.onConsumed(1);
    EXPECT_TRUE(l.any());
    m = decodeCredit(l.take());
    EXPECT_EQ(m.ringUnits, 1u);
    EXPECT_EQ(l.ringDue(), 0u);
}

TEST(LocalCredits, TakeCapsRingUnitsAtTheFieldWidth)
{
    LocalCredits l;
    l.init(1 << 20, 64);
    const unsigned shift = l.shift();
    const uint64_t owed = (uint64_t(3) << 20) + 5; // more than one word can carry
    l.onConsumed(owed);
    uint64_t returned = 0;
    wire::Message m = decodeCredit(l.take());
    EXPECT_EQ(m.ringUnits, wire::kMaxRingUnits);
    returned += uint64_t(m.ringUnits) << shift;
    EXPECT_EQ(l.ringDue(), owed - returned);
    for (int i = 0; l.any(); i++) {
        ASSERT_LT(i, 100) << "take() never finishes returning " << owed << " bytes";
        m = decodeCredit(l.take());
        ASSERT_GT(m.ringUnits, 0u);
        returned += uint64_t(m.ringUnits) << shift;
    }
    EXPECT_EQ(l.ringDue(), owed - returned);
    EXPECT_LT(l.ringDue(), uint64_t(1) << shift);
}

TEST(LocalCredits, TakeCapsSlotsAtTheFieldWidth)
{
    LocalCredits l;
    l.init(4096, wire::kMaxSlots);
    for (uint32_t i = 0; i < wire::kMaxSlots + 10; i++)
        l.onSlotReposted();
    wire::Message m = decodeCredit(l.take());
    EXPECT_EQ(m.slots, wire::kMaxSlots);
    EXPECT_EQ(l.slotsDue(), 10u);
}

// take() "builds the CREDIT word for everything owed": when the application has consumed the
// whole ring, one word must return all of it but for less than a unit.
class WholeRingTest : public ::testing::TestWithParam<uint64_t>
{};

TEST_P(WholeRingTest, OneWordReturnsAConsumedRing)
{
    const uint64_t ringSize = GetParam();
    LocalCredits l;
    l.init(ringSize, 64);
    const uint64_t unit = uint64_t(1) << l.shift();
    l.onConsumed(ringSize);
    ASSERT_TRUE(l.due());
    wire::Message m = decodeCredit(l.take());
    EXPECT_LT(l.ringDue(), unit) << "ring " << ringSize << ", unit " << unit << ": returned "
                                 << m.ringUnits << " units, " << l.ringDue()
                                 << " bytes still owed after consuming the whole ring";

    PeerCredits p;
    p.init(ringSize, 64, wire::creditShift(ringSize));
    p.onDataSent(ringSize);
    ASSERT_EQ(p.onCredit(m.slots, m.ringUnits), 0);
    EXPECT_GE(p.ringAvail(), ringSize - unit + 1) << "ring " << ringSize;
}

INSTANTIATE_TEST_SUITE_P(Sizes, WholeRingTest,
                         ::testing::Values(uint64_t(1024), uint64_t(32768), uint64_t(65535),
                                           uint64_t(65536), uint64_t(65537), uint64_t(1) << 20,
                                           (uint64_t(1) << 20) + 3, uint64_t(1) << 28));

TEST(LocalCredits, UntakeRestoresWhatTakeMarked)
{
    LocalCredits l;
    l.init(1 << 20, 64);
    const uint64_t unit = uint64_t(1) << l.shift();
    l.onConsumed(1000 * unit + 3);
    for (int i = 0; i < 40; i++)
        l.onSlotReposted();
    const uint64_t ringBefore = l.ringDue();
    const uint32_t slotsBefore = l.slotsDue();
    const bool dueBefore = l.due();
    uint32_t word = l.take();
    ASSERT_NE(word, 0u);
    EXPECT_EQ(l.slotsDue(), 0u);
    EXPECT_EQ(l.ringDue(), 3u);
    l.untake(word);
    EXPECT_EQ(l.ringDue(), ringBefore);
    EXPECT_EQ(l.slotsDue(), slotsBefore);
    EXPECT_EQ(l.due(), dueBefore);
    // Taking again builds the same word.
    EXPECT_EQ(l.take(), word);
}

TEST(LocalCredits, UntakeIgnoresNonCreditWords)
{
    LocalCredits l;
    l.init(4096, 16);
    l.onConsumed(100);
    l.onSlotReposted();
    l.untake(0);
    l.untake(*wire::encodeData(100));
    l.untake(wire::encodeCtrl(wire::Ctrl::Reset));
    EXPECT_EQ(l.ringDue(), 100u);
    EXPECT_EQ(l.slotsDue(), 1u);
}

// Two endpoints exchanging DATA, CREDIT and CTRL words through wire::decode, driven by random
// steps. Each end tracks its posted receives and its receive ring on its own, independently of
// the credit classes, so an overrun shows up as a failed assertion rather than a wrong count.
namespace {

struct Endpoint
{
    // This end's receive side.
    uint64_t ringSize = 0;
    uint32_t rxSlots = 0;
    RecvRing rx;
    uint32_t posted = 0;   // receives posted now
    uint32_t toRepost = 0; // receives completed and not yet reposted
    LocalCredits local;    // what this end owes the peer
    // This end's send side.
    PeerCredits peer;            // this end's view of the peer's ring and slots
    bool sends = false;          // the application has data to send
    std::deque<uint32_t> outbox; // words sent and not yet delivered, in order
    uint64_t dataSent = 0;
    uint64_t dataReceived = 0;
    uint64_t creditsSent = 0;

    void init(uint64_t ring, uint32_t slots)
    {
        ringSize = ring;
        rxSlots = slots;
        rx.size = ring;
        posted = slots;
        local.init(ring, slots);
    }
};

void connect(Endpoint &a, Endpoint &b)
{
    // What each side learns from the other's hello.
    a.peer.init(b.ringSize, b.rxSlots, wire::creditShift(b.ringSize));
    b.peer.init(a.ringSize, a.rxSlots, wire::creditShift(a.ringSize));
}

class Pair
{
public:
    Pair(uint64_t ringA, uint32_t slotsA, uint64_t ringB, uint32_t slotsB, uint64_t seed)
        : rng_(seed)
    {
        a_.init(ringA, slotsA);
        b_.init(ringB, slotsB);
        connect(a_, b_);
    }

    Endpoint &a() { return a_; }
    Endpoint &b() { return b_; }
    Endpoint &other(Endpoint &e) { return &e == &a_ ? b_ : a_; }

    uint64_t below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }

    // Sends one DATA chunk if the credits allow; len 0 picks a random size. Chunks never
    // straddle the end of the peer's ring.
    bool sendData(Endpoint &e, uint64_t len)
    {
        if (!e.peer.canSendData())
            return false;
        Ring peerRing{e.peer.ringSize()};
        uint64_t max = std::min(e.peer.ringAvail(), peerRing.toEnd(e.peer.written()));
        max = std::min<uint64_t>(max, wire::kMaxDataLen);
        if (len == 0)
            len = 1 + below(std::min<uint64_t>(max, uint64_t(1) << below(22)));
        len = std::min(len, max);
        EXPECT_GT(len, 0u);
        auto word = wire::encodeData(static_cast<uint32_t>(len));
        EXPECT_TRUE(word);
        e.outbox.push_back(*word);
        e.peer.onDataSent(len);
        e.dataSent += len;
        return true;
    }

    // Sends the owed credit if it is due (or anything owed when forced) and a slot is free.
    bool sendCredit(Endpoint &e, bool force)
    {
        if (!(force ? e.local.any() : e.local.due()) || !e.peer.canSendCtrl())
            return false;
        uint32_t word = e.local.take();
        if (word == 0)
            return false;
        e.outbox.push_back(word);
        e.peer.onCtrlSent();
        e.creditsSent++;
        return true;
    }

    // Delivers the oldest word from e to its peer.
    bool deliver(Endpoint &from)
    {
        if (from.outbox.empty())
            return false;
        Endpoint &to = other(from);
        uint32_t word = from.outbox.front();
        from.outbox.pop_front();
        EXPECT_GT(to.posted, 0u) << "a message arrived with no receive posted";
        if (to.posted == 0)
            return false;
        to.posted--;
        to.toRepost++;
        auto m = wire::decode(word);
        EXPECT_TRUE(m) << "undecodable word 0x" << std::hex << word;
        if (!m)
            return false;
        switch (m->op) {
        case wire::Op::Data:
            EXPECT_LE(to.rx.readable() + m->len, to.ringSize) << "receive ring overrun";
            EXPECT_LE(to.rx.offset(to.rx.written) + m->len, to.ringSize)
                << "write straddles the ring end";
            to.rx.written += m->len;
            to.local.onWritten(m->len);
            to.dataReceived += m->len;
            break;
        case wire::Op::Credit:
            EXPECT_EQ(to.peer.onCredit(m->slots, m->ringUnits), 0)
                << "credit rejected: " << m->slots << " slots, " << m->ringUnits << " units";
            break;
        case wire::Op::Ctrl:
        case wire::Op::IoMap: // a message like CTRL for flow control
            break;
        }
        return true;
    }

    bool repost(Endpoint &e, uint32_t n)
    {
        n = std::min(n, e.toRepost);
        for (uint32_t i = 0; i < n; i++) {
            e.toRepost--;
            e.posted++;
            e.local.onSlotReposted();
        }
        EXPECT_LE(e.posted, e.rxSlots);
        return n > 0;
    }

    bool consume(Endpoint &e, uint64_t n)
    {
        n = std::min(n, e.rx.readSpan());
        e.rx.consumed += n;
        e.local.onConsumed(n);
        return n > 0;
    }

    void randomStep()
    {
        Endpoint &e = below(2) ? a_ : b_;
        switch (below(6)) {
        case 0:
            if (e.sends)
                sendData(e, 0);
            break;
        case 1:
            sendCredit(e, false);
            break;
        case 2:
            deliver(e);
            break;
        case 3:
            repost(e, static_cast<uint32_t>(1 + below(e.rxSlots)));
            break;
        case 4:
            consume(e, 1 + below(std::min<uint64_t>(e.ringSize, uint64_t(1) << below(22))));
            break;
        case 5:
            // A sender with nothing else to do ends its burst.
            break;
        }
    }

    // Runs the protocol with no new data until nothing moves: everything delivered, reposted
    // and consumed, and every due credit sent.
    void settle()
    {
        for (int round = 0; round < 100000; round++) {
            bool moved = false;
            for (Endpoint *e : {&a_, &b_}) {
                while (deliver(*e))
                    moved = true;
            }
            for (Endpoint *e : {&a_, &b_}) {
                moved |= repost(*e, e->toRepost);
                while (consume(*e, UINT64_MAX))
                    moved = true;
                moved |= sendCredit(*e, false);
            }
            if (!moved)
                return;
        }
        ADD_FAILURE() << "the pair never settled";
    }

    // Invariants that hold at every step.
    void check()
    {
        for (Endpoint *e : {&a_, &b_}) {
            Endpoint &o = other(*e);
            ASSERT_LE(e->peer.slots(), o.rxSlots);
            ASSERT_LE(e->peer.ringAvail(), o.ringSize);
            // The sender never believes in more space than the receiver really has free.
            ASSERT_LE(e->peer.written() - o.rx.consumed, o.ringSize);
            // Slots: what the sender may still use is at most what the peer has posted,
            // less what is on its way.
            uint64_t inFlight = e->outbox.size();
            ASSERT_LE(e->peer.slots() + inFlight, o.posted + 0ull)
                << "sender thinks " << e->peer.slots() << " slots free, " << inFlight
                << " in flight, " << o.posted << " posted";
        }
    }

private:
    std::mt19937_64 rng_;
    Endpoint a_, b_;
};

struct SimParam
{
    uint64_t ringA;
    uint32_t slotsA;
    uint64_t ringB;
    uint32_t slotsB;
    bool bothSend;
};

std::ostream &operator<<(std::ostream &os, const SimParam &p)
{
    return os << "ringA=" << p.ringA << " slotsA=" << p.slotsA << " ringB=" << p.ringB
              << " slotsB=" << p.slotsB << (p.bothSend ? " both send" : " A sends");
}

class CreditSimTest : public ::testing::TestWithParam<SimParam>
{};

// Fills the peer's ring until the credits stop the sender, lets the receiver consume it all and
// return what is due, and checks the sender can go on with all but a sub-unit of the ring.
void fillDrainAndCheck(Pair &pair, Endpoint &sender)
{
    Endpoint &receiver = pair.other(sender);
    const uint64_t unit = uint64_t(1) << wire::creditShift(receiver.ringSize);
    for (int round = 0; round < 3; round++) {
        int sent = 0;
        while (pair.sendData(sender, UINT64_MAX))
            ASSERT_LT(++sent, 1000000);
        ASSERT_FALSE(sender.peer.canSendData());
        pair.settle();
        ASSERT_EQ(receiver.rx.written, sender.peer.written());
        ASSERT_EQ(receiver.rx.readable(), 0u);
        EXPECT_TRUE(sender.peer.canSendData())
            << "sender stalled with everything consumed: " << sender.peer.ringAvail()
            << " ring bytes, " << sender.peer.slots() << " slots";
        EXPECT_GE(sender.peer.ringAvail(), receiver.ringSize - unit + 1)
            << "ring " << receiver.ringSize << ", unit " << unit
            << ": the receiver consumed everything but the sender still misses "
            << receiver.ringSize - sender.peer.ringAvail() << " bytes";
        EXPECT_GT(sender.peer.slots(), kReservedSlots);
    }
}

} // namespace

TEST_P(CreditSimTest, NeverOverrunsNeverStalls)
{
    const SimParam p = GetParam();
    Pair pair(p.ringA, p.slotsA, p.ringB, p.slotsB, p.ringA * 7919 + p.slotsA + p.bothSend);
    pair.a().sends = true;
    pair.b().sends = p.bothSend;

    for (int burst = 0; burst < 20; burst++) {
        for (int step = 0; step < 10000; step++) {
            pair.randomStep();
            pair.check();
            if (HasFatalFailure() || HasNonfatalFailure())
                return;
        }
        // Quiescence: nobody may be left waiting on the other.
        pair.settle();
        for (Endpoint *e : {&pair.a(), &pair.b()}) {
            Endpoint &o = pair.other(*e);
            ASSERT_EQ(o.rx.written, e->peer.written());
            ASSERT_EQ(o.rx.readable(), 0u);
            ASSERT_EQ(o.posted, o.rxSlots);
            EXPECT_TRUE(e->peer.canSendData())
                << "burst " << burst << ": stalled with " << e->peer.ringAvail()
                << " ring bytes and " << e->peer.slots() << " slots";
        }
        if (HasFatalFailure() || HasNonfatalFailure())
            return;
    }

    fillDrainAndCheck(pair, pair.a());
    if (p.bothSend)
        fillDrainAndCheck(pair, pair.b());

    EXPECT_EQ(pair.a().dataSent, pair.b().dataReceived);
    EXPECT_EQ(pair.b().dataSent, pair.a().dataReceived);
    EXPECT_GT(pair.a().dataSent, 4 * p.ringB) << "the simulation moved too little data";
    EXPECT_GT(pair.b().creditsSent, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Rings, CreditSimTest,
    ::testing::Values(SimParam{1024, 8, 1024, 8, false}, SimParam{4096, 4, 4096, 4, false},
                      SimParam{4096, 384, 32768, 384, false}, SimParam{32768, 16, 32768, 16, false},
                      SimParam{65536, 64, 65536, 64, false}, SimParam{65537, 64, 65537, 64, false},
                      SimParam{1 << 20, 384, 1 << 20, 384, false}, SimParam{1024, 8, 1024, 8, true},
                      SimParam{4096, 4, 4096, 4, true}, SimParam{32768, 5, 4096, 9, true},
                      SimParam{1 << 20, 16, 1024, 8191, true},
                      SimParam{1 << 20, 384, 1 << 20, 384, true}));

// A rewind (wire::kDataRewind), both ends and the receive ring in step: the padding takes the
// sender's credit until the reader has passed it, the write after it lands at offset 0 in room
// the reader had freed, and once all is read and credited the sender holds the whole ring again.
TEST(Rewind, PaddingTakesCreditUntilTheReaderPassesIt)
{
    PeerCredits p;
    LocalCredits l;
    RecvRing r;
    r.size = 4096;
    p.init(4096, 16, wire::creditShift(4096));
    l.init(4096, 16);
    EXPECT_EQ(p.rewindSkip(), 0u) << "at the start already";
    p.onDataSent(1000);
    l.onWritten(1000);
    r.written += 1000;
    EXPECT_EQ(p.rewindSkip(), 3096u);
    EXPECT_EQ(p.ringAvail(), 3096u) << "no room at the start: no rewind";
    l.onConsumed(r.consume(600));
    ASSERT_EQ(p.onCredit(0, decodeCredit(l.take()).ringUnits), 0);
    ASSERT_EQ(p.ringAvail(), 3696u);
    // 600 bytes free at the start: a write of up to 600 may go there.
    p.onRewind();
    EXPECT_EQ(p.written(), 4096u);
    EXPECT_EQ(p.ringAvail(), 600u);
    const uint64_t skip = r.toEnd(r.written);
    ASSERT_EQ(skip, 3096u);
    ASSERT_LT(r.written + skip - l.reported(), r.size) << "the receiver's check";
    l.onWritten(skip);
    EXPECT_EQ(r.pad(skip), 0u) << "400 bytes before it are unread";
    p.onDataSent(500);
    EXPECT_EQ(r.offset(r.written), 0u) << "the write lands at the start";
    r.written += 500;
    l.onWritten(500);
    EXPECT_EQ(r.readable(), 900u);
    EXPECT_EQ(r.readableToPad(), 400u);
    EXPECT_EQ(r.readableAfterPad(), 500u);
    EXPECT_EQ(r.offset(r.consumed), 600u);
    EXPECT_FALSE(l.peerStarved());
    // Reading all of it passes the padding, which is owed back with the bytes.
    const uint64_t moved = r.consume(900);
    EXPECT_EQ(moved, 900u + 3096u);
    EXPECT_EQ(r.padLen, 0u);
    EXPECT_EQ(r.readable(), 0u);
    l.onConsumed(moved);
    ASSERT_TRUE(l.due());
    ASSERT_EQ(p.onCredit(0, decodeCredit(l.take()).ringUnits), 0);
    EXPECT_EQ(p.ringAvail(), 4096u) << "the whole ring again";
    EXPECT_EQ(r.offset(r.consumed), 500u);
}

// With nothing unread a rewind's padding is passed at once, and owed back at once.
TEST(Rewind, PaddingOfAReadRingIsPassedAtOnce)
{
    RecvRing r;
    r.size = 4096;
    r.written = r.consumed = 5000; // a lap and 904 bytes, all read
    EXPECT_EQ(r.pad(r.toEnd(r.written)), 3192u);
    EXPECT_EQ(r.padLen, 0u);
    EXPECT_EQ(r.readable(), 0u);
    EXPECT_EQ(r.offset(r.written), 0u);
    EXPECT_EQ(r.consumed, r.written);
}

// Reading up to the padding exactly passes it; discarding everything drops it.
TEST(Rewind, ReadingUpToThePaddingPassesIt)
{
    RecvRing r;
    r.size = 4096;
    r.written = 4000;
    r.consumed = 3000;
    EXPECT_EQ(r.pad(96), 0u);
    r.written += 10;
    EXPECT_EQ(r.readSpan(), 1000u) << "not into the padding";
    EXPECT_EQ(r.consume(1000), 1096u);
    EXPECT_EQ(r.padLen, 0u);
    EXPECT_EQ(r.readable(), 10u);
    EXPECT_EQ(r.readSpan(), 10u);
    EXPECT_EQ(r.offset(r.consumed), 0u);
    r.written += 4086 - 10;
    EXPECT_EQ(r.pad(10), 0u);
    EXPECT_EQ(r.discardAll(), 4086u + 10u);
    EXPECT_EQ(r.readable(), 0u);
    EXPECT_EQ(r.padLen, 0u);
}
