// SPDX-License-Identifier: MIT
// Per-endpoint settings: buffer and queue sizes, polling, timeouts, transport modes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "configvars.h" // parseSize, and the table fromEnv reads

namespace rstream {

struct Settings
{
    static constexpr size_t kMinBuf = config::kMinBuf;
    static constexpr size_t kMaxBuf = config::kMaxBuf;
    static constexpr uint32_t kMinQueue = 8;
    static constexpr uint32_t kMaxQueue = 8191;

    size_t sendBuf = 32 * 1024; // send ring bytes (at connection setup)
    size_t recvBuf = 32 * 1024; // receive ring bytes (at connection setup)
    // Rings grow up to these for bulk transfers, as Linux autotunes socket buffers (only on
    // providers that do not pin registered memory). A size set explicitly (setSendBuf,
    // SO_SNDBUF...) sets the limit too: the ring keeps the size asked for.
    size_t sendBufMax = 1024 * 1024;
    size_t recvBufMax = 1024 * 1024;
    uint32_t txSize = 384;       // send queue entries
    uint32_t rxSize = 384;       // receive queue entries (message credits given to the peer)
    uint32_t pollUs = 50;        // spin this long making progress before sleeping
    int connectTimeoutMs = 2000; // bound on connection establishment (also the shim's fallback)
    uint32_t ioMapSize = 64;     // riomap() windows the peer may map (RDMA_IOMAPSIZE)
    // riounmap() and close() with windows wait this long for the peer's UNMAPPED (its engine
    // answers at once), then reset the connection: either way no write lands after they return.
    int unmapTimeoutMs = 5000;
    // A connection that went this long without a byte gives its send ring's pages back (they
    // are backed again as used); only where ProviderCaps::placesInCalls. 0: never.
    int ringIdleMs = 2000;
    bool iwarp = false;  // force RMA write + small send instead of write with immediate
    bool strict = false; // ask the provider for verbs-shaped MR semantics (tests)
    // The preload shim's sockets: a connect says it can take a Defer refusal (and upgrade
    // in-band); a listener defers such connects from other processes (listener.h).
    bool upgrade = false;
    // Offer and take the same-host transport (samehost.h) for peers in this kernel and network
    // namespace. fromEnv() turns it on (RSTREAM_SAME_HOST, default 1), as the rsocket API and
    // the shim run; a Settings made in code, as the engine's tests make theirs, asks for it.
    bool sameHost = false;
    // On tcp up to libfabric 1.17, take the provider's completion signal out of a connected
    // endpoint's wait fd (quiet_signal.cpp). RSTREAM_QUIET_SIGNAL=0 keeps it.
    bool quietSignal = true;
    // Take DATA words that rewind to the start of the receive ring (wire.h, kDataRewind): said
    // in the hello, and a peer that says it gets them. RSTREAM_RING_REWIND=0 turns it off
    // (both directions: this end then never rewinds either, towards any peer).
    bool ringRewind = true;
    std::string provider; // empty: verbs when usable, else tcp

    // The defaults overridden by RSTREAM_* environment variables (the registry in configvars.h
    // parses and checks them). Invalid values are logged once and ignored.
    static const Settings &fromEnv();

    // Setters validate: -EINVAL for out-of-range values. The buffer setters fix the size (no
    // growth).
    int setSendBuf(size_t bytes);
    int setRecvBuf(size_t bytes);
    int setTxSize(uint64_t entries);
    int setRxSize(uint64_t entries);
};

} // namespace rstream
