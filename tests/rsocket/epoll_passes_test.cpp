// SPDX-License-Identifier: MIT
// The provider passes an emulated epoll wait costs a fabric server between requests (none for
// the look after an answer the kernel took whole, and a request that came meanwhile still
// seen), and what a client's poll for its answer costs (one sleep, one pass).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <poll.h>
#include <sys/epoll.h>
#include <thread>

#include <gtest/gtest.h>

#include "connection.h"
#include "epoll_fixture.h"
#include "kernel.h"
#include "poller.h"
#include "provider_sends_hook.h"
#include "socket.h"

namespace rstream {
namespace {

using rstest_epoll::EpollReady;
using rstest_epoll::kModes;

// A server's round: the wait reports the request, the server reads it dry (its recv arms the
// member's connection without a pass) and answers with a byte, which the provider injects and
// the kernel takes whole (the executable's send reports it, as the preload shim's does). The
// look at the member in the next wait then needs no pass: nothing reached its wait fd since
// the last one (each request was a pass and a look before). In every other round the client's
// next request is already there at that look, which must report it. Unreported, the answer's
// send leaves the connection disarmed and the look makes a pass, as before.
TEST_P(EpollReady, ALookAfterAnAnswerMakesNoPass)
{
    if (GetParam().sameHost)
        GTEST_SKIP() << "a same-host link's look makes no provider pass";
    connectPairs(1);
    ASSERT_TRUE(parked(1));
    auto [c, s] = pairs_[0];
    std::shared_ptr<Connection> conn = s->connection();
    ASSERT_TRUE(conn);
    const int n = 40;
    int quiet[2] = {0, 0};
    for (const bool report : {true, false}) {
        test::gReportSends = report;
        bool pending = false; // the next request is there already
        for (int i = 0; i < n; i++) {
            SCOPED_TRACE(i);
            epoll_event out[4];
            if (!pending)
                sendByte(*c);
            ASSERT_EQ(set_->wait(out, 4, 5000, nullptr, 0), 1);
            char b = 0;
            iovec v{&b, 1};
            ASSERT_EQ(s->recv(&v, 1, 0), 1);
            ASSERT_EQ(s->send(&v, 1, 0), 1);
            pending = i % 2 == 1;
            if (pending)
                sendByte(*c); // on loopback, in the server's socket when send returns
            const uint64_t before = conn->progressCalls();
            const int got = set_->wait(out, 4, 0, nullptr, 0);
            if (pending) {
                EXPECT_EQ(got, 1) << "a request that came after the answer was not reported";
            } else {
                EXPECT_EQ(got, 0);
                quiet[report] += conn->progressCalls() == before;
            }
            ASSERT_EQ(c->recv(&v, 1, 0), 1); // the answer
            if (pending && got == 1) {
                // Reported already: read now, answered in the next round's wait-less start.
                ASSERT_EQ(s->recv(&v, 1, 0), 1);
                ASSERT_EQ(s->send(&v, 1, 0), 1);
                ASSERT_EQ(c->recv(&v, 1, 0), 1);
                pending = false;
            }
        }
    }
    test::gReportSends = true;
    RecordProperty("looks_without_pass_reported", quiet[1]);
    RecordProperty("looks_without_pass_unreported", quiet[0]);
    EXPECT_GE(quiet[1], n / 2 * 9 / 10) << "looks after answers the kernel took whole made passes";
    EXPECT_EQ(quiet[0], 0) << "a look after an unverified answer made no pass";
}

std::atomic<int> gPpolls{0};
int countingPpoll(pollfd *fds, nfds_t n, const timespec *t, const sigset_t *mask)
{
    gPpolls++;
    return ::ppoll(fds, n, t, mask);
}
std::shared_ptr<Pollable> gClient;
std::shared_ptr<Pollable> pollClient(int fd)
{
    return fd == 1000 ? gClient : nullptr;
}

// A client sends a request, reads (nothing yet: that read's pass found nothing and armed the
// connection), and polls for the answer, which the server sends 5 ms later. The poll sleeps on
// the armed wait fd at once, and its look after the sleep makes the one pass that takes the
// answer: a ppoll and a pass per request. Before, the poll made a pass of its own before the
// sleep, a check of the fd after registering its wake-ups, and another check after the sleep
// (three ppolls and two passes).
TEST_P(EpollReady, APollForAnAnswerSleepsOnceAndLooksOnce)
{
    if (GetParam().sameHost)
        GTEST_SKIP() << "a same-host link's look makes no provider pass";
    connectPairs(1);
    auto [c, s] = pairs_[0];
    c->setNonblocking(true);
    std::shared_ptr<Connection> conn = c->connection();
    ASSERT_TRUE(conn);
    gClient = c;
    static sys::Calls table = [] {
        sys::Calls t = sys::kLibc;
        t.ppoll = countingPpoll;
        return t;
    }();
    const int n = 20;
    int ppolls = 0, passes = 0;
    for (int i = 0; i < n; i++) {
        SCOPED_TRACE(i);
        sendByte(*c);
        char b = 0;
        iovec v{&b, 1};
        ASSERT_EQ(c->recv(&v, 1, 0), -EAGAIN);
        Socket *srv = s.get(); // clang 14 cannot capture a structured binding
        std::thread server([srv] {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            char r = 0;
            iovec rv{&r, 1};
            for (int k = 0; k < 5000 && srv->recv(&rv, 1, 0) != 1; k++)
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            EXPECT_EQ(srv->send(&rv, 1, 0), 1);
        });
        pollfd p{1000, POLLIN, 0};
        const uint64_t before = conn->progressCalls();
        sys::bind(&table);
        gPpolls = 0;
        const int r = pollFds(&p, 1, 5000, nullptr, pollClient, 0);
        ppolls += gPpolls.load();
        sys::bind(&sys::kLibc);
        passes += static_cast<int>(conn->progressCalls() - before);
        server.join();
        ASSERT_EQ(r, 1);
        EXPECT_EQ(p.revents, POLLIN);
        ASSERT_EQ(c->recv(&v, 1, 0), 1);
    }
    gClient.reset();
    RecordProperty("ppolls", ppolls);
    RecordProperty("passes", passes);
    // A wake-up before the provider has the whole answer costs a sleep and a pass more.
    EXPECT_LE(ppolls, n + n / 4) << "polls checked the armed fd besides sleeping on it";
    EXPECT_LE(passes, n + n / 4) << "polls made passes besides the one that took the answer";
}

std::shared_ptr<Pollable> gListener;
std::shared_ptr<Pollable> pollServer(int fd)
{
    return fd == 1000 ? gClient : fd == 999 ? gListener : nullptr;
}

// A select() loop's call over a readable connection and its listener (iperf3's server reads a
// small piece after each): the first look asks the kernel for the listener's fds (and an armed
// connection's wait fd) in one ppoll and returns what it found. It used to look again before
// returning, a second ppoll each call.
TEST_P(EpollReady, APollOverAListenerAndAReadableConnectionAsksTheKernelOnce)
{
    connectPairs(1);
    auto [c, s] = pairs_[0];
    const int n = 20;
    for (int i = 0; i < n; i++)
        sendByte(*c);
    char b = 0;
    iovec v{&b, 1};
    gClient = s;
    gListener = listener_;
    static sys::Calls table = [] {
        sys::Calls t = sys::kLibc;
        t.ppoll = countingPpoll;
        return t;
    }();
    int ppolls = 0;
    for (int i = 0; i < n; i++) {
        SCOPED_TRACE(i);
        pollfd p[2] = {{1000, POLLIN, 0}, {999, POLLIN, 0}};
        sys::bind(&table);
        gPpolls = 0;
        const int r = pollFds(p, 2, 5000, nullptr, pollServer, 0);
        ppolls += gPpolls.load();
        sys::bind(&sys::kLibc);
        ASSERT_EQ(r, 1);
        EXPECT_EQ(p[0].revents, POLLIN);
        EXPECT_EQ(p[1].revents, 0);
        ASSERT_EQ(s->recv(&v, 1, 0), 1);
    }
    gClient.reset();
    gListener.reset();
    RecordProperty("ppolls", ppolls);
    EXPECT_LE(ppolls, n + 2) << "calls that found the connection ready looked again";
}

INSTANTIATE_TEST_SUITE_P(Modes, EpollReady, ::testing::ValuesIn(kModes),
                         [](const auto &p) { return std::string(p.param.name); });

} // namespace
} // namespace rstream
