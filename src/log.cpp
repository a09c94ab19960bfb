// SPDX-License-Identifier: MIT
// Log sink: one line per event with time, pid and tid, written with a single write(2).

#include "log.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <mutex>
#include <string>
#include <sys/syscall.h>
#include <unistd.h>

namespace rstream {

namespace {

int levelFromEnv()
{
    const char *v = std::getenv("RSTREAM_LOG");
    if (!v)
        return static_cast<int>(LogLevel::Warn);
    static const char *names[] = {"error", "warn", "info", "debug", "trace"};
    for (int i = 0; i < 5; i++)
        if (!strcasecmp(v, names[i]))
            return i;
    return static_cast<int>(LogLevel::Warn);
}

int gLogFd = STDERR_FILENO;
std::once_flag gLogOnce;
// gLogFd once settled; an atomic so that a signal handler on any thread may read it.
std::atomic<int> gLogFdReady{-1};

void openLogFile()
{
    const char *path = std::getenv("RSTREAM_LOG_FILE");
    if (!path || !*path)
        return;
    std::string p;
    for (const char *c = path; *c; c++) {
        if (c[0] == '%' && c[1] == 'p') {
            p += std::to_string(getpid());
            c++;
        } else {
            p += *c;
        }
    }
    int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0)
        gLogFd = fd;
}

void openLog()
{
    openLogFile();
    gLogFdReady.store(gLogFd, std::memory_order_release);
}

} // namespace

std::atomic<int> gLogLevel{levelFromEnv()};

void logInit()
{
    std::call_once(gLogOnce, openLog);
}

int logFd()
{
    return gLogFdReady.load(std::memory_order_acquire);
}

void logWrite(LogLevel level, const char *fmt, ...)
{
    logInit();
    static const char *tags[] = {"error", "warn", "info", "debug", "trace"};
    char buf[1024];
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int n = snprintf(buf, sizeof(buf), "rstream %ld.%06ld %d/%ld %s: ", (long)ts.tv_sec,
                     ts.tv_nsec / 1000, getpid(), (long)syscall(SYS_gettid),
                     tags[static_cast<int>(level)]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof(buf) - n - 1, fmt, ap);
    va_end(ap);
    n += m < 0 ? 0 : std::min<int>(m, sizeof(buf) - n - 2);
    buf[n++] = '\n';
    ssize_t w = ::write(gLogFd, buf, n);
    (void)w;
}

} // namespace rstream
