// SPDX-License-Identifier: MIT
// Logging: RSTREAM_LOG=error|warn|info|debug|trace (default warn), RSTREAM_LOG_FILE=PATH.
#pragma once

#include <atomic>
#include <cstdarg>
#include <cstddef>
#include <ctime>

namespace rstream {

enum class LogLevel : int
{
    Error = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
    Trace = 4
};

// gLogLevel before RSTREAM_LOG was read: above every level, so that the first line logged
// reaches logWrite (which reads the environment and filters it) even when it comes from a
// constructor that runs before any of this file's initializers could.
constexpr int kLogLevelUnread = 100;
extern constinit std::atomic<int> gLogLevel;

// Reads RSTREAM_LOG and RSTREAM_LOG_FILE (once; again in a fork child, see logAfterFork).
void logInit();
// Whether lines of this level are written (reads the environment on first use).
bool logEnabled(LogLevel level);
// The fd log lines go to, or -1 before the first line opened it (RSTREAM_LOG_FILE is opened
// lazily). Async-signal-safe: for the crash handler, which opens the file itself on -1.
int logFd();
void logWrite(LogLevel level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// A line about the socket the application knows as fd.
void logWriteFd(LogLevel level, int fd, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
// In a fork child: a log file whose name has %p is reopened under the child's pid by the next
// line (the parent keeps its own). Call with only the forking thread alive.
void logAfterFork();

// One log line, newline included, cut to cap bytes:
//   rstream 2026-01-02T03:04:05.123456Z pid=1234 tid=1236 info: fd=7 message
// (fd= only for fd >= 0). Returns its length. For the sink and the tests.
size_t formatLogLine(char *buf, size_t cap, LogLevel level, int fd, const timespec &realtime,
                     int pid, long tid, const char *fmt, va_list ap);

} // namespace rstream

// Formats nothing unless the level is enabled.
#define RS_LOG(level, ...)                                                                         \
    do {                                                                                           \
        if (static_cast<int>(::rstream::LogLevel::level) <=                                        \
            ::rstream::gLogLevel.load(std::memory_order_relaxed))                                  \
            ::rstream::logWrite(::rstream::LogLevel::level, __VA_ARGS__);                          \
    } while (0)

// The same for a line about the application's socket fd.
#define RS_LOG_FD(level, fd, ...)                                                                  \
    do {                                                                                           \
        if (static_cast<int>(::rstream::LogLevel::level) <=                                        \
            ::rstream::gLogLevel.load(std::memory_order_relaxed))                                  \
            ::rstream::logWriteFd(::rstream::LogLevel::level, (fd), __VA_ARGS__);                  \
    } while (0)
