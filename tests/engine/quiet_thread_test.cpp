// SPDX-License-Identifier: MIT
// The progress thread beside connections whose answers leave the tcp provider's wait fd quiet
// (quiet_signal.cpp): it is not woken, and makes no pass, for what the application takes itself.
// The provider's sends are reported as under the preload shim.

#include <atomic>
#include <chrono>
#include <thread>
#include <unistd.h>
#include <vector>

#include "engine_fixture.h"
#include "kernel.h"
#include "proc.h"
#include "provider_sends_hook.h" // the sends the kernel took whole, as the shim reports them
#include "quiet_modes.h"

namespace rstream {
namespace {

class QuietThreadTest : public EngineTest
{
protected:
    // n connected pairs, their client ends in cs and server ends in ss.
    void pairs(int n, std::vector<std::unique_ptr<Connection>> *cs,
               std::vector<std::unique_ptr<Connection>> *ss)
    {
        for (int i = 0; i < n; i++) {
            auto [c, s] = pair(settings(), settings());
            ASSERT_TRUE(c && s);
            cs->push_back(std::move(c));
            ss->push_back(std::move(s));
        }
    }
};
using test::notInjectedQuiet;

// A server that answers a request each millisecond or so, asleep in its receive between them.
// Its answers are injects the kernel took whole: nothing stays pending once its next receive's
// pass has run, and the progress thread has nothing to do. It used to keep the connection
// watched for as long as the requests came, waking each millisecond to find the application
// recent (sockperf's paced server: 380 wake-ups a second, a seventh of the server's CPU).
TEST_P(QuietThreadTest, AServerAnsweringEachMillisecondLeavesTheProgressThreadAsleep)
{
    if (const char *why = notInjectedQuiet(GetParam()))
        GTEST_SKIP() << why;
    auto [c, s] = pair(settings(), settings());
    ASSERT_TRUE(c && s);
    const int n = 300;
    std::atomic<int> answered{0};
    Connection *srv = s.get(); // clang 14 cannot capture a structured binding
    std::thread server([srv, &answered] {
        char b = 0;
        for (int i = 0; i < n + 1; i++) {
            if (srv->recv(&b, 1, 0, 5000) != 1 || srv->send("a", 1, 0, 5000) != 1)
                return;
            answered++;
        }
    });
    char b = 0;
    Connection *cli = c.get();
    auto round = [cli, &b] {
        ASSERT_EQ(cli->send("q", 1, 0, 5000), 1);
        ASSERT_EQ(cli->recv(&b, 1, 0, 5000), 1);
    };
    round(); // settle: the first exchange may be the thread's work
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const long before = rstest::threadSwitches("rstream-prog");
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n && !HasFatalFailure(); i++) {
        round();
        std::this_thread::sleep_for(std::chrono::microseconds(700));
    }
    const long switches = rstest::threadSwitches("rstream-prog") - before;
    const long ms = long(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count());
    server.join();
    ASSERT_EQ(answered.load(), n + 1);
    ASSERT_GE(before, 0) << "no thread named rstream-prog";
    RecordProperty("progress_thread_switches", int(switches));
    RecordProperty("elapsed_ms", int(ms));
    // 135-139 wake-ups in 250 ms before, 11-23 now (timers, the passive round's looks).
    EXPECT_LT(switches, ms / 3) << "the progress thread woke " << switches << " times in " << ms
                                << " ms (" << n << " requests)";
}

// The engine's own writes (its wake-ups of the progress thread) made while tCountWrites is set.
thread_local bool tCountWrites = false;
std::atomic<int> gEngineWrites{0};
ssize_t countingWrite(int fd, const void *buf, size_t len)
{
    gEngineWrites += tCountWrites;
    return ::write(fd, buf, len);
}

// The engine's writes go through countingWrite for as long as it lives.
struct CountedWrites
{
    CountedWrites()
    {
        table.write = countingWrite;
        sys::bind(&table);
    }
    ~CountedWrites() { sys::bind(&sys::kLibc); }
    CountedWrites(const CountedWrites &) = delete;
    CountedWrites &operator=(const CountedWrites &) = delete;
    sys::Calls table = sys::kLibc;
};

// A server that answers its connections in turn, each less often than the progress thread waits
// before it reaps a quiet connection's write completions (kInjectIdleNs): the thread lets each
// connection go between its answers, and each answer watches it again. The thread, asleep until
// the timer of a connection answered before, finds the new one at that wake-up: an answer does
// not write its eventfd (nginx with 200 clients did for most of its requests, and the thread
// woke only to set a timer).
TEST_P(QuietThreadTest, AnswersInTurnDoNotWakeTheProgressThreadEachTime)
{
    if (const char *why = notInjectedQuiet(GetParam()))
        GTEST_SKIP() << why;
    constexpr int kPairs = 4;
    std::vector<std::unique_ptr<Connection>> cs, ss;
    pairs(kPairs, &cs, &ss);
    if (HasFatalFailure())
        return;
    CountedWrites counted;
    const std::vector<char> answer(1024, 'a'); // a write, not an inject
    std::vector<char> got(answer.size());
    auto round = [&](int k) {
        char b = 0;
        ASSERT_EQ(cs[size_t(k)]->send("q", 1, 0, 5000), 1);
        ASSERT_EQ(ss[size_t(k)]->recv(&b, 1, 0, 5000), 1);
        tCountWrites = true;
        const ssize_t n = ss[size_t(k)]->send(answer.data(), answer.size(), 0, 5000);
        tCountWrites = false;
        ASSERT_EQ(n, ssize_t(answer.size()));
        ASSERT_EQ(cs[size_t(k)]->recv(got.data(), got.size(), kWaitAll, 5000), ssize_t(got.size()));
    };
    for (int k = 0; k < kPairs; k++)
        round(k); // settle
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    constexpr int kRounds = 64;
    gEngineWrites = 0;
    for (int i = 0; i < kRounds && !HasFatalFailure(); i++) {
        round(i % kPairs);
        // Each connection answered every 4 x 7 ms: longer than kInjectIdleNs (20 ms).
        std::this_thread::sleep_for(std::chrono::milliseconds(7));
    }
    const int wakes = gEngineWrites.load();
    RecordProperty("answer_wakes", wakes);
    EXPECT_LE(wakes, kRounds / 8) << "the answers woke the progress thread " << wakes
                                  << " times in " << kRounds;
}

// Busy request/response connections return ring credit every few messages, each return a
// CREDIT word (a zero-length send). A word the kernel took whole leaves nothing in the provider,
// as an answer does: the progress thread, if it is to look at all, looks once the application
// has gone quiet. Unseen, each return watched its connection at once and woke a sleeping thread
// through its eventfd, for a look that found the application busy (rstream-perf rr at 50
// connections, the server per 1,000 requests: 7-12 eventfd writes and 11-14 polls of the thread
// before, 0.2-0.5 and 1.0-1.6 since).
TEST_P(QuietThreadTest, CreditReturnsOfBusyConnectionsDoNotWakeTheProgressThread)
{
    if (const char *why = notInjectedQuiet(GetParam()))
        GTEST_SKIP() << why;
    constexpr int kPairs = 16;
    constexpr int kRounds = 3000;
    constexpr size_t kSize = 64; // 188 KiB each way on each, into 32 KiB rings
    std::vector<std::unique_ptr<Connection>> cs, ss;
    pairs(kPairs, &cs, &ss);
    if (HasFatalFailure())
        return;
    CountedWrites counted;
    std::atomic<bool> ok{true};
    gEngineWrites = 0;
    std::thread server([&ss, &ok] {
        std::vector<char> b(kSize);
        tCountWrites = true;
        for (int i = 0; i < kRounds && ok; i++)
            for (auto &s : ss)
                ok = ok && s->recv(b.data(), kSize, kWaitAll, 5000) == ssize_t(kSize) &&
                     s->send(b.data(), kSize, 0, 5000) == ssize_t(kSize);
        tCountWrites = false;
    });
    const std::vector<char> q(kSize, 'q');
    std::vector<char> a(kSize);
    tCountWrites = true;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kRounds && ok; i++) {
        for (auto &c : cs)
            ok = ok && c->send(q.data(), kSize, 0, 5000) == ssize_t(kSize);
        for (auto &c : cs)
            ok = ok && c->recv(a.data(), kSize, kWaitAll, 5000) == ssize_t(kSize);
    }
    tCountWrites = false;
    const long ms = long(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count());
    server.join();
    ASSERT_TRUE(ok) << "a send or receive failed";
    const int wakes = gEngineWrites.load();
    RecordProperty("credit_wakes", wakes);
    RecordProperty("elapsed_ms", int(ms));
    // Seen whole, the returns leave the thread asleep until its own timer: at most about one
    // wake-up every kInjectIdleNs (20 ms). 16 pairs, 2,000 rounds: 9-15 wake-ups in 270-330 ms;
    // 28-55 before.
    EXPECT_LE(wakes, 8 + int(ms / 20))
        << "the credit returns of " << kPairs * kRounds << " round trips woke the progress thread "
        << wakes << " times in " << ms << " ms";
}

// A server answers a request with a write the kernel took whole, looks at the connection again
// 5 ms later (a read that finds nothing, whose pass takes the answer's completion), and gets its
// next request 30 ms later. The progress thread, woken for the answer, looks 20 ms after it and
// finds nothing left: it unwatches the connection without a look of its own. It used to make a
// pass and an fi_trywait there, as the application had been quiet for over a millisecond
// (nginx with 200 clients: five system calls for most of its requests).
TEST_P(QuietThreadTest, AnAnswerTheServerTookBackLeavesTheProgressThreadNothing)
{
    if (const char *why = notInjectedQuiet(GetParam()))
        GTEST_SKIP() << why;
    Settings st = settings();
    st.pollUs = 0; // the server sleeps at once: its own passes are counted below
    auto [c, s] = pair(st, st);
    ASSERT_TRUE(c && s);
    const int n = 15;
    const std::vector<char> answer(1024, 'a'); // more than tcp injects (128 B)
    Connection *srv = s.get();                 // clang 14 cannot capture a structured binding
    std::atomic<bool> ok{true};
    std::thread server([srv, &answer, &ok] {
        char b = 0;
        bool early = false; // a loaded machine let the next request in before the look
        for (int i = 0; i < n + 1 && ok; i++) {
            ok = (early || srv->recv(&b, 1, 0, 5000) == 1) &&
                 srv->send(answer.data(), answer.size(), 0, 5000) == ssize_t(answer.size());
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            const ssize_t r = ok ? srv->recv(&b, 1, kNonBlock, 0) : 0;
            early = r == 1;
            ok = ok && (early || r == -EAGAIN);
        }
    });
    std::vector<char> in(answer.size());
    uint64_t calls0 = 0;
    bool asked = true; // the client's failures end the loop; the server is joined either way
    for (int i = 0; i < n + 1 && ok && asked; i++) {
        if (i == 1)
            calls0 = s->progressCalls();
        asked = c->send("q", 1, 0, 5000) == 1 &&
                c->recv(in.data(), in.size(), kWaitAll, 5000) == ssize_t(in.size());
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
    server.join();
    ASSERT_TRUE(ok) << "the server's receive or answer failed";
    ASSERT_TRUE(asked) << "the client's request or the answer's receive failed";
    const uint64_t calls = s->progressCalls() - calls0;
    RecordProperty("server_progress_calls", int(calls));
    // The server's own: two a request (the read after its wake-up, the read that finds
    // nothing). The thread's look made a third, and its passive round another where it came
    // before the server's own wake-up for the request (3 to 9 a run beside a CPU hog).
    EXPECT_LT(calls, uint64_t(2 * n + n / 2)) << "the progress thread made passes over it";
}

INSTANTIATE_TEST_SUITE_P(Modes, QuietThreadTest, ::testing::ValuesIn(kModes),
                         [](const auto &p) { return std::string(p.param.name); });

} // namespace
} // namespace rstream
