// SPDX-License-Identifier: MIT
// Where a code address lies, for crash reports: the loaded objects recorded at install time, and
// /proc/self/maps read with plain system calls for objects loaded later.

#include "dsomap.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <link.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace rstream::dsomap {

namespace {

// The loaded objects at install time (dl_iterate_phdr takes the loader's lock, so the handler
// cannot call it); objects loaded later are found in /proc/self/maps.
struct Dso
{
    uintptr_t lo;
    uintptr_t hi;
    uintptr_t base; // load bias: address - base is what addr2line takes
    char name[240];
};
constexpr int kMaxDsos = 256;
Dso gDsos[kMaxDsos];
int gNumDsos;

int collectDso(dl_phdr_info *info, size_t, void *)
{
    if (gNumDsos == kMaxDsos)
        return 1;
    uintptr_t lo = UINTPTR_MAX;
    uintptr_t hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) &ph = info->dlpi_phdr[i];
        if (ph.p_type != PT_LOAD)
            continue;
        lo = std::min<uintptr_t>(lo, info->dlpi_addr + ph.p_vaddr);
        hi = std::max<uintptr_t>(hi, info->dlpi_addr + ph.p_vaddr + ph.p_memsz);
    }
    if (lo >= hi)
        return 0;
    Dso &d = gDsos[gNumDsos++];
    d.lo = lo;
    d.hi = hi;
    d.base = info->dlpi_addr;
    const char *name = info->dlpi_name;
    if (name && *name) {
        strncpy(d.name, name, sizeof(d.name) - 1);
    } else {
        // The main program has no name here.
        const ssize_t n = readlink("/proc/self/exe", d.name, sizeof(d.name) - 1);
        if (n > 0)
            d.name[n] = '\0';
        else
            strcpy(d.name, "(program)");
    }
    return 0;
}

// Parses one /proc/self/maps line ("lo-hi perms offset dev inode path"); true when it maps addr.
bool mapsLineHas(const char *line, uintptr_t addr, uintptr_t *rel, const char **path)
{
    auto hexAt = [](const char *&p) {
        uintptr_t v = 0;
        for (;; p++) {
            const char c = *p;
            if (c >= '0' && c <= '9')
                v = v * 16 + static_cast<uintptr_t>(c - '0');
            else if (c >= 'a' && c <= 'f')
                v = v * 16 + static_cast<uintptr_t>(c - 'a' + 10);
            else
                return v;
        }
    };
    auto skipField = [](const char *&p) {
        while (*p == ' ')
            p++;
        while (*p && *p != ' ')
            p++;
    };
    const char *p = line;
    const uintptr_t lo = hexAt(p);
    if (*p++ != '-')
        return false;
    const uintptr_t hi = hexAt(p);
    if (addr < lo || addr >= hi)
        return false;
    skipField(p); // perms
    while (*p == ' ')
        p++;
    const uintptr_t offset = hexAt(p);
    skipField(p); // dev
    skipField(p); // inode
    while (*p == ' ')
        p++;
    *rel = addr - lo + offset;
    *path = p;
    return true;
}

// Looks addr up in /proc/self/maps with plain system calls; copies the mapping's path.
bool mapsLookup(uintptr_t addr, char *name, size_t cap, uintptr_t *rel)
{
    const long fd = syscall(SYS_openat, AT_FDCWD, "/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    char buf[4096];
    size_t have = 0;
    bool found = false;
    for (;;) {
        const long r = syscall(SYS_read, fd, buf + have, sizeof(buf) - 1 - have);
        if (r < 0 && errno == EINTR)
            continue;
        if (r > 0)
            have += static_cast<size_t>(r);
        size_t start = 0;
        for (size_t i = 0; i < have && !found; i++) {
            if (buf[i] != '\n')
                continue;
            buf[i] = '\0';
            const char *path = nullptr;
            if (mapsLineHas(buf + start, addr, rel, &path)) {
                strncpy(name, *path ? path : "(anonymous)", cap - 1);
                name[cap - 1] = '\0';
                found = true;
            }
            start = i + 1;
        }
        if (found || r <= 0)
            break;
        if (start == 0 && have == sizeof(buf) - 1)
            have = 0; // a line longer than the buffer: drop it
        else {
            memmove(buf, buf + start, have - start);
            have -= start;
        }
    }
    syscall(SYS_close, fd);
    return found;
}

} // namespace

void snapshot()
{
    gNumDsos = 0;
    dl_iterate_phdr(collectDso, nullptr);
}

bool lookup(uintptr_t addr, char *name, size_t cap, uintptr_t *rel)
{
    if (cap == 0)
        return false;
    for (int i = 0; i < gNumDsos; i++) {
        if (addr >= gDsos[i].lo && addr < gDsos[i].hi) {
            strncpy(name, gDsos[i].name, cap - 1);
            name[cap - 1] = '\0';
            *rel = addr - gDsos[i].base;
            return true;
        }
    }
    return mapsLookup(addr, name, cap, rel);
}

} // namespace rstream::dsomap
