// SPDX-License-Identifier: MIT
// Telling the shim's, libfabric's and the verbs libraries' own calls apart from the program's.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <link.h>
#include <mutex>
#include <sys/resource.h>
#include <vector>

#include "configvars.h"
#include "shim_object.h"

namespace rstream::shim {

constinit thread_local int tDepth __attribute__((tls_model("initial-exec"))) = 0;

namespace {

// ---- Address ranges ---------------------------------------------------------------------------

struct Range
{
    uintptr_t lo;
    uintptr_t hi;
    bool internal;
};

// An immutable, sorted snapshot of every loaded object's executable segments. Readers load the
// pointer and search without a lock; a refresh publishes a new snapshot and leaks the old one
// (a reader may still hold it; refreshes happen only after a dlopen).
struct RangeSet
{
    unsigned long long adds; // dl_iterate_phdr's load counter when the snapshot was taken
    size_t n;
    Range r[];
};

std::atomic<const RangeSet *> gRanges{nullptr};
std::mutex gRangesMutex;

// libfabric, its DSO providers (lib<name>-fi.so, under libfabric/), rdma-core's libibverbs,
// librdmacm and their providers (under libibverbs/, lib<name>-rdmav<N>.so) and the verbs
// providers' own libraries.
bool internalName(const char *path)
{
    if (!path || !*path)
        return false;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    static const char *const prefixes[] = {"libfabric", "libibverbs", "librdmacm", "libmlx4",
                                           "libmlx5",   "libefa",     "libpsm",    "librstream"};
    for (const char *p : prefixes)
        if (!strncmp(base, p, strlen(p)))
            return true;
    return strstr(base, "-fi.so") || strstr(base, "-rdmav") || strstr(path, "/libfabric/") ||
           strstr(path, "/libibverbs/");
}

struct Collect
{
    std::vector<Range> ranges;
    unsigned long long adds = 0;
};

int collectObject(dl_phdr_info *info, size_t, void *data)
{
    auto *c = static_cast<Collect *>(data);
    c->adds = info->dlpi_adds;
    // This module is recognized by address, whatever its file is called.
    const auto self = reinterpret_cast<uintptr_t>(&collectObject);
    bool internal = internalName(info->dlpi_name);
    for (int i = 0; i < info->dlpi_phnum && !internal; i++) {
        const ElfW(Phdr) &ph = info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
        if (ph.p_type == PT_LOAD && self >= lo && self < lo + ph.p_memsz)
            internal = true;
    }
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) &ph = info->dlpi_phdr[i];
        if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X))
            continue;
        uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
        c->ranges.push_back({lo, lo + ph.p_memsz, internal});
    }
    return 0;
}

int readAdds(dl_phdr_info *info, size_t, void *data)
{
    *static_cast<unsigned long long *>(data) = info->dlpi_adds;
    return 1; // the counter is the same in every entry: one is enough
}

const Range *findRange(const RangeSet *s, uintptr_t a)
{
    const Range *end = s->r + s->n;
    const Range *it =
        std::upper_bound(s->r, end, a, [](uintptr_t x, const Range &r) { return x < r.lo; });
    if (it == s->r)
        return nullptr;
    --it;
    return a < it->hi ? it : nullptr;
}

const RangeSet *refreshRanges()
{
    Collect c;
    dl_iterate_phdr(collectObject, &c);
    std::sort(c.ranges.begin(), c.ranges.end(),
              [](const Range &a, const Range &b) { return a.lo < b.lo; });
    auto *s = static_cast<RangeSet *>(malloc(sizeof(RangeSet) + c.ranges.size() * sizeof(Range)));
    if (!s)
        return nullptr;
    s->adds = c.adds;
    s->n = c.ranges.size();
    std::copy(c.ranges.begin(), c.ranges.end(), s->r);
    gRanges.store(s, std::memory_order_release);
    return s;
}

// ---- Descriptor limit -------------------------------------------------------------------------

// How far above the base the soft limit is raised at most.
constexpr rlim_t kInternalReserve = 65536;

} // namespace

bool internalAddress(const void *ra)
{
    const auto a = reinterpret_cast<uintptr_t>(ra);
    const RangeSet *s = gRanges.load(std::memory_order_acquire);
    if (s) {
        if (const Range *r = findRange(s, a))
            return r->internal;
        // Unknown code (a library loaded since, or generated code): look again only when an
        // object was loaded since the snapshot.
        unsigned long long adds = 0;
        dl_iterate_phdr(readAdds, &adds);
        if (adds == s->adds)
            return false;
    }
    std::lock_guard<std::mutex> lock(gRangesMutex);
    const RangeSet *now = gRanges.load(std::memory_order_acquire);
    if (now == s || !now)
        now = refreshRanges();
    if (!now)
        return false;
    const Range *r = findRange(now, a);
    return r && r->internal;
}

// RLIMIT_NOFILE: the program keeps the descriptor numbers it would have had without the shim,
// and select() users keep theirs below FD_SETSIZE, because the shim's own descriptors (the
// engine's and libfabric's sockets, eventfds, epoll fds, pipes) live at or above
// base = max(FD_SETSIZE, the original soft limit). To make room there, the constructor raises
// the soft limit towards the hard limit, but to at most base + 65536: containers often have
// hard limits near a billion, and programs that size tables by the limit or close every fd up
// to it would pay for all of it. The program sees the raised soft limit in getrlimit (it only
// ever allows more). When the hard limit leaves no room above the base, or the program later
// lowers its limit, internal fds stay where the kernel put them. Where the soft limit already is
// the hard one (common in containers, and so on these machines), nothing can be raised: the
// shim's fds then take the upper half of the limit instead, so that the program's stay low and
// dense up to half its limit (a program sizing a table by its connection count, as wrk's event
// loop does, would otherwise see descriptor numbers past its table's end).
// Limits survive exec but our memory does not: the original soft limit travels to exec'd
// children in RSTREAM_NOFILE_ORIG, so that a preloaded child (`env LD_PRELOAD=... prog`, a
// shell script) does not take the raised limit for its original one.
void initFdLimit()
{
    rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    rlim_t original = rl.rlim_cur;
    // Silently: a value above the current limit is a stale one, not a user's mistake.
    int64_t inherited;
    if (config::read("RSTREAM_NOFILE_ORIG", &inherited) == 0 && rlim_t(inherited) <= rl.rlim_cur)
        original = static_cast<rlim_t>(inherited);
    char text[32];
    snprintf(text, sizeof(text), "%llu", static_cast<unsigned long long>(original));
    setenv("RSTREAM_NOFILE_ORIG", text, 1);
    rlim_t base = std::max<rlim_t>(FD_SETSIZE, original);
    rlim_t want = rl.rlim_max;
    if (want == RLIM_INFINITY || want > base + kInternalReserve)
        want = base + kInternalReserve;
    if (want > rl.rlim_cur) {
        rlimit raised{want, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &raised) == 0)
            rl.rlim_cur = want;
        else
            RS_LOG(Info, "preload: cannot raise RLIMIT_NOFILE to %llu", (unsigned long long)want);
    }
    if (rl.rlim_cur <= base)
        base = std::max<rlim_t>(FD_SETSIZE, rl.rlim_cur / 2);
    if (rl.rlim_cur > base && base < static_cast<rlim_t>(FdTable<HybridSocket>::kMaxFd))
        setHighFdBase(static_cast<int>(base));
    // Prime the address ranges while the process is still quiet.
    internalAddress(reinterpret_cast<const void *>(&initFdLimit));
}

} // namespace rstream::shim
