// SPDX-License-Identifier: MIT
// A blocking call interrupted by a signal: run on a thread of its own, sent SIGUSR1 30 ms in.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <pthread.h>
#include <signal.h>
#include <thread>

namespace rstest {

struct Interrupted
{
    long result = 0;  // what the call returned
    int64_t ms = 0;   // how long it took
    int handlers = 0; // how many times the signal's handler ran
};

inline std::atomic<int> gInterruptHandlers{0};

// Runs call() on a new thread (so that a spin it learns per thread starts from nothing) and
// sends that thread SIGUSR1 once it has run 30 ms, under a handler without SA_RESTART (the
// kernel's calls return EINTR under it); the handler in place before is put back.
template <typename Call>
Interrupted interruptAfter30ms(Call call)
{
    struct sigaction sa = {};
    struct sigaction old = {};
    sa.sa_handler = [](int) { gInterruptHandlers++; };
    sigemptyset(&sa.sa_mask);
    Interrupted out;
    if (sigaction(SIGUSR1, &sa, &old) != 0) {
        out.result = -1000;
        return out;
    }
    gInterruptHandlers = 0;
    std::atomic<bool> started{false};
    std::thread waiter([&] {
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
    pthread_kill(waiter.native_handle(), SIGUSR1);
    waiter.join();
    sigaction(SIGUSR1, &old, nullptr);
    out.handlers = gInterruptHandlers.load();
    return out;
}

} // namespace rstest
