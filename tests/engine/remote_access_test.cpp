// SPDX-License-Identifier: MIT
// What a peer can write into: only the receive ring in use (never the rest of the area reserved
// for growth, never a ring it switched away from), and a riomap window only until riounmap()
// or close() returns, which wait for the peer's UNMAPPED (or reset it).

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "engine_fixture.h"
#include "raw_peer.h"

namespace rstream {
namespace {

using Clock = std::chrono::steady_clock;

int64_t msSince(Clock::time_point t)
{
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

class RemoteAccess : public EngineTest
{
protected:
    // A RawPeer connected to an accepted connection of ours (ioMaps: windows it takes).
    std::unique_ptr<Connection> acceptRaw(RawPeer *peer, const Settings &s, uint32_t ioMaps = 0)
    {
        auto l = listen(s);
        std::unique_ptr<Connection> accepted;
        std::thread t([&] { EXPECT_EQ(l->accept(&accepted, false, 5000), 0); });
        peer->connect(port_, GetParam().strict, GetParam().iwarp, 4096, ioMaps);
        t.join();
        listener_ = std::move(l);
        return accepted;
    }

    // Waits for the next message of op from the peer, making progress on c meanwhile.
    static bool awaitOp(RawPeer *peer, Connection *c, wire::Op op, RawPeer::Message *m)
    {
        for (int i = 0; i < 500; i++) {
            c->peekRecv();
            while (peer->next(m, 0))
                if ((m->word >> wire::kOpShift) == uint32_t(op))
                    return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        return false;
    }

    // Maps window on a as a riomap() window and waits until the peer has its record.
    static wire::IoMapRecord mapKnown(Connection *a, RawPeer *peer, std::vector<uint8_t> &window)
    {
        off_t off = -1;
        EXPECT_EQ(a->mapWindow(window.data(), window.size(), true, -1, &off), 0);
        const wire::IoMapRecord rec = awaitRecord(peer, a);
        EXPECT_EQ(rec.length, window.size());
        return rec;
    }

    // The IOMAP record the peer got for a window of ours.
    static wire::IoMapRecord awaitRecord(RawPeer *peer, Connection *c)
    {
        RawPeer::Message m;
        wire::IoMapRecord rec;
        EXPECT_TRUE(awaitOp(peer, c, wire::Op::IoMap, &m));
        EXPECT_EQ(wire::decodeIoMapRecord(m.payload.data(), m.payload.size(), &rec), 0);
        return rec;
    }
};

// Before, the whole area reserved for growth (the ring and twice RSTREAM_RECV_BUF_MAX) was
// registered under the ring's key: a peer could write past its ring and make every page of the
// reservation resident. (A write the provider refuses drops that connection: one each.)
TEST_P(RemoteAccess, OnlyTheRingInUseIsWritable)
{
    std::vector<uint8_t> bytes(64, 0x5a);
    {
        // Inside the ring: taken (and harmless: no DATA word announces it).
        RawPeer peer;
        auto a = acceptRaw(&peer, settings());
        ASSERT_TRUE(a);
        const wire::Hello &h = peer.accepted();
        EXPECT_EQ(peer.write(h.ringAddr, h.ringKey, bytes.data(), bytes.size()), 0);
    }
    // Right past it, and a megabyte past it: refused.
    for (uint64_t past : {uint64_t(0), uint64_t(1) << 20}) {
        SCOPED_TRACE(past);
        RawPeer peer;
        auto a = acceptRaw(&peer, settings());
        ASSERT_TRUE(a);
        const wire::Hello &h = peer.accepted();
        const int w =
            peer.write(h.ringAddr + h.ringSize + past, h.ringKey, bytes.data(), bytes.size());
        EXPECT_NE(w, 0) << "a write past the ring was taken";
    }
}

// The peer follows a GROW as an rstream peer does (SWITCH, then the new ring under the key that
// follows the current one): the new ring takes its writes, and the application reads both
// rings' bytes in order; the old ring, or the new one under the old key, refuses them.
TEST_P(RemoteAccess, AfterASwitchOnlyTheNewRingIsWritable)
{
    if (GetParam().strict)
        GTEST_SKIP() << "the provider chooses keys: rings keep their size";
    enum Case
    {
        NewRing,
        OldRing,
        OldKey
    };
    for (Case c : {NewRing, OldRing, OldKey}) {
        SCOPED_TRACE(int(c));
        RawPeer peer;
        auto a = acceptRaw(&peer, settings());
        ASSERT_TRUE(a);
        const wire::Hello h = peer.accepted();
        // Fill the ring with unread bytes: the receiver asks for a bigger ring at once.
        std::vector<uint8_t> first(h.ringSize), second(1000);
        for (size_t i = 0; i < first.size(); i++)
            first[i] = uint8_t(i * 7 + 1);
        for (size_t i = 0; i < second.size(); i++)
            second[i] = uint8_t(i * 13 + 5);
        ASSERT_EQ(peer.write(h.ringAddr, h.ringKey, first.data(), first.size()), 0);
        peer.send(*wire::encodeData(h.ringSize));
        RawPeer::Message m;
        ASSERT_TRUE(awaitOp(&peer, a.get(), wire::Op::Ctrl, &m));
        const auto grow = wire::decode(m.word);
        ASSERT_TRUE(grow && grow->ctrl == wire::Ctrl::Grow) << std::hex << m.word;
        peer.send(wire::encodeCtrl(wire::Ctrl::Switch));
        a->peekRecv();
        // The new ring follows the old one in memory, in a registration of its own (offsets:
        // it starts at 0).
        const uint64_t key = wire::nextRingKey(h.ringKey);
        if (c == OldRing) {
            EXPECT_NE(peer.write(h.ringAddr, h.ringKey, second.data(), 64), 0)
                << "the old ring was still writable";
            continue;
        }
        if (c == OldKey) {
            EXPECT_NE(peer.write(0, h.ringKey, second.data(), 64), 0) << "the old key wrote";
            continue;
        }
        ASSERT_EQ(peer.write(0, key, second.data(), second.size()), 0);
        peer.send(*wire::encodeData(uint32_t(second.size())));
        std::vector<uint8_t> got(first.size() + second.size());
        ASSERT_EQ(a->recv(got.data(), got.size(), kWaitAll, 5000), ssize_t(got.size()));
        EXPECT_TRUE(std::equal(first.begin(), first.end(), got.begin()));
        EXPECT_TRUE(std::equal(second.begin(), second.end(), got.begin() + first.size()));
    }
}

// riounmap() of a window the peer knows returns once the peer answered the withdrawal: a write
// the peer made before its answer lands before riounmap() returns, none after. Before, the
// region was closed at once while such a write could still be arriving.
TEST_P(RemoteAccess, UnmapWaitsForThePeersAnswer)
{
    RawPeer peer;
    auto a = acceptRaw(&peer, settings(), 4);
    ASSERT_TRUE(a);
    std::vector<uint8_t> window(4096, 0);
    const wire::IoMapRecord rec = mapKnown(a.get(), &peer, window);
    std::atomic<int64_t> tookMs{-1};
    std::thread unmapper([&] {
        const auto t0 = Clock::now();
        EXPECT_EQ(a->unmapWindow(window.data(), window.size()), 0);
        tookMs = msSince(t0);
    });
    // The withdrawal comes; the peer's write still in flight lands, then it answers.
    const wire::IoMapRecord gone = awaitRecord(&peer, a.get());
    EXPECT_EQ(gone.length, 0u);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(tookMs.load(), -1) << "riounmap returned before the peer answered";
    const std::vector<uint8_t> late(100, 0x77);
    EXPECT_EQ(peer.write(rec.addr, rec.key, late.data(), late.size()), 0);
    peer.send(wire::encodeCtrl(wire::Ctrl::Unmapped));
    unmapper.join();
    EXPECT_GE(tookMs.load(), 300);
    EXPECT_LT(tookMs.load(), 4000);
    EXPECT_EQ(window[0], 0x77);
    EXPECT_EQ(window[99], 0x77);
    // The answer was in order: the connection is healthy, and the region closed.
    EXPECT_EQ(a->info().error, 0);
    std::vector<uint8_t> evil(64, 0xee);
    EXPECT_NE(peer.write(rec.addr, rec.key, evil.data(), evil.size()), 0);
    EXPECT_EQ(window[0], 0x77);
}

// A peer that never answers is reset after unmapTimeoutMs: riounmap() returns, and nothing the
// peer sends lands in the window afterwards.
TEST_P(RemoteAccess, UnmapResetsAPeerThatNeverAnswers)
{
    Settings s = settings();
    s.unmapTimeoutMs = 300;
    RawPeer peer;
    auto a = acceptRaw(&peer, s, 4);
    ASSERT_TRUE(a);
    std::vector<uint8_t> window(4096, 0);
    const wire::IoMapRecord rec = mapKnown(a.get(), &peer, window);
    const auto t0 = Clock::now();
    EXPECT_EQ(a->unmapWindow(window.data(), window.size()), 0);
    const int64_t took = msSince(t0);
    EXPECT_GE(took, 300);
    EXPECT_LT(took, 4000);
    uint8_t b;
    EXPECT_EQ(a->recv(&b, 1, kNonBlock), -ECONNRESET);
    std::vector<uint8_t> evil(64, 0xee);
    peer.write(rec.addr, rec.key, evil.data(), evil.size());
    EXPECT_EQ(window, std::vector<uint8_t>(4096, 0));
}

// An UNMAPPED that answers nothing breaks the protocol: a reset.
TEST_P(RemoteAccess, UnmappedForNoWithdrawalIsReset)
{
    RawPeer peer;
    auto a = acceptRaw(&peer, settings(), 4);
    ASSERT_TRUE(a);
    std::vector<uint8_t> window(4096, 0);
    mapKnown(a.get(), &peer, window);
    peer.send(wire::encodeCtrl(wire::Ctrl::Unmapped));
    uint8_t b;
    EXPECT_EQ(a->recv(&b, 1, 0, 5000), -ECONNRESET);
}

// close() with a window waits for the answer too: the connection lives on to deliver what was
// sent, and the application may free the window's memory as soon as close() returns.
TEST_P(RemoteAccess, CloseWaitsForTheAnswerToo)
{
    RawPeer peer;
    auto a = acceptRaw(&peer, settings(), 4);
    ASSERT_TRUE(a);
    std::vector<uint8_t> window(4096, 0);
    mapKnown(a.get(), &peer, window);
    std::atomic<bool> closed{false};
    std::thread closer([&] {
        Connection::close(std::move(a));
        closed = true;
    });
    RawPeer::Message m;
    wire::IoMapRecord gone;
    for (;;) {
        ASSERT_TRUE(peer.next(&m, 5000)) << "no withdrawal";
        if ((m.word >> wire::kOpShift) == uint32_t(wire::Op::IoMap))
            break;
    }
    ASSERT_EQ(wire::decodeIoMapRecord(m.payload.data(), m.payload.size(), &gone), 0);
    EXPECT_EQ(gone.length, 0u);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_FALSE(closed.load()) << "close returned before the peer answered";
    peer.send(wire::encodeCtrl(wire::Ctrl::Unmapped));
    closer.join();
    EXPECT_TRUE(closed.load());
}

INSTANTIATE_TEST_SUITE_P(Modes, RemoteAccess, ::testing::ValuesIn(kModes),
                         [](const auto &p) { return std::string(p.param.name); });

} // namespace
} // namespace rstream
