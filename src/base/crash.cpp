// SPDX-License-Identifier: MIT
// Crash handler: the faulting thread's backtrace to the log, then the previous handler or death.
//
// Everything the handler does is async-signal-safe: no malloc, no stdio, no locks. It unwinds
// with libunwind's local unwinder, formats into stack buffers and writes with the write system
// call. Whatever needs memory or the loader (the DSO table, the log file's name, libunwind's
// lazy setup and PLT slots, the alternate stack) is prepared at install time.

#define UNW_LOCAL_ONLY
#include <libunwind.h>

#include "configvars.h"
#include "crash.h"
#include "dsomap.h"
#include "log.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

namespace rstream {

namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL};
constexpr const char *kSignalNames[] = {"SIGSEGV", "SIGBUS", "SIGABRT", "SIGFPE", "SIGILL"};
constexpr int kNumSignals = sizeof(kSignals) / sizeof(kSignals[0]);
constexpr int kMaxFrames = 64;
constexpr size_t kAltStackSize = 64 * 1024; // libunwind reads ELF and DWARF data on it

int signalIndex(int sig)
{
    for (int i = 0; i < kNumSignals; i++)
        if (kSignals[i] == sig)
            return i;
    return -1;
}

// ---- System calls -------------------------------------------------------------------------------

// Direct system calls: the preload shim interposes read, write and close, and its versions look
// up tables that a crashing process cannot be trusted with.
pid_t sysGettid()
{
    return static_cast<pid_t>(syscall(SYS_gettid));
}

void sysWriteAll(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        const long w = syscall(SYS_write, fd, buf, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        buf += w;
        len -= static_cast<size_t>(w);
    }
}

// ---- Formatting ---------------------------------------------------------------------------------

// One log line in a fixed buffer (snprintf is not async-signal-safe); longer lines are cut.
class Line
{
public:
    Line &str(const char *s)
    {
        while (*s && n_ < sizeof(buf_) - 1)
            buf_[n_++] = *s++;
        return *this;
    }
    Line &hex(uintptr_t v)
    {
        char t[2 * sizeof(v)];
        int k = 0;
        do {
            t[k++] = "0123456789abcdef"[v & 15];
            v >>= 4;
        } while (v);
        str("0x");
        while (k > 0 && n_ < sizeof(buf_) - 1)
            buf_[n_++] = t[--k];
        return *this;
    }
    Line &dec(long v)
    {
        char t[24];
        int k = 0;
        unsigned long u =
            v < 0 ? 0UL - static_cast<unsigned long>(v) : static_cast<unsigned long>(v);
        do {
            t[k++] = static_cast<char>('0' + u % 10);
            u /= 10;
        } while (u);
        if (v < 0)
            str("-");
        while (k > 0 && n_ < sizeof(buf_) - 1)
            buf_[n_++] = t[--k];
        return *this;
    }
    void flush(int fd)
    {
        buf_[n_++] = '\n';
        sysWriteAll(fd, buf_, n_);
        n_ = 0;
    }

private:
    char buf_[640];
    size_t n_ = 0;
};

// ---- Log destination ----------------------------------------------------------------------------

// RSTREAM_LOG_FILE as it was at load (the program may change its environment later).
char gLogPath[4096];

// The logger's fd; before its first line the logger has not opened RSTREAM_LOG_FILE yet, and
// the handler opens it the same way (append, %p is the pid) with the system call.
int crashLogFd()
{
    const int fd = logFd();
    if (fd >= 0)
        return fd;
    if (!gLogPath[0])
        return STDERR_FILENO;
    char path[sizeof(gLogPath) + 32];
    size_t n = 0;
    for (const char *c = gLogPath; *c && n < sizeof(path) - 24; c++) {
        if (c[0] == '%' && c[1] == 'p') {
            char t[16];
            int k = 0;
            for (long pid = getpid(); k == 0 || pid > 0; pid /= 10)
                t[k++] = static_cast<char>('0' + pid % 10);
            while (k > 0)
                path[n++] = t[--k];
            c++;
        } else {
            path[n++] = *c;
        }
    }
    path[n] = '\0';
    const long f =
        syscall(SYS_openat, AT_FDCWD, path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    return f >= 0 ? static_cast<int>(f) : STDERR_FILENO;
}

// Appends " (dso+0xoffset)" for addr.
void appendDso(Line &l, uintptr_t addr)
{
    char name[240];
    uintptr_t rel = 0;
    if (dsomap::lookup(addr, name, sizeof(name), &rel))
        l.str(" (").str(name).str("+").hex(rel).str(")");
}

// ---- The handler --------------------------------------------------------------------------------

// The disposition each signal had before us, and whether to call it.
struct Previous
{
    struct sigaction action;
    bool chain;
};
Previous gPrevious[kNumSignals];

// The thread writing the report (0: none yet, -1: written). Only the first crash of the
// process is reported: a second thread crashing meanwhile waits for the report to be complete,
// and a handler that returns and faults again is not reported in a loop.
std::atomic<pid_t> gReporter{0};
static_assert(std::atomic<pid_t>::is_always_lock_free);

// Positions cursor at the interrupted frame.
bool initCursor(unw_cursor_t *cursor, unw_context_t *ctx, void *uctx)
{
#if defined(__x86_64__)
    // libunwind's context is a ucontext_t here: start right at the faulting instruction.
    if (unw_init_local2(cursor, static_cast<unw_context_t *>(uctx), UNW_INIT_SIGNAL_FRAME) == 0)
        return true;
#else
    (void)uctx;
#endif
    // Elsewhere, unwind from here through the kernel's signal frame.
    if (unw_getcontext(ctx) != 0 || unw_init_local(cursor, ctx) != 0)
        return false;
    for (int i = 0; i < 16; i++) {
        if (unw_is_signal_frame(cursor) > 0)
            return unw_step(cursor) > 0;
        if (unw_step(cursor) <= 0)
            break;
    }
    // No signal frame found: report from the handler itself rather than nothing.
    return unw_getcontext(ctx) == 0 && unw_init_local(cursor, ctx) == 0;
}

// Writes one line per frame from cursor on: "#n 0xip name+off (object+offset)". Async-signal-
// safe. signal: the first frame is the interrupted instruction (not a return address).
void writeFrames(int fd, unw_cursor_t *cursor, bool signal)
{
    Line l;
    for (int n = 0;; n++) {
        if (n == kMaxFrames) {
            l.str("#").dec(n).str(" ... (more frames not shown)").flush(fd);
            break;
        }
        unw_word_t ip = 0;
        if (unw_get_reg(cursor, UNW_REG_IP, &ip) != 0 || ip == 0)
            break;
        l.str("#").dec(n).str(" ").hex(ip).str(" ");
        char name[256];
        unw_word_t off = 0;
        name[0] = '\0';
        // -UNW_ENOMEM still returns the name, cut to the buffer.
        const int r = unw_get_proc_name(cursor, name, sizeof(name), &off);
        if ((r == 0 || r == -UNW_ENOMEM) && name[0])
            l.str(name).str("+").hex(off);
        else
            l.str("??");
        // A return address may be just past its function's (or object's) end: look up the call.
        appendDso(l, (n == 0 && signal) || unw_is_signal_frame(cursor) > 0 ? ip : ip - 1);
        l.flush(fd);
        if (unw_step(cursor) <= 0)
            break;
    }
}

void report(int idx, const siginfo_t *info, void *uctx, pid_t tid)
{
    const int fd = crashLogFd();
    const int sig = kSignals[idx];
    unw_context_t ctx;
    unw_cursor_t cursor;
    const bool unwound = initCursor(&cursor, &ctx, uctx);
    unw_word_t pc = 0;
    if (unwound)
        unw_get_reg(&cursor, UNW_REG_IP, &pc);
    // The faulting address for memory faults; the instruction otherwise (the kernel puts it in
    // si_addr for SIGILL and SIGFPE; abort and kill leave it empty).
    uintptr_t at = pc;
    if (info && info->si_code > 0 && sig != SIGABRT)
        at = reinterpret_cast<uintptr_t>(info->si_addr);
    Line l;
    l.str("rstream crash: signal ").dec(sig).str(" (").str(kSignalNames[idx]).str(") at ").hex(at);
    l.str(" in thread ").dec(tid).flush(fd);
    if (!unwound) {
        l.str("rstream crash: no backtrace (libunwind could not start)").flush(fd);
        return;
    }
    writeFrames(fd, &cursor, true);
}

void setDefault(int sig)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
}

// What the process would have done without us: the previous handler, or the default action.
void chain(int idx, int sig, siginfo_t *info, void *uctx)
{
    const Previous &p = gPrevious[idx];
    if (p.chain) {
        if (p.action.sa_flags & SA_RESETHAND)
            setDefault(sig);
        sigset_t saved;
        pthread_sigmask(SIG_BLOCK, &p.action.sa_mask, &saved);
        if (p.action.sa_flags & SA_SIGINFO)
            p.action.sa_sigaction(sig, info, uctx);
        else
            p.action.sa_handler(sig);
        pthread_sigmask(SIG_SETMASK, &saved, nullptr);
        return;
    }
    // Ignored before us and sent by kill or raise: still ignored. (An ignored fault kills.)
    const bool fromKernel = info && info->si_code > 0;
    if (!(p.action.sa_flags & SA_SIGINFO) && p.action.sa_handler == SIG_IGN && !fromKernel)
        return;
    // Die of the signal itself, so that the exit status and the core dump are the usual ones:
    // the signal is blocked in here and stays pending until the handler returns, then it kills
    // at the interrupted instruction (a fault would also recur there). The mask restored on
    // return must let it through.
    setDefault(sig);
    if (uctx)
        sigdelset(&static_cast<ucontext_t *>(uctx)->uc_sigmask, sig);
    syscall(SYS_tgkill, getpid(), sysGettid(), sig);
}

void onCrash(int sig, siginfo_t *info, void *uctx)
{
    const int savedErrno = errno;
    const int idx = signalIndex(sig);
    if (idx < 0)
        return;
    const pid_t tid = sysGettid();
    pid_t expected = 0;
    if (gReporter.compare_exchange_strong(expected, tid)) {
        report(idx, info, uctx, tid);
        gReporter.store(-1);
    } else if (expected > 0 && expected != tid) {
        // Another thread is writing the report: dying now would cut it short (bounded wait,
        // in case that thread is stuck).
        for (int i = 0; i < 300 && gReporter.load() > 0; i++) {
            timespec ts{0, 10 * 1000 * 1000};
            nanosleep(&ts, nullptr);
        }
    }
    chain(idx, sig, info, uctx);
    errno = savedErrno;
}

// ---- Installation -------------------------------------------------------------------------------

// Runs libunwind once outside any handler: its lazy setup and the loader's lazy binding of its
// functions happen now, not in a crashing process.
__attribute__((noinline)) void warmUp()
{
    unw_context_t ctx;
    unw_cursor_t cursor;
    if (unw_getcontext(&ctx) != 0 || unw_init_local(&cursor, &ctx) != 0)
        return;
    char name[64];
    unw_word_t off;
    unw_word_t ip;
    unw_get_reg(&cursor, UNW_REG_IP, &ip);
    unw_get_proc_name(&cursor, name, sizeof(name), &off);
    unw_is_signal_frame(&cursor);
    unw_step(&cursor);
    unw_init_local2(&cursor, &ctx, 0);
}

// An alternate signal stack for this thread, so that a stack overflow is reported too (the
// handler could not run on the exhausted stack). The program's own alternate stack is kept.
void installAltStack()
{
    stack_t cur;
    if (sigaltstack(nullptr, &cur) == 0 && !(cur.ss_flags & SS_DISABLE))
        return;
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void *mem = mmap(nullptr, kAltStackSize + page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (mem == MAP_FAILED)
        return;
    // A guard page below: overflowing the alternate stack faults instead of writing over memory.
    mprotect(mem, page, PROT_NONE);
    stack_t ss;
    memset(&ss, 0, sizeof(ss));
    ss.ss_sp = static_cast<char *>(mem) + page;
    ss.ss_size = kAltStackSize;
    if (sigaltstack(&ss, nullptr) != 0)
        munmap(mem, kAltStackSize + page);
}

// How many invariant failures still get a backtrace (the first few tell the story).
std::atomic<int> gBacktracesLeft{16};

} // namespace

bool isFabricLibraryHandler(const struct sigaction &sa)
{
    if (!(sa.sa_flags & SA_SIGINFO) && (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN))
        return false;
    void *fn = (sa.sa_flags & SA_SIGINFO) ? reinterpret_cast<void *>(sa.sa_sigaction)
                                          : reinterpret_cast<void *>(sa.sa_handler);
    Dl_info info;
    return dladdr(fn, &info) && info.dli_fname &&
           (strstr(info.dli_fname, "libinfinipath") || strstr(info.dli_fname, "libpsm") ||
            strstr(info.dli_fname, "libfabric"));
}

__attribute__((noinline)) void logBacktrace(int skip)
{
    logInit();
    const int fd = logFd() >= 0 ? logFd() : STDERR_FILENO;
    unw_context_t ctx;
    unw_cursor_t cursor;
    if (unw_getcontext(&ctx) != 0 || unw_init_local(&cursor, &ctx) != 0)
        return;
    // Starts at the caller: this function is not part of the story.
    for (int i = 0; i <= skip; i++)
        if (unw_step(&cursor) <= 0)
            return;
    writeFrames(fd, &cursor, false);
}

__attribute__((noinline)) bool invariantFailed(const char *what, const char *file, int line)
{
    const char *base = std::strrchr(file, '/');
    RS_LOG(Error, "internal invariant failed: %s (%s:%d); resetting the connection", what,
           base ? base + 1 : file, line);
    if (!config::getFlag("RSTREAM_BACKTRACE") || !logEnabled(LogLevel::Error))
        return false;
    if (gBacktracesLeft.fetch_sub(1, std::memory_order_relaxed) > 0)
        logBacktrace(1); // from the function whose check failed
    return false;
}

void resetFabricSignalHandlers()
{
    // For libraries loaded from now on, exec'd children included (the program's own choice
    // wins when it set the variable).
    setenv("IPATH_NO_BACKTRACE", "1", 0);
    for (int sig : kFabricLibrarySignals) {
        struct sigaction cur;
        if (sigaction(sig, nullptr, &cur) == 0 && isFabricLibraryHandler(cur)) {
            // What the signal did before that library is lost; a signal ignored since exec is
            // kept ignored only when the library never took it (rstream-run sets the variable).
            setDefault(sig);
            RS_LOG(Debug, "signal %d: a fabric library's handler replaced by the default action",
                   sig);
        }
    }
}

void installCrashHandler()
{
    static bool installed = false;
    if (installed)
        return;
    installed = true;
    resetFabricSignalHandlers();
    if (!config::getFlag("RSTREAM_BACKTRACE"))
        return; // no report
    const char *path = config::getString("RSTREAM_LOG_FILE");
    if (path && strlen(path) < sizeof(gLogPath))
        strcpy(gLogPath, path);
    dsomap::snapshot();
    warmUp();
    installAltStack();

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = onCrash;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    // The other crash signals wait while a report is written (a fault in here still kills).
    sigemptyset(&sa.sa_mask);
    for (int sig : kSignals)
        sigaddset(&sa.sa_mask, sig);
    for (int i = 0; i < kNumSignals; i++) {
        Previous &p = gPrevious[i];
        if (sigaction(kSignals[i], nullptr, &p.action) != 0)
            continue;
        // A fabric library's handler is gone already (resetFabricSignalHandlers).
        p.chain = (p.action.sa_flags & SA_SIGINFO) ||
                  (p.action.sa_handler != SIG_DFL && p.action.sa_handler != SIG_IGN);
        sigaction(kSignals[i], &sa, nullptr);
    }
}

} // namespace rstream
