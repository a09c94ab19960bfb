// SPDX-License-Identifier: MIT
// Logging: RSTREAM_LOG=error|warn|info|debug|trace (default warn), RSTREAM_LOG_FILE=PATH.
#pragma once

#include <atomic>

namespace rstream {

enum class LogLevel : int
{
    Error = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
    Trace = 4
};

extern std::atomic<int> gLogLevel;

void logInit();
// The fd log lines go to, or -1 before the first line opened it (RSTREAM_LOG_FILE is opened
// lazily). Async-signal-safe: for the crash handler, which opens the file itself on -1.
int logFd();
void logWrite(LogLevel level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

} // namespace rstream

// Formats nothing unless the level is enabled.
#define RS_LOG(level, ...)                                                                         \
    do {                                                                                           \
        if (static_cast<int>(::rstream::LogLevel::level) <=                                        \
            ::rstream::gLogLevel.load(std::memory_order_relaxed))                                  \
            ::rstream::logWrite(::rstream::LogLevel::level, __VA_ARGS__);                          \
    } while (0)
