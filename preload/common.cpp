// SPDX-License-Identifier: MIT
// The shim's process-wide state: the fd tables, the configuration and the error sink.

#include <type_traits>

#include "address.h"
#include "settings.h"
#include "shim.h"

namespace rstream::shim {

static_assert(std::is_trivially_destructible_v<FdTable<HybridSocket>>,
              "the fd tables must outlive every destructor and atexit handler");

constinit FdTable<HybridSocket> gSockets;
constinit FdTable<ShimEpoll> gEpolls;
constinit FdTable<ConnRecord> gKernelConns;
std::atomic<int> gMaxFd{-1};
std::atomic<bool> gChildKernelOnly{false};

bool installSocket(int fd, std::shared_ptr<HybridSocket> s)
{
    if (!gSockets.set(fd, std::move(s)))
        return false;
    int m = gMaxFd.load(std::memory_order_relaxed);
    while (fd > m && !gMaxFd.compare_exchange_weak(m, fd, std::memory_order_relaxed)) {
    }
    return true;
}

void releaseFd(int fd)
{
    const int saved = errno;
    if (auto s = gSockets.take(fd)) {
        try {
            NoCancel nc;
            EngineCall ec;
            s->onFdClosed(fd);
            s.reset(); // the last reference may tear the engine side down: still inside
        } catch (...) {
            noteInternalError();
        }
    }
    if (auto k = gKernelConns.take(fd)) {
        try {
            NoCancel nc;
            EngineCall ec;
            k->readKernelBytes(fd);
            k.reset(); // the last descriptor: the record closes
        } catch (...) {
            noteInternalError();
        }
    }
    gEpolls.take(fd);
    errno = saved;
}

const ShimConfig &shimConfig()
{
    // Leaked: sockets keep a reference to it until the process ends.
    static const ShimConfig *config = new ShimConfig(ShimConfig::fromEnv());
    return *config;
}

int spinUs()
{
    // The first call reads the environment and may log: an engine call.
    EngineCall ec;
    return static_cast<int>(Settings::fromEnv().pollUs);
}

namespace {

// The socket, once a background fabric attempt it may have made has settled, unless the kernel
// fd answers for it.
std::shared_ptr<HybridSocket> unlessKernel(std::shared_ptr<HybridSocket> s)
{
    if (!s)
        return nullptr;
    s->settle();
    return s->mode() == HybridSocket::Mode::Kernel ? nullptr : s;
}

} // namespace

std::shared_ptr<HybridSocket> engineSocket(int fd, const void *ra)
{
    if (__builtin_expect(tDepth > 0 || !gSockets.has(fd), 1))
        return nullptr;
    if (internalAddress(ra))
        return nullptr;
    return unlessKernel(gSockets.get(fd));
}

std::shared_ptr<Pollable> resolvePollable(int fd)
{
    if (!gSockets.has(fd)) {
        // An epoll fd holding engine sockets, inside poll() or another epoll.
        if (gEpolls.has(fd)) {
            auto set = gEpolls.get(fd);
            if (set && set->engine.load(std::memory_order_acquire))
                return set;
        }
        return nullptr;
    }
    return unlessKernel(gSockets.get(fd));
}

void trackKernelAccept(int listenFd, int fd, bool dual)
{
    const int saved = errno;
    try {
        NoCancel nc;
        EngineCall ec;
        Fallback why = Fallback::KernelPeer;
        if (!dual) {
            auto listener = gSockets.get(listenFd);
            if (!listener || !listener->kernelListener(&why)) {
                errno = saved;
                return;
            }
        }
        sockaddr_storage local{};
        sockaddr_storage peer{};
        socklen_t llen = sizeof(local);
        socklen_t plen = sizeof(peer);
        if (real_getsockname()(fd, reinterpret_cast<sockaddr *>(&local), &llen) != 0)
            llen = 0;
        if (real_getpeername()(fd, reinterpret_cast<sockaddr *>(&peer), &plen) != 0)
            plen = 0;
        auto record =
            std::make_shared<ConnRecord>(fd, false, why, true, reinterpret_cast<sockaddr *>(&local),
                                         llen, reinterpret_cast<sockaddr *>(&peer), plen);
        countFallback(why);
        RS_LOG_FD(Info, fd, "kernel TCP from %s: %s (%s)",
                  addressText(reinterpret_cast<sockaddr *>(&peer)).c_str(), fallbackName(why),
                  dual ? "the peer connected over kernel TCP"
                       : "accepted on a listener without a fabric side");
        gKernelConns.set(fd, std::move(record));
    } catch (...) {
        noteInternalError();
    }
    errno = saved;
}

void noteInternalError()
{
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true))
        RS_LOG(Error, "preload: internal error (reported to the application as EIO)");
}

} // namespace rstream::shim
