// SPDX-License-Identifier: MIT
// The RSTREAM_* registry's parsing and getters: usable from load-time constructors and by the
// log's own initialization (no allocation, no static constructor, no logging in read()).

#include "configvars.h"

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <iterator>
#include <strings.h>

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

namespace config {

namespace {

constexpr const char *kLevelNames[] = {"error", "warn", "info", "debug", "trace"};

// One flag per variable: an invalid value is logged once, however often it is read. Constant
// initialized (zero), so a constructor that runs before this file's initializers may use it.
constinit std::atomic<bool> gWarned[std::size(kConfigVars)] = {};

} // namespace

int parse(const ConfigVar &var, const char *text, int64_t *out)
{
    if (!text || !*text || var.kind == Kind::Text)
        return -ENOENT;
    if (var.kind == Kind::Level) {
        for (int i = 0; i < 5; i++) {
            if (!strcasecmp(text, kLevelNames[i]) && i >= var.min && i <= var.max) {
                *out = i;
                return 0;
            }
        }
        return -EINVAL;
    }
    uint64_t v;
    // errno is the caller's: parseSize sets it through strtoull.
    const int saved = errno;
    const int rc = parseSize(text, &v);
    errno = saved;
    if (rc < 0)
        return rc;
    switch (var.kind) {
    case Kind::Flag:
        *out = v != 0;
        return 0;
    case Kind::NumberOrZero:
        if (v == 0) {
            *out = 0;
            return 0;
        }
        [[fallthrough]];
    default:
        if (v < uint64_t(var.min) || v > uint64_t(var.max))
            return -EINVAL;
        *out = static_cast<int64_t>(v);
        return 0;
    }
}

int64_t defaultValue(const ConfigVar &var)
{
    int64_t v = 0;
    return parse(var, var.defaultText, &v) == 0 ? v : 0;
}

int read(const char *name, int64_t *out)
{
    const ConfigVar *var = find(name);
    if (!var)
        return -EINVAL;
    return parse(*var, std::getenv(name), out);
}

int64_t getInt(const char *name, int64_t fallback)
{
    return valueOf(name, std::getenv(name), fallback);
}

int64_t valueOf(const char *name, const char *text, int64_t fallback)
{
    const ConfigVar *var = find(name);
    if (!var) {
        RS_LOG(Error, "internal error: %s is not in the configuration table", name);
        return fallback;
    }
    int64_t v;
    const int rc = parse(*var, text, &v);
    if (rc == 0)
        return v;
    if (rc == -EINVAL && !gWarned[var - kConfigVars].exchange(true, std::memory_order_relaxed))
        RS_LOG(Warn, "ignoring %s=%s: invalid or out of range", name, text);
    return fallback;
}

int64_t getInt(const char *name)
{
    const ConfigVar *var = find(name);
    return getInt(name, var ? defaultValue(*var) : 0);
}

bool getFlag(const char *name)
{
    return getInt(name) != 0;
}

const char *getString(const char *name)
{
    if (!find(name)) {
        RS_LOG(Error, "internal error: %s is not in the configuration table", name);
        return nullptr;
    }
    const char *text = std::getenv(name);
    return text && *text ? text : nullptr;
}

} // namespace config
} // namespace rstream
