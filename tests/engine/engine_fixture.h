// SPDX-License-Identifier: MIT
// The engine tests' fixture: connected pairs over the tcp provider on loopback, in every
// transport mode, and whole-buffer transfers in random chunks.
#pragma once

#include <algorithm>
#include <arpa/inet.h>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "connection.h"
#include "listener.h"
#include "net.h"

namespace rstream {

struct Mode
{
    const char *name;
    bool iwarp;
    bool strict;
    bool sameHost = false; // both ends in this process: the same-host transport carries it
};

inline const Mode kModes[] = {
    {"default", false, false},    {"iwarp", true, false},           {"strict", false, true},
    {"strict_iwarp", true, true}, {"samehost", false, false, true},
};

inline uint32_t checksum(const uint8_t *p, size_t n, uint32_t h = 2166136261u)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

using rstest::loopback4;

class EngineTest : public ::testing::TestWithParam<Mode>
{
protected:
    Settings settings() const
    {
        Settings s;
        s.provider = "tcp";
        s.iwarp = GetParam().iwarp;
        s.strict = GetParam().strict;
        s.sameHost = GetParam().sameHost;
        return s;
    }

    // A listener on an ephemeral loopback port.
    std::unique_ptr<Listener> listen(const Settings &s)
    {
        auto l = std::make_unique<Listener>(s);
        sockaddr_in a = loopback4(0);
        EXPECT_EQ(l->bind(reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0);
        EXPECT_EQ(l->listen(128), 0);
        sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        EXPECT_EQ(l->localAddress(&ss, &len), 0);
        port_ = ntohs(reinterpret_cast<sockaddr_in *>(&ss)->sin_port);
        EXPECT_NE(port_, 0);
        return l;
    }

    std::unique_ptr<Connection> connect(const Settings &s)
    {
        auto c = std::make_unique<Connection>(s);
        sockaddr_in a = loopback4(port_);
        int r = c->connect(reinterpret_cast<sockaddr *>(&a), sizeof(a));
        EXPECT_EQ(r, 0) << strerror(-r);
        return c;
    }

    // A connected pair: first the client, second the server side.
    std::pair<std::unique_ptr<Connection>, std::unique_ptr<Connection>> pair(const Settings &client,
                                                                             const Settings &server)
    {
        auto l = listen(server);
        std::unique_ptr<Connection> accepted;
        std::thread t([&] { EXPECT_EQ(l->accept(&accepted, false, 10000), 0); });
        auto c = connect(client);
        t.join();
        listener_ = std::move(l);
        if (c && accepted) {
            // Which transport carried it: the one the settings asked for.
            EXPECT_EQ(c->sameHost(), client.sameHost && server.sameHost);
            EXPECT_EQ(accepted->sameHost(), client.sameHost && server.sameHost);
        }
        return {std::move(c), std::move(accepted)};
    }

    std::pair<std::unique_ptr<Connection>, std::unique_ptr<Connection>> pair()
    {
        return pair(settings(), settings());
    }

    uint16_t port_ = 0;
    std::unique_ptr<Listener> listener_;
};

inline void sendAll(Connection &c, const uint8_t *p, size_t n, std::mt19937 &rng, size_t maxChunk)
{
    size_t off = 0;
    while (off < n) {
        size_t chunk = std::min(n - off, std::uniform_int_distribution<size_t>(1, maxChunk)(rng));
        ssize_t r = c.send(p + off, chunk);
        ASSERT_GT(r, 0) << strerror(-r);
        off += r;
    }
}

// rounds request/response exchanges of size-byte messages from a to b and back, contents checked.
inline void pingPong(Connection &a, Connection &b, int rounds, size_t size)
{
    std::vector<uint8_t> out(size), in(size);
    for (int i = 0; i < rounds; i++) {
        for (size_t k = 0; k < size; k++)
            out[k] = static_cast<uint8_t>(i * 31 + k);
        ASSERT_EQ(a.send(out.data(), size), ssize_t(size));
        ASSERT_EQ(b.recv(in.data(), size, kWaitAll, 5000), ssize_t(size));
        ASSERT_EQ(in, out) << "request " << i;
        ASSERT_EQ(b.send(in.data(), size), ssize_t(size));
        ASSERT_EQ(a.recv(in.data(), size, kWaitAll, 5000), ssize_t(size));
        ASSERT_EQ(in, out) << "reply " << i;
    }
}

inline void recvAll(Connection &c, uint8_t *p, size_t n, std::mt19937 &rng, size_t maxChunk)
{
    size_t off = 0;
    while (off < n) {
        size_t chunk = std::min(n - off, std::uniform_int_distribution<size_t>(1, maxChunk)(rng));
        ssize_t r = c.recv(p + off, chunk, 0, 20000);
        ASSERT_GT(r, 0) << "at " << off << " of " << n << ": " << strerror(-r);
        off += r;
    }
}

} // namespace rstream
