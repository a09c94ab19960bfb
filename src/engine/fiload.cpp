// SPDX-License-Identifier: MIT
// libfabric, loaded on first use rather than with the program.
//
// libfabric brings its providers' libraries with it, and on Debian one of them, libinfinipath,
// sleeps about 0.2 s in its constructor and takes SIGINT, SIGTERM and the fault signals for
// itself. Linked as a dependency it would do so in every program the shim is preloaded into,
// before the shim's own constructor could look at the signals the program was started with
// (a signal ignored at exec came back with its default action). So neither librstream.so nor
// the shim depends on libfabric: the five functions the engine calls by symbol (everything
// else in libfabric's API goes through the objects' operation tables) are defined here and
// load libfabric the first time one of them is called, which is when a fabric socket is
// first made. By then the constructors have set IPATH_NO_BACKTRACE, so libinfinipath leaves
// the signals alone; a handler that a fabric library installs anyway is replaced by what the
// signal had just before.

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <dlfcn.h>
#include <mutex>

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include "crash.h"
#include "fabric.h"
#include "log.h"

namespace rstream {

namespace {

// The versions of the symbols a program built against these headers binds to: the layouts of
// struct fi_info and its attributes that the headers describe.
struct Api
{
    decltype(&::fi_getinfo) getinfo = nullptr;
    decltype(&::fi_freeinfo) freeinfo = nullptr;
    decltype(&::fi_dupinfo) dupinfo = nullptr;
    decltype(&::fi_fabric) fabric = nullptr;
    decltype(&::fi_strerror) strerror = nullptr;
};

constexpr const char *kLibrary = "libfabric.so.1";

std::once_flag gOnce;
Api gApi;
// The engine's calls into libfabric (the first of them sets up its providers).
thread_local bool tInLibrary = false;
bool gProgramsLibrary = false; // libfabric was loaded before the engine loaded it
struct InLibrary
{
    InLibrary() { tInLibrary = true; }
    ~InLibrary() { tInLibrary = false; }
    InLibrary(const InLibrary &) = delete;
    InLibrary &operator=(const InLibrary &) = delete;
};
bool gLoaded = false;
uint32_t gVersion = 0;          // the loaded library's fi_version()
std::atomic<bool> gDone{false}; // the load is over, whatever its outcome

template <typename F>
bool bind(void *lib, const char *name, const char *version, F *out)
{
    void *sym = dlvsym(lib, name, version);
    if (!sym) {
        RS_LOG(Error, "%s has no %s@%s: the fabric is not used", kLibrary, name, version);
        return false;
    }
    *out = reinterpret_cast<F>(sym);
    return true;
}

void load()
{
    struct sigaction before[std::size(kFabricLibrarySignals)];
    for (size_t i = 0; i < std::size(kFabricLibrarySignals); i++)
        sigaction(kFabricLibrarySignals[i], nullptr, &before[i]);
    if (void *had = dlopen(kLibrary, RTLD_LAZY | RTLD_NOLOAD)) {
        gProgramsLibrary = true;
        dlclose(had);
    }
    void *lib = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!lib) {
        const char *why = dlerror();
        RS_LOG(Error, "cannot load %s (%s): the fabric is not used", kLibrary, why ? why : "?");
        return;
    }
    for (size_t i = 0; i < std::size(kFabricLibrarySignals); i++) {
        struct sigaction now;
        if (sigaction(kFabricLibrarySignals[i], nullptr, &now) == 0 &&
            isFabricLibraryHandler(now)) {
            sigaction(kFabricLibrarySignals[i], &before[i], nullptr);
            RS_LOG(Debug, "signal %d: a fabric library's handler replaced by the one before it",
                   kFabricLibrarySignals[i]);
        }
    }
    // Structures laid out as these headers say need a library at least as new.
    decltype(&::fi_version) version = nullptr;
    if (!bind(lib, "fi_version", "FABRIC_1.0", &version))
        return;
    const uint32_t v = version();
    if (v < FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION)) {
        RS_LOG(Error,
               "%s is version %u.%u, older than the %u.%u rstream was built with: the "
               "fabric is not used",
               kLibrary, FI_MAJOR(v), FI_MINOR(v), FI_MAJOR_VERSION, FI_MINOR_VERSION);
        return;
    }
    Api a;
    if (bind(lib, "fi_getinfo", "FABRIC_1.3", &a.getinfo) &&
        bind(lib, "fi_freeinfo", "FABRIC_1.3", &a.freeinfo) &&
        bind(lib, "fi_dupinfo", "FABRIC_1.3", &a.dupinfo) &&
        bind(lib, "fi_fabric", "FABRIC_1.1", &a.fabric) &&
        bind(lib, "fi_strerror", "FABRIC_1.0", &a.strerror)) {
        gApi = a;
        gVersion = v;
        gLoaded = true;
        RS_LOG(Debug, "%s %u.%u loaded", kLibrary, FI_MAJOR(v), FI_MINOR(v));
    }
}

const Api *api()
{
    std::call_once(gOnce, [] {
        load();
        gDone.store(true, std::memory_order_release);
    });
    return gLoaded ? &gApi : nullptr;
}

} // namespace

bool fabricLoadDone()
{
    return gDone.load(std::memory_order_acquire);
}

// libfabric 1.17's verbs provider, when it is set up (every provider is, at the first
// fi_getinfo, whichever is asked for), reads /proc/kallsyms from end to end twice, a line at a
// time, for two kernel symbols that say whether it may register GPU memory (peer memory,
// dma-buf). On a kernel without them that is two full reads of a 5 MB file the kernel formats
// as it goes: 70-90 ms of CPU, most of what loading libfabric costs a process (fi_info: 0.11 s
// of CPU, 0.02 s without the reads). The engine registers only host memory, so the shim's
// fopen() says the file does not exist and both features stay off, for the engine's first
// calls only; a program that loaded libfabric itself keeps what its own providers find (it
// may register GPU memory through them).
bool fabricHidesFile(const char *path)
{
    return tInLibrary && !gProgramsLibrary && path && std::strcmp(path, "/proc/kallsyms") == 0;
}

uint32_t fabricLibraryVersion()
{
    return api() ? gVersion : 0;
}

} // namespace rstream

using rstream::api;
using rstream::InLibrary;

extern "C" {

int fi_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags,
               const struct fi_info *hints, struct fi_info **info)
{
    const auto *a = api();
    if (!a)
        return -FI_ENOSYS;
    InLibrary in;
    return a->getinfo(version, node, service, flags, hints, info);
}

void fi_freeinfo(struct fi_info *info)
{
    // Anything to free came from libfabric, which is loaded then.
    if (const auto *a = info ? api() : nullptr)
        a->freeinfo(info);
}

struct fi_info *fi_dupinfo(const struct fi_info *info)
{
    const auto *a = api();
    if (!a) {
        errno = ENOSYS;
        return nullptr;
    }
    return a->dupinfo(info);
}

int fi_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context)
{
    const auto *a = api();
    if (!a)
        return -FI_ENOSYS;
    InLibrary in;
    return a->fabric(attr, fabric, context);
}

const char *fi_strerror(int errnum)
{
    const auto *a = api();
    return a ? a->strerror(errnum) : strerror(errnum);
}

} // extern "C"
