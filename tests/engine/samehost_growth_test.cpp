// SPDX-License-Identifier: MIT
// A same-host ring's growth: a full ring grows once, to what the region holds, and the bytes on
// both sides of the growth arrive in order; a size that was set stays; a peer's bad growth
// resets its own connection only.

#include <bit>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "samehost.h"
#include "samehost_fixture.h"

namespace rstream {
namespace {

class SameHostGrowth : public SameHostTest
{};

std::vector<uint8_t> pattern(size_t n, uint32_t seed)
{
    std::vector<uint8_t> v(n);
    std::mt19937 rng(seed);
    for (auto &b : v)
        b = uint8_t(rng());
    return v;
}

// Sends without blocking until the ring takes no more; returns what it took.
size_t fill(Connection &c, const std::vector<uint8_t> &data, size_t from, size_t chunk)
{
    size_t off = from;
    while (off < data.size()) {
        const ssize_t r = c.send(data.data() + off, std::min(chunk, data.size() - off), kNonBlock);
        if (r == -EAGAIN)
            break;
        EXPECT_GT(r, 0) << strerror(int(-r));
        if (r <= 0)
            break;
        off += size_t(r);
    }
    return off - from;
}

// A reader that leaves the bytes unread: the writer's ring grows once it is full, so a writer
// that does not block gets well past the first ring, and the bytes written before the growth
// (in the first ring, at positions not aligned to anything) and after it arrive in order.
TEST_F(SameHostGrowth, AFullRingGrowsOnceAndKeepsItsBytesInOrder)
{
    auto [c, s] = pair();
    ASSERT_TRUE(c && s);
    SameHostLink *w = c->testSameHostLink();
    SameHostLink *r = s->testSameHostLink();
    const uint64_t first = w->sendRing(), most = w->sendRingMax();
    ASSERT_GT(most, first);
    const auto data = pattern(3 * most, 1);
    std::vector<uint8_t> got(data.size());
    // 777 bytes through first, so that the ring's positions are not aligned at its growth.
    ASSERT_EQ(c->send(data.data(), 777), 777);
    ASSERT_EQ(s->recv(got.data(), 777, kWaitAll, 5000), 777);
    const size_t unread = fill(*c, data, 777, 10000);
    EXPECT_GT(unread, first + first / 2);
    EXPECT_LE(unread, most);
    EXPECT_EQ(w->sendRing(), most);
    EXPECT_EQ(r->recvRing(), first) << "grown before any byte past the growth was read";
    size_t off = 777;
    while (off < 777 + unread) {
        const ssize_t n =
            s->recv(got.data() + off, std::min<size_t>(4099, 777 + unread - off), kNonBlock);
        ASSERT_GT(n, 0) << strerror(int(-n));
        off += size_t(n);
    }
    ASSERT_EQ(std::memcmp(got.data(), data.data(), off), 0);
    EXPECT_EQ(r->recvRing(), most);
    // Grown once, it goes on at its new size, the writer and the reader both busy.
    std::mt19937 rng(7);
    std::thread writer(
        [&, &c = c] { sendAll(*c, data.data() + off, data.size() - off, rng, 65536); });
    std::mt19937 rng2(9);
    recvAll(*s, got.data() + off, data.size() - off, rng2, 7000);
    writer.join();
    EXPECT_EQ(got, data);
    EXPECT_EQ(w->sendRing(), most);
}

// A ring filled exactly (no write found it short of room) grows at the next write, which finds
// no room at all: a send that met a full ring used to wait (or fail with EAGAIN) without
// trying, and iperf3's 128 KiB writes into a 256 KiB ring never grew it.
TEST_F(SameHostGrowth, AWriteIntoAnExactlyFullRingGrowsIt)
{
    auto [c, s] = pair();
    ASSERT_TRUE(c && s);
    SameHostLink *w = c->testSameHostLink();
    const uint64_t first = w->sendRing();
    const auto data = pattern(first + 1000, 4);
    ASSERT_EQ(c->send(data.data(), first, kNonBlock), ssize_t(first));
    EXPECT_EQ(w->sendRing(), first);
    ASSERT_EQ(c->send(data.data() + first, 1000, kNonBlock), 1000);
    EXPECT_EQ(w->sendRing(), w->sendRingMax());
    std::vector<uint8_t> got(data.size());
    ASSERT_EQ(s->recv(got.data(), got.size(), kWaitAll, 5000), ssize_t(got.size()));
    EXPECT_EQ(got, data);
}

// A bulk transfer with both ends busy: the ring fills wherever the reader's head is, grows, and
// every byte arrives in order.
TEST_F(SameHostGrowth, ABulkWriterGrowsTheRingUnderABusyReader)
{
    for (uint32_t seed : {1u, 2u, 3u}) {
        SCOPED_TRACE(seed);
        auto [c, s] = pair();
        ASSERT_TRUE(c && s);
        const uint64_t most = c->testSameHostLink()->sendRingMax();
        const auto data = pattern(4 * most + seed * 1237, seed);
        std::vector<uint8_t> got(data.size());
        std::mt19937 rng(seed);
        std::thread writer([&, &c = c] { sendAll(*c, data.data(), data.size(), rng, 200000); });
        std::mt19937 rng2(seed + 100);
        recvAll(*s, got.data(), got.size(), rng2, 3000 + seed * 1000);
        writer.join();
        EXPECT_EQ(got, data);
        EXPECT_EQ(s->testSameHostLink()->recvRing(), most);
    }
}

// SO_SNDBUF set (the engine's fixBufferSizes): the ring keeps the size it has, as Linux stops
// growing a buffer whose size was set.
TEST_F(SameHostGrowth, ASendBufferSizeThatWasSetKeepsTheRing)
{
    auto [c, s] = pair();
    ASSERT_TRUE(c && s);
    c->fixBufferSizes(true, false);
    SameHostLink *w = c->testSameHostLink();
    const uint64_t first = w->sendRing();
    const auto data = pattern(2 * w->sendRingMax(), 3);
    EXPECT_EQ(fill(*c, data, 0, 10000), first);
    EXPECT_EQ(w->sendRing(), first);
    std::vector<uint8_t> got(first);
    ASSERT_EQ(s->recv(got.data(), got.size(), kWaitAll, 5000), ssize_t(first));
    EXPECT_EQ(std::memcmp(got.data(), data.data(), first), 0);
}

// A peer that publishes a growth no honest peer could: its connection is reset (it only ever
// reaches the region: sizes beyond it are refused), others go on. A growth that is merely a lie
// within the region garbles that peer's own bytes and nothing else.
TEST_F(SameHostGrowth, ABadGrowthResetsOnlyThatConnection)
{
    auto [okc, oks] = pair();
    ASSERT_TRUE(okc && oks);
    struct Case
    {
        const char *what;
        uint64_t log2;   // 0: the ring's most
        int64_t atDelta; // growAt, from the reader's head (4)
        bool reset;
    };
    const Case cases[] = {
        {"bigger than the region", 40, 6, true},
        {"no bigger than the first ring", 1, 6, true},
        {"from before what was read", 0, -2, true},
        {"from past a first ring unread", 0, 1 << 30, true},
        {"a lie within the region", 0, 6, false},
    };
    for (const Case &k : cases) {
        SCOPED_TRACE(k.what);
        auto [c, s] = pairWithSixInFlight();
        ASSERT_TRUE(c && s);
        char buf[16];
        SameHostLink *r = c->testSameHostLink();
        const uint64_t most = s->testSameHostLink()->sendRingMax();
        uint64_t log2 = k.log2 == 1 ? std::countr_zero(r->recvRing()) : k.log2;
        if (!log2)
            log2 = std::countr_zero(most);
        r->testRecvDir()->growAt.v.store(uint64_t(4 + k.atDelta));
        r->testRecvDir()->grownLog2.v.store(log2);
        const ssize_t n = c->recv(buf, sizeof(buf), 0, 5000);
        if (k.reset) {
            EXPECT_EQ(n, -ECONNRESET);
            EXPECT_EQ(s->recv(buf, sizeof(buf), 0, 5000), -ECONNRESET);
        } else {
            EXPECT_EQ(n, 6); // the bytes before the claimed growth are where they were
            EXPECT_EQ(std::memcmp(buf, "456789", 6), 0);
            EXPECT_EQ(r->recvRing(), most);
            ASSERT_EQ(s->send("abcdef", 6), 6);
            EXPECT_EQ(c->recv(buf, 6, kWaitAll, 5000), 6); // garbled, in the region
        }
    }
    ASSERT_EQ(okc->send("still", 5), 5);
    char buf[5];
    ASSERT_EQ(oks->recv(buf, 5, kWaitAll, 5000), 5);
    EXPECT_EQ(std::memcmp(buf, "still", 5), 0);
}

} // namespace
} // namespace rstream
