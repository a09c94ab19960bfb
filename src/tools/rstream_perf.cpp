// SPDX-License-Identifier: MIT
// rstream-perf: bandwidth and latency of the rstream engine next to plain libfabric, and
// request/response rates of many connections.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <signal.h>
#include <string>
#include <thread>
#include <unistd.h>

#include "configvars.h"
#include "perf.h"
#include "sigtrack.h"

namespace rstream::perf {
namespace {

const char kUsage[] =
    R"(Usage: rstream-perf server [--port P] [--bind ADDR] [--ring BYTES]
       rstream-perf client HOST [--port P] --test bw|lat --size BYTES --seconds S
                               --transport engine|raw [--ring BYTES] [--busy-poll]
       rstream-perf rr-server [--port P] [--bind ADDR] --transport kernel|raw
                              [--cq own|shared] [--size BYTES]
       rstream-perf rr-client HOST [--port P] --transport kernel|raw [--cq own|shared]
                              --conns N --size BYTES --seconds S [--rate R]

The server serves both transports, one run at a time per transport, until it is killed:
plain libfabric ("raw") on port P and the rstream engine on port P+1 (default P = 18515).
Its address defaults to 0.0.0.0. Each client run picks its transport by the port it uses
(the client adds 1 to --port for the engine, so client and server take the same P).

Tests:
  bw   the client sends BYTES-sized messages for S seconds, then the server acknowledges the
       total it received; MBps = acknowledged bytes / time to the acknowledgement, 1 MB = 1e6 B.
  lat  ping-pong of BYTES-sized messages for S seconds, after up to 100 warm-up round
       trips (at most a tenth of S); p50_us/p99_us are one-way latencies: half the
       round-trip time, as sockperf reports.

Transports:
  raw     fi_writedata of BYTES into the peer's receive ring, the length in the immediate,
          space handed back with zero-length credit sends; the client's --ring (default
          1 MiB, at most 64 MiB, at least BYTES) sizes the rings of both sides. Provider tcp,
          or RSTREAM_PROVIDER. A waiting side busy-polls the CQ (yielding the CPU between
          polls) for 50 us, then sleeps on its fd. The receiver does not copy the data
          out: this is the ceiling.
  engine  rstream::Connection send/recv: blocking calls, or with --busy-poll nonblocking
          ones in a loop, on both sides. Send and receive buffers of --ring bytes (default
          1 MiB; the server's --ring for its side). Other settings come from the RSTREAM_*
          environment variables. Signal handlers are tracked as under the shim, so that
          blocking calls hold no signals off (RSTREAM_SIGNAL_TRACK=0 holds them).

Request/response (rr): the client opens N connections (1..4096) from one thread and keeps
one BYTES-sized request (1..1m) outstanding on each, a closed loop as redis-benchmark -c N
runs; the server answers each request with a reply of BYTES. With --rate R the client sends
R requests a second over all the connections instead (each connection's next request due
N/R s after its previous one was), polling through the last millisecond before each, as
sockperf's --mps does: what a mostly idle server pays a request. After a warm-up of
min(0.5 s, S/10) the client counts the round trips completed in S seconds: rps = round trips
/ S; p50_us/p99_us are percentiles of the whole round-trip time (request written to reply
read, not halved) over a uniform sample of up to 262144 of those round trips. The rr server
listens on P (default 18515) for its one transport and serves one client run at a time until
it is killed; it takes the size and the CQ layout from each client (they travel in its first
bytes, or the CM private data), and with --size or --cq refuses clients that differ. Both
sides must name the same --transport.
  kernel  nonblocking sockets and epoll, plain libc calls only: run both sides under
          LD_PRELOAD=librstream_preload.so to measure the shim (cq is "none").
  raw     plain libfabric FI_EP_MSG (provider as above), fi_inject (or fi_send past the
          inject size) into posted receives; a side sleeps in epoll_wait over CQ wait fds
          after fi_trywait. --cq own (the client's default): one CQ per connection;
          --cq shared: one CQ for all the connections of the process.

Sizes take a k, m or g suffix (powers of 1024). The client's last line of output is JSON:
  {"transport":"raw","test":"bw","size":65536,"MBps":1234.5,"p50_us":null,"p99_us":null}
  {"transport":"raw","test":"rr","cq":"shared","conns":50,"size":64,"rps":120000.0,
   "p50_us":400.12,"p99_us":650.40,"requests":420000}   (on one line; requests: all
   the round trips the client completed, the warm-up included)
)";

int parseSize(const char *text, uint64_t *out)
{
    char *end = nullptr;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno || end == text || *text == '-')
        return -EINVAL;
    unsigned shift = 0;
    switch (*end) {
    case 'k':
    case 'K':
        shift = 10;
        break;
    case 'm':
    case 'M':
        shift = 20;
        break;
    case 'g':
    case 'G':
        shift = 30;
        break;
    case '\0':
        break;
    default:
        return -EINVAL;
    }
    if (shift && *++end)
        return -EINVAL;
    if (value > (UINT64_MAX >> shift))
        return -ERANGE;
    *out = uint64_t(value) << shift;
    return 0;
}

// A number in (0, max]: seconds, a rate.
bool parsePositive(const char *text, double max, double *out)
{
    char *end = nullptr;
    const double v = strtod(text, &end);
    if (end == text || *end || !(v > 0 && v <= max))
        return false;
    *out = v;
    return true;
}

bool parsePort(const char *text, unsigned long max, uint16_t *out)
{
    char *end = nullptr;
    const unsigned long port = strtoul(text, &end, 10);
    if (*end || *text == '-' || !port || port > max)
        return false;
    *out = uint16_t(port);
    return true;
}

int usageError(const char *fmt, const char *arg)
{
    fprintf(stderr, "rstream-perf: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nTry 'rstream-perf --help'.\n");
    return 2;
}

// Nearest-rank percentile of sorted samples, in microseconds.
double percentileUs(const std::vector<int64_t> &sorted, double pct)
{
    size_t rank = size_t(std::ceil(pct / 100.0 * double(sorted.size())));
    size_t index = std::min(sorted.size() - 1, rank ? rank - 1 : 0);
    return double(sorted[index]) / 1000.0;
}

// The same, in microseconds of one-way latency.
double oneWayUs(const std::vector<int64_t> &sorted, double pct)
{
    return percentileUs(sorted, pct) / 2.0;
}

int runClient(const Options &opts, bool engine)
{
    Result result;
    int ret = engine ? engineClient(opts, &result) : rawClient(opts, &result);
    if (ret)
        return 1;
    const char *transport = engine ? "engine" : "raw";
    const char *test = testName(opts.test);
    if (opts.test == Test::Bandwidth) {
        double mbps = result.seconds > 0 ? double(result.bytes) / result.seconds / 1e6 : 0;
        printf("%s %s %u B: %.1f MB/s (%llu bytes in %.2f s)\n", transport, test, opts.size, mbps,
               (unsigned long long)result.bytes, result.seconds);
        printf("{\"transport\":\"%s\",\"test\":\"%s\",\"size\":%u,\"MBps\":%.1f,"
               "\"p50_us\":null,\"p99_us\":null}\n",
               transport, test, opts.size, mbps);
        return 0;
    }
    if (result.rttNs.empty()) {
        fprintf(stderr, "rstream-perf: no round trips measured\n");
        return 1;
    }
    std::sort(result.rttNs.begin(), result.rttNs.end());
    double p50 = oneWayUs(result.rttNs, 50);
    double p99 = oneWayUs(result.rttNs, 99);
    printf("%s %s %u B: one-way (RTT/2) p50 %.2f us, p99 %.2f us over %zu round trips\n", transport,
           test, opts.size, p50, p99, result.rttNs.size());
    printf("{\"transport\":\"%s\",\"test\":\"%s\",\"size\":%u,\"MBps\":null,"
           "\"p50_us\":%.2f,\"p99_us\":%.2f}\n",
           transport, test, opts.size, p50, p99);
    return 0;
}

int runServer(const Options &opts)
{
    static std::atomic<int> stopped{0};
    static Options rawOpts, engineOpts;
    rawOpts = opts;
    engineOpts = opts;
    engineOpts.port = uint16_t(opts.port + 1);
    // Each transport serves its clients in its own thread, and returns only when it cannot
    // serve at all (it said why); the server goes on while either one still works.
    std::thread([] {
        rawServer(rawOpts);
        stopped++;
    }).detach();
    std::thread([] {
        engineServer(engineOpts);
        stopped++;
    }).detach();
    while (stopped < 2)
        usleep(100'000);
    fflush(stdout);
    _exit(1);
}

int runRrClient(const RrOptions &opts)
{
    RrResult result;
    int ret = opts.raw ? rrRawClient(opts, &result) : rrKernelClient(opts, &result);
    if (ret)
        return 1;
    if (result.rttNs.empty()) {
        fprintf(stderr, "rstream-perf: no round trips completed\n");
        return 1;
    }
    const char *transport = opts.raw ? "raw" : "kernel";
    double rps = double(result.rounds) / result.seconds;
    std::sort(result.rttNs.begin(), result.rttNs.end());
    double p50 = percentileUs(result.rttNs, 50);
    double p99 = percentileUs(result.rttNs, 99);
    printf("%s rr %u B, cq %s, %u connections: %.1f requests/s, round trip p50 %.2f us, "
           "p99 %.2f us (%llu round trips in %.2f s)\n",
           transport, opts.size, rrCqName(opts.cq), opts.conns, rps, p50, p99,
           (unsigned long long)result.rounds, result.seconds);
    printf("{\"transport\":\"%s\",\"test\":\"rr\",\"cq\":\"%s\",\"conns\":%u,\"size\":%u,"
           "\"rps\":%.1f,\"p50_us\":%.2f,\"p99_us\":%.2f,\"requests\":%llu}\n",
           transport, rrCqName(opts.cq), opts.conns, opts.size, rps, p50, p99,
           (unsigned long long)result.allRounds);
    return 0;
}

int runRr(int argc, char **argv, bool server)
{
    RrOptions opts;
    int i = 2;
    if (!server) {
        if (argc < 3 || argv[2][0] == '-')
            return usageError("%s", "rr-client: the server's HOST is needed");
        opts.host = argv[i++];
    } else {
        opts.host = "0.0.0.0";
    }
    bool haveTransport = false, haveCq = false;
    for (; i < argc; i++) {
        std::string arg = argv[i];
        if (arg == "-h" || arg == "--help") {
            fputs(kUsage, stdout);
            return 0;
        }
        if (i + 1 >= argc)
            return usageError("unknown option or missing value: '%s'", argv[i]);
        const char *value = argv[++i];
        uint64_t n = 0;
        if (arg == "--port") {
            if (!parsePort(value, 65535, &opts.port))
                return usageError("bad port '%s' (1..65535)", value);
        } else if (arg == "--bind" && server) {
            opts.host = value;
        } else if (arg == "--transport") {
            if (!strcmp(value, "raw"))
                opts.raw = true;
            else if (strcmp(value, "kernel"))
                return usageError("bad transport '%s' (kernel or raw)", value);
            haveTransport = true;
        } else if (arg == "--cq") {
            if (!strcmp(value, "own"))
                opts.cq = RrCq::Own;
            else if (!strcmp(value, "shared"))
                opts.cq = RrCq::Shared;
            else
                return usageError("bad cq '%s' (own or shared)", value);
            haveCq = true;
        } else if (arg == "--size") {
            if (parseSize(value, &n) || n < 1 || n > kRrMaxSize)
                return usageError("bad size '%s' (1..1m)", value);
            opts.size = uint32_t(n);
        } else if (arg == "--conns" && !server) {
            char *end = nullptr;
            unsigned long conns = strtoul(value, &end, 10);
            if (*end || *value == '-' || conns < 1 || conns > kRrMaxConns)
                return usageError("bad conns '%s' (1..4096)", value);
            opts.conns = uint32_t(conns);
        } else if (arg == "--rate" && !server) {
            if (!parsePositive(value, 1e7, &opts.rate))
                return usageError("bad rate '%s' (0..10000000 requests a second)", value);
        } else if (arg == "--seconds" && !server) {
            if (!parsePositive(value, 3600, &opts.seconds))
                return usageError("bad seconds '%s' (0..3600)", value);
        } else {
            return usageError("unknown option '%s'", argv[i - 1]);
        }
    }
    if (!haveTransport)
        return usageError("%s", "rr: --transport kernel or raw is needed");
    if (haveCq && !opts.raw)
        return usageError("%s", "rr: --cq is for --transport raw");
    if (!server && (!opts.size || !opts.conns || !opts.seconds))
        return usageError("%s", "rr-client: --conns, --size and --seconds are needed");
    if (!server && opts.raw && !haveCq)
        opts.cq = RrCq::Own;
    signal(SIGPIPE, SIG_IGN);
    if (!server)
        return runRrClient(opts);
    // Servers return only when they cannot serve at all (they said why).
    if (opts.raw ? rrRawServer(opts) : rrKernelServer(opts))
        return 1;
    return 0;
}

int run(int argc, char **argv)
{
    if (argc < 2)
        return usageError("%s", "a mode is needed: server, client, rr-server or rr-client");
    std::string mode = argv[1];
    if (mode == "-h" || mode == "--help") {
        fputs(kUsage, stdout);
        return 0;
    }
    if (mode == "rr-server" || mode == "rr-client")
        return runRr(argc, argv, mode == "rr-server");
    bool server = mode == "server";
    if (!server && mode != "client")
        return usageError("unknown mode '%s'", argv[1]);

    Options opts;
    int i = 2;
    if (!server) {
        if (argc < 3 || argv[2][0] == '-')
            return usageError("%s", "client: the server's HOST is needed");
        opts.host = argv[i++];
    } else {
        opts.host = "0.0.0.0";
    }
    bool engine = false;
    bool haveTest = false, haveSize = false, haveSeconds = false, haveTransport = false;
    for (; i < argc; i++) {
        std::string arg = argv[i];
        if (arg == "-h" || arg == "--help") {
            fputs(kUsage, stdout);
            return 0;
        }
        if (arg == "--busy-poll" && !server) {
            opts.busyPoll = true;
            continue;
        }
        if (i + 1 >= argc)
            return usageError("unknown option or missing value: '%s'", argv[i]);
        const char *value = argv[++i];
        uint64_t n = 0;
        if (arg == "--port") {
            // The engine listens one above.
            if (!parsePort(value, 65534, &opts.port))
                return usageError("bad port '%s' (1..65534)", value);
        } else if (arg == "--bind" && server) {
            opts.host = value;
        } else if (arg == "--ring") {
            if (parseSize(value, &n) || n < 4096 || n > (1u << 30))
                return usageError("bad ring size '%s' (4k..1g)", value);
            opts.ring = uint32_t(n);
        } else if (arg == "--test" && !server) {
            if (!strcmp(value, "bw"))
                opts.test = Test::Bandwidth;
            else if (!strcmp(value, "lat"))
                opts.test = Test::Latency;
            else
                return usageError("bad test '%s' (bw or lat)", value);
            haveTest = true;
        } else if (arg == "--size" && !server) {
            if (parseSize(value, &n) || n < 1 || n > (1u << 30))
                return usageError("bad size '%s' (1..1g)", value);
            opts.size = uint32_t(n);
            haveSize = true;
        } else if (arg == "--seconds" && !server) {
            if (!parsePositive(value, 3600, &opts.seconds))
                return usageError("bad seconds '%s' (0..3600)", value);
            haveSeconds = true;
        } else if (arg == "--transport" && !server) {
            if (!strcmp(value, "engine"))
                engine = true;
            else if (strcmp(value, "raw"))
                return usageError("bad transport '%s' (engine or raw)", value);
            haveTransport = true;
        } else {
            return usageError("unknown option '%s'", argv[i - 1]);
        }
    }
    signal(SIGPIPE, SIG_IGN);
    // The engine's blocking calls learn that a handler ran (and end with EINTR) from the
    // trampoline in front of this program's handlers, as the shim's do, instead of holding
    // signals off from a call's first empty look to its sleep: two rt_sigprocmask calls a
    // round trip otherwise, which plain libfabric ("raw") does not make (RSTREAM_SIGNAL_TRACK=0
    // holds them).
    if (config::getFlag("RSTREAM_SIGNAL_TRACK"))
        sigtrack::activate(&::sigaction);
    if (server)
        return runServer(opts);
    if (!haveTest || !haveSize || !haveSeconds || !haveTransport)
        return usageError("%s", "client: --test, --size, --seconds and --transport are needed");
    if (engine)
        opts.port = uint16_t(opts.port + 1);
    return runClient(opts, engine);
}

} // namespace
} // namespace rstream::perf

int main(int argc, char **argv)
{
    return rstream::perf::run(argc, argv);
}
