// SPDX-License-Identifier: MIT
// The shim's statistics: process counters, per-connection records, the RSTREAM_STATS JSON and
// the live export rstream-stat reads (/dev/shm/rstream-<pid>, see statexport.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <sys/socket.h>

#include "statexport.h"

namespace rstream {
class Connection;
} // namespace rstream

namespace rstream::shim {

// Process-wide counters (relaxed atomics; a fork child starts from zero).
struct ShimStats
{
    std::atomic<uint64_t> fabricConnections{0};
    std::atomic<uint64_t> fallbackConnections{0};
    std::atomic<uint64_t> fabricBytesSent{0}; // of the fabric connections already closed
    std::atomic<uint64_t> fabricBytesReceived{0};
    std::atomic<uint64_t> fabricListeners{0};
    std::atomic<uint64_t> kernelListeners{0}; // listeners that got no fabric side
    // Of the fabric connections, those whose bytes moved through same-host memory.
    std::atomic<uint64_t> sameHostConnections{0};
    std::atomic<uint64_t> sameHostBytesSent{0}; // of those already closed
    std::atomic<uint64_t> sameHostBytesReceived{0};
    std::atomic<uint64_t> fallbacks[kFallbackCount] = {};
};
ShimStats &shimStats();
void countFabricConnection();
// An established connection on kernel TCP, and why.
void countFallback(Fallback why);
void countListener(bool fabric);

// One connection of the program, from the moment its path is known until its last descriptor
// closes: its slot in the live export (when there is one), its byte counters and, once it
// closes, its entry in RSTREAM_STATS. Created and destroyed outside the data path; the data
// path only adds to bytes().
class ConnRecord
{
public:
    // local and peer as the kernel or the engine reports them (sockaddr_in or sockaddr_in6;
    // null when unknown). A kernel record counts as established only once markEstablished().
    ConnRecord(int fd, bool fabric, Fallback why, bool accepted, const sockaddr *local,
               socklen_t localLen, const sockaddr *peer, socklen_t peerLen);
    ~ConnRecord();
    ConnRecord(const ConnRecord &) = delete;
    ConnRecord &operator=(const ConnRecord &) = delete;

    exportfile::ByteCounters &bytes() { return *bytes_; }
    bool fabric() const { return fabric_; }
    bool sameHost() const { return sameHost_.load(std::memory_order_relaxed); }
    Fallback fallback() const { return why_; }
    // Fabric records: the engine connection, for the queues and credits rstream-stat shows.
    void setConnection(const std::shared_ptr<Connection> &conn);
    // Kernel records: the connection reached the established state.
    void markEstablished() { established_.store(true, std::memory_order_relaxed); }
    // Kernel records: the kernel's byte counts (TCP_INFO) of fd, kept for
    // when the descriptor is gone. Call before it closes.
    void readKernelBytes(int fd);

private:
    friend struct Registry;
    friend std::string shimStatsJson();

    const int fd_;
    const bool fabric_;
    std::atomic<bool> sameHost_{false}; // setConnection(): the engine chose the same-host link
    const Fallback why_;
    const bool accepted_;
    const uint32_t generation_; // the fork generation it was created in
    std::atomic<bool> established_;
    sockaddr_storage local_{};
    sockaddr_storage peer_{};
    exportfile::ByteCounters own_;            // when there is no export slot
    exportfile::ByteCounters *bytes_ = &own_; // the slot's counters, or own_
    exportfile::Slot *slot_ = nullptr;
    size_t index_ = 0; // in the registry's list of open records
    std::weak_ptr<Connection> conn_;
    std::atomic<uint64_t> kernelSent_{0};
    std::atomic<uint64_t> kernelReceived_{0};
};

// "1.2.3.4:80", "[::1]:80"; "-" for anything else.

// RSTREAM_STATS: one JSON object with the counters, the fallbacks by reason and a record per
// connection (open ones included: getsockopt reads the bytes of those on kernel TCP).
std::string shimStatsJson();

// At load: removes the export a previous program of this process (before execve) left behind.
void exportAtLoad();
// At exit: removes this process's export.
void exportAtExit();

} // namespace rstream::shim
