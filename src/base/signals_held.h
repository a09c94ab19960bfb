// SPDX-License-Identifier: MIT
// Signals held off while a blocking call spins and arms, so that its sleep's ppoll takes them.
#pragma once

#include <cerrno>
#include <pthread.h>
#include <signal.h>

#include "sigtrack.h"

namespace rstream {

// A blocking call spins, then arms, then sleeps in ppoll. A signal that came before the sleep
// ran its handler there, and the call slept anyway: the program's handler had set its flag
// (nginx's on SIGQUIT) but nothing woke the sleep, where the kernel's own call would have
// returned EINTR. nginx under the shim at times did not stop. So from its first look that
// finds nothing, a call holds the catchable signals and sleeps with the mask it was called
// with, or the one its caller passed (ppoll, pselect, epoll_pwait): ppoll delivers one that
// came in between, and the call returns EINTR. A call answered at its first look changes no
// mask.
// Faults are never held (a held SIGSEGV kills the process); glibc keeps its own
// cancellation and setxid signals out of any mask, so pthread_cancel still stops a spin.
// Under the shim (sigtrack.h) nothing is held: the program's handlers count themselves, and
// write the fd of the sleep their thread is about to make. A call whose thread ran a handler
// since it began returns EINTR at its sleep (beginSleep) or after it (endSleep): the same
// answer without the two rt_sigprocmask calls of every sleep.
class SignalsHeld
{
public:
    SignalsHeld()
        : tracked_(sigtrack::active()),
          ran_(tracked_ ? sigtrack::thread().ran.load(std::memory_order_relaxed) : 0)
    {}
    SignalsHeld(const SignalsHeld &) = delete;
    SignalsHeld &operator=(const SignalsHeld &) = delete;
    ~SignalsHeld()
    {
        if (held_)
            pthread_sigmask(SIG_SETMASK, &before_, nullptr);
    }

    // Holds them, once (tracked: nothing to hold).
    void hold()
    {
        if (held_ || tracked_)
            return;
        sigset_t all;
        sigfillset(&all);
        for (const int s : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS})
            sigdelset(&all, s);
        held_ = pthread_sigmask(SIG_BLOCK, &all, &before_) == 0;
    }

    // The mask to sleep with: the caller's if it passed one, else the thread's own from before
    // the hold (null: not held, sleep with the current one).
    const sigset_t *sleepMask(const sigset_t *callerMask) const
    {
        return callerMask ? callerMask : held_ ? &before_ : nullptr;
    }

    // Just before the sleep, which waits on wakeFd (readable) among its fds: a handler that
    // runs on this thread from now on writes it. -EINTR when one ran since the call began (no
    // sleep then). Without a wake fd (-1), signals are held for the sleep instead.
    int beginSleep(int wakeFd)
    {
        if (!tracked_)
            return 0;
        if (wakeFd < 0) {
            tracked_ = false; // the sleep's mask then lets them in
            hold();
            tracked_ = true;
            return interrupted() ? -EINTR : 0;
        }
        sigtrack::ThreadState &t = sigtrack::thread();
        t.wakeFd.store(wakeFd, std::memory_order_relaxed);
        std::atomic_signal_fence(std::memory_order_seq_cst);
        if (interrupted()) {
            t.wakeFd.store(-1, std::memory_order_relaxed);
            return -EINTR;
        }
        return 0;
    }

    // Right after it: true when a handler ran on this thread since the call began (the call
    // then returns EINTR, whatever the sleep saw; a wake fd it wrote was seen and drained, or
    // wakes the next sleep at once, which drains it).
    bool endSleep()
    {
        if (!tracked_)
            return false;
        std::atomic_signal_fence(std::memory_order_seq_cst);
        sigtrack::thread().wakeFd.store(-1, std::memory_order_relaxed);
        return interrupted();
    }

private:
    bool interrupted() const
    {
        return sigtrack::thread().ran.load(std::memory_order_relaxed) != ran_;
    }

    sigset_t before_{};
    bool held_ = false;
    bool tracked_ = false;
    uint64_t ran_ = 0;
};

} // namespace rstream
