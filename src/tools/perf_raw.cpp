// SPDX-License-Identifier: MIT
// rstream-perf's raw transport, the runs: the client's bw or lat run over one RawConn and the
// server that answers them (perf_raw_conn.h: the connection and its wire).

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <endian.h>
#include <string>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_eq.h>

#include "perf.h"
#include "perf_fabric.h"
#include "perf_raw_conn.h"

namespace rstream::perf {
namespace {

using namespace raw;

// Owns a fabric until the objects opened on it are gone (declare it first).
struct FabricHolder
{
    fid_fabric *fabric = nullptr;
    ~FabricHolder() { closeFid(fabric ? &fabric->fid : nullptr); }
};

// The client side of one run.
int runClient(const Options &opts, Result *result)
{
    std::string service = std::to_string(opts.port);
    fi_info *info = nullptr;
    int ret = getInfo(opts.host.c_str(), service.c_str(), 0, &info);
    if (ret)
        return ret;
    FabricHolder holder;
    ret = fi_fabric(info->fabric_attr, &holder.fabric, nullptr);
    if (ret) {
        logErr("fi_fabric", ret);
        fi_freeinfo(info);
        return ret;
    }
    RawConn conn;
    ret = conn.open(holder.fabric, info, opts.ring, opts.size);
    if (!ret)
        ret = conn.connect(conn.localHello(opts.test, uint32_t(opts.seconds * 1000)));
    if (ret)
        return ret;

    int64_t start = nowNs();
    int64_t deadline = start + int64_t(opts.seconds * 1e9);
    int64_t limit = deadline + kGraceNs;
    if (opts.test == Test::Bandwidth) {
        for (uint32_t posted = 0; !ret && nowNs() < deadline;) {
            ret = conn.tryWrite();
            if (ret == 0)
                ret = conn.progressOrWait();
            else if (ret == 1 && ++posted % 8 == 0)
                ret = conn.progress();
            ret = std::min(ret, 0);
        }
    } else {
        result->rttNs.reserve(1 << 20);
        for (int64_t round = 0; !ret; round++) {
            int64_t t0 = nowNs();
            if (t0 >= deadline && !result->rttNs.empty())
                break;
            bool warm = warmingUp(round, t0 - start, opts.seconds);
            uint64_t want = conn.arrivals() + 1;
            ret = conn.write();
            if (!ret)
                ret = conn.progressUntil([&] { return conn.arrivals() >= want; }, limit);
            if (!ret && !warm)
                result->rttNs.push_back(nowNs() - t0);
        }
    }
    if (!ret)
        ret = conn.sendCtrl(kTypeFin << kTypeShift, nullptr, 0);
    if (!ret)
        ret = conn.progressUntil([&] { return conn.ack(); }, limit);
    if (ret) {
        logErr("run", ret);
        return ret;
    }
    result->seconds = double(nowNs() - start) / 1e9;
    result->bytes = conn.ackValue();
    conn.shutdown();
    return 0;
}

// Serves one connection request; takes info.
int serveOne(fid_fabric *fabric, fid_pep *pep, fi_info *info, const void *data, size_t len)
{
    Hello peer;
    int ret = fromWire(data, len, &peer);
    if (ret) {
        fprintf(stderr, "rstream-perf: raw: rejecting a connection with bad private data\n");
        fi_reject(pep, info->handle, nullptr, 0);
        fi_freeinfo(info);
        return ret;
    }
    Test test = Test(peer.test);
    RawConn conn;
    fid_t handle = info->handle;
    ret = conn.open(fabric, info, peer.ringSize, peer.msgSize);
    if (!ret)
        ret = conn.setPeer(peer);
    if (ret) {
        fi_reject(pep, handle, nullptr, 0);
        return ret;
    }
    ret = conn.accept(conn.localHello(test, peer.durationMs));
    if (ret)
        return ret;

    int64_t start = nowNs();
    int64_t limit = start + int64_t(peer.durationMs) * 1'000'000 + kGraceNs;
    if (test == Test::Bandwidth) {
        ret = conn.progressUntil([&] { return conn.fin(); }, limit);
    } else {
        // Answer each message with one of the same size until the client says it is done.
        for (uint64_t answered = 0; !ret && !conn.fin();) {
            ret =
                conn.progressUntil([&] { return conn.fin() || conn.arrivals() > answered; }, limit);
            for (; !ret && answered < conn.arrivals(); answered++)
                ret = conn.write();
        }
    }
    if (ret) {
        logErr("run", ret);
        return ret;
    }
    double secs = double(nowNs() - start) / 1e9;
    uint64_t total = htobe64(conn.bytesIn());
    ret = conn.sendCtrl(kTypeAck << kTypeShift, &total, sizeof(total));
    if (ret)
        return ret;
    conn.waitShutdown(kEqTimeoutMs);
    printf("raw %s %u B: %llu bytes in %.2f s\n", testName(test), peer.msgSize,
           (unsigned long long)conn.bytesIn(), secs);
    fflush(stdout);
    return 0;
}

} // namespace

int rawClient(const Options &opts, Result *result)
{
    if (opts.ring > kMaxRing) {
        fprintf(stderr, "rstream-perf: raw: --ring is at most %u MiB\n", kMaxRing >> 20);
        return -EINVAL;
    }
    if (opts.size > opts.ring) {
        fprintf(stderr, "rstream-perf: raw: --size (%u) must not exceed --ring (%u)\n", opts.size,
                opts.ring);
        return -EINVAL;
    }
    return runClient(opts, result);
}

int rawServer(const Options &opts)
{
    std::string service = std::to_string(opts.port);
    fi_info *info = nullptr;
    int ret = getInfo(opts.host.c_str(), service.c_str(), FI_SOURCE, &info);
    if (ret)
        return ret;
    Listening l;
    ret = listenOn(info, "raw", opts.host, opts.port, &l);
    while (!ret) {
        alignas(fi_eq_cm_entry) uint8_t buf[sizeof(fi_eq_cm_entry) + 256];
        ssize_t bytes = 0;
        int event = readEvent(l.eq, buf, sizeof(buf), -1, &bytes);
        if (event < 0) {
            if (event == -ETIMEDOUT || event == -EINTR || event == -ECONNREFUSED ||
                event == -ECONNRESET || event == -ECONNABORTED)
                continue;
            logErr("fi_eq_sread", event);
            ret = event;
            break;
        }
        if (event != FI_CONNREQ)
            continue;
        auto *entry = reinterpret_cast<fi_eq_cm_entry *>(buf);
        serveOne(l.fabric, l.pep, entry->info, entry->data, size_t(bytes) - sizeof(*entry));
    }
    closeListening(&l);
    fi_freeinfo(info);
    return ret;
}

} // namespace rstream::perf
