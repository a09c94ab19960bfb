// SPDX-License-Identifier: MIT
// Settings defaults, validation and the RSTREAM_* environment.

#include "settings.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "log.h"

namespace rstream {

int parseSize(const char *text, uint64_t *out)
{
    if (!text)
        return -EINVAL;
    while (*text == ' ' || *text == '\t')
        text++;
    // Decimal, or hexadecimal with 0x; never octal, and never negative.
    int base = (text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) ? 16 : 10;
    if (!*text || text[0] == '-' || text[0] == '+')
        return -EINVAL;
    errno = 0;
    char *end = nullptr;
    unsigned long long v = std::strtoull(text, &end, base);
    if (errno || end == text)
        return -EINVAL;
    unsigned shift = 0;
    switch (*end) {
    case '\0':
        break;
    case 'k':
    case 'K':
        shift = 10;
        end++;
        break;
    case 'm':
    case 'M':
        shift = 20;
        end++;
        break;
    case 'g':
    case 'G':
        shift = 30;
        end++;
        break;
    default:
        return -EINVAL;
    }
    if (*end != '\0' || (shift && v > (~0ull >> shift)))
        return -EINVAL;
    *out = v << shift;
    return 0;
}

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

template <typename Setter>
void fromEnvVar(const char *name, Setter set)
{
    const char *text = std::getenv(name);
    if (!text)
        return;
    uint64_t v;
    if (parseSize(text, &v) < 0 || set(v) < 0)
        RS_LOG(Warn, "ignoring %s=%s: invalid or out of range", name, text);
}

Settings loadEnv()
{
    Settings s;
    // The initial sizes; the rings still grow up to the limits, which 0 sets to the initial
    // size (no growth).
    fromEnvVar("RSTREAM_SEND_BUF_MAX", [&](uint64_t v) {
        if (v != 0 && (v < Settings::kMinBuf || v > Settings::kMaxBuf))
            return -EINVAL;
        s.sendBufMax = v;
        return 0;
    });
    fromEnvVar("RSTREAM_RECV_BUF_MAX", [&](uint64_t v) {
        if (v != 0 && (v < Settings::kMinBuf || v > Settings::kMaxBuf))
            return -EINVAL;
        s.recvBufMax = v;
        return 0;
    });
    fromEnvVar("RSTREAM_SEND_BUF", [&](uint64_t v) {
        if (v < Settings::kMinBuf || v > Settings::kMaxBuf)
            return -EINVAL;
        s.sendBuf = v;
        return 0;
    });
    fromEnvVar("RSTREAM_RECV_BUF", [&](uint64_t v) {
        if (v < Settings::kMinBuf || v > Settings::kMaxBuf)
            return -EINVAL;
        s.recvBuf = v;
        return 0;
    });
    s.sendBufMax = std::max(s.sendBufMax, s.sendBuf);
    s.recvBufMax = std::max(s.recvBufMax, s.recvBuf);
    fromEnvVar("RSTREAM_TX_SIZE", [&](uint64_t v) { return s.setTxSize(v); });
    fromEnvVar("RSTREAM_RX_SIZE", [&](uint64_t v) { return s.setRxSize(v); });
    fromEnvVar("RSTREAM_POLL_US", [&](uint64_t v) {
        if (v > 1000000)
            return -EINVAL;
        s.pollUs = static_cast<uint32_t>(v);
        return 0;
    });
    fromEnvVar("RSTREAM_CONNECT_TIMEOUT_MS", [&](uint64_t v) {
        if (v < 1 || v > 3600 * 1000)
            return -EINVAL;
        s.connectTimeoutMs = static_cast<int>(v);
        return 0;
    });
    fromEnvVar("RSTREAM_IWARP", [&](uint64_t v) {
        s.iwarp = v != 0;
        return 0;
    });
    fromEnvVar("RSTREAM_STRICT", [&](uint64_t v) {
        s.strict = v != 0;
        return 0;
    });
    if (const char *p = std::getenv("RSTREAM_PROVIDER"))
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
