// SPDX-License-Identifier: MIT
// Unit tests of the keepalive state machine (keepalive.h): deadlines, probes and failure.

#include <gtest/gtest.h>

#include "keepalive.h"

using rstream::KeepaliveTimer;
using Action = KeepaliveTimer::Action;

namespace {

constexpr int64_t kSec = KeepaliveTimer::kSec;

TEST(Keepalive, DefaultsAreLinuxs)
{
    KeepaliveTimer ka;
    EXPECT_FALSE(ka.on());
    EXPECT_EQ(ka.idleSec(), 7200);
    EXPECT_EQ(ka.intervalSec(), 75);
    EXPECT_EQ(ka.count(), 9);
    EXPECT_EQ(ka.unanswered(), 0u);
    EXPECT_EQ(ka.sent(), 0u);
}

TEST(Keepalive, ValidRanges)
{
    EXPECT_TRUE(KeepaliveTimer::valid(0, 0, 0));
    EXPECT_TRUE(KeepaliveTimer::valid(32767, 32767, 127));
    EXPECT_FALSE(KeepaliveTimer::valid(-1, 0, 0));
    EXPECT_FALSE(KeepaliveTimer::valid(32768, 0, 0));
    EXPECT_FALSE(KeepaliveTimer::valid(0, 32768, 0));
    EXPECT_FALSE(KeepaliveTimer::valid(0, 0, 128));
    EXPECT_FALSE(KeepaliveTimer::valid(0, 0, -1));
}

TEST(Keepalive, ZeroKeepsTheCurrentValue)
{
    KeepaliveTimer ka;
    ka.configure(true, 10, 0, 3, 0);
    EXPECT_EQ(ka.idleSec(), 10);
    EXPECT_EQ(ka.intervalSec(), 75);
    EXPECT_EQ(ka.count(), 3);
    ka.configure(false, 0, 5, 0, 0);
    EXPECT_FALSE(ka.on());
    EXPECT_EQ(ka.idleSec(), 10);
    EXPECT_EQ(ka.intervalSec(), 5);
}

TEST(Keepalive, ProbesAfterIdleThenEveryIntervalThenFails)
{
    KeepaliveTimer ka;
    const int64_t t0 = 1000 * kSec;
    ka.configure(true, 10, 2, 3, t0);
    Action a;
    EXPECT_EQ(ka.tick(t0 + 5 * kSec, &a), t0 + 10 * kSec);
    EXPECT_EQ(a, Action::None);
    // Three probes, an interval apart.
    for (int i = 0; i < 3; i++) {
        const int64_t at = t0 + (10 + 2 * i) * kSec;
        EXPECT_EQ(ka.tick(at - 1, &a), at);
        EXPECT_EQ(a, Action::None);
        EXPECT_EQ(ka.tick(at, &a), at + 2 * kSec);
        EXPECT_EQ(a, Action::Probe);
        EXPECT_EQ(ka.unanswered(), uint32_t(i + 1));
    }
    EXPECT_EQ(ka.sent(), 3u);
    // The count is reached: an interval after the last probe the connection fails.
    EXPECT_EQ(ka.tick(t0 + 15 * kSec, &a), t0 + 16 * kSec);
    EXPECT_EQ(a, Action::None);
    EXPECT_EQ(ka.tick(t0 + 16 * kSec, &a), 0);
    EXPECT_EQ(a, Action::Fail);
    EXPECT_EQ(ka.sent(), 3u);
}

TEST(Keepalive, AnyWordAnswers)
{
    KeepaliveTimer ka;
    ka.configure(true, 10, 2, 3, 0);
    Action a;
    ka.tick(10 * kSec, &a);
    ASSERT_EQ(a, Action::Probe);
    EXPECT_EQ(ka.unanswered(), 1u);
    ka.noteWord();
    EXPECT_TRUE(ka.takeWord());
    EXPECT_FALSE(ka.takeWord());
    ka.onRx(11 * kSec);
    EXPECT_EQ(ka.unanswered(), 0u);
    // The idle time counts again from the word.
    EXPECT_EQ(ka.tick(12 * kSec, &a), 21 * kSec);
    EXPECT_EQ(a, Action::None);
    EXPECT_EQ(ka.sent(), 1u);
}

TEST(Keepalive, SwitchingOnRestartsTheIdleTime)
{
    KeepaliveTimer ka;
    ka.configure(true, 10, 2, 3, 0);
    Action a;
    ka.tick(10 * kSec, &a);
    ASSERT_EQ(ka.unanswered(), 1u);
    // Still on: the probes continue.
    ka.configure(true, 0, 0, 0, 50 * kSec);
    EXPECT_EQ(ka.unanswered(), 1u);
    ka.configure(false, 0, 0, 0, 0);
    ka.configure(true, 0, 0, 0, 100 * kSec);
    EXPECT_EQ(ka.unanswered(), 0u);
    EXPECT_EQ(ka.tick(100 * kSec, &a), 110 * kSec);
    EXPECT_EQ(a, Action::None);
}

TEST(Keepalive, StartCountsFromTheConnection)
{
    KeepaliveTimer ka;
    ka.configure(true, 10, 2, 3, 0);
    EXPECT_EQ(ka.start(40 * kSec), 40 * kSec);
    Action a;
    EXPECT_EQ(ka.tick(45 * kSec, &a), 50 * kSec);
    EXPECT_EQ(a, Action::None);
}

} // namespace
