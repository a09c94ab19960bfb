// SPDX-License-Identifier: MIT
// Rings that rewind (wire.h, kDataRewind): a connection moving small messages keeps to the first
// pages of its rings, every byte still arrives in order, a peer that does not take rewinds gets
// none, and a peer that rewinds with bytes of ours unread or uncredited is reset.

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "engine_fixture.h"
#include "raw_peer.h"

using namespace rstream;

namespace {

class RingRewind : public EngineTest
{
protected:
    void SetUp() override
    {
        if (GetParam().sameHost)
            GTEST_SKIP() << "same-host links have rings of their own";
    }

    // A connection accepted from a raw peer whose hello has flags besides the usual ones.
    std::unique_ptr<Connection> acceptRaw(RawPeer *peer, const Settings &s, uint16_t flags)
    {
        auto l = listen(s);
        std::unique_ptr<Connection> accepted;
        std::thread t([&] { EXPECT_EQ(l->accept(&accepted, false, 5000), 0); });
        peer->connect(port_, GetParam().strict, GetParam().iwarp, 4096, 0, flags);
        t.join();
        listener_ = std::move(l);
        return accepted;
    }
};

} // namespace

// 2,000 round trips of 100 bytes move six times the 32 KiB rings each way. Without rewinds every
// page of both rings at both ends ends up resident (and stays: a receive ring keeps its pages);
// with them the pages at the start are used again.
TEST_P(RingRewind, RequestResponseKeepsToTheRingsFirstPages)
{
    size_t resident[2] = {};
    for (const bool rewind : {false, true}) {
        SCOPED_TRACE(rewind ? "rewinds" : "no rewinds");
        Settings s = settings();
        s.ringRewind = rewind;
        auto [client, server] = pair(s, s);
        ASSERT_TRUE(client && server);
        pingPong(*client, *server, 2000, 100);
        resident[rewind] = client->ringResidentBytes() + server->ringResidentBytes();
        if (rewind) {
            EXPECT_GT(client->ringRewinds(), 0u);
            EXPECT_GT(server->ringRewinds(), 0u);
        } else {
            EXPECT_EQ(client->ringRewinds(), 0u);
            EXPECT_EQ(server->ringRewinds(), 0u);
        }
    }
    // Four 32 KiB rings whole, against a few pages.
    EXPECT_GE(resident[false], 4u * 32 * 1024 * 3 / 4);
    EXPECT_LE(resident[true], 48u * 1024) << "without rewinds: " << resident[false];
    std::printf("resident: %zu KiB with rewinds, %zu KiB without\n", resident[true] / 1024,
                resident[false] / 1024);
}

// A connection that moved small messages and then went quiet: its send ring gives its pages back
// (ringIdleMs), its receive ring never does while it lives, so what rstream itself holds for it
// is what its receive ring touched. Without rewinds that is all of the ring.
TEST_P(RingRewind, AQuietConnectionThatMovedSmallMessagesHoldsLittle)
{
    size_t own[2][2] = {};
    for (const bool rewind : {false, true}) {
        SCOPED_TRACE(rewind ? "rewinds" : "no rewinds");
        Settings s = settings();
        s.ringRewind = rewind;
        s.ringIdleMs = 100;
        auto [client, server] = pair(s, s);
        ASSERT_TRUE(client && server);
        pingPong(*client, *server, 2000, 100);
        // (Strict mode registers memory as verbs pins it: rings keep their pages there.)
        for (int i = 0; !GetParam().strict && i < 300 &&
                        (client->ringReleases() == 0 || server->ringReleases() == 0);
             i++)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        own[rewind][0] = client->ownMemoryBytes();
        own[rewind][1] = server->ownMemoryBytes();
        std::printf("own memory %s: client %zu KiB, server %zu KiB (rings %zu, %zu)\n",
                    rewind ? "with rewinds" : "without", own[rewind][0] / 1024,
                    own[rewind][1] / 1024, client->ringResidentBytes() / 1024,
                    server->ringResidentBytes() / 1024);
    }
    for (int end = 0; end < 2; end++) {
        EXPECT_LE(own[true][end] + 12 * 1024, own[false][end]) << "end " << end;
        // The memory target for an idle connection on tcp: 64 KiB of rstream's own.
        if (!GetParam().iwarp && !GetParam().strict) {
            EXPECT_LE(own[true][end], 64u * 1024) << "end " << end;
        }
    }
}

// Messages of every size from 1 byte to a few times the ring, both ways, rewinds at whatever
// position each finds: every byte arrives, in order.
TEST_P(RingRewind, MessagesOfEverySizeArriveIntact)
{
    auto [client, server] = pair();
    ASSERT_TRUE(client && server);
    std::mt19937 rng(7);
    std::vector<uint8_t> out, in;
    for (int i = 0; i < 1500; i++) {
        const size_t size = i % 50 == 49 ? std::uniform_int_distribution<size_t>(1, 100000)(rng)
                                         : std::uniform_int_distribution<size_t>(1, 3000)(rng);
        out.resize(size);
        in.assign(size, 0);
        for (auto &b : out)
            b = static_cast<uint8_t>(rng());
        Connection &from = i % 2 ? *client : *server;
        Connection &to = i % 2 ? *server : *client;
        std::thread writer([&] { EXPECT_EQ(from.send(out.data(), size), ssize_t(size)); });
        EXPECT_EQ(to.recv(in.data(), size, kWaitAll, 10000), ssize_t(size));
        writer.join();
        ASSERT_EQ(in, out) << "message " << i << " of " << size << " bytes";
    }
    EXPECT_GT(client->ringRewinds(), 0u);
    EXPECT_GT(server->ringRewinds(), 0u);
}

// Either end may turn rewinds off (an end that never says it takes them, as one of an earlier
// version): then neither direction rewinds, and the bytes are as ever.
TEST_P(RingRewind, AnEndWithoutRewindsGetsAndSendsNone)
{
    for (const bool clientTakes : {false, true}) {
        SCOPED_TRACE(clientTakes ? "the server takes none" : "the client takes none");
        Settings c = settings(), s = settings();
        c.ringRewind = clientTakes;
        s.ringRewind = !clientTakes;
        auto [client, server] = pair(c, s);
        ASSERT_TRUE(client && server);
        pingPong(*client, *server, 1000, 100);
        EXPECT_EQ(client->ringRewinds(), 0u);
        EXPECT_EQ(server->ringRewinds(), 0u);
    }
}

// An end of an earlier version refuses a hello with a flag it does not know: the accepting end
// offers rewinds only to a connecting end that offered them.
TEST_P(RingRewind, OnlyAnEndThatOffersRewindsIsOfferedThem)
{
    for (const bool offers : {false, true}) {
        SCOPED_TRACE(offers ? "offers" : "offers none");
        RawPeer peer;
        auto accepted = acceptRaw(&peer, settings(), offers ? wire::kFlagRewind : 0);
        ASSERT_TRUE(accepted);
        EXPECT_EQ(bool(peer.accepted().flags & wire::kFlagRewind), offers);
    }
}

// A raw peer that rewinds as an rstream peer does, with real bytes: after 20,000 bytes read and
// credited back and 5,000 more unread, its next 3,000 go to the start of our 32 KiB ring, and the
// application reads the 5,000 and then the 3,000, in order. A second rewind before the padding
// of the first was read past resets the connection.
TEST_P(RingRewind, APeersRewindIsReadInOrder)
{
    for (const bool second : {false, true}) {
        SCOPED_TRACE(second ? "a second rewind" : "one rewind");
        RawPeer peer;
        auto accepted = acceptRaw(&peer, settings(), wire::kFlagRewind);
        ASSERT_TRUE(accepted);
        const wire::Hello &h = peer.accepted();
        ASSERT_TRUE(h.flags & wire::kFlagRewind);
        ASSERT_EQ(h.ringSize, 32u * 1024);
        auto put = [&](uint64_t off, size_t len, uint8_t seed, bool rewind) {
            std::vector<uint8_t> bytes(len);
            for (size_t k = 0; k < len; k++)
                bytes[k] = static_cast<uint8_t>(seed + k * 7);
            EXPECT_EQ(peer.write(h.ringAddr + off, h.ringKey, bytes.data(), len), 0);
            peer.send(*wire::encodeData(static_cast<uint32_t>(len), rewind));
            return bytes;
        };
        std::vector<uint8_t> in(20000);
        auto a = put(0, 20000, 1, false);
        ASSERT_EQ(accepted->recv(in.data(), in.size(), kWaitAll, 5000), 20000);
        ASSERT_EQ(in, a);
        // The credit for them (half the ring read: due at once).
        RawPeer::Message m;
        bool credited = false;
        while (!credited && peer.next(&m, 2000)) {
            auto w = wire::decode(m.word);
            credited = w && w->op == wire::Op::Credit &&
                       (w->ringUnits << wire::creditShift(h.ringSize)) >= 20000;
        }
        ASSERT_TRUE(credited);
        auto b = put(20000, 5000, 2, false);
        auto c = put(0, 3000, 3, true);
        if (second) {
            peer.send(*wire::encodeData(10, true));
            ssize_t r;
            while ((r = accepted->recv(in.data(), in.size(), 0, 5000)) > 0) {
            }
            EXPECT_EQ(r, -ECONNRESET);
            continue;
        }
        in.assign(8000, 0);
        ASSERT_EQ(accepted->recv(in.data(), in.size(), kWaitAll, 5000), 8000);
        EXPECT_TRUE(std::equal(b.begin(), b.end(), in.begin()));
        EXPECT_TRUE(std::equal(c.begin(), c.end(), in.begin() + 5000));
        char ch;
        EXPECT_EQ(accepted->recv(&ch, 1, kNonBlock), -EAGAIN) << "healthy, nothing more";
    }
}

// A rewinding DATA word at the start, with nothing outstanding, is a write like any other; one
// whose padding would take more than the credit the peer holds (bytes it wrote unread, or read
// but not yet credited back: it cannot know they were read), or towards an end that did not say
// it takes rewinds, resets the connection.
TEST_P(RingRewind, APeerThatRewindsBeyondItsCreditIsReset)
{
    struct Case
    {
        const char *what;
        bool takes;         // the accepting end takes rewinds
        uint32_t readFirst; // bytes of the first DATA the application reads before the rewind
        bool ok;
    };
    const Case cases[] = {
        {"a first write, rewinding at the start", true, 0, true},
        {"the first write unread", true, 0, false},
        {"the first write read, not credited", true, 100, false},
        {"an end that does not take rewinds", false, 0, false},
    };
    for (const Case &c : cases) {
        SCOPED_TRACE(c.what);
        Settings s = settings();
        s.ringRewind = c.takes;
        RawPeer peer;
        auto accepted = acceptRaw(&peer, s, wire::kFlagRewind);
        ASSERT_TRUE(accepted);
        EXPECT_EQ(bool(peer.accepted().flags & wire::kFlagRewind), c.takes);
        char buf[200];
        if (c.ok) {
            peer.send(*wire::encodeData(10, true));
            EXPECT_EQ(accepted->recv(buf, sizeof(buf), 0, 5000), 10);
            EXPECT_EQ(accepted->send("x", 1), 1);
            continue;
        }
        if (c.takes) {
            peer.send(*wire::encodeData(100));
            if (c.readFirst) {
                ASSERT_EQ(accepted->recv(buf, c.readFirst, kWaitAll, 5000), ssize_t(c.readFirst));
            }
        }
        peer.send(*wire::encodeData(10, true));
        ssize_t r;
        // Whatever of the first write is unread may still be read before the reset shows.
        while ((r = accepted->recv(buf, sizeof(buf), 0, 5000)) > 0) {
        }
        EXPECT_EQ(r, -ECONNRESET);
        EXPECT_EQ(accepted->send("x", 1), -ECONNRESET);
    }
}

INSTANTIATE_TEST_SUITE_P(Modes, RingRewind, ::testing::ValuesIn(kModes),
                         [](const auto &p) { return std::string(p.param.name); });
