// SPDX-License-Identifier: MIT
// The program's signal handlers, set through sigtrack's trampoline (src/base/sigtrack.h), so
// that a blocking call knows a handler ran without holding signals off around each sleep.

#include <csignal>

#include "configvars.h"
#include "shim_object.h"
#include "sigtrack.h"

namespace rstream::shim {

namespace {

// glibc's signal(), sysv_signal() and sigset() reach the kernel with glibc's own sigaction:
// the call, then the trampoline in front of what it set. They answer with the handler the
// kernel had, the trampoline: the program's own is said instead.
template <class Call>
sighandler_t throughGlibc(int sig, Call call)
{
    if (!sigtrack::active() || !sigtrack::tracked(sig))
        return call();
    struct sigaction before;
    if (sigtrack::setAction(sig, nullptr, &before) != 0)
        return call();
    const sighandler_t r = call();
    if (r == SIG_ERR || r == SIG_HOLD)
        return r; // SIG_HOLD: sigset() says the signal was blocked, whatever the handler
    sigtrack::resync(sig);
    return (before.sa_flags & SA_SIGINFO)
               ? reinterpret_cast<sighandler_t>(reinterpret_cast<void *>(before.sa_sigaction))
               : before.sa_handler;
}

// What the trampoline keeps of each thread: static TLS, which a handler may touch first (the
// shim is loaded at the program's start, so it has room there).
constinit thread_local sigtrack::ThreadState tSigState __attribute__((tls_model("initial-exec")));

sigtrack::ThreadState &sigState()
{
    return tSigState;
}

} // namespace

void activateSignalTracking()
{
    if (config::getFlag("RSTREAM_SIGNAL_TRACK") && config::getFlag("RSTREAM_ENABLE"))
        sigtrack::activate(shim().real.sigaction(), sigState);
}

int Shim::sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    if (!sigtrack::active())
        return real.sigaction()(sig, act, old);
    return sigtrack::setAction(sig, act, old);
}

sighandler_t Shim::signal(int sig, sighandler_t handler)
{
    return throughGlibc(sig, [&] { return real.signal()(sig, handler); });
}

sighandler_t Shim::sysv_signal(int sig, sighandler_t handler)
{
    return throughGlibc(sig, [&] { return real.sysv_signal()(sig, handler); });
}

sighandler_t Shim::sigset(int sig, sighandler_t disposition)
{
    return throughGlibc(sig, [&] { return real.sigset()(sig, disposition); });
}

int Shim::siginterrupt(int sig, int flag)
{
    const int r = real.siginterrupt()(sig, flag);
    if (r == 0)
        sigtrack::resync(sig); // the trampoline's SA_RESTART changed: the program's did
    return r;
}

} // namespace rstream::shim
