// SPDX-License-Identifier: MIT
// rstream-perf's pieces outside any one transport: the rr test's hello and clock, and address
// resolution.

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <endian.h>
#include <netdb.h>
#include <sys/random.h>
#include <unistd.h>

#include "perf.h"

namespace rstream::perf {
namespace {

constexpr uint32_t kMagic = 0x72707272; // "rprr"
constexpr uint16_t kVersion = 1;

uint32_t load32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof(v));
    return be32toh(v);
}

void store32(uint8_t *p, uint32_t v)
{
    v = htobe32(v);
    memcpy(p, &v, sizeof(v));
}

} // namespace

const char *rrCqName(RrCq cq)
{
    return cq == RrCq::Own ? "own" : cq == RrCq::Shared ? "shared" : "none";
}

RrHello rrHello(const RrOptions &opts)
{
    RrHello h;
    h.cq = opts.cq;
    h.size = opts.size;
    h.conns = opts.conns;
    h.durationMs = uint32_t((opts.seconds * 1e9 + double(rrWarmupNs(opts.seconds))) / 1e6) + 1;
    if (getrandom(&h.runId, sizeof(h.runId), 0) != sizeof(h.runId))
        h.runId = uint32_t(nowNs()) ^ uint32_t(getpid());
    return h;
}

void rrEncode(const RrHello &hello, uint8_t *out)
{
    memset(out, 0, kRrHelloBytes);
    store32(out, kMagic);
    out[4] = uint8_t(kVersion >> 8);
    out[5] = uint8_t(kVersion);
    out[6] = uint8_t(hello.cq);
    store32(out + 8, hello.size);
    store32(out + 12, hello.conns);
    store32(out + 16, hello.durationMs);
    store32(out + 20, hello.runId);
}

int rrAdmit(const RrOptions &server, const void *data, size_t len, RrHello *out)
{
    const auto *p = static_cast<const uint8_t *>(data);
    if (len < kRrHelloBytes || load32(p) != kMagic || p[4] != (kVersion >> 8) ||
        p[5] != uint8_t(kVersion)) {
        fprintf(stderr, "rstream-perf: rr: refusing a connection that is not an rr client's\n");
        return -EPROTO;
    }
    RrHello h;
    h.cq = RrCq(p[6]);
    h.size = load32(p + 8);
    h.conns = load32(p + 12);
    h.durationMs = load32(p + 16);
    h.runId = load32(p + 20);
    if (h.size == 0 || h.size > kRrMaxSize || h.conns == 0 || h.conns > kRrMaxConns ||
        h.cq > RrCq::Shared) {
        fprintf(stderr, "rstream-perf: rr: refusing a client with a bad hello\n");
        return -EPROTO;
    }
    if (server.size && h.size != server.size) {
        fprintf(stderr, "rstream-perf: rr: refusing a client with --size %u (server: %u)\n", h.size,
                server.size);
        return -EPROTO;
    }
    bool cqOk = server.raw ? h.cq != RrCq::None && (server.cq == RrCq::None || h.cq == server.cq)
                           : h.cq == RrCq::None;
    if (!cqOk) {
        fprintf(stderr, "rstream-perf: rr: refusing a client with --cq %s (server: %s)\n",
                rrCqName(h.cq), rrCqName(server.cq));
        return -EPROTO;
    }
    *out = h;
    return 0;
}

int64_t rrWarmupNs(double seconds)
{
    return std::min<int64_t>(500'000'000, int64_t(seconds * 1e8));
}

RrStats::RrStats(double seconds, int64_t startNs)
    : fromNs_(startNs + rrWarmupNs(seconds)), endNs_(fromNs_ + int64_t(seconds * 1e9)),
      rng_(uint64_t(startNs) | 1)
{
    sample_.reserve(kRrSamples);
}

void RrStats::record(int64_t sentNs, int64_t nowNs)
{
    allRounds_++;
    if (nowNs < fromNs_ || nowNs >= endNs_)
        return;
    rounds_++;
    // Reservoir sampling: every round trip of the window is kept with the same chance.
    int64_t rtt = nowNs - sentNs;
    if (sample_.size() < kRrSamples) {
        sample_.push_back(rtt);
        return;
    }
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 7;
    rng_ ^= rng_ << 17;
    uint64_t slot = rng_ % rounds_;
    if (slot < kRrSamples)
        sample_[slot] = rtt;
}

void RrStats::finish(RrResult *result)
{
    result->rounds = rounds_;
    result->allRounds = allRounds_;
    result->seconds = double(endNs_ - fromNs_) / 1e9;
    result->rttNs = std::move(sample_);
}

int resolveAddress(const char *who, const std::string &host, uint16_t port, bool passive,
                   sockaddr_storage *out, socklen_t *len)
{
    addrinfo hints = {};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    addrinfo *res = nullptr;
    std::string service = std::to_string(port);
    int ret = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
    if (ret) {
        fprintf(stderr, "rstream-perf: %s: %s: %s\n", who, host.c_str(), gai_strerror(ret));
        return -EHOSTUNREACH;
    }
    memcpy(out, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

} // namespace rstream::perf
