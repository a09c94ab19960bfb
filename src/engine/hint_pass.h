// SPDX-License-Identifier: MIT
// A poller's pass over its sockets: a number per pass, so that what one look learnt is used
// within that pass only (Connection::hintQuiet(), the shim's looks of kernel fds).
#pragma once

#include <atomic>
#include <cstdint>

namespace rstream {

class HintPass
{
public:
    HintPass() : saved_(tCurrent), savedBefore_(tBefore)
    {
        tBefore = tEnded;
        tCurrent = next_.fetch_add(1) + 1;
    }
    ~HintPass()
    {
        tEnded = tCurrent;
        tCurrent = saved_;
        tBefore = savedBefore_;
    }
    HintPass(const HintPass &) = delete;
    HintPass &operator=(const HintPass &) = delete;
    // This thread's pass (each one a new number), or 0 outside any.
    static uint64_t current() { return tCurrent; }
    // The pass that ended on this thread last before the current one began (0: none): what a
    // pass learnt is still news in the next one only when no other came in between.
    static uint64_t previous() { return tBefore; }

private:
    uint64_t saved_;
    uint64_t savedBefore_;
    static inline std::atomic<uint64_t> next_{0};
    static inline thread_local uint64_t tCurrent = 0; // this thread's pass, 0: none
    static inline thread_local uint64_t tEnded = 0;   // the last one that ended on it
    static inline thread_local uint64_t tBefore = 0;  // previous()
};

// A poll or select without a timeout: it never sleeps, so its looks are all that a program
// polling in a loop makes, and a same-host look reads the link's pipe now and then (a peer that
// went shows only there; a poller that sleeps sees it in its sleep, epoll in its parked members).
class LooksWithoutSleep
{
public:
    explicit LooksWithoutSleep(bool on) : saved_(tOn) { tOn = on; }
    ~LooksWithoutSleep() { tOn = saved_; }
    LooksWithoutSleep(const LooksWithoutSleep &) = delete;
    LooksWithoutSleep &operator=(const LooksWithoutSleep &) = delete;
    static bool on() { return tOn; }

private:
    bool saved_;
    static inline thread_local bool tOn = false;
};

} // namespace rstream
