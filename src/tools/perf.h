// SPDX-License-Identifier: MIT
// rstream-perf's shared pieces: options, results, the clock, and each transport's entry points.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <queue>
#include <string>
#include <sys/socket.h>
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

// The rr test: a client opens `conns` connections from one thread and keeps one request of
// `size` bytes outstanding on each; the server answers each with a reply of the same size.
enum class RrCq : uint8_t
{
    None = 0,   // kernel sockets; for a raw server: take the client's
    Own = 1,    // raw: one CQ per connection
    Shared = 2, // raw: one CQ for all the connections of the process
};

constexpr uint32_t kRrMaxSize = 1u << 20;
constexpr uint32_t kRrMaxConns = 4096;
// A uniform sample of this many round trips gives the percentiles.
constexpr size_t kRrSamples = 1u << 18;
// How long a server waits for a new connection's hello, and for the rest of a run's.
constexpr int64_t kRrHelloNs = 10'000'000'000;

struct RrOptions
{
    std::string host; // client: the server; server: the address to bind
    uint16_t port = kDefaultPort;
    bool raw = false;
    RrCq cq = RrCq::None;
    uint32_t size = 0; // server: 0 takes the client's
    uint32_t conns = 0;
    double seconds = 0;
    double rate = 0; // client: requests a second over all connections; 0: a closed loop
};

struct RrResult
{
    uint64_t rounds = 0;        // round trips completed in the measured window
    uint64_t allRounds = 0;     // and in all, the warm-up and the end's included (for CPU)
    double seconds = 0;         // the measured window
    std::vector<int64_t> rttNs; // a uniform sample of their round-trip times
};

// What a client tells the server on each connection: in its first bytes (kernel) or in the
// CM private data (raw). The run id keeps a second client out of a run being set up.
struct RrHello
{
    RrCq cq = RrCq::None;
    uint32_t size = 0;
    uint32_t conns = 0;
    uint32_t durationMs = 0; // warm-up included
    uint32_t runId = 0;
};
constexpr size_t kRrHelloBytes = 24;

const char *rrCqName(RrCq cq); // "own", "shared" or "none"
RrHello rrHello(const RrOptions &opts);
void rrEncode(const RrHello &hello, uint8_t *out);
// Decodes and checks a hello against the server's options: 0, or -EPROTO after saying why.
int rrAdmit(const RrOptions &server, const void *data, size_t len, RrHello *out);
// Both sides measure min(0.5 s, S/10) after the connections are up, then S seconds.
int64_t rrWarmupNs(double seconds);

// Counts the round trips completed in the measured window and samples their times.
class RrStats
{
public:
    RrStats(double seconds, int64_t startNs);
    void record(int64_t sentNs, int64_t nowNs);
    bool over(int64_t nowNs) const { return nowNs >= endNs_; }
    int64_t endNs() const { return endNs_; }
    void finish(RrResult *result);

private:
    int64_t fromNs_;
    int64_t endNs_;
    uint64_t rounds_ = 0;
    uint64_t allRounds_ = 0;
    uint64_t rng_;
    std::vector<int64_t> sample_;
};

// Paces a client's requests (--rate): each connection's next request is due an interval
// (connections / rate) after its previous one was due, or at once when it is more than an
// interval late (no burst to catch up). A wait sleeps until the first due, in whole
// milliseconds, and polls through the last one, as sockperf's --mps does.
template <typename ConnT>
class RrPacer
{
public:
    RrPacer(double rate, uint32_t conns)
        : intervalNs_(rate > 0 ? int64_t(double(conns) * 1e9 / rate) : 0)
    {}
    bool paced() const { return intervalNs_ > 0; }
    // The reply to the request due at dueNs came: the next is due an interval later.
    void schedule(ConnT *conn, int64_t dueNs, int64_t nowNs)
    {
        int64_t next = dueNs + intervalNs_;
        due_.push({next + intervalNs_ < nowNs ? nowNs : next, conn});
    }
    // The next connection due by nowNs and when it was due; nullptr when none is.
    ConnT *takeDue(int64_t nowNs, int64_t *dueNs)
    {
        if (due_.empty() || due_.top().first > nowNs)
            return nullptr;
        auto top = due_.top();
        due_.pop();
        *dueNs = top.first;
        return top.second;
    }
    // How long a wait may sleep: capMs, or less when a request falls due sooner.
    int timeoutMs(int64_t nowNs, int capMs) const
    {
        if (due_.empty())
            return capMs;
        int64_t ms = (due_.top().first - nowNs) / 1'000'000;
        return ms < 0 ? 0 : int(std::min<int64_t>(ms, capMs));
    }

private:
    using Entry = std::pair<int64_t, ConnT *>;
    struct Later
    {
        bool operator()(const Entry &a, const Entry &b) const { return a.first > b.first; }
    };
    int64_t intervalNs_;
    std::priority_queue<Entry, std::vector<Entry>, Later> due_;
};

// Resolves host:port (host empty: any address) to a socket address; -EHOSTUNREACH after saying
// why (who: the transport, for the message).
int resolveAddress(const char *who, const std::string &host, uint16_t port, bool passive,
                   sockaddr_storage *out, socklen_t *len);

// Each returns 0 or -errno after printing what failed. Servers return only when they cannot
// serve at all; a failed run is logged and the next client is accepted.
int rawClient(const Options &opts, Result *result);
int rawServer(const Options &opts);
int engineClient(const Options &opts, Result *result);
int engineServer(const Options &opts);
int rrKernelClient(const RrOptions &opts, RrResult *result);
int rrKernelServer(const RrOptions &opts);
int rrRawClient(const RrOptions &opts, RrResult *result);
int rrRawServer(const RrOptions &opts);

} // namespace rstream::perf
