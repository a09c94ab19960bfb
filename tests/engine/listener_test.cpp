// SPDX-License-Identifier: MIT
// A listener whose process does not accept (a fork parent's, as in prefork servers) refuses
// requests at once instead of leaving the peer to its connect timeout, and answers them as soon
// as the process looks.

#include <cerrno>
#include <chrono>
#include <memory>
#include <thread>

#include <gtest/gtest.h>

#include "clock.h"
#include "connection.h"
#include "listener.h"
#include "net.h"

using namespace rstream;
using rstest::loopback4;

namespace {

Settings tcpSettings()
{
    Settings s = Settings::fromEnv();
    s.provider = "tcp";
    s.connectTimeoutMs = 3000;
    return s;
}

// A listening endpoint on 127.0.0.1 and its port.
std::unique_ptr<Listener> listenOnLoopback(uint16_t *port)
{
    auto l = std::make_unique<Listener>(tcpSettings());
    auto a = loopback4(0);
    if (l->bind(reinterpret_cast<sockaddr *>(&a), sizeof(a)) < 0 || l->listen(16) < 0)
        return nullptr;
    sockaddr_storage bound;
    socklen_t len = sizeof(bound);
    if (l->localAddress(&bound, &len) < 0)
        return nullptr;
    *port = ntohs(reinterpret_cast<sockaddr_in *>(&bound)->sin_port);
    return l;
}

// Connects a client, blocking; returns the result and how long it took.
int connectTimed(uint16_t port, int64_t *ms)
{
    Connection c(tcpSettings());
    auto a = loopback4(port);
    const int64_t start = nowNs();
    int r = c.connect(reinterpret_cast<sockaddr *>(&a), sizeof(a));
    *ms = (nowNs() - start) / 1000000;
    return r;
}

} // namespace

TEST(Listener, NotAcceptingProcessRefusesAtOnce)
{
    uint16_t port = 0;
    auto l = listenOnLoopback(&port);
    ASSERT_TRUE(l);
    l->setBackgroundAccept(false);
    int64_t ms = 0;
    // The connect timeout is 3 s: a refusal comes after the grace, not after the timeout.
    EXPECT_EQ(connectTimed(port, &ms), -ECONNREFUSED);
    EXPECT_LT(ms, 1000);
    // Again: the listener keeps refusing while its process does not look.
    EXPECT_EQ(connectTimed(port, &ms), -ECONNREFUSED);
    EXPECT_LT(ms, 1000);
}

TEST(Listener, NotAcceptingProcessAnswersWhenItAccepts)
{
    uint16_t port = 0;
    auto l = listenOnLoopback(&port);
    ASSERT_TRUE(l);
    l->setBackgroundAccept(false);
    std::unique_ptr<Connection> accepted;
    int acceptRet = 1;
    std::thread server([&] { acceptRet = l->accept(&accepted, false, 5000); });
    int64_t ms = 0;
    EXPECT_EQ(connectTimed(port, &ms), 0);
    server.join();
    EXPECT_EQ(acceptRet, 0);
    EXPECT_TRUE(accepted);
}

TEST(Listener, BusyProcessGetsTheLongerGrace)
{
    uint16_t port = 0;
    auto l = listenOnLoopback(&port);
    ASSERT_TRUE(l);
    l->setBackgroundAccept(false);
    // The process looked at the listener after it went off (an event loop), then is busy for
    // less than the busy grace: the request waits for it instead of being refused.
    EXPECT_FALSE(l->pending());
    std::unique_ptr<Connection> accepted;
    std::thread server([&] {
        std::this_thread::sleep_for(std::chrono::nanoseconds(Listener::kIdleGraceNs * 5));
        l->accept(&accepted, false, 5000);
    });
    int64_t ms = 0;
    EXPECT_EQ(connectTimed(port, &ms), 0);
    server.join();
    EXPECT_TRUE(accepted);
}
