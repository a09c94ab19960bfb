// SPDX-License-Identifier: MIT
// Same-host rings that start again at their beginning once read empty (samehost.h, rebaseAt):
// small messages keep to the first pages, every byte arrives across growths and rebases, and a
// peer's rebase anywhere but where this end has read up to resets the connection.

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "samehost_fixture.h"

namespace rstream {
namespace {

class SameHostRebase : public SameHostTest
{};

// 3,000 round trips of 100 bytes move more than the rings hold each way. Without rebases every
// page of both rings ends up resident until the connection idles; with them the first ones are
// used again. (The region is one, mapped by both ends: one end's count is all of it.)
TEST_F(SameHostRebase, SmallMessagesKeepToTheRingsFirstPages)
{
    size_t resident[2] = {};
    for (const bool rebase : {false, true}) {
        SCOPED_TRACE(rebase ? "rebases" : "no rebases");
        Settings s = settings();
        s.ringRewind = rebase;
        auto [c, a] = EngineTest::pair(s, s);
        ASSERT_TRUE(c && a);
        ASSERT_TRUE(c->sameHost());
        pingPong(*c, *a, 3000, 100);
        resident[rebase] = c->ringResidentBytes();
        const uint64_t ring = c->testSameHostLink()->sendRing();
        if (!rebase) {
            EXPECT_GE(resident[rebase], 2 * std::min<uint64_t>(ring, 300000) * 3 / 4);
        }
    }
    std::printf("resident: %zu KiB with rebases, %zu KiB without\n", resident[true] / 1024,
                resident[false] / 1024);
    EXPECT_LE(resident[true], 4u * 8192) << "without rebases: " << resident[false];
}

// Small messages (rebases), a bulk transfer that grows the ring, small messages again (rebases
// after the growth), both ways: every byte in order.
TEST_F(SameHostRebase, RebasesAroundAGrowthKeepEveryByte)
{
    auto [c, a] = pair();
    ASSERT_TRUE(c && a);
    std::mt19937 rng(5);
    for (int phase = 0; phase < 3; phase++) {
        SCOPED_TRACE(phase);
        pingPong(*c, *a, 500, 1 + phase * 700);
        std::vector<uint8_t> out(3 << 20), in(out.size());
        for (auto &x : out)
            x = static_cast<uint8_t>(rng());
        Connection &from = phase % 2 ? *a : *c;
        Connection &to = phase % 2 ? *c : *a;
        std::thread writer([&] {
            std::mt19937 g(phase);
            sendAll(from, out.data(), out.size(), g, 200000);
        });
        std::mt19937 g(phase + 50);
        recvAll(to, in.data(), in.size(), g, 70000);
        writer.join();
        ASSERT_EQ(checksum(out.data(), out.size()), checksum(in.data(), in.size()));
    }
    pingPong(*c, *a, 500, 333);
}

// A stream's writes do not rebase: its ring is read empty whenever the reader catches up, and
// the lines just read are in the reader's cache (samehost.cpp, kRebaseMaxWrite). 32 KiB messages
// go round the 256 KiB rings several times, each finding its ring empty, without a rebase; small
// ones after them rebase (50 of 100 B reach a page past wherever the large ones ended).
TEST_F(SameHostRebase, LargeWritesDoNotRebase)
{
    auto [c, a] = pair();
    ASSERT_TRUE(c && a);
    const std::atomic<uint64_t> &cAt = c->testSameHostLink()->testSendDir()->tail.rebaseAt;
    const std::atomic<uint64_t> &aAt = a->testSameHostLink()->testSendDir()->tail.rebaseAt;
    pingPong(*c, *a, 41, 32 * 1024);
    EXPECT_EQ(cAt.load(), 0u);
    EXPECT_EQ(aAt.load(), 0u);
    pingPong(*c, *a, 50, 100);
    EXPECT_GT(cAt.load(), 0u);
    EXPECT_GT(aAt.load(), 0u);
}

// A rebase the peer says its bytes take anywhere but where this end has read up to: the peer
// broke the protocol (it rebases only an empty ring), and the connection is reset.
TEST_F(SameHostRebase, ARebaseNotWhereTheReaderIsResets)
{
    for (const uint64_t at : {uint64_t(7), uint64_t(2), uint64_t(1) << 40}) {
        SCOPED_TRACE(at);
        auto [c, s] = pairWithSixInFlight(); // c has read 4 of 10
        ASSERT_TRUE(c && s);
        c->testSameHostLink()->testRecvDir()->tail.rebaseAt.store(at);
        char buf[16];
        EXPECT_EQ(c->recv(buf, sizeof(buf), 0, 5000), -ECONNRESET);
        EXPECT_EQ(s->recv(buf, sizeof(buf), 0, 5000), -ECONNRESET);
    }
}

} // namespace
} // namespace rstream
