// SPDX-License-Identifier: MIT
// Signals held off while a blocking call spins and arms, so that its sleep's ppoll takes them.
#pragma once

#include <pthread.h>
#include <signal.h>

namespace rstream {

// A blocking call spins, then arms, then sleeps in ppoll. A signal that came before the sleep
// ran its handler there, and the call slept anyway: the program's handler had set its flag
// (nginx's on SIGQUIT) but nothing woke the sleep, where the kernel's own call would have
// returned EINTR. nginx under the shim at times did not stop. So from its first look that
// finds nothing, a call holds the catchable signals and sleeps with the mask it was called
// with, or the one its caller passed (ppoll, pselect, epoll_pwait): ppoll delivers one that
// came in between, and the call returns EINTR. A call answered at its first look changes no
// mask: that costs two system calls, which the spin's own sched_yield calls dwarf.
// Faults are never held (a held SIGSEGV kills the process); glibc keeps its own
// cancellation and setxid signals out of any mask, so pthread_cancel still stops a spin.
class SignalsHeld
{
public:
    SignalsHeld() = default;
    SignalsHeld(const SignalsHeld &) = delete;
    SignalsHeld &operator=(const SignalsHeld &) = delete;
    ~SignalsHeld()
    {
        if (held_)
            pthread_sigmask(SIG_SETMASK, &before_, nullptr);
    }

    // Holds them, once.
    void hold()
    {
        if (held_)
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

private:
    sigset_t before_{};
    bool held_ = false;
};

} // namespace rstream
