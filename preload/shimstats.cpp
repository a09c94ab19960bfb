// SPDX-License-Identifier: MIT
// The shim's statistics: process counters, connection records and the RSTREAM_STATS JSON.

#include "shimstats.h"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <linux/tcp.h>
#include <mutex>
#include <netinet/in.h>
#include <unistd.h>

#include "address.h"
#include "connection.h"
#include "fabric.h"
#include "kernel.h"
#include "settings.h"
#include "shimregistry.h"

namespace rstream::shim {

using namespace exportfile;

std::atomic<uint32_t> gGeneration{0};

namespace {

void copyAddress(sockaddr_storage *out, const sockaddr *in, socklen_t len)
{
    std::memset(out, 0, sizeof(*out));
    if (in && len >= sizeof(sa_family_t))
        std::memcpy(out, in, std::min<size_t>(len, sizeof(sockaddr_in6)));
}

} // namespace

std::string storedAddressText(const void *addr)
{
    sockaddr_storage ss{};
    std::memcpy(&ss, addr, sizeof(sockaddr_in6));
    return addressText(reinterpret_cast<const sockaddr *>(&ss));
}

ShimStats &shimStats()
{
    static auto *stats = new ShimStats();
    return *stats;
}

void countFabricConnection()
{
    shimStats().fabricConnections.fetch_add(1, std::memory_order_relaxed);
    publishTotals();
}

void countFallback(Fallback why)
{
    ShimStats &s = shimStats();
    s.fallbackConnections.fetch_add(1, std::memory_order_relaxed);
    const auto i = static_cast<size_t>(why);
    if (i < static_cast<size_t>(kFallbackCount))
        s.fallbacks[i].fetch_add(1, std::memory_order_relaxed);
    publishTotals();
}

void countListener(bool fabric)
{
    (fabric ? shimStats().fabricListeners : shimStats().kernelListeners)
        .fetch_add(1, std::memory_order_relaxed);
    publishTotals();
}

ConnRecord::ConnRecord(int fd, bool fabric, Fallback why, bool accepted, const sockaddr *local,
                       socklen_t localLen, const sockaddr *peer, socklen_t peerLen)
    : fd_(fd), fabric_(fabric), why_(why), accepted_(accepted),
      generation_(gGeneration.load(std::memory_order_relaxed)), established_(fabric || accepted)
{
    copyAddress(&local_, local, localLen);
    copyAddress(&peer_, peer, peerLen);
    Registry &r = Registry::instance();
    std::lock_guard<std::mutex> lock(r.mutex);
    index_ = r.live.size();
    r.live.push_back(this);
    slot_ = r.claimLocked(*this);
    if (slot_) {
        bytes_ = &slot_->bytes;
        if (fabric_)
            r.startRefresherLocked(r.header.load(std::memory_order_relaxed));
    }
}

ConnRecord::~ConnRecord()
{
    if (generation_ != gGeneration.load(std::memory_order_relaxed))
        return; // a fork child's copy of its parent's connection
    const uint64_t sent = fabric_ ? bytes_->sent.load(std::memory_order_relaxed)
                                  : kernelSent_.load(std::memory_order_relaxed);
    const uint64_t received = fabric_ ? bytes_->received.load(std::memory_order_relaxed)
                                      : kernelReceived_.load(std::memory_order_relaxed);
    if (fabric_) {
        shimStats().fabricBytesSent.fetch_add(sent, std::memory_order_relaxed);
        shimStats().fabricBytesReceived.fetch_add(received, std::memory_order_relaxed);
    }
    if (sameHost()) {
        shimStats().sameHostBytesSent.fetch_add(sent, std::memory_order_relaxed);
        shimStats().sameHostBytesReceived.fetch_add(received, std::memory_order_relaxed);
    }
    Registry &r = Registry::instance();
    std::lock_guard<std::mutex> lock(r.mutex);
    if (index_ < r.live.size() && r.live[index_] == this) {
        r.live[index_] = r.live.back();
        r.live[index_]->index_ = index_;
        r.live.pop_back();
    }
    if (established_.load(std::memory_order_relaxed))
        r.closedLocked(*this, sent, received);
    r.releaseLocked(*this);
}

void ConnRecord::setConnection(const std::shared_ptr<Connection> &conn)
{
    {
        std::lock_guard<std::mutex> lock(Registry::instance().mutex);
        conn_ = conn;
        if (!conn || !conn->sameHost() || sameHost_.load(std::memory_order_relaxed))
            return;
        sameHost_.store(true, std::memory_order_relaxed);
        if (slot_)
            slot_->path.store(exportfile::kPathSameHost, std::memory_order_relaxed);
    }
    shimStats().sameHostConnections.fetch_add(1, std::memory_order_relaxed);
    publishTotals();
}

void ConnRecord::readKernelBytes(int fd)
{
    struct tcp_info ti;
    std::memset(&ti, 0, sizeof(ti));
    socklen_t len = sizeof(ti);
    const int saved = errno;
    // Payload bytes sent once (bytes_acked would count the SYN too); older kernels: acked.
    if (sys::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 &&
        len >= offsetof(struct tcp_info, tcpi_bytes_received) + sizeof(ti.tcpi_bytes_received)) {
        const bool hasSent =
            len >= offsetof(struct tcp_info, tcpi_bytes_retrans) + sizeof(ti.tcpi_bytes_retrans);
        kernelSent_.store(hasSent ? ti.tcpi_bytes_sent - ti.tcpi_bytes_retrans
                                  : ti.tcpi_bytes_acked,
                          std::memory_order_relaxed);
        kernelReceived_.store(ti.tcpi_bytes_received -
                                  tcpFinCounted(ti.tcpi_state, ti.tcpi_bytes_received),
                              std::memory_order_relaxed);
    }
    errno = saved;
}

std::string shimStatsJson()
{
    ShimStats &s = shimStats();
    Registry &r = Registry::instance();
    std::lock_guard<std::mutex> lock(r.mutex);
    std::string records;
    uint64_t openSent = 0;
    uint64_t openReceived = 0;
    uint64_t openSameSent = 0;
    uint64_t openSameReceived = 0;
    auto add = [&](int fd, bool fabric, bool sameHost, Fallback why, bool accepted,
                   const void *local, const void *peer, uint64_t sent, uint64_t received,
                   bool open) {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "{\"fd\": %d, \"path\": \"%s\", ", fd,
                      sameHost ? "same_host"
                      : fabric ? "fabric"
                               : "kernel");
        records += records.empty() ? "" : ", ";
        records += buf;
        if (!fabric)
            records += std::string("\"reason\": \"") + fallbackName(why) + "\", ";
        records += std::string("\"direction\": \"") + (accepted ? "accepted" : "connected") +
                   "\", \"local\": \"" + storedAddressText(local) + "\", \"peer\": \"" +
                   storedAddressText(peer) + "\", ";
        std::snprintf(buf, sizeof(buf),
                      "\"sent\": %" PRIu64 ", \"received\": %" PRIu64 ", \"open\": %s}", sent,
                      received, open ? "true" : "false");
        records += buf;
    };
    // Closed ones first, oldest first.
    for (size_t i = 0; i < r.closed.size(); i++) {
        const ClosedRecord &c = r.closed[(r.closedNext + i) % r.closed.size()];
        add(c.fd, c.fabric, c.sameHost, c.why, c.accepted, &c.local, &c.peer, c.sent, c.received,
            false);
    }
    for (ConnRecord *c : r.live) {
        if (!c->established_.load(std::memory_order_relaxed))
            continue;
        uint64_t sent, received;
        if (c->fabric_) {
            sent = c->bytes_->sent.load(std::memory_order_relaxed);
            received = c->bytes_->received.load(std::memory_order_relaxed);
            openSent += sent;
            openReceived += received;
            if (c->sameHost()) {
                openSameSent += sent;
                openSameReceived += received;
            }
        } else {
            c->readKernelBytes(c->fd_);
            sent = c->kernelSent_.load(std::memory_order_relaxed);
            received = c->kernelReceived_.load(std::memory_order_relaxed);
        }
        add(c->fd_, c->fabric_, c->sameHost(), c->why_, c->accepted_, &c->local_, &c->peer_, sent,
            received, true);
    }
    std::string reasons;
    for (int i = 1; i < kFallbackCount; i++) {
        char buf[64];
        std::snprintf(buf, sizeof(buf), "%s\"%s\": %" PRIu64, i > 1 ? ", " : "", kFallbackNames[i],
                      s.fallbacks[i].load(std::memory_order_relaxed));
        reasons += buf;
    }
    char buf[800];
    std::snprintf(buf, sizeof(buf),
                  "{\"pid\": %d, \"provider\": \"%s\", \"fabric_connections\": %" PRIu64
                  ", \"fallback_connections\": %" PRIu64 ", \"fabric_bytes_sent\": %" PRIu64
                  ", \"fabric_bytes_received\": %" PRIu64 ", \"fabric_listeners\": %" PRIu64
                  ", \"kernel_listeners\": %" PRIu64 ", \"same_host_connections\": %" PRIu64
                  ", \"same_host_bytes_sent\": %" PRIu64 ", \"same_host_bytes_received\": %" PRIu64
                  ", \"fallback_reasons\": {",
                  static_cast<int>(getpid()), chooseProvider(Settings::fromEnv()).c_str(),
                  s.fabricConnections.load(), s.fallbackConnections.load(),
                  s.fabricBytesSent.load() + openSent, s.fabricBytesReceived.load() + openReceived,
                  s.fabricListeners.load(), s.kernelListeners.load(), s.sameHostConnections.load(),
                  s.sameHostBytesSent.load() + openSameSent,
                  s.sameHostBytesReceived.load() + openSameReceived);
    std::string json = buf;
    json += reasons + "}, \"connections\": [" + records +
            "], \"connections_unlisted\": " + std::to_string(r.unlisted) + "}";
    return json;
}

} // namespace rstream::shim
