// SPDX-License-Identifier: MIT
// AdaptiveSpin: the window follows the waits, and probes let a fallen window rise again.
// RoomRate: a wait for room spins only when the peer reads what is queued within a wake-up.

#include <algorithm>
#include <gtest/gtest.h>
#include <numeric>
#include <vector>

#include "spin.h"

namespace rstream {
namespace {

constexpr int64_t kCap = 50000; // 50 us, RSTREAM_POLL_US's default

// The windows of n waits in a row, each of which ended after waitedNs; spun: each recorded as
// having spun its window (as the waits do), else as having spun nothing.
std::vector<int64_t> run(AdaptiveSpin &s, int n, int64_t waitedNs, bool spun = false)
{
    std::vector<int64_t> windows;
    for (int i = 0; i < n; i++) {
        windows.push_back(s.windowNs(kCap));
        s.record(waitedNs, kCap, spun ? windows.back() : 0);
    }
    return windows;
}

TEST(AdaptiveSpin, StartsAtTheCap)
{
    AdaptiveSpin s;
    EXPECT_EQ(s.windowNs(kCap), kCap);
}

TEST(AdaptiveSpin, ZeroCapNeverSpins)
{
    AdaptiveSpin s;
    for (int i = 0; i < 40; i++) {
        EXPECT_EQ(s.windowNs(0), 0);
        s.record(10, 0);
    }
}

TEST(AdaptiveSpin, LongWaitsStopTheSpinExceptForProbes)
{
    // A server with a request every millisecond: after a few waits it sleeps at once, and
    // spins the cap only on every 16th wait.
    AdaptiveSpin s;
    auto w = run(s, 64, 1000000);
    int spins = 0;
    for (size_t i = 8; i < w.size(); i++)
        if (w[i] > 0)
            spins++;
    EXPECT_EQ(s.currentNs(), 0);
    EXPECT_LE(spins, 4) << "probes only";
    int64_t spent = 0;
    for (int64_t x : w)
        spent += x;
    // Spin spent over 64 waits of 1 ms: under 2 % of the time (a fixed spin would be 5 %).
    EXPECT_LT(spent, 64 * 1000000 / 50);
}

TEST(AdaptiveSpin, ShortWaitsKeepASpinOfTwiceTheirLength)
{
    AdaptiveSpin s;
    run(s, 10, 1000000);
    ASSERT_EQ(s.currentNs(), 0);
    // A ping-pong of 10 us round trips starts: the first wait slept (its wake-up counted too),
    // and from then on the window covers the round trip.
    s.record(30000, kCap);
    EXPECT_EQ(s.currentNs(), 50000);
    run(s, 20, 10000);
    EXPECT_GE(s.currentNs(), 20000);
    EXPECT_LE(s.currentNs(), kCap);
}

TEST(AdaptiveSpin, AProbeLetsAFallenWindowRise)
{
    // Each sleep's wake-up alone makes every measured wait longer than the cap; only a probe,
    // which spins the whole cap, can see that the waits are short now.
    AdaptiveSpin s;
    run(s, 20, 1000000);
    ASSERT_EQ(s.currentNs(), 0);
    bool rose = false;
    for (int i = 0; i < int(AdaptiveSpin::kProbeEvery) && !rose; i++) {
        const int64_t window = s.windowNs(kCap);
        // Within a spin the wait is short; a sleep costs it 80 us of wake-up.
        s.record(window >= 5000 ? 5000 : 85000, kCap);
        rose = s.currentNs() > 0;
    }
    EXPECT_TRUE(rose);
    EXPECT_EQ(s.currentNs(), 10000);
}

TEST(AdaptiveSpin, AWakeUpPastTheCapDoesNotShrinkTheWindow)
{
    // A wait that slept is measured with its wake-up: 120 us against a 50 us cap may be a
    // request that came at 40 us. Only waits longer than the cap and a wake-up shrink it.
    AdaptiveSpin s;
    s.record(20000, kCap);
    const int64_t w = s.currentNs();
    for (int i = 0; i < 10; i++)
        s.record(kCap + AdaptiveSpin::kWakeSlackNs, kCap);
    EXPECT_EQ(s.currentNs(), w);
    s.record(kCap + AdaptiveSpin::kWakeSlackNs + 1, kCap);
    EXPECT_EQ(s.currentNs(), w / 2);
}

TEST(AdaptiveSpin, AFullSpinThatMissedShrinksTheWindow)
{
    // ab -c 1 against a server: a connection every 100 us. A wait that spun the whole cap
    // caught nothing, and its wake-up came within kWakeSlackNs of the cap: the window falls
    // all the same, and the spin soon stops but for probes.
    AdaptiveSpin s;
    const int n = 200;
    const std::vector<int64_t> w = run(s, n, 100000, true);
    const int64_t spent = std::accumulate(w.begin() + n / 2, w.end(), int64_t(0));
    EXPECT_EQ(s.currentNs(), 0);
    // Then only the probes spin (they spun the cap every time before: 100 %).
    EXPECT_LE(spent, int64_t(n / 2) * kCap / int64_t(AdaptiveSpin::kProbeEvery) + kCap);
    // A wait past the cap that did not spin it all is no evidence (see above).
    AdaptiveSpin t;
    run(t, 10, 1000000);
    t.record(20000, kCap);
    t.record(100000, kCap, 20000);
    EXPECT_EQ(t.currentNs(), 40000);
}

TEST(AdaptiveSpin, MissedProbesComeLessOften)
{
    // A server with a request every millisecond: its probes (the cap, every 16th wait) miss
    // each time, and come half as often after each miss, down to one wait in 256; a probe that
    // catches a short wait brings them back to every 16th.
    AdaptiveSpin s;
    const int n = 4096;
    const std::vector<int64_t> w = run(s, n, 1000000, true);
    const auto probes = std::count(w.begin(), w.end(), kCap);
    EXPECT_EQ(s.currentNs(), 0);
    EXPECT_EQ(s.probeEvery(), AdaptiveSpin::kProbeMax);
    // The first wait (nothing learnt yet), one probe at each interval on the way down, then one
    // in 256: 18 here, against 256 at one in 16.
    EXPECT_LE(probes, 2 + 4 + n / int(AdaptiveSpin::kProbeMax));
    int64_t window = 0;
    for (uint32_t i = 0; i < AdaptiveSpin::kProbeMax && window != kCap; i++) {
        window = s.windowNs(kCap);
        if (window != kCap)
            s.record(1000000, kCap, window);
    }
    ASSERT_EQ(window, kCap) << "no probe within kProbeMax waits";
    s.record(5000, kCap, window); // the probe caught it
    EXPECT_EQ(s.probeEvery(), AdaptiveSpin::kProbeEvery);
    EXPECT_EQ(s.currentNs(), 10000);
}

TEST(AdaptiveSpin, MixedWaitsKeepASmallWindow)
{
    // Short and long waits in turn: the window stays at least as long as the short ones.
    AdaptiveSpin s;
    for (int i = 0; i < 100; i++) {
        s.windowNs(kCap);
        s.record(i % 2 ? 1000000 : 8000, kCap);
        if (i % 2 == 0) {
            EXPECT_GE(s.currentNs(), 16000) << i;
        }
    }
}

// A wait for room spins when the peer reads what is queued within a wake-up's time
// (AdaptiveSpin::kWakeSlackNs, 100 us), at the rate it read since the previous wait for room.
TEST(RoomRate, SpinsOnlyForAFastReader)
{
    RoomRate r;
    const int64_t ms = 1000000;
    // The first wait has no rate to go by: it sleeps.
    EXPECT_FALSE(r.spin(0, 256 * 1024, 10 * ms));
    // 1 MiB read in 200 us (5 GB/s): 256 KiB queued is read in 50 us.
    EXPECT_TRUE(r.spin(1 << 20, 256 * 1024, 10 * ms + 200000));
    // 85 KiB more in 2.5 ms (35 MB/s, iperf3 -l 64): 256 KiB takes 7.5 ms.
    EXPECT_FALSE(r.spin((1 << 20) + 85 * 1024, 256 * 1024, 12 * ms + 700000));
    // Fast again, but with more queued than it reads in 100 us (5 GB/s: 500 KB).
    EXPECT_TRUE(r.spin((2 << 20) + 85 * 1024, 400 * 1000, 12 * ms + 900000));
    EXPECT_FALSE(r.spin((3 << 20) + 85 * 1024, 600 * 1000, 13 * ms + 100000));
    // Nothing read since (the same instant, or no bytes): it sleeps.
    EXPECT_FALSE(r.spin((3 << 20) + 85 * 1024, 1, 13 * ms + 100000));
    EXPECT_FALSE(r.spin((3 << 20) + 85 * 1024, 1, 14 * ms));
}

} // namespace
} // namespace rstream
