// SPDX-License-Identifier: MIT
// rstream-perf's shared pieces: options, results, the clock, and each transport's entry points.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <time.h>
#include <vector>

namespace rstream::perf {

constexpr uint16_t kDefaultPort = 18515;
// Round trips run before the measured ones in the latency test, for at most a tenth of it.
constexpr int kWarmupRounds = 100;
// How long a server waits for a client that stops talking, beyond the run's own length.
constexpr int64_t kGraceNs = 30'000'000'000;

enum class Test : uint8_t
{
    Bandwidth = 1,
    Latency = 2,
};

struct Options
{
    std::string host; // client: the server; server: the address to bind
    uint16_t port = kDefaultPort;
    Test test = Test::Bandwidth;
    uint32_t size = 65536; // bytes per message
    double seconds = 3;
    uint32_t ring = 1 << 20; // receive ring bytes (raw), send and receive buffers (engine)
    bool busyPoll = false;   // engine: spin on nonblocking calls instead of blocking ones
};

struct Result
{
    uint64_t bytes = 0;         // bytes the server acknowledged
    double seconds = 0;         // from the first byte sent to the acknowledgement
    std::vector<int64_t> rttNs; // latency: one round trip each, warm-up excluded
};

inline int64_t nowNs()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

inline bool warmingUp(int64_t round, int64_t elapsedNs, double seconds)
{
    return round < kWarmupRounds && elapsedNs < int64_t(seconds * 1e8);
}

inline const char *testName(Test test)
{
    return test == Test::Bandwidth ? "bw" : "lat";
}

// Each returns 0 or -errno after printing what failed. Servers return only when they cannot
// serve at all; a failed run is logged and the next client is accepted.
int rawClient(const Options &opts, Result *result);
int rawServer(const Options &opts);
int engineClient(const Options &opts, Result *result);
int engineServer(const Options &opts);

} // namespace rstream::perf
