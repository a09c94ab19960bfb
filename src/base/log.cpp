// SPDX-License-Identifier: MIT
// Log sink: one line per event with time, pid, tid (and fd), written with a single write(2).

#include "log.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <mutex>
#include <new>
#include <pthread.h>
#include <string>
#include <sys/syscall.h>
#include <unistd.h>

#include "configvars.h"
#include "kernel.h"

namespace rstream {

constinit std::atomic<int> gLogLevel{kLogLevelUnread};

namespace {

constexpr const char *kLevelNames[] = {"error", "warn", "info", "debug", "trace"};

// Set once RSTREAM_LOG was read and the sink chosen; cleared in a fork child that must reopen.
std::atomic<bool> gReady{false};
std::mutex gInitMutex; // taken only by logInit, until gReady
int gLogFd = STDERR_FILENO;
bool gOwnFd = false;      // gLogFd is RSTREAM_LOG_FILE, opened here
bool gPathHasPid = false; // its name has %p: a fork child opens its own
// gLogFd once settled; an atomic so that a signal handler on any thread may read it.
std::atomic<int> gLogFdReady{-1};

// Read under gInitMutex, before the level is known: through the registry's calls that never
// log (a line logged from here would wait for that mutex). Both are in its table, so getString
// has no internal error to log either.
static_assert(config::known("RSTREAM_LOG") && config::known("RSTREAM_LOG_FILE"));
static_assert(config::find("RSTREAM_LOG")->kind == config::Kind::Level);

// The level RSTREAM_LOG names; *bad when it names none (warn is used).
int levelFromEnv(const char **bad)
{
    int64_t level;
    const int rc = config::read("RSTREAM_LOG", &level);
    if (rc == 0)
        return static_cast<int>(level);
    if (rc == -EINVAL)
        *bad = std::getenv("RSTREAM_LOG");
    return static_cast<int>(config::defaultValue(*config::find("RSTREAM_LOG")));
}

// Opens RSTREAM_LOG_FILE (%p = pid, appended); stderr when unset or when it cannot be opened.
void openLogFile(std::string *failed)
{
    gLogFd = STDERR_FILENO;
    gOwnFd = false;
    gPathHasPid = false;
    const char *path = config::getString("RSTREAM_LOG_FILE");
    if (!path)
        return;
    std::string p;
    for (const char *c = path; *c; c++) {
        if (c[0] == '%' && c[1] == 'p') {
            p += std::to_string(getpid());
            gPathHasPid = true;
            c++;
        } else {
            p += *c;
        }
    }
    int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        *failed = p + ": " + strerror(errno);
        return;
    }
    gLogFd = fd;
    gOwnFd = true;
}

// Through the seam, so that under the shim a line does not re-enter its write(). Usable from a
// signal handler and before any constructor has run: the seam's table is constant-initialized
// and a call through it is a plain function pointer. EINTR is read from the result, not from
// errno (vlog restores the caller's errno in any case).
void writeLine(int fd, const char *buf, size_t n)
{
    while (n > 0) {
        ssize_t w = sys::write(fd, buf, n);
        if (w == -EINTR)
            continue;
        if (w <= 0)
            return;
        buf += w;
        n -= static_cast<size_t>(w);
    }
}

void vlog(LogLevel level, int fd, const char *fmt, va_list ap)
{
    // The first line of the process may come before anything read the level.
    if (!gReady.load(std::memory_order_acquire))
        logInit();
    if (static_cast<int>(level) > gLogLevel.load(std::memory_order_relaxed))
        return;
    const int saved = errno;
    char buf[1024];
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    const size_t n = formatLogLine(buf, sizeof(buf), level, fd, ts, getpid(),
                                   static_cast<long>(syscall(SYS_gettid)), fmt, ap);
    writeLine(gLogFd, buf, n);
    errno = saved;
}

} // namespace

void logInit()
{
    if (gReady.load(std::memory_order_acquire))
        return;
    const char *bad = nullptr;
    std::string failed;
    {
        std::lock_guard<std::mutex> lock(gInitMutex);
        if (gReady.load(std::memory_order_relaxed))
            return;
        static bool atfork = false;
        if (!atfork) {
            atfork = true;
            pthread_atfork(nullptr, nullptr, logAfterFork);
        }
        const int level = levelFromEnv(&bad);
        openLogFile(&failed);
        gLogFdReady.store(gLogFd, std::memory_order_release);
        gLogLevel.store(level, std::memory_order_relaxed);
        gReady.store(true, std::memory_order_release);
    }
    if (bad)
        RS_LOG(Warn, "RSTREAM_LOG=%s is not error, warn, info, debug or trace; using warn", bad);
    if (!failed.empty())
        RS_LOG(Warn, "cannot open RSTREAM_LOG_FILE %s; logging to stderr", failed.c_str());
}

bool logEnabled(LogLevel level)
{
    logInit();
    return static_cast<int>(level) <= gLogLevel.load(std::memory_order_relaxed);
}

int logFd()
{
    return gLogFdReady.load(std::memory_order_acquire);
}

void logWrite(LogLevel level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(level, -1, fmt, ap);
    va_end(ap);
}

void logWriteFd(LogLevel level, int fd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(level, fd < 0 ? -1 : fd, fmt, ap);
    va_end(ap);
}

void logAfterFork()
{
    // Another thread of the parent may have held the lock at the fork.
    new (&gInitMutex) std::mutex();
    if (!gReady.load(std::memory_order_relaxed) || !gPathHasPid || !gOwnFd)
        return;
    sys::close(gLogFd);
    gLogFd = STDERR_FILENO;
    gOwnFd = false;
    gLogFdReady.store(-1, std::memory_order_release);
    gReady.store(false, std::memory_order_release);
}

size_t formatLogLine(char *buf, size_t cap, LogLevel level, int fd, const timespec &realtime,
                     int pid, long tid, const char *fmt, va_list ap)
{
    if (cap < 2)
        return 0;
    // The text ends at cap - 1 at most, where the newline replaces snprintf's terminator.
    size_t n = 0;
    auto add = [&](int m) {
        if (m > 0)
            n = std::min(cap - 1, n + static_cast<size_t>(m));
    };
    tm t{};
    const time_t secs = realtime.tv_sec;
    gmtime_r(&secs, &t);
    const int lvl = std::clamp(static_cast<int>(level), 0, 4);
    add(snprintf(buf, cap, "rstream %04d-%02d-%02dT%02d:%02d:%02d.%06ldZ pid=%d tid=%ld %s: ",
                 t.tm_year + 1900, t.tm_mon + 1, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec,
                 realtime.tv_nsec / 1000, pid, tid, kLevelNames[lvl]));
    if (fd >= 0)
        add(snprintf(buf + n, cap - n, "fd=%d ", fd));
    add(vsnprintf(buf + n, cap - n, fmt, ap));
    buf[n++] = '\n';
    return n;
}

} // namespace rstream
