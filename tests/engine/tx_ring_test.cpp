// SPDX-License-Identifier: MIT
// Unit tests of the transmit op ring (tx_ring.h): in-order release, injects, wrap-around, full.

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tx_ring.h"

using rstream::TxOp;
using rstream::TxOpRing;

namespace {

// Posts an op of len ring bytes (a write when len > 0), as the connection does.
TxOp &post(TxOpRing &ring, uint64_t len)
{
    TxOp &op = ring.prepare(len);
    ring.commit();
    if (len)
        ring.countWrite();
    return op;
}

// Releases what can be released; returns the ring bytes freed.
uint64_t releaseDone(TxOpRing &ring)
{
    uint64_t bytes = 0;
    while (ring.doneHead())
        bytes += ring.release();
    return bytes;
}

TEST(TxOpRing, StartsEmpty)
{
    TxOpRing ring;
    EXPECT_FALSE(ring.hasRoom(1)); // no contexts before init()
    ASSERT_EQ(ring.init(4), 0);
    EXPECT_EQ(ring.cap(), 4u);
    EXPECT_TRUE(ring.empty());
    EXPECT_EQ(ring.used(), 0u);
    EXPECT_TRUE(ring.hasRoom(4));
    EXPECT_FALSE(ring.hasRoom(5));
    EXPECT_EQ(ring.doneHead(), nullptr);
    EXPECT_EQ(ring.writesInFlight(), 0u);
    EXPECT_FALSE(ring.injectPending());
}

TEST(TxOpRing, ReleasesInOrder)
{
    TxOpRing ring;
    ASSERT_EQ(ring.init(8), 0);
    TxOp &a = post(ring, 100);
    TxOp &b = post(ring, 0); // a control send: no ring bytes
    TxOp &c = post(ring, 50);
    EXPECT_EQ(a.seq, 0u);
    EXPECT_EQ(b.seq, 1u);
    EXPECT_EQ(c.seq, 2u);
    EXPECT_EQ(ring.used(), 3u);
    EXPECT_EQ(ring.writesInFlight(), 2u);

    TxOpRing::complete(&a);
    EXPECT_EQ(ring.doneHead(), &a);
    EXPECT_EQ(releaseDone(ring), 100u);
    EXPECT_EQ(ring.head(), 1u);
    EXPECT_EQ(ring.writesInFlight(), 1u);

    TxOpRing::complete(&b);
    TxOpRing::complete(&c);
    EXPECT_EQ(releaseDone(ring), 50u);
    EXPECT_TRUE(ring.empty());
    EXPECT_EQ(ring.writesInFlight(), 0u);
    // Released contexts are clean for their next use.
    EXPECT_FALSE(a.done);
    EXPECT_EQ(a.len, 0u);
}

TEST(TxOpRing, LaterCompletionWaitsForEarlierOnes)
{
    TxOpRing ring;
    ASSERT_EQ(ring.init(8), 0);
    TxOp &a = post(ring, 10);
    TxOp &b = post(ring, 20);
    TxOp &c = post(ring, 30);

    TxOpRing::complete(&c);
    EXPECT_EQ(ring.doneHead(), nullptr);
    EXPECT_EQ(releaseDone(ring), 0u);
    TxOpRing::complete(&b);
    EXPECT_EQ(releaseDone(ring), 0u);
    EXPECT_EQ(ring.used(), 3u);
    EXPECT_EQ(ring.writesInFlight(), 3u);

    // The oldest completes: all three leave, in order.
    TxOpRing::complete(&a);
    std::vector<uint64_t> lens;
    while (ring.doneHead())
        lens.push_back(ring.release());
    EXPECT_EQ(lens, (std::vector<uint64_t>{10, 20, 30}));
    EXPECT_TRUE(ring.empty());
    EXPECT_EQ(ring.writesInFlight(), 0u);
}

TEST(TxOpRing, RecordFlagClearedOnRelease)
{
    TxOpRing ring;
    ASSERT_EQ(ring.init(2), 0);
    TxOp &r = post(ring, 0);
    r.record = true;
    TxOpRing::complete(&r);
    ASSERT_EQ(ring.doneHead(), &r);
    EXPECT_TRUE(ring.doneHead()->record);
    ring.release();
    EXPECT_FALSE(r.record);
}

TEST(TxOpRing, InjectPendingUntilALaterCompletion)
{
    TxOpRing ring;
    ASSERT_EQ(ring.init(8), 0);
    TxOp &w = post(ring, 10); // a write with a completion, still in flight
    TxOp &inj = post(ring, 5);
    ring.onInject(inj);
    TxOpRing::complete(&inj); // an inject completes at once, reporting nothing
    EXPECT_TRUE(ring.injectPending());

    // An earlier op's completion does not say the inject left.
    ring.onReported(w);
    TxOpRing::complete(&w);
    EXPECT_EQ(releaseDone(ring), 15u);
    EXPECT_TRUE(ring.empty());
    EXPECT_TRUE(ring.injectPending());

    // A later one does.
    TxOp &k = post(ring, 0);
    ring.onReported(k);
    TxOpRing::complete(&k);
    EXPECT_FALSE(ring.injectPending());
    EXPECT_EQ(releaseDone(ring), 0u);
}

TEST(TxOpRing, WrapsAround)
{
    TxOpRing ring;
    ASSERT_EQ(ring.init(3), 0);
    uint64_t freed = 0;
    for (uint64_t i = 0; i < 10; i++) {
        EXPECT_EQ(ring.nextIndex(), i % 3);
        TxOp &op = post(ring, i + 1);
        EXPECT_EQ(op.seq, i);
        EXPECT_EQ(ring.find(&op.ctx), &op);
        TxOpRing::complete(&op);
        freed += releaseDone(ring);
    }
    EXPECT_EQ(freed, 55u);
    EXPECT_EQ(ring.head(), 10u);
    EXPECT_EQ(ring.next(), 10u);
    EXPECT_TRUE(ring.empty());
    EXPECT_EQ(ring.writesInFlight(), 0u);
}

TEST(TxOpRing, FullRing)
{
    TxOpRing ring;
    ASSERT_EQ(ring.init(3), 0);
    // One op in and out first, so the ring's slots wrap below.
    TxOpRing::complete(&post(ring, 1));
    releaseDone(ring);
    std::vector<TxOp *> ops;
    while (ring.hasRoom(1))
        ops.push_back(&post(ring, 1));
    EXPECT_EQ(ops.size(), 3u);
    EXPECT_EQ(ring.used(), 3u);
    EXPECT_FALSE(ring.hasRoom(1));
    EXPECT_TRUE(ring.hasRoom(0));
    // Distinct contexts, all of the ring's.
    EXPECT_NE(ops[0], ops[1]);
    EXPECT_NE(ops[1], ops[2]);
    EXPECT_NE(ops[0], ops[2]);
    for (TxOp *op : ops)
        EXPECT_EQ(ring.find(op), op);
    // The last one completing frees nothing until the first one does.
    TxOpRing::complete(ops[2]);
    EXPECT_EQ(releaseDone(ring), 0u);
    EXPECT_FALSE(ring.hasRoom(1));
    TxOpRing::complete(ops[0]);
    EXPECT_EQ(releaseDone(ring), 1u);
    EXPECT_TRUE(ring.hasRoom(1));
    EXPECT_FALSE(ring.hasRoom(2));
}

TEST(TxOpRing, FindsOnlyItsOwnContexts)
{
    TxOpRing ring;
    ASSERT_EQ(ring.init(4), 0);
    TxOp other{};
    int receive = 0;
    EXPECT_EQ(ring.find(&other), nullptr);
    EXPECT_EQ(ring.find(&receive), nullptr);
    EXPECT_EQ(ring.find(nullptr), nullptr);
    TxOp &op = post(ring, 0);
    EXPECT_EQ(ring.find(&op.ctx), &op);
}

} // namespace
