// SPDX-License-Identifier: MIT
// Unit tests of the riomap window table (window_table.h): ids, overlaps, the record queue, and
// the checks on the peer's records.

#include <cerrno>
#include <cstdint>

#include <gtest/gtest.h>

#include "window_table.h"

using namespace rstream;

namespace {

// Stands in for registered regions: the table only tells them from null.
fid_mr gMr[4];

wire::IoMapRecord record(uint64_t offset, uint64_t length, uint64_t addr = 0, uint64_t key = 7)
{
    wire::IoMapRecord r;
    r.offset = offset;
    r.length = length;
    r.addr = addr;
    r.key = key;
    return r;
}

int peerRecord(WindowTable &t, uint32_t id, const wire::IoMapRecord &r, bool virtAddr,
               const char **why)
{
    uint8_t buf[wire::kIoMapRecordSize];
    wire::encodeIoMapRecord(r, buf);
    return t.onPeerRecord(id, buf, virtAddr, why);
}

TEST(WindowTable, IdsAreTakenLowestFirstUntilThePeersTableIsFull)
{
    WindowTable t;
    t.init(2, 0);
    uint32_t id = 99;
    ASSERT_TRUE(t.freeId(&id));
    EXPECT_EQ(id, 0u);
    t.addRemote({nullptr, 10, 0, &gMr[0], id}, record(0, 10));
    ASSERT_TRUE(t.freeId(&id));
    EXPECT_EQ(id, 1u);
    t.addRemote({nullptr, 10, 100, &gMr[1], id}, record(100, 10));
    EXPECT_FALSE(t.freeId(&id));
    // A PROT_NONE mapping takes no id.
    t.addLocal({&gMr[3], 5, 0, nullptr, 0});
    EXPECT_EQ(t.local().size(), 3u);
}

TEST(WindowTable, OverlapsCountRemoteWindowsOnly)
{
    WindowTable t;
    t.init(4, 0);
    t.addRemote({nullptr, 100, 1000, &gMr[0], 0}, record(1000, 100));
    t.addLocal({nullptr, 100, 5000, nullptr, 0});
    EXPECT_TRUE(t.overlapsLocal(1000, 1));
    EXPECT_TRUE(t.overlapsLocal(1099, 1));
    EXPECT_TRUE(t.overlapsLocal(900, 101));
    EXPECT_FALSE(t.overlapsLocal(900, 100));
    EXPECT_FALSE(t.overlapsLocal(1100, 10));
    EXPECT_FALSE(t.overlapsLocal(5000, 100));
    // Above every remote window, page aligned.
    EXPECT_EQ(t.offsetAboveLocal(), 4096u);
    t.addRemote({nullptr, 4096, 8192, &gMr[1], 1}, record(8192, 4096));
    EXPECT_EQ(t.offsetAboveLocal(), 12288u);
}

TEST(WindowTable, RecordsGoInOrderAndAnUnsentAnnouncementIsDropped)
{
    WindowTable t;
    t.init(4, 0);
    int a, b;
    t.addRemote({&a, 10, 0, &gMr[0], 0}, record(0, 10));
    t.addRemote({&b, 10, 100, &gMr[1], 1}, record(100, 10));
    // Unmapped before its announcement went: nothing to tell, and its id is free again.
    LocalWindow *w = t.findLocal(&a, 10);
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(t.findLocal(&a, 11), nullptr);
    EXPECT_FALSE(t.removeLocal(w, true));
    EXPECT_EQ(t.findLocal(&a, 10), nullptr);
    uint32_t id = 99;
    ASSERT_TRUE(t.freeId(&id));
    EXPECT_EQ(id, 0u);
    ASSERT_FALSE(t.recordsEmpty());
    EXPECT_EQ(t.nextRecord().id, 1u);
    EXPECT_EQ(t.nextRecord().rec, record(100, 10));
    t.popRecord();
    EXPECT_TRUE(t.recordsEmpty());
    // Announced already: the peer is told with a record of length 0, when it may be.
    EXPECT_TRUE(t.removeLocal(t.findLocal(&b, 10), true));
    ASSERT_FALSE(t.recordsEmpty());
    EXPECT_EQ(t.nextRecord().id, 1u);
    EXPECT_EQ(t.nextRecord().rec.length, 0u);
    t.popRecord();
    t.addRemote({&b, 10, 100, &gMr[1], 1}, record(100, 10));
    t.popRecord();
    EXPECT_FALSE(t.removeLocal(t.findLocal(&b, 10), false));
    EXPECT_TRUE(t.recordsEmpty());
    EXPECT_TRUE(t.local().empty());
}

TEST(WindowTable, RemoveAllLocalFreesEverything)
{
    WindowTable t;
    t.init(2, 0);
    t.addRemote({nullptr, 10, 0, &gMr[0], 0}, record(0, 10));
    uint32_t id;
    ASSERT_TRUE(t.freeId(&id));
    EXPECT_EQ(id, 1u);
    t.addRemote({nullptr, 10, 100, &gMr[1], 1}, record(100, 10));
    EXPECT_FALSE(t.freeId(&id));
    // The first one's announcement went; the second's is still queued.
    t.popRecord();
    EXPECT_EQ(t.removeAllLocal(true), 1u);
    EXPECT_TRUE(t.local().empty());
    EXPECT_TRUE(t.freeId(&id));
    // Only the announced window is withdrawn; the other's announcement was dropped unsent.
    ASSERT_FALSE(t.recordsEmpty());
    EXPECT_EQ(t.nextRecord().id, 0u);
    EXPECT_EQ(t.nextRecord().rec.length, 0u);
    t.popRecord();
    EXPECT_TRUE(t.recordsEmpty());
}

TEST(WindowTable, PeerWindowsAreFoundByOffsetAndLength)
{
    WindowTable t;
    t.init(0, 4);
    const char *why = nullptr;
    ASSERT_EQ(peerRecord(t, 2, record(1000, 100, 0, 42), false, &why), 0);
    const PeerWindow *w = t.findPeer(1000, 100);
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->key, 42u);
    EXPECT_EQ(t.findPeer(1050, 50), w);
    EXPECT_EQ(t.findPeer(1050, 51), nullptr);
    EXPECT_EQ(t.findPeer(999, 1), nullptr);
    EXPECT_EQ(t.findPeer(1100, 0), nullptr);
    // Withdrawn (1: the peer is owed an UNMAPPED).
    ASSERT_EQ(peerRecord(t, 2, wire::IoMapRecord{}, false, &why), 1);
    EXPECT_EQ(t.findPeer(1000, 1), nullptr);
}

TEST(WindowTable, PeerRecordsThatBreakTheRulesAreRefused)
{
    WindowTable t;
    t.init(0, 2);
    const char *why = nullptr;
    EXPECT_EQ(peerRecord(t, 2, record(0, 10), false, &why), -ECONNRESET);
    EXPECT_STREQ(why, "malformed window record");
    EXPECT_EQ(t.onPeerRecord(0, nullptr, false, &why), -ECONNRESET);
    EXPECT_EQ(peerRecord(t, 0, wire::IoMapRecord{}, false, &why), -ECONNRESET);
    EXPECT_STREQ(why, "peer withdrew a window it never announced");
    EXPECT_EQ(peerRecord(t, 0, record(0, 10, 0x1000), false, &why), -ECONNRESET);
    EXPECT_STREQ(why, "window address without FI_MR_VIRT_ADDR");
    ASSERT_EQ(peerRecord(t, 0, record(0, 10, 0x1000), true, &why), 0);
    EXPECT_EQ(peerRecord(t, 0, record(100, 10), true, &why), -ECONNRESET);
    EXPECT_STREQ(why, "peer announced a window id twice");
    EXPECT_EQ(peerRecord(t, 1, record(5, 10), true, &why), -ECONNRESET);
    EXPECT_STREQ(why, "peer announced overlapping windows");
    EXPECT_EQ(peerRecord(t, 1, record(10, 10), true, &why), 0);
}

} // namespace
