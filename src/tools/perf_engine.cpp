// SPDX-License-Identifier: MIT
// rstream-perf's engine transport: the same tests through rstream::Connection and Listener.
//
// The client sends a 16-byte header (magic, test, flags, message size), then its messages; at
// the end it shuts down its sending side. The server counts what it receives (echoing each
// message in the latency test), and at EOF answers with the 8-byte total, which the client
// waits for before it stops the clock.

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <endian.h>
#include <memory>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <string>
#include <sys/socket.h>
#include <vector>

#include "connection.h"
#include "listener.h"
#include "perf.h"

namespace rstream::perf {
namespace {

constexpr uint32_t kMagic = 0x72706567; // "rpeg"
constexpr uint8_t kFlagBusyPoll = 1 << 0;

struct Header
{
    uint32_t magic;
    uint8_t test;
    uint8_t flags;
    uint16_t reserved;
    uint32_t msgSize;
    uint32_t durationMs;
};
static_assert(sizeof(Header) == 16);

void logErr(const char *what, long err)
{
    fprintf(stderr, "rstream-perf: engine: %s: %s\n", what, strerror(int(-err)));
}

void applyRing(Settings &settings, uint32_t ring)
{
    if (settings.setSendBuf(ring) || settings.setRecvBuf(ring))
        fprintf(stderr, "rstream-perf: engine: ring size %u refused, using the default\n", ring);
}

// Moves all of buf, or fails: 0 or -errno (-EPIPE at EOF while receiving).
ssize_t sendAll(Connection &conn, const uint8_t *buf, size_t len, bool busyPoll)
{
    int flags = busyPoll ? kNonBlock : 0;
    for (size_t done = 0; done < len;) {
        ssize_t n = conn.send(buf + done, len - done, flags);
        if (n == -EAGAIN && busyPoll) {
            sched_yield(); // see perf_raw.cpp: pure spinning starves loopback tcp
            continue;
        }
        if (n < 0)
            return n;
        done += size_t(n);
    }
    return 0;
}

ssize_t recvAll(Connection &conn, uint8_t *buf, size_t len, bool busyPoll, int timeoutMs = -1)
{
    int flags = busyPoll ? kNonBlock : kWaitAll;
    for (size_t done = 0; done < len;) {
        ssize_t n = conn.recv(buf + done, len - done, flags, timeoutMs);
        if (n == -EAGAIN && busyPoll) {
            sched_yield(); // see perf_raw.cpp: pure spinning starves loopback tcp
            continue;
        }
        if (n < 0)
            return n;
        if (n == 0)
            return -EPIPE;
        done += size_t(n);
    }
    return 0;
}

int serveOne(std::unique_ptr<Connection> conn)
{
    Header h;
    ssize_t ret = recvAll(*conn, reinterpret_cast<uint8_t *>(&h), sizeof(h), false, 10000);
    if (ret) {
        logErr("header", ret);
        Connection::abort(std::move(conn));
        return int(ret);
    }
    h.magic = be32toh(h.magic);
    h.msgSize = be32toh(h.msgSize);
    h.durationMs = be32toh(h.durationMs);
    Test test = Test(h.test);
    if (h.magic != kMagic || h.msgSize == 0 || (test != Test::Bandwidth && test != Test::Latency)) {
        fprintf(stderr, "rstream-perf: engine: bad header, closing\n");
        Connection::abort(std::move(conn));
        return -EPROTO;
    }
    bool busyPoll = h.flags & kFlagBusyPoll;
    int64_t start = nowNs();
    int64_t limit = start + int64_t(h.durationMs) * 1'000'000 + kGraceNs;
    int timeoutMs = int(limit / 1'000'000 - start / 1'000'000);
    std::vector<uint8_t> buf(std::max<uint32_t>(h.msgSize, 65536));
    uint64_t total = 0;
    if (test == Test::Bandwidth) {
        for (;;) {
            ssize_t n = conn->recv(buf.data(), buf.size(), busyPoll ? kNonBlock : 0, timeoutMs);
            if (n == -EAGAIN && busyPoll && nowNs() < limit) {
                sched_yield();
                continue;
            }
            if (n <= 0) {
                ret = n;
                break;
            }
            total += uint64_t(n);
        }
    } else {
        for (;;) {
            ssize_t n =
                conn->recv(buf.data(), h.msgSize, busyPoll ? kNonBlock : kWaitAll, timeoutMs);
            if (n == -EAGAIN && busyPoll && nowNs() < limit) {
                sched_yield();
                continue;
            }
            if (n <= 0) {
                ret = n;
                break;
            }
            total += uint64_t(n);
            if (n < ssize_t(h.msgSize)) {
                ret = recvAll(*conn, buf.data() + n, h.msgSize - size_t(n), busyPoll, timeoutMs);
                if (ret)
                    break;
                total += h.msgSize - uint64_t(n);
            }
            ret = sendAll(*conn, buf.data(), h.msgSize, busyPoll);
            if (ret)
                break;
        }
    }
    if (ret) {
        logErr("run", ret);
        Connection::abort(std::move(conn));
        return int(ret);
    }
    double secs = double(nowNs() - start) / 1e9;
    uint64_t wire = htobe64(total);
    ret = sendAll(*conn, reinterpret_cast<const uint8_t *>(&wire), sizeof(wire), false);
    if (!ret) {
        // Wait for the client to close, so the total is delivered before we go.
        uint8_t byte;
        conn->recv(&byte, 1, 0, 10000);
    }
    Connection::close(std::move(conn));
    printf("engine %s %u B: %llu bytes in %.2f s\n", testName(test), h.msgSize,
           (unsigned long long)total, secs);
    fflush(stdout);
    return int(ret);
}

} // namespace

int engineClient(const Options &opts, Result *result)
{
    sockaddr_storage addr;
    socklen_t len = 0;
    int ret = resolveAddress("engine", opts.host, opts.port, false, &addr, &len);
    if (ret)
        return ret;
    auto conn = std::make_unique<Connection>();
    applyRing(conn->settings(), opts.ring);
    ret = conn->connect(reinterpret_cast<const sockaddr *>(&addr), len);
    if (ret) {
        logErr("connect", ret);
        return ret;
    }

    Header h = {};
    h.magic = htobe32(kMagic);
    h.test = uint8_t(opts.test);
    h.flags = opts.busyPoll ? kFlagBusyPoll : 0;
    h.msgSize = htobe32(opts.size);
    h.durationMs = htobe32(uint32_t(opts.seconds * 1000));
    std::vector<uint8_t> buf(opts.size);
    ssize_t err = sendAll(*conn, reinterpret_cast<const uint8_t *>(&h), sizeof(h), false);

    int64_t start = nowNs();
    int64_t deadline = start + int64_t(opts.seconds * 1e9);
    if (opts.test == Test::Bandwidth) {
        while (!err && nowNs() < deadline)
            err = sendAll(*conn, buf.data(), buf.size(), opts.busyPoll);
    } else {
        result->rttNs.reserve(1 << 20);
        for (int64_t round = 0; !err; round++) {
            int64_t t0 = nowNs();
            if (t0 >= deadline && !result->rttNs.empty())
                break;
            bool warm = warmingUp(round, t0 - start, opts.seconds);
            err = sendAll(*conn, buf.data(), buf.size(), opts.busyPoll);
            if (!err)
                err = recvAll(*conn, buf.data(), buf.size(), opts.busyPoll);
            if (!err && !warm)
                result->rttNs.push_back(nowNs() - t0);
        }
    }
    if (!err)
        err = conn->shutdown(SHUT_WR);
    uint64_t total = 0;
    if (!err)
        err = recvAll(*conn, reinterpret_cast<uint8_t *>(&total), sizeof(total), false);
    if (err) {
        logErr("run", err);
        Connection::abort(std::move(conn));
        return int(err);
    }
    result->seconds = double(nowNs() - start) / 1e9;
    result->bytes = be64toh(total);
    Connection::close(std::move(conn));
    return 0;
}

int engineServer(const Options &opts)
{
    sockaddr_storage addr;
    socklen_t len = 0;
    int ret = resolveAddress("engine", opts.host, opts.port, true, &addr, &len);
    if (ret)
        return ret;
    Listener listener;
    applyRing(listener.settings(), opts.ring);
    ret = listener.bind(reinterpret_cast<const sockaddr *>(&addr), len);
    if (!ret)
        ret = listener.listen(16);
    if (ret) {
        logErr("listen", ret);
        return ret;
    }
    sockaddr_storage bound;
    socklen_t boundLen = sizeof(bound);
    uint16_t port = 0;
    if (listener.localAddress(&bound, &boundLen) == 0)
        port = ntohs(bound.ss_family == AF_INET6
                         ? reinterpret_cast<const sockaddr_in6 *>(&bound)->sin6_port
                         : reinterpret_cast<const sockaddr_in *>(&bound)->sin_port);
    if (port != opts.port) {
        // Seen with tcp on libfabric 1.17: a wildcard address loses its port in fi_getinfo.
        fprintf(stderr, "rstream-perf: engine: listening on port %u instead of %u\n", port,
                opts.port);
        return -EADDRNOTAVAIL;
    }
    printf("rstream-perf: engine server on %s:%u\n", opts.host.c_str(), opts.port);
    fflush(stdout);
    for (;;) {
        std::unique_ptr<Connection> conn;
        ret = listener.accept(&conn);
        if (ret == -EINTR || ret == -ECONNABORTED || ret == -ECONNRESET || ret == -ETIMEDOUT)
            continue;
        if (ret) {
            logErr("accept", ret);
            return ret;
        }
        serveOne(std::move(conn));
    }
}

} // namespace rstream::perf
