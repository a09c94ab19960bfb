// SPDX-License-Identifier: MIT
// Unit tests of the ring growth decisions (ring_growth.h): GROW, SWITCH and send ring growth.

#include <gtest/gtest.h>

#include <cstdint>

#include "ring_growth.h"

using rstream::RingGrowth;

namespace {

constexpr uint64_t kRing = 64 * 1024;
constexpr uint64_t kMax = 4 * 1024 * 1024;
constexpr uint64_t kReserve = kRing + 2 * kMax; // as the connection reserves it
constexpr int64_t kMs = 1'000'000;

// A receiver that has read enough within the window to ask, the window opened at start.
RingGrowth bulkReader(int64_t start)
{
    RingGrowth g;
    g.enable(true, false);
    // The first look opens the window.
    EXPECT_FALSE(g.recvGrowLog2(start, kRing, kRing, kReserve, kMax, false));
    EXPECT_TRUE(g.onConsumed(RingGrowth::kRings * kRing, kRing));
    return g;
}

TEST(RingGrowth, ConsumedCountsOnlyWhenEnabled)
{
    RingGrowth g;
    EXPECT_FALSE(g.onConsumed(100 * kRing, kRing));
    g.enable(true, false);
    EXPECT_TRUE(g.recvEnabled());
    EXPECT_FALSE(g.sendEnabled());
    EXPECT_TRUE(g.onConsumed(0, kRing)); // counted before too
    g.disableRecv();
    EXPECT_FALSE(g.onConsumed(kRing, kRing));
}

TEST(RingGrowth, BulkReaderAsksForFourTimesTheRing)
{
    const int64_t t0 = 1000 * kMs;
    RingGrowth g = bulkReader(t0);
    auto log2 = g.recvGrowLog2(t0 + 10 * kMs, kRing, kRing, kReserve, kMax, false);
    ASSERT_TRUE(log2);
    EXPECT_EQ(uint64_t(1) << *log2, 4 * kRing);
    g.onGrowSent(*log2, t0 + 10 * kMs);
    EXPECT_TRUE(g.growSent());
    // Counting starts again, and one GROW at a time.
    EXPECT_FALSE(g.onConsumed(kRing, kRing));
    EXPECT_TRUE(g.onConsumed(3 * kRing, kRing));
    EXPECT_FALSE(g.recvGrowLog2(t0 + 20 * kMs, kRing, kRing, kReserve, kMax, false));

    EXPECT_EQ(g.onSwitch(), 4 * kRing);
    EXPECT_FALSE(g.growSent());
    EXPECT_EQ(g.recvGrowths(), 1u);
}

TEST(RingGrowth, SlowReaderNeverAsks)
{
    const int64_t t0 = 1000 * kMs;
    RingGrowth g = bulkReader(t0);
    // Past the window: it opens again instead, and the count starts over.
    EXPECT_FALSE(
        g.recvGrowLog2(t0 + RingGrowth::kWindowNs + 1, kRing, kRing, kReserve, kMax, false));
    EXPECT_FALSE(g.onConsumed(kRing, kRing));
}

TEST(RingGrowth, HeldOrTooBigDoesNotAsk)
{
    const int64_t t0 = 1000 * kMs;
    RingGrowth g = bulkReader(t0);
    // The previous ring still holds bytes, or the stream is ending.
    EXPECT_FALSE(g.recvGrowLog2(t0 + 1, kRing, kRing, kReserve, kMax, true));
    // Already at the largest size.
    EXPECT_FALSE(g.recvGrowLog2(t0 + 1, kMax, kRing, kReserve, kMax, false));
    // No room left in the reserved area after the current ring.
    EXPECT_FALSE(g.recvGrowLog2(t0 + 1, kRing, kReserve - 2 * kRing, kReserve, kMax, false));
    // Capped at the largest size, rounded down to a power of two.
    auto log2 = g.recvGrowLog2(t0 + 1, kMax / 2, kRing, kReserve, kMax + kMax / 2, false);
    ASSERT_TRUE(log2);
    EXPECT_EQ(uint64_t(1) << *log2, kMax);
}

TEST(RingGrowth, FullRingAsksForTheLargestThatFitsAtOnce)
{
    RingGrowth g;
    // Not enabled (the peer does not follow GROW): never.
    EXPECT_FALSE(g.recvFullGrowLog2(kRing, kRing, kReserve, kMax, false));
    g.enable(true, false);
    // No reading needed: a full ring asks for the maximum at once.
    auto log2 = g.recvFullGrowLog2(kRing, kRing, kReserve, kMax, false);
    ASSERT_TRUE(log2);
    EXPECT_EQ(uint64_t(1) << *log2, kMax);
    // Held (an older ring unread, the stream ending) or a GROW unanswered: not now.
    EXPECT_FALSE(g.recvFullGrowLog2(kRing, kRing, kReserve, kMax, true));
    g.onGrowSent(*log2, 0);
    EXPECT_FALSE(g.recvFullGrowLog2(kRing, kRing, kReserve, kMax, false));
    EXPECT_EQ(g.onSwitch(), kMax);
    // The reserve left bounds it; already at the maximum, or no room for more: none.
    log2 = g.recvFullGrowLog2(kRing, kRing + kMax + kMax / 2, kReserve, kMax, false);
    ASSERT_TRUE(log2);
    EXPECT_EQ(uint64_t(1) << *log2, kMax / 2);
    EXPECT_FALSE(g.recvFullGrowLog2(kMax, kRing + kMax, kReserve, kMax, false));
    EXPECT_FALSE(g.recvFullGrowLog2(kRing, kReserve, kReserve, kMax, false));
    EXPECT_FALSE(g.recvFullGrowLog2(kRing, kReserve + 1, kReserve, kMax, false));
}

TEST(RingGrowth, FixedSizesStopGrowth)
{
    RingGrowth g;
    g.enable(true, true);
    g.fix(false, true); // SO_RCVBUF: neither a bulk reader nor a full ring asks any more
    EXPECT_FALSE(g.onConsumed(100 * kRing, kRing));
    EXPECT_FALSE(g.recvFullGrowLog2(kRing, kRing, kReserve, kMax, false));
    EXPECT_TRUE(g.sendEnabled());
    // A send ring that wanted to grow keeps its size once SO_SNDBUF is set.
    EXPECT_TRUE(g.onSendSpace(0, 100, kRing, kReserve, 4 * kRing));
    g.fix(true, false);
    EXPECT_FALSE(g.onSendSpace(0, 100, kRing, kReserve, 4 * kRing));
    EXPECT_EQ(g.sendGrowth(true, kRing, kReserve), 0u);
}

TEST(RingGrowth, SwitchWithoutGrowIsRefused)
{
    RingGrowth g;
    EXPECT_EQ(g.onSwitch(), 0u);
    EXPECT_EQ(g.recvGrowths(), 0u);
}

TEST(RingGrowth, PeerGrowOneAtATimeAndOnlyBigger)
{
    RingGrowth g;
    EXPECT_EQ(g.switchTo(), 0u);
    EXPECT_FALSE(g.onPeerGrow(16, kRing)); // 64 KiB: not bigger
    EXPECT_FALSE(g.onPeerGrow(15, kRing));
    EXPECT_TRUE(g.onPeerGrow(18, kRing));
    EXPECT_EQ(g.switchTo(), 4 * kRing);
    EXPECT_FALSE(g.onPeerGrow(20, kRing)); // our SWITCH is still owed
    g.onSwitchSent();
    EXPECT_EQ(g.switchTo(), 0u);
    EXPECT_TRUE(g.onPeerGrow(20, 4 * kRing));
}

TEST(RingGrowth, SendRingGrowsOnceEmpty)
{
    RingGrowth g;
    g.enable(false, true);
    // Room for all of it: nothing wanted.
    EXPECT_FALSE(g.onSendSpace(100, 100, kRing, kMax, kMax));
    EXPECT_EQ(g.sendGrowth(true, kRing, kMax), 0u);
    // Short of room with a bigger peer ring: wanted, and it stays wanted until it happens.
    EXPECT_TRUE(g.onSendSpace(10, 100, kRing, kMax, kMax));
    EXPECT_TRUE(g.onSendSpace(100, 100, kRing, kMax, kMax));
    EXPECT_EQ(g.sendGrowth(false, kRing, kMax), 0u); // not empty yet
    EXPECT_EQ(g.sendGrowth(true, kRing, kMax), 4 * kRing);
    EXPECT_EQ(g.sendGrowths(), 1u);
    EXPECT_FALSE(g.onSendSpace(100, 100, 4 * kRing, kMax, kMax));
    // Capped at the reservation.
    EXPECT_TRUE(g.onSendSpace(0, 1, 4 * kRing, 8 * kRing, kMax));
    EXPECT_EQ(g.sendGrowth(true, 4 * kRing, 8 * kRing), 8 * kRing);
    EXPECT_EQ(g.sendGrowths(), 2u);
}

TEST(RingGrowth, SendRingKeepsItsSizeWhenGrowthWouldNotHelp)
{
    RingGrowth g;
    EXPECT_FALSE(g.onSendSpace(0, 100, kRing, kMax, kMax)); // not enabled
    g.enable(false, true);
    EXPECT_FALSE(g.onSendSpace(0, 100, kRing, kRing, kMax)); // no room reserved
    EXPECT_FALSE(g.onSendSpace(0, 100, kRing, kMax, kRing)); // the peer's ring is no bigger
    EXPECT_EQ(g.sendGrowth(true, kRing, kMax), 0u);
    EXPECT_EQ(g.sendGrowths(), 0u);
}

} // namespace
