// SPDX-License-Identifier: MIT
// rstream-perf's raw transport, one connection: plain libfabric, the ceiling the engine is
// measured against (the runs over it: perf_raw.cpp).
//
// Each side registers a receive ring and tells the peer its address, key and size in the CM
// private data of fi_connect/fi_accept. A message is one fi_writedata of `size` bytes into the
// peer's ring, its length in the 32-bit immediate; the receiver learns of it from the
// FI_REMOTE_CQ_DATA completion (tcp reports len 0 there, so the immediate is what counts).
// Messages never wrap: one that does not fit before the end of the ring goes to its start, and
// both sides skip the same bytes because writes arrive in order. The receiver does not copy
// the data out; it frees the space at once and hands it back in batches with zero-length
// fi_injectdata credit messages, which land in receives posted for them. When the provider
// asks for FI_RX_CQ_DATA, writes consume posted receives as well and those are credited too.
//
// Control immediates (zero-length sends; kAck carries 8 bytes):
//   bits 31..30  type: 0 credit, 1 fin (client: no more data), 2 ack (server: bytes received)
//   credit:      bits 21..0 ring bytes freed, bits 29..22 posted receives freed
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>

#include "perf.h"

namespace rstream::perf::raw {

constexpr uint32_t kMagic = 0x72706572; // "rper"
constexpr uint16_t kVersion = 1;
constexpr uint32_t kMaxRing = 64u << 20;
constexpr uint32_t kMaxRecvs = 256;
// Receives kept for control messages when writes consume receives too.
constexpr uint32_t kCtrlReserve = 16;
constexpr int kEqTimeoutMs = 10000;
// A waiting side busy-polls the CQ, yielding the CPU after each empty poll, for kSpinNs (more
// than a loopback round trip), then sleeps on the CQ's fd until something arrives. Pure
// spinning ends on a machine with few, shared CPUs starve the kernel's loopback processing
// (ksoftirqd) and each other: tcp bandwidth drops up to tenfold and latency p99 goes to
// milliseconds. Sleeping after a while also lets the scheduler favour the woken side.
constexpr int64_t kSpinNs = 50'000;
constexpr int kSleepMs = 1; // a bound, should a wake-up be missed
// Empty CQ polls between looks for a disconnect.
constexpr uint32_t kEqPolls = 4096;

constexpr unsigned kTypeShift = 30;
constexpr uint32_t kTypeCredit = 0;
constexpr uint32_t kTypeFin = 1;
constexpr uint32_t kTypeAck = 2;
constexpr unsigned kCreditMsgsShift = 22;
constexpr uint32_t kCreditBytesMax = (1u << kCreditMsgsShift) - 1;
constexpr uint32_t kCreditMsgsMax = (1u << (kTypeShift - kCreditMsgsShift)) - 1;

// The CM private data, in network byte order on the wire.
struct Hello
{
    uint32_t magic;
    uint16_t version;
    uint8_t test;
    uint8_t reserved;
    uint32_t msgSize;
    uint32_t ringSize;
    uint64_t ringAddr; // target of the ring's first byte: a virtual address or 0
    uint64_t ringKey;
    uint32_t rxCredits; // writes the peer may have unacknowledged; 0: writes consume no receive
    uint32_t durationMs;
};
static_assert(sizeof(Hello) == 40);

Hello toWire(Hello h);
// Decodes and checks a peer's private data: 0, or -EPROTO.
int fromWire(const void *data, size_t len, Hello *out);
// fi_getinfo for FI_EP_MSG with RMA and the provider of RSTREAM_PROVIDER (default tcp).
int getInfo(const char *node, const char *service, uint64_t flags, fi_info **out);

// One connected endpoint with its rings, credits and counters; single-threaded.
class RawConn
{
public:
    RawConn() = default;
    ~RawConn();
    RawConn(const RawConn &) = delete;
    RawConn &operator=(const RawConn &) = delete;

    // Opens the domain, queues, endpoint and memory for info (owned from here on).
    int open(fid_fabric *fabric, fi_info *info, uint32_t ringSize, uint32_t msgSize);
    Hello localHello(Test test, uint32_t durationMs) const;
    int setPeer(const Hello &peer);
    int connect(const Hello &local);
    int accept(const Hello &local);

    // Reads the CQ once and returns credits: completions handled (>= 0) or -errno.
    int progress();
    // progress() for a caller that cannot go on until something completes: yields the CPU
    // after an empty poll, and after kSpinNs of nothing sleeps on the CQ's wait fd.
    int progressOrWait();
    // Waits while pred() is false, making progress, until deadlineNs: 0, -ETIMEDOUT or -errno.
    template <typename Pred>
    int progressUntil(Pred pred, int64_t deadlineNs);
    // Posts one message: 1 when posted, 0 when out of credits or queue space, -errno.
    int tryWrite();
    // Posts a control message, making progress while the queue is full.
    int sendCtrl(uint32_t imm, const void *payload, size_t len);
    // Posts one message, making progress until it can: 0 or -errno.
    int write();
    // Waits for the peer to disconnect (the server's last step), up to timeoutMs.
    void waitShutdown(int timeoutMs);
    void shutdown() { fi_shutdown(ep_, 0); }

    uint64_t arrivals() const { return arrivals_; }
    uint64_t bytesIn() const { return bytesIn_; }
    bool fin() const { return fin_; }
    bool ack() const { return ack_; }
    uint64_t ackValue() const { return ackValue_; }

private:
    int regMr(void *buf, size_t len, uint64_t access, fid_mr **mr, void **desc);
    int postRecv(uint32_t slot);
    int checkEq();
    void sleepOnCq();
    int cqError();
    void onArrival(uint32_t len);
    void onCtrl(uint32_t imm, uint32_t slot, size_t len);
    int returnCredits();
    int waitConnected(const char *what);

    fi_info *info_ = nullptr;
    fid_fabric *fabric_ = nullptr;
    fid_domain *domain_ = nullptr;
    fid_eq *eq_ = nullptr;
    fid_cq *cq_ = nullptr;
    fid_ep *ep_ = nullptr;
    fid_mr *ringMr_ = nullptr;
    fid_mr *sendMr_ = nullptr;
    fid_mr *ctrlMr_ = nullptr;
    void *sendDesc_ = nullptr;
    void *ctrlDesc_ = nullptr;

    bool mrLocal_ = false;
    bool virtAddr_ = false;
    bool provKey_ = false;
    bool mrEndpoint_ = false;
    bool rxCqData_ = false;
    uint64_t keyMask_ = ~uint64_t(0);
    size_t injectSize_ = 0;

    uint8_t *ring_ = nullptr;
    uint8_t *send_ = nullptr;
    uint8_t *ctrl_ = nullptr; // 8 bytes per posted receive, then 8 bytes to send from
    uint32_t ringSize_ = 0;
    uint32_t msgSize_ = 0;
    uint32_t recvCount_ = 0;
    std::vector<fi_context2> recvCtx_;
    std::vector<fi_context2> txCtx_;
    std::vector<uint32_t> txFree_;

    // Sending into the peer's ring.
    uint64_t peerAddr_ = 0;
    uint64_t peerKey_ = 0;
    uint32_t peerRing_ = 0;
    uint32_t peerCredits_ = 0; // 0: unlimited
    uint64_t txPos_ = 0;       // bytes of the peer's ring used, padding included
    uint64_t txFreed_ = 0;     // of which the peer handed back
    uint32_t txMsgs_ = 0;      // writes not yet credited (when they consume receives)

    // Receiving into our ring.
    uint64_t rxPos_ = 0;
    uint32_t rxBytesOwed_ = 0; // freed, not yet handed back
    uint32_t rxMsgsOwed_ = 0;
    bool creditsDue_ = false;
    uint32_t batchBytes_ = 1;
    uint32_t batchMsgs_ = 1;
    uint32_t rxCredits_ = 0;

    uint64_t arrivals_ = 0;
    uint64_t bytesIn_ = 0;
    bool fin_ = false;
    bool ack_ = false;
    uint64_t ackValue_ = 0;
    bool peerGone_ = false;
    uint32_t idlePolls_ = 0;
    int64_t idleSinceNs_ = 0;
    int waitFd_ = -1;
};

template <typename Pred>
int RawConn::progressUntil(Pred pred, int64_t deadlineNs)
{
    for (uint32_t i = 0; !pred(); i++) {
        int ret = progressOrWait();
        if (ret < 0)
            return ret;
        if (i % 1024 == 0 && nowNs() > deadlineNs)
            return -ETIMEDOUT;
    }
    return 0;
}

} // namespace rstream::perf::raw
