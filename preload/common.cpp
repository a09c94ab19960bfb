// SPDX-License-Identifier: MIT
// The Shim object and its tables' bookkeeping, the configuration and the error sink.

#include <type_traits>

#include "address.h"
#include "settings.h"
#include "shim_object.h"

namespace rstream::shim {

static_assert(std::is_trivially_destructible_v<Shim>,
              "the Shim object (its fd tables) must outlive every destructor and atexit handler");

constinit Shim gShim;

bool Shim::installSocket(int fd, std::shared_ptr<HybridSocket> s)
{
    if (!sockets_.set(fd, std::move(s)))
        return false;
    int m = fdBound_.load(std::memory_order_relaxed);
    while (fd >= m && !fdBound_.compare_exchange_weak(m, fd + 1, std::memory_order_relaxed)) {
    }
    return true;
}

void Shim::releaseFd(int fd)
{
    const int saved = errno;
    if (auto s = sockets_.take(fd)) {
        try {
            NoCancel nc;
            EngineCall ec;
            s->onFdClosed(fd);
            s.reset(); // the last reference may tear the engine side down: still inside
        } catch (...) {
            noteInternalError();
        }
    }
    if (auto k = kernelConns_.take(fd)) {
        try {
            NoCancel nc;
            EngineCall ec;
            k->readKernelBytes(fd);
            k.reset(); // the last descriptor: the record closes
        } catch (...) {
            noteInternalError();
        }
    }
    epolls_.take(fd);
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
    if (s->mode() == HybridSocket::Mode::Kernel && !s->upgradePending())
        return nullptr;
    return s; // moved: a conditional expression would copy it (two atomic counts a lookup)
}

} // namespace

std::shared_ptr<HybridSocket> Shim::engineSocket(int fd, const void *ra)
{
    if (__builtin_expect(tDepth > 0 || !sockets_.has(fd), 1))
        return nullptr;
    if (internalAddress(ra))
        return nullptr;
    return unlessKernel(sockets_.get(fd));
}

std::shared_ptr<Pollable> resolvePollable(int fd)
{
    return shim().pollable(fd);
}

std::shared_ptr<Pollable> Shim::pollable(int fd)
{
    if (!sockets_.has(fd)) {
        // An epoll fd holding engine sockets, inside poll() or another epoll.
        if (epolls_.has(fd)) {
            auto set = epolls_.get(fd);
            if (set && set->engine.load(std::memory_order_acquire))
                return set;
        }
        return nullptr;
    }
    return unlessKernel(sockets_.get(fd));
}

void Shim::trackKernelAccept(int listenFd, int fd, bool dual, int flags,
                             const sockaddr_storage *peer, socklen_t plen)
{
    const int saved = errno;
    try {
        NoCancel nc;
        EngineCall ec;
        Fallback why = Fallback::KernelPeer;
        if (!dual) {
            auto listener = sockets_.get(listenFd);
            if (!listener || !listener->kernelListener(&why)) {
                errno = saved;
                return;
            }
        }
        if (dual) {
            // Served by a listener of ours: the client may offer an in-band upgrade, which the
            // process that does the first I/O takes (decided, and counted, then).
            // The new fd is nonblocking exactly when accept4 was asked to make it so.
            auto listener = sockets_.get(listenFd);
            if (listener) {
                auto s = HybridSocket::acceptedKernel(fd, listener->family(), flags & SOCK_NONBLOCK,
                                                      shimConfig());
                sockaddr_storage local;
                const socklen_t llen = listener->acceptedLocal(&local);
                if (llen || plen)
                    s->knowAddresses(local, llen, plen ? *peer : sockaddr_storage{}, plen);
                if (installSocket(fd, std::move(s))) {
                    errno = saved;
                    return;
                }
            }
        }
        sockaddr_storage kLocal{};
        sockaddr_storage kPeer{};
        socklen_t kLocalLen = sizeof(kLocal);
        socklen_t kPeerLen = sizeof(kPeer);
        if (real.getsockname()(fd, reinterpret_cast<sockaddr *>(&kLocal), &kLocalLen) != 0)
            kLocalLen = 0;
        if (real.getpeername()(fd, reinterpret_cast<sockaddr *>(&kPeer), &kPeerLen) != 0)
            kPeerLen = 0;
        auto record = std::make_shared<ConnRecord>(fd, false, why, true,
                                                   reinterpret_cast<sockaddr *>(&kLocal), kLocalLen,
                                                   reinterpret_cast<sockaddr *>(&kPeer), kPeerLen);
        countFallback(why);
        RS_LOG_FD(Info, fd, "kernel TCP from %s: %s (%s)",
                  addressText(reinterpret_cast<sockaddr *>(&kPeer)).c_str(), fallbackName(why),
                  dual ? "the peer connected over kernel TCP"
                       : "accepted on a listener without a fabric side");
        kernelConns_.set(fd, std::move(record));
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
