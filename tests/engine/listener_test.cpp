// SPDX-License-Identifier: MIT
// A listener shared with a fork child (prefork and fork-per-connection servers) defers every
// request at once, with a refusal the client recognises, instead of answering it in a process
// that may never serve it; turned off again it answers as before.

#include <atomic>
#include <cerrno>
#include <chrono>
#include <memory>
#include <poll.h>
#include <thread>
#include <unistd.h>

#include <gtest/gtest.h>

#include "clock.h"
#include "connection.h"
#include "listener.h"
#include "net.h"
#include "progress.h"

using namespace rstream;
using rstest::loopback4;

namespace {

Settings tcpSettings(bool upgrade = false)
{
    Settings s = Settings::fromEnv();
    s.provider = "tcp";
    s.connectTimeoutMs = 3000;
    s.upgrade = upgrade; // the shim's connects can take a Defer
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

// Connects a client, blocking; returns the result and how long it took, and whether the
// refusal was a Defer.
int connectTimed(uint16_t port, int64_t *ms, bool *deferred = nullptr, bool upgrade = true)
{
    Connection c(tcpSettings(upgrade));
    auto a = loopback4(port);
    const int64_t start = nowNs();
    int r = c.connect(reinterpret_cast<sockaddr *>(&a), sizeof(a));
    *ms = (nowNs() - start) / 1000000;
    if (deferred)
        *deferred = c.refusedWithDefer();
    return r;
}

} // namespace

// A poller that finds an armed listener's two fds not readable skips asking the provider
// (Socket::lookFds): that holds only if every request after the arming makes one of them
// readable, whether a look or the progress thread answers it first.
TEST(Listener, ArmedHintSeesEveryRequest)
{
    uint16_t port = 0;
    auto l = listenOnLoopback(&port);
    ASSERT_TRUE(l);
    EXPECT_FALSE(l->hintArmed()) << "armed before any look";
    for (int round = 0; round < 3; round++) {
        SCOPED_TRACE(round);
        pollfd fds[2] = {{l->waitFd(), POLLIN, 0}, {l->readyFd(), POLLIN, 0}};
        // Nothing pending: a look arms it, and then both are quiet.
        bool quiet = false;
        for (int i = 0; i < 200 && !quiet; i++) {
            ASSERT_FALSE(l->pendingArm());
            quiet = l->hintArmed() && poll(fds, 2, 0) == 0;
            if (!quiet)
                usleep(1000);
        }
        ASSERT_TRUE(quiet);
        int rc = 1;
        std::thread client([&] {
            int64_t ms;
            rc = connectTimed(port, &ms, nullptr, false);
        });
        EXPECT_EQ(poll(fds, 2, 5000), 1 + (fds[0].revents && fds[1].revents ? 1 : 0));
        bool pending = false;
        for (int i = 0; i < 500 && !pending; i++)
            if (!(pending = l->pendingArm()))
                poll(fds, 2, 10);
        EXPECT_TRUE(pending);
        std::unique_ptr<Connection> c;
        EXPECT_EQ(l->accept(&c, true), 0);
        client.join();
        EXPECT_EQ(rc, 0);
    }
}

// The progress thread looks at a listener (an EQ read and an fi_trywait, two system calls of
// the provider) only when its fd fired: a thread that wakes for other work (here a timer every
// 10 ms; a connection's pass every millisecond while it has work) leaves a quiet listener be,
// and every request still gets answered without the application's accept.
class TickingClient : public ProgressClient
{
public:
    int backgroundProgress(bool *, int64_t *) override { return kProgressDone; }
    int64_t timerTick(int64_t nowNs, bool *) override
    {
        ticks++;
        return nowNs + 1000000;
    }
    bool passiveProgress(bool *) override { return false; }
    bool closeDelivered() const override { return true; }
    int waitFd() const override { return -1; }
    std::atomic<int> ticks{0};
};

TEST(Listener, TheProgressThreadLooksOnlyWhenRequestsCome)
{
    uint16_t port = 0;
    auto l = listenOnLoopback(&port);
    ASSERT_TRUE(l);
    TickingClient ticking;
    ProgressThread::instance().schedule(&ticking, nowNs());
    std::this_thread::sleep_for(std::chrono::milliseconds(50)); // its first look, armed
    for (int round = 0; round < 3; round++) {
        SCOPED_TRACE(round);
        const uint64_t looks = l->backgroundLooks();
        const int ticks = ticking.ticks.load();
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        const int woke = ticking.ticks.load() - ticks;
        EXPECT_GE(woke, 5) << "the thread did not wake for its timer";
        EXPECT_LE(l->backgroundLooks() - looks, 1u)
            << "the thread looked at a quiet listener at its " << woke << " wake-ups";
        // A request: the thread answers it into the accept queue (a blocking connect completes
        // without an accept).
        int64_t ms;
        ASSERT_EQ(connectTimed(port, &ms, nullptr, false), 0);
        std::unique_ptr<Connection> c;
        EXPECT_EQ(l->accept(&c, true), 0);
        std::this_thread::sleep_for(std::chrono::milliseconds(20)); // armed again
    }
    ProgressThread::instance().forget(&ticking, -1);
}

// A poller's arm before it sleeps is skipped while nothing was read since the last one, and
// the request that comes after it still wakes a sleeper and is accepted. (An accept that
// skipped its read after a clean arm too left the shim's upgrade requests unanswered in
// e2e_nginx_wrk; here the progress thread's own read answers the request either way.)
TEST(Listener, AcceptAfterACleanArmAnswers)
{
    uint16_t port = 0;
    auto l = listenOnLoopback(&port);
    ASSERT_TRUE(l);
    int armed = -1;
    for (int i = 0; i < 200 && armed != 0; i++)
        if ((armed = l->arm()) != 0)
            usleep(1000);
    ASSERT_EQ(armed, 0);
    EXPECT_EQ(l->arm(), 0) << "armed again, nothing read since";
    int rc = 1;
    std::thread client([&] {
        int64_t ms;
        rc = connectTimed(port, &ms, nullptr, false);
    });
    pollfd fds[2] = {{l->waitFd(), POLLIN, 0}, {l->readyFd(), POLLIN, 0}};
    EXPECT_GE(poll(fds, 2, 5000), 1) << "the request did not wake a sleeper";
    std::unique_ptr<Connection> c;
    int r = -EAGAIN;
    for (int i = 0; i < 500 && r == -EAGAIN; i++)
        if ((r = l->accept(&c, true)) == -EAGAIN)
            usleep(2000);
    EXPECT_EQ(r, 0);
    client.join();
    EXPECT_EQ(rc, 0);
}

TEST(Listener, SharedListenerDefersAtOnce)
{
    uint16_t port = 0;
    auto l = listenOnLoopback(&port);
    ASSERT_TRUE(l);
    l->setDeferring(true);
    // The connect timeout is 3 s: the refusal comes at once, and says "defer".
    for (int i = 0; i < 3; i++) {
        int64_t ms = 0;
        bool deferred = false;
        EXPECT_EQ(connectTimed(port, &ms, &deferred), -ECONNREFUSED);
        EXPECT_TRUE(deferred);
        EXPECT_LT(ms, 1000);
    }
    // Even while the process accepts: the connection must reach the process that serves it.
    std::unique_ptr<Connection> accepted;
    EXPECT_EQ(l->accept(&accepted, true), -EAGAIN);
    EXPECT_FALSE(accepted);
}

TEST(Listener, ConnectsThatCannotTakeADeferAreAnswered)
{
    // An rsocket program's connect (no kFlagUpgrade): answered even by a deferring listener.
    uint16_t port = 0;
    auto l = listenOnLoopback(&port);
    ASSERT_TRUE(l);
    l->setDeferring(true);
    std::unique_ptr<Connection> accepted;
    int acceptRet = 1;
    std::thread server([&] { acceptRet = l->accept(&accepted, false, 5000); });
    int64_t ms = 0;
    bool deferred = true;
    EXPECT_EQ(connectTimed(port, &ms, &deferred, false), 0);
    EXPECT_FALSE(deferred);
    server.join();
    EXPECT_EQ(acceptRet, 0);
}

TEST(Listener, OwnProcessIsAnsweredDirectly)
{
    // A shim listener (Settings::upgrade) defers other processes' connects; its own process's
    // are answered over the fabric at once (they cannot go to another process).
    auto l = std::make_unique<Listener>(tcpSettings(true));
    auto a = loopback4(0);
    ASSERT_EQ(l->bind(reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0);
    ASSERT_EQ(l->listen(16), 0);
    sockaddr_storage bound;
    socklen_t len = sizeof(bound);
    ASSERT_EQ(l->localAddress(&bound, &len), 0);
    const uint16_t port = ntohs(reinterpret_cast<sockaddr_in *>(&bound)->sin_port);
    std::unique_ptr<Connection> accepted;
    int acceptRet = 1;
    std::thread server([&] { acceptRet = l->accept(&accepted, false, 5000); });
    int64_t ms = 0;
    bool deferred = true;
    EXPECT_EQ(connectTimed(port, &ms, &deferred), 0);
    EXPECT_FALSE(deferred);
    server.join();
    EXPECT_EQ(acceptRet, 0);
}

TEST(Listener, DeferringOffAnswersAgain)
{
    uint16_t port = 0;
    auto l = listenOnLoopback(&port);
    ASSERT_TRUE(l);
    l->setDeferring(true);
    int64_t ms = 0;
    bool deferred = false;
    EXPECT_EQ(connectTimed(port, &ms, &deferred), -ECONNREFUSED);
    l->setDeferring(false);
    std::unique_ptr<Connection> accepted;
    int acceptRet = 1;
    std::thread server([&] { acceptRet = l->accept(&accepted, false, 5000); });
    EXPECT_EQ(connectTimed(port, &ms, &deferred), 0);
    EXPECT_FALSE(deferred);
    server.join();
    EXPECT_EQ(acceptRet, 0);
    EXPECT_TRUE(accepted);
}

TEST(Listener, PlainRefusalIsNotADefer)
{
    // Nothing listens: a refusal by the kernel, not a Defer.
    uint16_t port = 0;
    {
        auto l = listenOnLoopback(&port);
        ASSERT_TRUE(l);
    }
    int64_t ms = 0;
    bool deferred = true;
    EXPECT_NE(connectTimed(port, &ms, &deferred), 0);
    EXPECT_FALSE(deferred);
}
