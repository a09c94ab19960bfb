// SPDX-License-Identifier: MIT
// rstream-perf's rr test over plain libfabric: the ceiling for many small request/response
// connections, with one CQ per connection or one shared by all.
//
// The client's hello (perf_rr.cpp) travels in the CM private data of fi_connect. Each endpoint
// keeps one receive of `size` bytes posted; a request or reply is one fi_inject (or fi_send
// when it is larger than inject_size). A receive is posted again before the answer goes, so
// the peer's next message always finds one. The server accepts a run's connections one by one,
// then serves them until all have gone; another client's requests wait on the listening EQ.

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <string>

#include <rdma/fi_cm.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include "perf.h"
#include "perf_rr_raw.h"

namespace rstream::perf {
namespace {

using rr::Conn;
using rr::Session;

int untilMs(int64_t deadlineNs)
{
    int64_t left = deadlineNs - nowNs();
    return left <= 0 ? 0 : int(std::min<int64_t>(left / 1'000'000 + 1, rr::kSleepMs));
}

// Accepts one connection request of the run; takes info.
int acceptOne(Session &session, fid_pep *pep, fi_info *info)
{
    Conn *conn = nullptr;
    fid_t handle = info->handle;
    int ret = session.addConn(info, &conn);
    fi_freeinfo(info);
    if (ret) {
        fi_reject(pep, handle, nullptr, 0);
        return ret;
    }
    ret = int(fi_accept(conn->ep, nullptr, 0));
    if (ret) {
        logErr("fi_accept", ret);
        return ret;
    }
    return session.waitConnected(conn, "accept");
}

// Reads the listening EQ for a connection request into buf: 0, -EAGAIN for an event to skip,
// -ETIMEDOUT, or -errno.
int readConnReq(fid_eq *eq, int timeoutMs, uint8_t *buf, size_t len, size_t *dataLen)
{
    ssize_t bytes = 0;
    const int event = readEvent(eq, buf, len, timeoutMs, &bytes);
    if (event == -ETIMEDOUT)
        return event;
    // A request that failed on its way, or a signal: wait for the next (as the raw server does).
    if (event == -EINTR || event == -ECONNREFUSED || event == -ECONNRESET || event == -ECONNABORTED)
        return -EAGAIN;
    if (event < 0)
        return event;
    if (event != FI_CONNREQ)
        return -EAGAIN;
    *dataLen = size_t(bytes) - sizeof(fi_eq_cm_entry);
    return 0;
}

// Serves one client's run, from its first connection request (whose info it takes).
int serveRun(const RrOptions &opts, fid_fabric *fabric, fid_pep *pep, fid_eq *pepEq, fi_info *info,
             const RrHello &hello)
{
    Session session(hello, true);
    int ret = session.open(fabric, info);
    if (ret) {
        fi_reject(pep, info->handle, nullptr, 0);
        fi_freeinfo(info);
        return ret;
    }
    ret = acceptOne(session, pep, info);
    // The rest of the run's connections; another client's are refused meanwhile.
    for (uint32_t joined = 1; !ret && joined < hello.conns;) {
        alignas(fi_eq_cm_entry) uint8_t buf[sizeof(fi_eq_cm_entry) + 256];
        size_t len = 0;
        ret = readConnReq(pepEq, int(kRrHelloNs / 1'000'000), buf, sizeof(buf), &len);
        if (ret == -EAGAIN) {
            ret = 0;
            continue;
        }
        if (ret) {
            if (ret == -ETIMEDOUT)
                fprintf(stderr, "rstream-perf: raw: a run's connections stopped coming\n");
            else
                logErr("fi_eq_sread", ret);
            break;
        }
        auto *entry = reinterpret_cast<fi_eq_cm_entry *>(buf);
        RrHello h;
        bool admitted = !rrAdmit(opts, entry->data, len, &h);
        if (admitted && h.runId != hello.runId)
            fprintf(stderr, "rstream-perf: raw: refusing a connection: a run is on\n");
        if (!admitted || h.runId != hello.runId) {
            fi_reject(pep, entry->info->handle, nullptr, 0);
            fi_freeinfo(entry->info);
            continue;
        }
        ret = acceptOne(session, pep, entry->info);
        joined++;
    }
    if (ret)
        return ret;
    int64_t start = nowNs();
    int64_t limit = start + int64_t(hello.durationMs) * 1'000'000 + kGraceNs;
    ret = session.start();
    while (!ret && session.live() && nowNs() < limit)
        ret = session.step(untilMs(limit));
    printf("raw rr %u B, cq %s: %u connections, %llu requests answered in %.2f s\n", hello.size,
           hello.cq == RrCq::Shared ? "shared" : "own", hello.conns,
           (unsigned long long)session.answered, double(nowNs() - start) / 1e9);
    fflush(stdout);
    return ret;
}

} // namespace

int rrRawServer(const RrOptions &opts)
{
    std::string service = std::to_string(opts.port);
    fi_info *info = nullptr;
    int ret = rr::getInfo(opts.host.c_str(), service.c_str(), FI_SOURCE, &info);
    if (ret)
        return ret;
    // SIGINT and SIGTERM end the server, also as a script's background job, which starts with
    // SIGINT ignored (plain libfabric has no statistics to write: the default action will do).
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    Listening l;
    ret = listenOn(info, "raw rr", opts.host, opts.port, &l);
    while (!ret) {
        alignas(fi_eq_cm_entry) uint8_t buf[sizeof(fi_eq_cm_entry) + 256];
        size_t len = 0;
        int err = readConnReq(l.eq, -1, buf, sizeof(buf), &len);
        if (err == -EAGAIN || err == -ETIMEDOUT)
            continue;
        if (err) {
            logErr("fi_eq_sread", err);
            ret = err;
            break;
        }
        auto *entry = reinterpret_cast<fi_eq_cm_entry *>(buf);
        RrHello hello;
        if (rrAdmit(opts, entry->data, len, &hello)) {
            fi_reject(l.pep, entry->info->handle, nullptr, 0);
            fi_freeinfo(entry->info);
            continue;
        }
        // A failed run was logged; the next client is served all the same.
        serveRun(opts, l.fabric, l.pep, l.eq, entry->info, hello);
    }
    closeListening(&l);
    fi_freeinfo(info);
    return ret;
}

int rrRawClient(const RrOptions &opts, RrResult *result)
{
    std::string service = std::to_string(opts.port);
    fi_info *info = nullptr;
    int ret = rr::getInfo(opts.host.c_str(), service.c_str(), 0, &info);
    if (ret)
        return ret;
    fid_fabric *fabric = nullptr;
    ret = fi_fabric(info->fabric_attr, &fabric, nullptr);
    if (ret) {
        logErr("fi_fabric", ret);
        fi_freeinfo(info);
        return ret;
    }
    {
        RrHello hello = rrHello(opts);
        uint8_t wire[kRrHelloBytes];
        rrEncode(hello, wire);
        Session session(hello, false);
        ret = session.open(fabric, info);
        for (uint32_t i = 0; !ret && i < opts.conns; i++) {
            Conn *conn = nullptr;
            ret = session.addConn(info, &conn);
            if (!ret && (ret = int(fi_connect(conn->ep, info->dest_addr, wire, sizeof(wire)))))
                logErr("fi_connect", ret);
            if (!ret)
                ret = session.waitConnected(conn, "connect");
        }
        if (!ret) {
            RrStats stats(opts.seconds, nowNs());
            RrPacer<Conn> pacer(opts.rate, opts.conns);
            session.stats = &stats;
            session.pacer = pacer.paced() ? &pacer : nullptr;
            ret = session.start();
            while (!ret && !stats.over(nowNs()))
                ret = session.step(untilMs(stats.endNs()));
            stats.finish(result);
            session.shutdown();
        }
    }
    closeFid(&fabric->fid);
    fi_freeinfo(info);
    return ret;
}

} // namespace rstream::perf
