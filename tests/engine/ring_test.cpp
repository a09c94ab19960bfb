// SPDX-License-Identifier: MIT
// Unit tests of the ring arithmetic: offsets, wrap, and a randomized check against a byte model.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "ring.h"

using namespace rstream;

namespace {

constexpr uint64_t k4G = uint64_t(1) << 32;

SendRing makeSendRing(uint64_t size, uint64_t base)
{
    SendRing r;
    r.size = size;
    r.tail = r.posted = r.done = base;
    return r;
}

} // namespace

TEST(Ring, OffsetAndToEnd)
{
    Ring r{1024};
    EXPECT_EQ(r.offset(0), 0u);
    EXPECT_EQ(r.toEnd(0), 1024u);
    EXPECT_EQ(r.offset(1), 1u);
    EXPECT_EQ(r.toEnd(1), 1023u);
    EXPECT_EQ(r.offset(1023), 1023u);
    EXPECT_EQ(r.toEnd(1023), 1u);
    EXPECT_EQ(r.offset(1024), 0u);
    EXPECT_EQ(r.toEnd(1024), 1024u);
    EXPECT_EQ(r.offset(1025), 1u);
    EXPECT_EQ(r.offset(5 * 1024 + 7), 7u);
}

TEST(Ring, OffsetOfANonPowerOfTwoRing)
{
    Ring r{1000};
    EXPECT_EQ(r.offset(999), 999u);
    EXPECT_EQ(r.toEnd(999), 1u);
    EXPECT_EQ(r.offset(1000), 0u);
    EXPECT_EQ(r.offset(2500), 500u);
    EXPECT_EQ(r.toEnd(2500), 500u);
}

TEST(Ring, PositionsBeyondFourGigabytes)
{
    // 2^32 is not a multiple of 1000: a ring must not assume 32-bit positions.
    Ring r{1000};
    EXPECT_EQ(r.offset(k4G), k4G % 1000);
    EXPECT_EQ(r.offset(k4G), 296u);
    EXPECT_EQ(r.toEnd(k4G), 704u);
    EXPECT_EQ(r.offset(k4G * 7 + 3), (k4G * 7 + 3) % 1000);

    Ring p{65536};
    EXPECT_EQ(p.offset(k4G + 65535), 65535u);
    EXPECT_EQ(p.toEnd(k4G + 65535), 1u);
    EXPECT_EQ(p.offset(UINT64_MAX), 65535u);
    EXPECT_EQ(p.toEnd(UINT64_MAX), 1u);

    Ring odd{65537};
    uint64_t pos = (uint64_t(1) << 40) + 12345;
    EXPECT_EQ(odd.offset(pos), pos % 65537);
    EXPECT_EQ(odd.offset(pos) + odd.toEnd(pos), 65537u);
}

TEST(SendRing, EmptyRing)
{
    SendRing r = makeSendRing(4096, 0);
    EXPECT_EQ(r.freeSpace(), 4096u);
    EXPECT_EQ(r.unsent(), 0u);
    EXPECT_EQ(r.inFlight(), 0u);
    EXPECT_EQ(r.appendSpan(), 4096u);
}

TEST(SendRing, AppendPostCompleteWithoutWrap)
{
    SendRing r = makeSendRing(4096, 0);
    r.tail += 1000;
    EXPECT_EQ(r.freeSpace(), 3096u);
    EXPECT_EQ(r.unsent(), 1000u);
    EXPECT_EQ(r.inFlight(), 0u);
    EXPECT_EQ(r.appendSpan(), 3096u);
    r.posted += 600;
    EXPECT_EQ(r.unsent(), 400u);
    EXPECT_EQ(r.inFlight(), 600u);
    EXPECT_EQ(r.freeSpace(), 3096u);
    r.done += 600;
    EXPECT_EQ(r.inFlight(), 0u);
    EXPECT_EQ(r.freeSpace(), 3696u);
    // Free space now wraps: 3096 bytes to the end, 600 bytes at the start.
    EXPECT_EQ(r.appendSpan(), 3096u);
}

TEST(SendRing, AppendSpanStopsAtTheEnd)
{
    SendRing r = makeSendRing(4096, 4000);
    // tail at offset 4000, the ring is empty: 96 bytes to the end, then 4000 more.
    EXPECT_EQ(r.freeSpace(), 4096u);
    EXPECT_EQ(r.appendSpan(), 96u);
    r.tail += 96;
    EXPECT_EQ(r.offset(r.tail), 0u);
    EXPECT_EQ(r.appendSpan(), 4000u);
    r.tail += 4000;
    EXPECT_EQ(r.freeSpace(), 0u);
    EXPECT_EQ(r.appendSpan(), 0u);
    EXPECT_EQ(r.unsent(), 4096u);
}

TEST(SendRing, AppendSpanLimitedByFreeSpaceAcrossTheWrap)
{
    SendRing r = makeSendRing(4096, 0);
    r.tail = 5000; // offset 904
    r.posted = 5000;
    r.done = 2000; // 3000 bytes in flight
    EXPECT_EQ(r.freeSpace(), 1096u);
    EXPECT_EQ(r.inFlight(), 3000u);
    EXPECT_EQ(r.toEnd(r.tail), 3192u);
    EXPECT_EQ(r.appendSpan(), 1096u);
    r.done = 4500;
    EXPECT_EQ(r.freeSpace(), 3596u);
    EXPECT_EQ(r.appendSpan(), 3192u);
}

TEST(SendRing, FullRingAtAWrappedPosition)
{
    SendRing r = makeSendRing(1024, 3 * k4G + 1000);
    r.tail += 1024;
    EXPECT_EQ(r.freeSpace(), 0u);
    EXPECT_EQ(r.appendSpan(), 0u);
    EXPECT_EQ(r.unsent(), 1024u);
    r.posted += r.toEnd(r.posted); // the first chunk stops at the end of the ring
    EXPECT_EQ(r.inFlight(), 24u);
    EXPECT_EQ(r.offset(r.posted), 0u);
    r.posted = r.tail;
    r.done = r.tail - 1;
    EXPECT_EQ(r.freeSpace(), 1023u);
    EXPECT_EQ(r.inFlight(), 1u);
}

TEST(SendRing, PositionsAcrossFourGigabytes)
{
    SendRing r = makeSendRing(1000, k4G - 10);
    r.tail = k4G + 500;
    r.posted = k4G + 100;
    EXPECT_EQ(r.unsent(), 400u);
    EXPECT_EQ(r.inFlight(), 110u);
    EXPECT_EQ(r.freeSpace(), 1000u - 510u);
    EXPECT_EQ(r.offset(r.tail), (k4G + 500) % 1000);
    EXPECT_EQ(r.appendSpan(), std::min<uint64_t>(490, r.toEnd(r.tail)));
}

TEST(RecvRing, ReadSpanWraps)
{
    RecvRing r;
    r.size = 2048;
    r.written = r.consumed = 3 * k4G + 2000;
    EXPECT_EQ(r.readable(), 0u);
    EXPECT_EQ(r.readSpan(), 0u);
    r.written += 48; // lands at the end of the ring
    EXPECT_EQ(r.readable(), 48u);
    EXPECT_EQ(r.readSpan(), 48u);
    r.written += 1000; // then from the start
    EXPECT_EQ(r.readable(), 1048u);
    EXPECT_EQ(r.readSpan(), r.toEnd(r.consumed));
    r.consumed += r.readSpan();
    EXPECT_EQ(r.offset(r.consumed), 0u);
    EXPECT_EQ(r.readSpan(), 1000u);
    r.consumed += 1000;
    EXPECT_EQ(r.readable(), 0u);
}

TEST(RecvRing, FullRing)
{
    RecvRing r;
    r.size = 1024;
    r.consumed = 100;
    r.written = 1124;
    EXPECT_EQ(r.readable(), 1024u);
    EXPECT_EQ(r.readSpan(), 924u);
}

// A send ring and a receive ring driven by random steps, checked against a byte-level model:
// the bytes each end sees are exactly the stream's bytes, in order, with no chunk crossing the
// end of a ring and no unsent or in-flight byte overwritten.
namespace {

struct ModelParam
{
    uint64_t size;
    uint64_t base; // starting stream position
};

class RingModelTest : public ::testing::TestWithParam<ModelParam>
{};

uint8_t streamByte(uint64_t pos)
{
    return static_cast<uint8_t>((pos * 2654435761u) >> 13);
}

} // namespace

TEST_P(RingModelTest, RandomStepsKeepTheInvariants)
{
    const ModelParam p = GetParam();
    std::mt19937_64 rng(p.size * 31 + p.base);
    auto below = [&](uint64_t n) { return n == 0 ? 0 : rng() % n; };
    // Step sizes from one byte to whole spans, cheap enough to model byte by byte.
    auto pick = [&](uint64_t max) { return below(std::min<uint64_t>(max, 1u << below(15)) + 1); };

    SendRing tx = makeSendRing(p.size, p.base);
    RecvRing rx;
    rx.size = p.size;
    rx.written = rx.consumed = p.base;

    std::vector<uint8_t> txMem(p.size), rxMem(p.size);
    std::deque<uint8_t> pending;  // model: bytes appended and not yet completed
    std::deque<uint64_t> chunks;  // lengths of posted, uncompleted chunks
    std::deque<uint8_t> readable; // model: bytes landed and not yet read
    uint64_t appended = p.base, read = p.base;

    for (int step = 0; step < 100000; step++) {
        switch (below(4)) {
        case 0: { // append at most appendSpan bytes
            uint64_t span = tx.appendSpan();
            if (tx.freeSpace() > 0) {
                ASSERT_GT(span, 0u);
            }
            ASSERT_LE(tx.offset(tx.tail) + span, p.size);
            uint64_t n = pick(span);
            for (uint64_t i = 0; i < n; i++) {
                txMem[tx.offset(tx.tail + i)] = streamByte(appended);
                pending.push_back(streamByte(appended));
                appended++;
            }
            tx.tail += n;
            break;
        }
        case 1: { // post a chunk that does not cross the end; it lands in the receive ring
            uint64_t max = std::min({tx.unsent(), tx.toEnd(tx.posted), p.size - rx.readable()});
            uint64_t n = pick(max);
            if (n == 0)
                break;
            ASSERT_LE(tx.offset(tx.posted) + n, p.size);
            // The receiver has the same ring size and position: space is free there too.
            ASSERT_LE(rx.readable() + n, p.size);
            ASSERT_EQ(rx.offset(rx.written), tx.offset(tx.posted));
            for (uint64_t i = 0; i < n; i++) {
                uint8_t b = txMem[tx.offset(tx.posted) + i];
                ASSERT_EQ(b, streamByte(tx.posted + i)) << "send ring byte overwritten";
                rxMem[rx.offset(rx.written) + i] = b;
                readable.push_back(b);
            }
            tx.posted += n;
            rx.written += n;
            chunks.push_back(n);
            break;
        }
        case 2: { // complete the oldest chunk
            if (chunks.empty())
                break;
            uint64_t n = chunks.front();
            chunks.pop_front();
            tx.done += n;
            ASSERT_GE(pending.size(), n);
            pending.erase(pending.begin(), pending.begin() + static_cast<ptrdiff_t>(n));
            break;
        }
        case 3: { // read at most readSpan bytes; the receive ring releases space in the model
            uint64_t span = rx.readSpan();
            if (rx.readable() > 0) {
                ASSERT_GT(span, 0u);
            }
            ASSERT_LE(rx.offset(rx.consumed) + span, p.size);
            uint64_t n = pick(span);
            for (uint64_t i = 0; i < n; i++) {
                ASSERT_EQ(rxMem[rx.offset(rx.consumed) + i], readable.front());
                ASSERT_EQ(readable.front(), streamByte(read));
                readable.pop_front();
                read++;
            }
            rx.consumed += n;
            break;
        }
        }

        ASSERT_LE(tx.done, tx.posted);
        ASSERT_LE(tx.posted, tx.tail);
        ASSERT_LE(tx.tail, tx.done + p.size);
        ASSERT_EQ(tx.tail - tx.done, pending.size());
        ASSERT_EQ(tx.freeSpace(), p.size - pending.size());
        ASSERT_EQ(tx.unsent() + tx.inFlight(), pending.size());
        ASSERT_EQ(tx.tail, appended);
        ASSERT_LE(tx.appendSpan(), tx.freeSpace());
        ASSERT_LE(tx.offset(tx.tail) + tx.appendSpan(), p.size);
        ASSERT_LE(rx.consumed, rx.written);
        ASSERT_EQ(rx.readable(), readable.size());
        ASSERT_LE(rx.readable(), p.size);
        ASSERT_LE(rx.offset(rx.consumed) + rx.readSpan(), p.size);
        ASSERT_EQ(rx.consumed, read);
    }
    // Something actually moved through, several times around the ring.
    EXPECT_GT(read - p.base, 4 * p.size);
}

INSTANTIATE_TEST_SUITE_P(Sizes, RingModelTest,
                         ::testing::Values(ModelParam{1, 0}, ModelParam{7, 0}, ModelParam{1000, 0},
                                           ModelParam{1024, 0}, ModelParam{1024, k4G - 300},
                                           ModelParam{4096, (uint64_t(1) << 40) - 1},
                                           ModelParam{65537, 3 * k4G - 17}));
