// SPDX-License-Identifier: MIT
// The live export of a preloaded process, /dev/shm/rstream-<pid>, as the shim writes it and
// rstream-stat reads it: a header and a fixed table of connection slots.
//
// The shim creates the file when its first connection is made (under a temporary name, renamed
// once complete), keeps the slots up to date with relaxed atomic stores and unlinks the file at
// exit. A slot's identity (fd, path, addresses) is written under a seqlock: seq is odd while it
// changes, and a reader that sees seq change across its copy reads again. Its byte counters are
// the connection's own counters (the data path adds to them in place); its engine fields
// (queues, credits) are filled in by the shim's refresher thread when a reader asks for them:
// the reader increments refreshRequest and wakes it (a shared futex), the thread refreshes every
// fabric slot and sets refreshDone to the request it served. All fields are lock-free atomics
// of 4 or 8 bytes, which are address-free and so valid between processes.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace rstream {

// Why a connection went over kernel TCP (the names are those of RSTREAM_STATS and the log).
enum class Fallback : uint8_t
{
    None = 0,      // over the fabric
    Refused,       // nothing listens on the peer's fabric port
    Timeout,       // the fabric attempt took RSTREAM_CONNECT_TIMEOUT_MS
    Excluded,      // the destination matches RSTREAM_EXCLUDE
    Ports,         // the port is not in RSTREAM_PORTS
    NegativeCache, // the destination failed recently (RSTREAM_NEGATIVE_CACHE_MS)
    ProviderError, // the fabric attempt failed otherwise
    PortBusy,      // the listener's fabric port was taken
    KernelPeer,    // accepted from a peer that connected over kernel TCP
    Unsupported,   // an address or port the fabric cannot serve
    ForkChild,     // a socket of a fork child, whose parent used the fabric
    NotUpgraded,   // deferred to kernel TCP by the listener, and the in-band upgrade was not made
    BeforeSwitch,  // upgrading, it ended over kernel TCP before its switch to the fabric came
    Loading,       // a fabric attempt was needed and libfabric was still loading: not waited for
    Count
};
constexpr const char *kFallbackNames[] = {
    "none",           "refused",        "timeout",       "excluded",    "ports",
    "negative_cache", "provider_error", "port_busy",     "kernel_peer", "unsupported",
    "fork_child",     "not_upgraded",   "before_switch", "loading"};
static_assert(sizeof(kFallbackNames) / sizeof(kFallbackNames[0]) ==
              static_cast<size_t>(Fallback::Count));
constexpr int kFallbackCount = static_cast<int>(Fallback::Count);

inline const char *fallbackName(Fallback f)
{
    const auto i = static_cast<size_t>(f);
    return i < static_cast<size_t>(Fallback::Count) ? kFallbackNames[i] : "unknown";
}

// Kernel TCP_INFO's bytes_received counts the peer's FIN as a byte: 1 in the states that follow
// it (TIME_WAIT, CLOSE_WAIT, LAST_ACK, CLOSING), to take off.
inline uint64_t tcpFinCounted(int state, uint64_t received)
{
    return received > 0 && (state == 6 || state == 8 || state == 9 || state == 11) ? 1 : 0;
}

namespace exportfile {

constexpr char kMagic[8] = {'R', 'S', 'T', 'R', 'E', 'X', 'P', '1'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kSlots = 16384; // connections exported at once (the file is sparse)
constexpr const char *kDir = "/dev/shm";
constexpr const char *kPrefix = "rstream-"; // then the pid

enum Path : uint32_t
{
    kPathFabric = 1,
    kPathKernel = 2,
    // An engine connection whose bytes moved through memory shared with a peer process on this
    // machine (the same-host transport), not the fabric.
    kPathSameHost = 3
};

enum SlotState : uint32_t
{
    kFree = 0,
    kOpen = 1
};

// Engine states, as refreshed (0: not refreshed yet).
enum EngineState : uint32_t
{
    kEngineUnknown = 0,
    kEngineConnecting = 1,
    kEngineEstablished = 2,
    kEngineShutWr = 3,     // our side shut down for writing
    kEnginePeerShutWr = 4, // the peer shut down for writing (EOF coming)
    kEngineClosing = 5,    // both
    kEngineClosed = 6,
    kEngineError = 7
};
constexpr const char *kEngineStateNames[] = {"-",          "connecting", "established", "fin-wait",
                                             "close-wait", "closing",    "closed",      "error"};

struct ByteCounters
{
    std::atomic<uint64_t> sent{0};     // bytes the application wrote
    std::atomic<uint64_t> received{0}; // bytes the application read
};

struct alignas(64) Slot
{
    std::atomic<uint32_t> seq;   // odd while the identity below changes
    std::atomic<uint32_t> state; // SlotState
    // Identity (under seq).
    std::atomic<int32_t> fd;
    std::atomic<uint32_t> path;     // Path
    std::atomic<uint32_t> fallback; // Fallback, for kernel connections
    std::atomic<uint32_t> accepted; // 1: accepted, 0: connected
    std::atomic<uint64_t> openedNs; // CLOCK_REALTIME when it was opened
    // sockaddr_in or sockaddr_in6 as the kernel reports them (family in the first 2 bytes).
    std::atomic<uint64_t> local[4];
    std::atomic<uint64_t> peer[4];
    // Fabric connections: what the application moved (always current).
    ByteCounters bytes;
    // Engine fields, as of the refresh numbered refreshed.
    std::atomic<uint32_t> refreshed;
    std::atomic<uint32_t> engineState; // EngineState
    std::atomic<int32_t> engineError;  // -errno, 0 if none
    std::atomic<uint32_t> rttUs;
    std::atomic<uint64_t> sendQueued;      // in the send ring: unsent or in flight
    std::atomic<uint64_t> recvQueued;      // in the receive ring, not read yet
    std::atomic<uint64_t> peerCreditBytes; // ring space the peer granted and we have not used
    std::atomic<uint32_t> peerCreditSlots; // messages the peer can still receive
    std::atomic<uint32_t> owedSlots;       // slots we owe the peer, not returned yet
    std::atomic<uint64_t> owedBytes;       // ring space we owe the peer, not returned yet
    std::atomic<uint32_t> sendBuf;
    std::atomic<uint32_t> recvBuf;
    // KiB of the rings backed by memory now (was padding: 0 from older writers).
    std::atomic<uint32_t> ringResidentKib;
};
static_assert(sizeof(Slot) == 192);

struct Header
{
    char magic[8];
    uint32_t version;
    uint32_t headerSize;
    uint32_t slotSize;
    uint32_t slotCount;
    int32_t pid;
    uint32_t reserved0;
    uint64_t startedNs; // CLOCK_REALTIME at creation
    char provider[16];
    char program[32];
    std::atomic<uint32_t> used;           // slots [0, used) may be open
    std::atomic<uint32_t> dropped;        // connections not exported: the table was full
    std::atomic<uint32_t> refresher;      // 1 while a refresher thread serves requests
    std::atomic<uint32_t> refreshRequest; // futex: readers increment it and wake
    std::atomic<uint32_t> refreshDone;    // futex: the request last served
    uint32_t reserved1;
    // Process totals, as RSTREAM_STATS reports them.
    std::atomic<uint64_t> fabricConnections;
    std::atomic<uint64_t> fallbackConnections;
    std::atomic<uint64_t> fabricListeners;
    std::atomic<uint64_t> kernelListeners;
    std::atomic<uint64_t> fallbacks[16]; // by Fallback
    // Of fabricConnections, those on the same-host transport (0 from older writers).
    std::atomic<uint64_t> sameHostConnections;
};
static_assert(kFallbackCount <= 16);

constexpr size_t kHeaderSize = 4096;
static_assert(sizeof(Header) <= kHeaderSize);
constexpr size_t kFileSize = kHeaderSize + size_t(kSlots) * sizeof(Slot);

inline Slot *slots(Header *h)
{
    return reinterpret_cast<Slot *>(reinterpret_cast<char *>(h) + kHeaderSize);
}

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
              std::atomic<uint32_t>::is_always_lock_free &&
              std::atomic<int32_t>::is_always_lock_free);

} // namespace exportfile

} // namespace rstream
