// SPDX-License-Identifier: MIT
// A peer that stops reading (so never returns credit): the writer's connection waits for it
// without costing the process CPU (the progress thread sleeps on the connection's wait fd
// instead of polling it), and other connections keep working meanwhile.

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <sys/resource.h>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "engine_fixture.h"

using namespace rstream;

namespace {

// CPU time (user and system) of the whole process, in milliseconds.
double cpuMs()
{
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
           (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

using StalledPeer = EngineTest;

TEST_P(StalledPeer, WaitingForCreditCostsNoCpu)
{
    auto [c, s] = pair();
    ASSERT_TRUE(c && s);
    // Fill everything the reader buffers (its rings grow first), until sends say EAGAIN.
    std::vector<uint8_t> chunk(64 * 1024, 0x5a);
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    int eagains = 0;
    while (eagains < 20 && std::chrono::steady_clock::now() < until) {
        const ssize_t r = c->send(chunk.data(), chunk.size(), kNonBlock);
        if (r == -EAGAIN) {
            eagains++;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            continue;
        }
        ASSERT_GT(r, 0) << strerror(-r);
        eagains = 0;
    }
    ASSERT_EQ(eagains, 20) << "the writer was never held back";
    // The application goes quiet with unsent data in its send ring: the progress thread has
    // work it cannot do until the peer returns credit. What was in flight when the writer gave
    // up may still be landing in the reader's ring (slow under the sanitizers), so the quietest
    // of three seconds counts; a thread that polls costs CPU in every one of them.
    double used = 1e9;
    std::string seconds;
    for (int i = 0; i < 3 && used >= 10.0; i++) {
        const double before = cpuMs();
        std::this_thread::sleep_for(std::chrono::seconds(1));
        const double ms = cpuMs() - before;
        used = std::min(used, ms);
        seconds += (seconds.empty() ? "" : " ") + std::to_string(ms);
    }
    RecordProperty("cpu_ms_per_s_stalled", std::to_string(used));
    EXPECT_LT(used, 10.0) << "the process spent " << seconds << " ms of CPU in each second waiting";
    // Another connection is not held up meanwhile.
    auto [c2, s2] = pair();
    ASSERT_TRUE(c2 && s2);
    EXPECT_EQ(c2->send("ok", 2), 2);
    char b[2];
    EXPECT_EQ(s2->recv(b, 2, kWaitAll, 5000), 2);
    // And once the reader reads, everything arrives.
    size_t got = 0;
    std::vector<uint8_t> buf(256 * 1024);
    for (;;) {
        const ssize_t r = s->recv(buf.data(), buf.size(), 0, 500);
        if (r <= 0)
            break;
        for (ssize_t i = 0; i < r; i++)
            ASSERT_EQ(buf[i], 0x5a);
        got += static_cast<size_t>(r);
    }
    EXPECT_GE(got, 64u * 1024); // the rings of strict mode keep their 32 KiB
}

INSTANTIATE_TEST_SUITE_P(Modes, StalledPeer, ::testing::ValuesIn(kModes),
                         [](const auto &p) { return std::string(p.param.name); });

} // namespace
