// SPDX-License-Identifier: MIT
// Parsing the shim's configuration from the environment, and what it decides per address.

#include "shimconfig.h"

#include <algorithm>
#include <arpa/inet.h>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "configvars.h"
#include "fabric.h"
#include "log.h"
#include "settings.h"
#include "shimaddr.h"

namespace rstream::shim {

namespace {

// A decimal number in lo..hi (digits only), or -1.
int parseNumber(const std::string &s, int lo, int hi)
{
    if (s.empty() || s.size() > 9 || !std::all_of(s.begin(), s.end(), ::isdigit))
        return -1;
    const int n = std::stoi(s);
    return n >= lo && n <= hi ? n : -1;
}

// A numeric variable from env, parsed and checked by the registry (configvars.h).
int envInt(const EnvLookup &env, const char *name, int def)
{
    return static_cast<int>(config::valueOf(name, env(name), def));
}

int envDefault(const char *name)
{
    return static_cast<int>(config::defaultValue(*config::find(name)));
}

} // namespace

ShimConfig ShimConfig::fromEnv()
{
    // verbs on IB/RoCE has a port space of its own: the fabric listener takes the app's port.
    // tcp (and iWarp) share the kernel's, so the fabric listener needs another one.
    const std::string &prov = chooseProvider(Settings::fromEnv());
    const int defOffset = prov == "verbs" ? 0 : envDefault("RSTREAM_PORT_OFFSET");
    return parse([](const char *name) -> const char * { return std::getenv(name); }, defOffset,
                 Settings::fromEnv().connectTimeoutMs);
}

ShimConfig ShimConfig::parse(const EnvLookup &env, int defaultPortOffset, int connectTimeoutMs)
{
    ShimConfig c;
    c.enabled = envInt(env, "RSTREAM_ENABLE", envDefault("RSTREAM_ENABLE")) != 0;
    c.portOffset = envInt(env, "RSTREAM_PORT_OFFSET", defaultPortOffset);
    c.connectTimeoutMs = connectTimeoutMs;
    c.negativeCacheMs =
        envInt(env, "RSTREAM_NEGATIVE_CACHE_MS", envDefault("RSTREAM_NEGATIVE_CACHE_MS"));
    c.upgradeTimeoutMs =
        envInt(env, "RSTREAM_UPGRADE_TIMEOUT_MS", envDefault("RSTREAM_UPGRADE_TIMEOUT_MS"));
    c.switchWaitMs = envInt(env, "RSTREAM_SWITCH_WAIT_MS", envDefault("RSTREAM_SWITCH_WAIT_MS"));
    c.upgradePendingMax =
        envInt(env, "RSTREAM_UPGRADE_PENDING_MAX", envDefault("RSTREAM_UPGRADE_PENDING_MAX"));
    c.tokenWaitMs = envInt(env, "RSTREAM_TOKEN_WAIT_MS", envDefault("RSTREAM_TOKEN_WAIT_MS"));
    if (const char *ports = env("RSTREAM_PORTS")) {
        // "5201,6379,7000-7100"
        std::string s(ports);
        size_t pos = 0;
        while (pos < s.size()) {
            size_t end = s.find(',', pos);
            std::string item =
                s.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
            int lo = 0, hi = 0;
            char dash;
            if (std::sscanf(item.c_str(), "%d%c%d", &lo, &dash, &hi) == 3 && dash == '-')
                c.ports.emplace_back(lo, hi);
            else if (std::sscanf(item.c_str(), "%d", &lo) == 1)
                c.ports.emplace_back(lo, lo);
            else if (!item.empty())
                RS_LOG(Warn, "RSTREAM_PORTS: ignoring '%s'", item.c_str());
            if (end == std::string::npos)
                break;
            pos = end + 1;
        }
    }
    if (const char *ex = env("RSTREAM_EXCLUDE")) {
        // "10.0.0.0/8,192.168.1.5,::1,:22,127.0.0.1:6379"
        std::string s(ex);
        size_t pos = 0;
        while (pos <= s.size()) {
            size_t end = s.find(',', pos);
            std::string item =
                s.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
            if (!item.empty()) {
                Net n{};
                std::string addr = item;
                // A trailing :port (for IPv6 write [addr]:port).
                size_t colon = std::string::npos;
                bool ok = true;
                if (addr[0] == '[') {
                    const size_t close = addr.find(']');
                    if (close == std::string::npos)
                        ok = false;
                    else if (close + 1 < addr.size() && addr[close + 1] == ':')
                        colon = close + 1;
                    else if (close + 1 != addr.size())
                        ok = false;
                } else if (std::count(addr.begin(), addr.end(), ':') == 1) {
                    colon = addr.find(':');
                }
                if (colon != std::string::npos) {
                    // A port that does not parse must not become "any port".
                    n.port = parseNumber(addr.substr(colon + 1), 1, 65535);
                    ok = n.port > 0;
                    addr = addr.substr(0, colon);
                }
                if (!addr.empty() && addr.front() == '[' && addr.back() == ']')
                    addr = addr.substr(1, addr.size() - 2);
                size_t slash = addr.find('/');
                std::string host = addr.substr(0, slash);
                if (!ok) {
                } else if (host.empty()) {
                    n.family = 0; // any address
                } else if (inet_pton(AF_INET, host.c_str(), n.addr) == 1) {
                    n.family = AF_INET;
                    n.prefix = 32;
                } else if (inet_pton(AF_INET6, host.c_str(), n.addr) == 1) {
                    n.family = AF_INET6;
                    n.prefix = 128;
                } else {
                    ok = false;
                }
                if (ok && slash != std::string::npos) {
                    n.prefix =
                        parseNumber(addr.substr(slash + 1), 0, n.family == AF_INET ? 32 : 128);
                    ok = n.family != 0 && n.prefix >= 0;
                }
                if (ok)
                    c.exclude.push_back(n);
                else
                    RS_LOG(Warn, "RSTREAM_EXCLUDE: ignoring '%s'", item.c_str());
            }
            if (end == std::string::npos)
                break;
            pos = end + 1;
        }
    }
    return c;
}

int ShimConfig::fabricPort(int port) const
{
    if (port <= 0 || port > 65535)
        return 0;
    int p = port + portOffset;
    if (p > 65535)
        p = p - 65536 + 1024; // wrap above the privileged ports
    return p == port && portOffset ? 0 : p;
}

bool ShimConfig::portAllowed(int port) const
{
    if (ports.empty())
        return true;
    for (auto &r : ports)
        if (port >= r.first && port <= r.second)
            return true;
    return false;
}

bool ShimConfig::excluded(const sockaddr *addr) const
{
    uint8_t bytes[16];
    int fam = addressBytes(addr, bytes);
    int port = addressPort(addr);
    for (auto &n : exclude) {
        if (n.port && n.port != port)
            continue;
        if (n.family == 0)
            return true;
        if (n.family != fam)
            continue;
        int bits = n.prefix, i = 0;
        bool match = true;
        for (; bits >= 8; bits -= 8, i++)
            if (bytes[i] != n.addr[i])
                match = false;
        if (match && bits > 0) {
            uint8_t mask = static_cast<uint8_t>(0xff << (8 - bits));
            match = (bytes[i] & mask) == (n.addr[i] & mask);
        }
        if (match)
            return true;
    }
    return false;
}

} // namespace rstream::shim
