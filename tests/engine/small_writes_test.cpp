// SPDX-License-Identifier: MIT
// Write sizes and small reads over the fabric: sends held back behind injected writes once half
// the peer's receive slots are out, a message that fits the peer's ring sent whole, and looks
// at a readable connection that skip progress.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "connection_detail.h"
#include "engine_fixture.h"

namespace rstream {
namespace {

using SmallWrites = EngineTest;

// A stream of small sends to a peer that does not keep up took a receive slot, a write and a
// completion at the peer for each until the slots ran out. Now, once half of them are out, the
// sends are held in the ring and the CREDIT for those slots (which the peer returns once its
// progress took them, read or not) flushes them as one write.
TEST_P(SmallWrites, SendsCoalesceOnceHalfThePeersSlotsAreOut)
{
    if (GetParam().sameHost || GetParam().iwarp)
        GTEST_SKIP() << "injected fabric writes only (iwarp writes wait for their completions)";
    // Up to three tries on fresh pairs: a stall of a millisecond in the sending loop (a loaded
    // machine) lets the progress thread flush what was held, each byte a write (about 5 % of
    // runs with two tests at once, at every version of this code). Without the coalescing every
    // try takes every slot.
    uint64_t best = UINT64_MAX;
    uint32_t slots = 0;
    for (int attempt = 0; attempt < 3 && best > slots / 2 + 8; attempt++) {
        auto [c, s] = pair();
        ASSERT_TRUE(c && s);
        Connection::FlowState flow;
        ASSERT_TRUE(c->flowState(&flow));
        slots = flow.peerCreditSlots; // all of them: nothing sent yet
        ASSERT_GE(slots, 16u);
        const uint64_t before = s->rxEventCount();
        const int n = 1000;
        for (int i = 0; i < n; i++) {
            const char b = static_cast<char>(i);
            ASSERT_EQ(c->send(&b, 1, kNonBlock), 1) << "send " << i;
        }
        std::vector<char> in(n);
        for (int got = 0; got < n;) {
            const ssize_t r = s->recv(in.data() + got, size_t(n - got), 0, 10000);
            ASSERT_GT(r, 0) << strerror(int(-r));
            got += int(r);
        }
        for (int i = 0; i < n; i++)
            ASSERT_EQ(in[size_t(i)], static_cast<char>(i)) << "byte " << i;
        best = std::min<uint64_t>(best, s->rxEventCount() - before);
    }
    RecordProperty("messages", int(best));
    RecordProperty("slots", int(slots));
    // Half the slots as single writes, then a few coalesced ones (before: every slot but the
    // reserved ones, then the rest).
    EXPECT_LE(best, slots / 2 + 8) << "of 1000 one-byte sends, in the best of three tries";
}

// A message bigger than a chunk (a quarter of the ring) that fits the room in the peer's ring,
// with nothing in flight, goes as one write: the peer gets one completion and its reader one
// wake-up. A 16 KiB message to a 32 KiB ring went as two writes of 8 KiB (sockperf's 16 KiB
// ping-pong at 1.7 x kernel TCP's latency).
TEST_P(SmallWrites, AMessageThatFitsThePeersRingGoesAsOneWrite)
{
    if (GetParam().sameHost)
        GTEST_SKIP() << "no fabric writes";
    auto [c, s] = pair();
    ASSERT_TRUE(c && s);
    Connection::FlowState flow;
    for (int i = 0; i < 1000 && !c->flowState(&flow); i++)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    // Half the peer's ring (nothing sent yet): twice a chunk, and clear of the ring's end.
    const size_t len = flow.peerCreditBytes / 2;
    ASSERT_GE(len, 8192u);
    std::vector<char> out(len);
    for (size_t i = 0; i < len; i++)
        out[i] = static_cast<char>(i * 7 + 3);
    const uint64_t before = s->rxEventCount();
    ASSERT_EQ(c->send(out.data(), len, 0, 10000), ssize_t(len));
    std::vector<char> in(len);
    for (size_t got = 0; got < len;) {
        const ssize_t r = s->recv(in.data() + got, len - got, 0, 10000);
        ASSERT_GT(r, 0) << strerror(int(-r));
        got += size_t(r);
    }
    ASSERT_EQ(in, out);
    // Its own events only: the reader sent nothing that could bring others.
    EXPECT_EQ(s->rxEventCount() - before, 1u) << "writes for a message of " << len << " bytes";
}

// A reader of small pieces that polls before each (iperf3 -l 64's server: select, then 64 B)
// made a progress round (an epoll_wait on tcp) at every look although the connection was
// readable and writable. Now such looks make progress at most every kLookProgressNs.
TEST_P(SmallWrites, LooksAtAReadableConnectionSkipProgress)
{
    if (GetParam().sameHost)
        GTEST_SKIP() << "a same-host look makes no progress call at all";
    auto [c, s] = pair();
    ASSERT_TRUE(c && s);
    std::vector<char> out(4096, 'x');
    ASSERT_EQ(c->send(out.data(), out.size(), 0, 10000), ssize_t(out.size()));
    ssize_t r = -EAGAIN, w = 0;
    for (int i = 0; i < 2000 && r == -EAGAIN; i++) {
        s->peek(&r, &w);
        if (r == -EAGAIN)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_GT(r, 0) << "the data did not arrive";
    const int looks = 200;
    const uint64_t before = s->progressCalls();
    const auto t0 = std::chrono::steady_clock::now();
    char b;
    for (int i = 0; i < looks; i++) {
        s->peek(&r, &w);
        ASSERT_GT(r, 0);
        ASSERT_GT(w, 0);
        ASSERT_EQ(s->recv(&b, 1, kNonBlock), 1); // 1 B a look, as a small reader does
    }
    const int64_t ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    const uint64_t calls = s->progressCalls() - before;
    RecordProperty("progress_calls", int(calls));
    RecordProperty("elapsed_us", int(ns / 1000));
    // One per kLookProgressNs at most (and one more at either end); before: one a look.
    EXPECT_LE(calls, uint64_t(2 + ns / kLookProgressNs))
        << looks << " looks in " << ns / 1000 << " us";
    EXPECT_LT(calls, uint64_t(looks / 2));
}

INSTANTIATE_TEST_SUITE_P(Modes, SmallWrites, ::testing::ValuesIn(kModes),
                         [](const auto &p) { return std::string(p.param.name); });

} // namespace
} // namespace rstream
