// SPDX-License-Identifier: MIT
// A blocking call interrupted by a signal: run on a thread of its own, sent SIGUSR1 30 ms in,
// its handler set with libc's sigaction or through sigtrack's trampoline (the shim's way).
#pragma once

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <pthread.h>
#include <signal.h>
#include <thread>
#include <unistd.h>

#include <gtest/gtest.h>

#include "sigtrack.h"

namespace rstest {

struct Interrupted
{
    long result = 0;          // what the call returned
    int64_t ms = 0;           // how long it took
    int handlers = 0;         // how many times the signal's handler ran
    uint64_t blocked = ~0ull; // the thread's blocked signals (SigBlk) just before the signal
};

// A thread's blocked signals, from /proc (~0: unknown).
inline uint64_t blockedSignals(pid_t tid)
{
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/self/task/%d/status", int(tid));
    FILE *f = std::fopen(path, "r");
    if (!f)
        return ~0ull;
    char line[256];
    unsigned long long v = ~0ull;
    while (std::fgets(line, sizeof(line), f))
        if (std::sscanf(line, "SigBlk: %llx", &v) == 1)
            break;
    std::fclose(f);
    return v;
}

inline std::atomic<int> gInterruptHandlers{0};

// Runs call() on a new thread (so that a spin it learns per thread starts from nothing) and
// sends that thread SIGUSR1 once it has run 30 ms, under a handler without SA_RESTART (the
// kernel's calls return EINTR under it); the handler in place before is put back.
// tracked: through sigtrack, active for the call (as under the shim), and ended after it.
template <typename Call>
Interrupted interruptAfter30ms(Call call, bool tracked = false)
{
    struct sigaction sa = {};
    struct sigaction old = {};
    sa.sa_handler = [](int) { gInterruptHandlers++; };
    sigemptyset(&sa.sa_mask);
    Interrupted out;
    if (tracked)
        rstream::sigtrack::activate(::sigaction);
    if (rstream::sigtrack::setAction(SIGUSR1, &sa, &old) != 0) {
        out.result = -1000;
        return out;
    }
    gInterruptHandlers = 0;
    std::atomic<bool> started{false};
    std::atomic<pid_t> tid{0};
    std::thread waiter([&] {
        tid = gettid();
        started = true;
        const auto t0 = std::chrono::steady_clock::now();
        out.result = static_cast<long>(call());
        out.ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::steady_clock::now() - t0)
                     .count();
    });
    while (!started)
        std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    out.blocked = blockedSignals(tid.load());
    pthread_kill(waiter.native_handle(), SIGUSR1);
    waiter.join();
    rstream::sigtrack::setAction(SIGUSR1, &old, nullptr);
    if (tracked)
        rstream::sigtrack::deactivate();
    out.handlers = gInterruptHandlers.load();
    return out;
}

// What every such test expects: the handler ran once, the call returned EINTR at once rather
// than at its timeout (3 s in the tests), and a spin held signals off unless tracked (its mask
// sampled during the spin: nothing blocked then).
inline void expectInterruptedSpin(const Interrupted &i, bool tracked)
{
    EXPECT_EQ(i.handlers, 1);
    EXPECT_EQ(i.result, -EINTR) << "after " << i.ms << " ms";
    EXPECT_LT(i.ms, 2000) << "the call slept on after the signal";
    if (tracked)
        EXPECT_EQ(i.blocked, 0u) << "signals held during the spin";
    else
        EXPECT_NE(i.blocked, 0u);
}

} // namespace rstest
