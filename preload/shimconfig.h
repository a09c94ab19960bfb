// SPDX-License-Identifier: MIT
// The shim's configuration (which connections go to the fabric) and its negative cache.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <sys/socket.h>
#include <utility>
#include <vector>

#include "clock.h"

namespace rstream::shim {

// A getenv-like lookup: the value of a variable, or null when it is unset.
using EnvLookup = std::function<const char *(const char *)>;

// RSTREAM_ENABLE, RSTREAM_PORT_OFFSET, RSTREAM_CONNECT_TIMEOUT_MS, RSTREAM_PORTS,
// RSTREAM_EXCLUDE, RSTREAM_NEGATIVE_CACHE_MS, RSTREAM_UPGRADE_TIMEOUT_MS, RSTREAM_SWITCH_WAIT_MS,
// RSTREAM_UPGRADE_PENDING_MAX, RSTREAM_TOKEN_WAIT_MS.
struct ShimConfig
{
    bool enabled = true;
    int portOffset = 20000; // fabric listener port = app port + offset (wrapping above 65535)
    int connectTimeoutMs = 2000;
    int negativeCacheMs = 30000;
    int upgradeTimeoutMs = 2000; // a switch waits this long for the peer's count
    int switchWaitMs = 30000;    // a server's switch waits this long (+ the connect timeout) for
                                 // the client's fabric connection
    // An upgrade listener's connections whose token is not read yet: at most this many (a peer
    // that opens connections and sends nothing holds no more; the oldest goes), each for at
    // most tokenWaitMs. A client sends its token at its first call after its connect completes,
    // which a busy program (a thousand connections switching at once) reaches seconds later:
    // at 2 s, most of such a burst stayed on kernel TCP.
    int upgradePendingMax = 4096;
    int tokenWaitMs = 10000;
    std::vector<std::pair<int, int>> ports; // port ranges to offload; empty: all
    struct Net
    {
        int family;
        uint8_t addr[16];
        int prefix; // bits
        int port;   // 0: any
    };
    std::vector<Net> exclude;

    // From the process environment and the engine's settings (which pick the provider).
    static ShimConfig fromEnv();
    // From env; what the engine decides is passed in: the offset when RSTREAM_PORT_OFFSET is
    // unset (it depends on the provider) and the connect timeout. Bad values are logged and
    // ignored, never fatal.
    static ShimConfig parse(const EnvLookup &env, int defaultPortOffset, int connectTimeoutMs);
    // The fabric port for an application port (0 if none).
    int fabricPort(int port) const;
    bool portAllowed(int port) const;
    bool excluded(const sockaddr *addr) const;
};

// Destinations whose fabric connect failed recently: later connects go straight to the kernel.
// Expired entries go when looked up, and all of them whenever the map has doubled since the
// last sweep, so it holds about as many entries as there are live ones.
class NegativeCache
{
public:
    bool has(const std::string &key)
    {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = entries_.find(key);
        if (it == entries_.end())
            return false;
        if (nowMs() >= it->second) {
            entries_.erase(it);
            return false;
        }
        return true;
    }
    void add(const std::string &key, int ttlMs)
    {
        if (ttlMs <= 0)
            return;
        std::lock_guard<std::mutex> lock(mutex_);
        const int64_t now = nowMs();
        entries_[key] = now + ttlMs;
        if (entries_.size() >= sweepAt_) {
            std::erase_if(entries_, [now](const auto &e) { return now >= e.second; });
            sweepAt_ = std::max<size_t>(64, 2 * entries_.size());
        }
    }
    void remove(const std::string &key)
    {
        std::lock_guard<std::mutex> lock(mutex_);
        entries_.erase(key);
    }
    size_t size()
    {
        std::lock_guard<std::mutex> lock(mutex_);
        return entries_.size();
    }

private:
    std::mutex mutex_;
    std::map<std::string, int64_t> entries_;
    size_t sweepAt_ = 64;
};

} // namespace rstream::shim
