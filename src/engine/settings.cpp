// SPDX-License-Identifier: MIT
// Settings defaults, validation, and the RSTREAM_* environment read through the registry.

#include "settings.h"

#include <algorithm>
#include <cerrno>

namespace rstream {

int Settings::setSendBuf(size_t bytes)
{
    if (bytes < kMinBuf || bytes > kMaxBuf)
        return -EINVAL;
    sendBuf = sendBufMax = bytes;
    return 0;
}

int Settings::setRecvBuf(size_t bytes)
{
    if (bytes < kMinBuf || bytes > kMaxBuf)
        return -EINVAL;
    recvBuf = recvBufMax = bytes;
    return 0;
}

int Settings::setTxSize(uint64_t entries)
{
    if (entries < kMinQueue || entries > kMaxQueue)
        return -EINVAL;
    txSize = static_cast<uint32_t>(entries);
    return 0;
}

int Settings::setRxSize(uint64_t entries)
{
    if (entries < kMinQueue || entries > kMaxQueue)
        return -EINVAL;
    rxSize = static_cast<uint32_t>(entries);
    return 0;
}

namespace {

// The registry (src/base/configvars.h) holds the ranges; these are the engine's own limits.
constexpr bool inRange(const char *name, int64_t min, int64_t max)
{
    return config::known(name) && config::find(name)->min == min && config::find(name)->max == max;
}
static_assert(inRange("RSTREAM_TX_SIZE", Settings::kMinQueue, Settings::kMaxQueue));
static_assert(inRange("RSTREAM_RX_SIZE", Settings::kMinQueue, Settings::kMaxQueue));
static_assert(inRange("RSTREAM_SEND_BUF", Settings::kMinBuf, Settings::kMaxBuf));
static_assert(inRange("RSTREAM_RECV_BUF", Settings::kMinBuf, Settings::kMaxBuf));
static_assert(inRange("RSTREAM_SEND_BUF_MAX", Settings::kMinBuf, Settings::kMaxBuf));
static_assert(inRange("RSTREAM_RECV_BUF_MAX", Settings::kMinBuf, Settings::kMaxBuf));

Settings loadEnv()
{
    // A variable unset or invalid (logged once) keeps the default of Settings itself, which the
    // settings test checks against the table's.
    Settings s;
    // The initial sizes; the rings still grow up to the limits, which 0 sets to the initial
    // size (no growth).
    s.sendBufMax = static_cast<size_t>(config::getInt("RSTREAM_SEND_BUF_MAX", s.sendBufMax));
    s.recvBufMax = static_cast<size_t>(config::getInt("RSTREAM_RECV_BUF_MAX", s.recvBufMax));
    s.sendBuf = static_cast<size_t>(config::getInt("RSTREAM_SEND_BUF", s.sendBuf));
    s.recvBuf = static_cast<size_t>(config::getInt("RSTREAM_RECV_BUF", s.recvBuf));
    s.sendBufMax = std::max(s.sendBufMax, s.sendBuf);
    s.recvBufMax = std::max(s.recvBufMax, s.recvBuf);
    s.txSize = static_cast<uint32_t>(config::getInt("RSTREAM_TX_SIZE", s.txSize));
    s.rxSize = static_cast<uint32_t>(config::getInt("RSTREAM_RX_SIZE", s.rxSize));
    s.pollUs = static_cast<uint32_t>(config::getInt("RSTREAM_POLL_US", s.pollUs));
    s.connectTimeoutMs =
        static_cast<int>(config::getInt("RSTREAM_CONNECT_TIMEOUT_MS", s.connectTimeoutMs));
    s.iwarp = config::getInt("RSTREAM_IWARP", s.iwarp) != 0;
    s.strict = config::getInt("RSTREAM_STRICT", s.strict) != 0;
    s.sameHost = config::getInt("RSTREAM_SAME_HOST", 1) != 0;
    s.quietSignal = config::getInt("RSTREAM_QUIET_SIGNAL", s.quietSignal) != 0;
    s.ringRewind = config::getInt("RSTREAM_RING_REWIND", s.ringRewind) != 0;
    if (const char *p = config::getString("RSTREAM_PROVIDER"))
        s.provider = p;
    return s;
}

} // namespace

const Settings &Settings::fromEnv()
{
    static const Settings settings = loadEnv();
    return settings;
}

} // namespace rstream
