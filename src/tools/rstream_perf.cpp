// SPDX-License-Identifier: MIT
// rstream-perf: bandwidth and latency of the rstream engine next to plain libfabric.

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

Sizes take a k, m or g suffix (powers of 1024). The client's last line of output is JSON:
  {"transport":"raw","test":"bw","size":65536,"MBps":1234.5,"p50_us":null,"p99_us":null}
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

int usageError(const char *fmt, const char *arg)
{
    fprintf(stderr, "rstream-perf: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nTry 'rstream-perf --help'.\n");
    return 2;
}

// Nearest-rank percentile of sorted samples, in microseconds of one-way latency.
double oneWayUs(const std::vector<int64_t> &sorted, double pct)
{
    size_t rank = size_t(std::ceil(pct / 100.0 * double(sorted.size())));
    size_t index = std::min(sorted.size() - 1, rank ? rank - 1 : 0);
    return double(sorted[index]) / 2.0 / 1000.0;
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

int run(int argc, char **argv)
{
    if (argc < 2)
        return usageError("%s", "a mode is needed: server or client");
    std::string mode = argv[1];
    if (mode == "-h" || mode == "--help") {
        fputs(kUsage, stdout);
        return 0;
    }
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
            char *end = nullptr;
            unsigned long port = strtoul(value, &end, 10);
            if (*end || !port || port > 65534)
                return usageError("bad port '%s' (1..65534)", value);
            opts.port = uint16_t(port);
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
            char *end = nullptr;
            opts.seconds = strtod(value, &end);
            if (*end || !(opts.seconds > 0 && opts.seconds <= 3600))
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
