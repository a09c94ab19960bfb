// SPDX-License-Identifier: MIT
// Signal tracking (sigtrack.h): the table of the program's handlers and the trampoline.

#include "sigtrack.h"

#include <cerrno>
#include <cstring>
#include <sys/syscall.h>
#include <unistd.h>

namespace rstream::sigtrack {

namespace {

// SA_RESTORER is glibc's business (it sets its own); a flag the program never set.
constexpr int kRestorer = 0x04000000;

// One signal's disposition as the program set it. Read by the trampoline in any thread, so
// each field on its own is atomic; the mask is only reported back (sigaction's old).
struct Entry
{
    std::atomic<void *> handler{nullptr};
    std::atomic<int> flags{0};
    std::atomic<bool> known{false}; // the fields say it (else: ask the kernel)
    sigset_t mask{};
};

Entry gEntries[NSIG];
std::atomic<bool> gActive{false};
std::atomic<SigactionFn> gReal{nullptr};

std::atomic<ThreadStateFn> gState{nullptr};

// activate()'s default: in an executable that links this library statically, the linker
// makes it static TLS.
thread_local ThreadState tState;
ThreadState &ownState()
{
    return tState;
}

void *handlerOf(const struct sigaction &sa)
{
    return (sa.sa_flags & SA_SIGINFO) ? reinterpret_cast<void *>(sa.sa_sigaction)
                                      : reinterpret_cast<void *>(sa.sa_handler);
}

// SIG_DFL and SIG_IGN are the same values in sa_sigaction (the kernel reads one field).
bool isHandler(const struct sigaction &sa)
{
    void *h = handlerOf(sa);
    return h != reinterpret_cast<void *>(SIG_DFL) && h != reinterpret_cast<void *>(SIG_IGN);
}

SigactionFn real()
{
    const SigactionFn r = gReal.load(std::memory_order_acquire);
    return r ? r : ::sigaction;
}

void trampoline(int sig, siginfo_t *info, void *uc)
{
    // Counted first, and the sleep this thread is about to make woken: a blocking call of ours
    // in progress here returns EINTR, as the kernel's would (handler then return, or the
    // reverse: either way the count has moved by the time the call looks).
    const int saved = errno;
    ThreadState &t = gState.load(std::memory_order_relaxed)();
    t.ran.fetch_add(1, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    if (const int fd = t.wakeFd.load(std::memory_order_relaxed); fd >= 0) {
        const uint64_t one = 1;
        (void)syscall(SYS_write, fd, &one, sizeof(one)); // not the shim's write
    }
    errno = saved;
    Entry &e = gEntries[sig];
    const int flags = e.flags.load(std::memory_order_acquire);
    void *h = e.handler.load(std::memory_order_acquire);
    if (flags & SA_RESETHAND) {
        // The kernel put the default action back as it delivered this one.
        e.handler.store(reinterpret_cast<void *>(SIG_DFL), std::memory_order_release);
        e.flags.store(0, std::memory_order_release);
    }
    if (h == reinterpret_cast<void *>(SIG_DFL)) {
        // Set to the default while this one was on its way: the default action, as the kernel
        // would have taken it (pending until this returns, unless SA_NODEFER).
        raise(sig);
    } else if (h == reinterpret_cast<void *>(SIG_IGN)) {
        return;
    } else if (flags & SA_SIGINFO) {
        reinterpret_cast<void (*)(int, siginfo_t *, void *)>(h)(sig, info, uc);
    } else {
        reinterpret_cast<void (*)(int)>(h)(sig);
    }
}

// Records sa as sig's disposition, and puts the trampoline in front of it when it is a handler.
int install(int sig, const struct sigaction &sa)
{
    Entry &e = gEntries[sig];
    const int flags = sa.sa_flags & ~kRestorer;
    if (!isHandler(sa)) {
        if (real()(sig, &sa, nullptr) != 0)
            return -1;
        e.handler.store(handlerOf(sa), std::memory_order_release);
        e.flags.store(flags, std::memory_order_release);
        e.mask = sa.sa_mask;
        e.known.store(true, std::memory_order_release);
        return 0;
    }
    // The table first: a signal delivered between the two finds the new handler either way.
    const void *beforeHandler = e.handler.load(std::memory_order_relaxed);
    const int beforeFlags = e.flags.load(std::memory_order_relaxed);
    const bool beforeKnown = e.known.load(std::memory_order_relaxed);
    e.handler.store(handlerOf(sa), std::memory_order_release);
    e.flags.store(flags, std::memory_order_release);
    e.mask = sa.sa_mask;
    e.known.store(true, std::memory_order_release);
    struct sigaction t = sa;
    t.sa_sigaction = trampoline;
    t.sa_flags = flags | SA_SIGINFO;
    if (real()(sig, &t, nullptr) != 0) {
        const int err = errno;
        e.handler.store(const_cast<void *>(beforeHandler), std::memory_order_release);
        e.flags.store(beforeFlags, std::memory_order_release);
        e.known.store(beforeKnown, std::memory_order_release);
        errno = err;
        return -1;
    }
    return 0;
}

// sig's disposition as the program set it.
int view(int sig, struct sigaction *out)
{
    Entry &e = gEntries[sig];
    if (!e.known.load(std::memory_order_acquire))
        return real()(sig, nullptr, out);
    std::memset(out, 0, sizeof(*out));
    out->sa_flags = e.flags.load(std::memory_order_acquire);
    void *h = e.handler.load(std::memory_order_acquire);
    if (out->sa_flags & SA_SIGINFO)
        out->sa_sigaction = reinterpret_cast<void (*)(int, siginfo_t *, void *)>(h);
    else
        out->sa_handler = reinterpret_cast<void (*)(int)>(h);
    out->sa_mask = e.mask;
    return 0;
}

} // namespace

bool active()
{
    return gActive.load(std::memory_order_acquire);
}

bool tracked(int sig)
{
    if (sig <= 0 || sig >= NSIG)
        return false;
    switch (sig) {
    case SIGKILL:
    case SIGSTOP:
    case SIGSEGV:
    case SIGBUS:
    case SIGILL:
    case SIGFPE:
    case SIGTRAP:
    case SIGSYS:
        return false;
    default:
        return sig < 32 || sig >= SIGRTMIN; // between them: glibc's own (cancellation, setxid)
    }
}

void activate(SigactionFn realFn, ThreadStateFn state)
{
    if (active())
        return;
    gState.store(state ? state : ownState, std::memory_order_release);
    gReal.store(realFn, std::memory_order_release);
    // Handlers set before the shim loaded (other libraries' constructors) go through it too.
    for (int sig = 1; sig < NSIG; sig++) {
        if (!tracked(sig))
            continue;
        struct sigaction cur;
        if (realFn(sig, nullptr, &cur) == 0)
            (void)install(sig, cur);
    }
    gActive.store(true, std::memory_order_release);
}

void deactivate()
{
    if (!active())
        return;
    gActive.store(false, std::memory_order_release);
    for (int sig = 1; sig < NSIG; sig++) {
        Entry &e = gEntries[sig];
        if (!tracked(sig) || !e.known.load())
            continue;
        struct sigaction sa;
        view(sig, &sa);
        e.known.store(false);
        real()(sig, &sa, nullptr);
    }
}

int setAction(int sig, const struct sigaction *act, struct sigaction *old)
{
    if (!active() || !tracked(sig))
        return real()(sig, act, old);
    struct sigaction before;
    if (view(sig, &before) != 0)
        return -1;
    if (act) {
        const struct sigaction copy = *act; // act may be old
        if (install(sig, copy) != 0)
            return -1;
    }
    if (old)
        *old = before;
    return 0;
}

void resync(int sig)
{
    if (!active() || !tracked(sig))
        return;
    struct sigaction k;
    if (real()(sig, nullptr, &k) != 0)
        return;
    Entry &e = gEntries[sig];
    if (handlerOf(k) == reinterpret_cast<void *>(trampoline)) {
        // Still ours, with new flags (siginterrupt): the program's handler stays, its kind too.
        const int kind = e.flags.load() & SA_SIGINFO;
        e.flags.store((k.sa_flags & ~(SA_SIGINFO | kRestorer)) | kind, std::memory_order_release);
        e.mask = k.sa_mask;
        return;
    }
    (void)install(sig, k);
}

ThreadState &thread()
{
    return gState.load(std::memory_order_relaxed)();
}

} // namespace rstream::sigtrack
