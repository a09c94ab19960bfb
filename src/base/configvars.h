// SPDX-License-Identifier: MIT
// The registry of the RSTREAM_* environment variables the libraries read, and their getters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace rstream {

// Parses a size with an optional k/m/g suffix (powers of 1024); -EINVAL when malformed. Every
// numeric variable takes this syntax: decimal, or hexadecimal with 0x; never negative.
int parseSize(const char *text, uint64_t *out);

namespace config {

enum class Kind : uint8_t
{
    Number,       // parseSize syntax, in min..max
    NumberOrZero, // the same, or 0 (which turns the feature off)
    Flag,         // a number: 0 is off, any other on
    Level,        // a log level name: error, warn, info, debug, trace (min..max are 0..4)
    Text,         // taken as it is (a path, a list the reader parses); empty is unset
};

struct ConfigVar
{
    const char *name;
    Kind kind;
    int64_t min, max;        // for the numeric kinds
    const char *defaultText; // in the variable's own syntax; "" for none
    const char *meaning;     // one line, as the README and man 7 rstream say it
};

inline constexpr int64_t kMinBuf = 1024;
inline constexpr int64_t kMaxBuf = int64_t(1) << 28;

// Kept in the order of the README's table. The engine checks its own limits against these at
// compile time (settings.cpp), and a unit test checks the README and the man page against them.
inline constexpr ConfigVar kConfigVars[] = {
    {"RSTREAM_PROVIDER", Kind::Text, 0, 0, "",
     "libfabric provider (empty: verbs when it has a device, else tcp)"},
    {"RSTREAM_SEND_BUF", Kind::Number, kMinBuf, kMaxBuf, "32k", "initial send ring size"},
    {"RSTREAM_RECV_BUF", Kind::Number, kMinBuf, kMaxBuf, "32k", "initial receive ring size"},
    {"RSTREAM_SEND_BUF_MAX", Kind::NumberOrZero, kMinBuf, kMaxBuf, "1m",
     "send ring growth limit (0: no growth)"},
    {"RSTREAM_RECV_BUF_MAX", Kind::NumberOrZero, kMinBuf, kMaxBuf, "1m",
     "receive ring growth limit (0: no growth)"},
    {"RSTREAM_TX_SIZE", Kind::Number, 8, 8191, "384", "send queue entries"},
    {"RSTREAM_RX_SIZE", Kind::Number, 8, 8191, "384", "receive queue entries"},
    {"RSTREAM_POLL_US", Kind::Number, 0, 1000000, "50",
     "the most a wait spins before sleeping, in microseconds"},
    {"RSTREAM_CONNECT_TIMEOUT_MS", Kind::Number, 1, 3600000, "2000",
     "bound on connection establishment, and the shim's fallback"},
    {"RSTREAM_IWARP", Kind::Flag, 0, 1, "0", "force write + send mode"},
    {"RSTREAM_STRICT", Kind::Flag, 0, 1, "0", "verbs-shaped memory registration (tests)"},
    {"RSTREAM_SAME_HOST", Kind::Flag, 0, 1, "1",
     "0: peers on this machine use the fabric too, not shared memory"},
    {"RSTREAM_QUIET_SIGNAL", Kind::Flag, 0, 1, "1",
     "0: tcp (libfabric 1.17 and older) wakes a connection's wait fd for each completion"},
    {"RSTREAM_RING_REWIND", Kind::Flag, 0, 1, "1",
     "0: small messages cycle through the whole of the rings instead of their first pages"},
    {"RSTREAM_LOG", Kind::Level, 0, 4, "warn", "log level"},
    {"RSTREAM_LOG_FILE", Kind::Text, 0, 0, "", "log file (%p = pid; empty: stderr)"},
    {"RSTREAM_BACKTRACE", Kind::Flag, 0, 1, "1",
     "0: no backtraces in crash reports and invariant failures"},
    {"RSTREAM_ENABLE", Kind::Flag, 0, 1, "1", "shim: 0 passes every socket call through"},
    {"RSTREAM_SIGNAL_TRACK", Kind::Flag, 0, 1, "1",
     "shim, rstream-perf: 0 holds signals off around each sleep instead of tracking the "
     "program's handlers"},
    {"RSTREAM_PORT_OFFSET", Kind::Number, 0, 65535, "20000",
     "shim: fabric listener port offset (the shim uses 0 on verbs)"},
    {"RSTREAM_PORTS", Kind::Text, 0, 0, "", "shim: ports to offload (empty: all)"},
    {"RSTREAM_EXCLUDE", Kind::Text, 0, 0, "", "shim: destinations never offloaded"},
    {"RSTREAM_NEGATIVE_CACHE_MS", Kind::Number, 0, 86400000, "30000",
     "shim: how long a failed fabric destination uses kernel TCP (0: never cached)"},
    {"RSTREAM_UPGRADE_TIMEOUT_MS", Kind::Number, 10, 600000, "2000",
     "shim: how long a switch to the fabric waits for the peer's count of kernel bytes"},
    {"RSTREAM_SWITCH_WAIT_MS", Kind::Number, 100, 86400000, "30000",
     "shim: how long a server waits for its client's fabric connection, beyond the connect "
     "timeout"},
    {"RSTREAM_UPGRADE_PENDING_MAX", Kind::Number, 1, 1048576, "4096",
     "shim: fabric connections an upgrade listener keeps while their token is due (beyond: the "
     "oldest is closed)"},
    {"RSTREAM_TOKEN_WAIT_MS", Kind::Number, 10, 3600000, "10000",
     "shim: how long a fabric connection to an upgrade listener may take to send its token"},
    {"RSTREAM_STATS", Kind::Text, 0, 0, "", "shim: statistics file written at exit (%p = pid)"},
    {"RSTREAM_EXPORT", Kind::Flag, 0, 1, "1", "shim: 0 keeps the process out of rstream-stat"},
    {"RSTREAM_NOFILE_ORIG", Kind::Number, 1, INT64_MAX, "",
     "set by the shim for its exec'd programs: the original RLIMIT_NOFILE soft limit"},
};

inline constexpr std::span<const ConfigVar> vars()
{
    return kConfigVars;
}

// The entry for name, or nullptr. constexpr: the engine checks its limits at compile time.
constexpr const ConfigVar *find(std::string_view name)
{
    for (const ConfigVar &v : kConfigVars)
        if (name == v.name)
            return &v;
    return nullptr;
}

// Whether the table holds name. For compile-time checks: GCC's UBSan instrumentation
// (-fsanitize=null) keeps find(name) != nullptr from being a constant expression.
constexpr bool known(std::string_view name)
{
    for (const ConfigVar &v : kConfigVars)
        if (name == v.name)
            return true;
    return false;
}

// Parses text as var's kind and range into *out (Flag: 0 or 1; Level: 0..4); -EINVAL when
// malformed or out of range, -ENOENT when empty or for Text. Logs nothing, allocates nothing.
int parse(const ConfigVar &var, const char *text, int64_t *out);
// var's default as a number; 0 where it has none.
int64_t defaultValue(const ConfigVar &var);

// Reads name from the environment: 0 and *out when set and valid, -ENOENT when unset or
// empty, -EINVAL when invalid (or not in the table). Logs nothing and allocates nothing, so
// that the log's own initialization and early constructors may use it.
int read(const char *name, int64_t *out);

// The getters: the value when set and valid, else the default; an invalid value is logged once
// per variable ("ignoring NAME=VALUE: invalid or out of range", at warn). They log through
// RS_LOG, which reads RSTREAM_LOG: logInit itself uses read() instead.
int64_t getInt(const char *name);
// The same with a default the caller chooses at run time (RSTREAM_PORT_OFFSET is 0 on verbs).
int64_t getInt(const char *name, int64_t fallback);
// The same for text that comes from elsewhere than the environment (a caller's lookup, a test).
int64_t valueOf(const char *name, const char *text, int64_t fallback);
bool getFlag(const char *name);
// The text, or nullptr when unset or empty. Allocates nothing; logs only a name not in the table.
const char *getString(const char *name);

} // namespace config
} // namespace rstream
