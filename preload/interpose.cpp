// SPDX-License-Identifier: MIT
// Interposers for socket setup, descriptor management and socket options.

#include <cstdarg>

#include "shim.h"

using namespace rstream;
using namespace rstream::shim;

namespace {

bool candidate(int domain, int type, int protocol)
{
    return (domain == AF_INET || domain == AF_INET6) && (type & 0xf) == SOCK_STREAM &&
           (protocol == 0 || protocol == IPPROTO_TCP) &&
           !gChildKernelOnly.load(std::memory_order_relaxed);
}

// A new fd from the kernel: internal callers' go high, the program's replace stale entries.
int placeNew(const void *ra, int fd)
{
    if (fd < 0)
        return fd;
    if (internalCall(ra))
        return moveHigh(fd);
    forgetStale(fd);
    return fd;
}

// Same for a pair (pipe, socketpair).
void placePair(const void *ra, int fds[2])
{
    if (internalCall(ra)) {
        fds[0] = moveHigh(fds[0]);
        fds[1] = moveHigh(fds[1]);
    } else {
        forgetStale(fds[0]);
        forgetStale(fds[1]);
    }
}

// After a successful dup of oldfd to newfd: the new number names the same socket.
void afterDup(int oldfd, int newfd)
{
    forgetStale(newfd);
    if (gSockets.has(oldfd))
        if (auto s = gSockets.get(oldfd))
            installSocket(newfd, std::move(s));
    if (gEpolls.has(oldfd))
        if (auto e = gEpolls.get(oldfd))
            gEpolls.set(newfd, std::move(e));
    if (gKernelConns.has(oldfd))
        if (auto k = gKernelConns.get(oldfd))
            gKernelConns.set(newfd, std::move(k));
}

// Runs an engine call that glibc declares noexcept: no cancellation inside.
template <class F>
int quiet(F &&f)
{
    return boundary([&]() -> int {
        NoCancel nc;
        EngineCall ec;
        return f();
    });
}

template <class Real>
int acceptImpl(const void *ra, Real real, int fd, sockaddr *addr, socklen_t *len, int flags)
{
    if (internalCall(ra))
        return moveHigh(real());
    auto s = engineSocket(fd, ra);
    if (!s) {
        int r = real();
        if (r >= 0) {
            forgetStale(r);
            // A listener of ours that serves kernel TCP only.
            if (tDepth == 0 && gSockets.has(fd))
                trackKernelAccept(fd, r, false);
        }
        return r;
    }
    return boundary([&]() -> int {
        pthread_testcancel();
        std::shared_ptr<HybridSocket> fresh;
        int r;
        {
            EngineCall ec;
            r = s->accept(addr, len, flags, &fresh);
        }
        if (r < 0)
            return r;
        forgetStale(r);
        if (fresh) {
            if (!installSocket(r, std::move(fresh)))
                RS_LOG_FD(Error, r, "preload: beyond the fd table; its connection is lost");
        } else {
            trackKernelAccept(fd, r, true);
        }
        return r;
    });
}

template <class Fn>
int fcntlImpl(const void *ra, Fn real, int fd, int cmd, void *arg)
{
    if (tDepth > 0)
        return real(fd, cmd, arg);
    switch (cmd) {
    case F_DUPFD:
    case F_DUPFD_CLOEXEC: {
        int r = real(fd, cmd, arg);
        if (r >= 0 && !internalAddress(ra))
            afterDup(fd, r);
        return r;
    }
    case F_GETFL:
    case F_SETFL:
        if (auto s = engineSocket(fd, ra)) {
            return boundary([&]() -> int {
                EngineCall ec;
                return cmd == F_GETFL
                           ? s->getFlags()
                           : s->setFlags(static_cast<int>(reinterpret_cast<intptr_t>(arg)));
            });
        }
        break;
    default:
        break;
    }
    return real(fd, cmd, arg);
}

template <class Dup>
int dupOnto(const void *ra, Dup dup, int oldfd, int newfd)
{
    if (tDepth > 0 || oldfd == newfd ||
        !(gSockets.has(newfd) || gEpolls.has(newfd) || gKernelConns.has(newfd) ||
          gSockets.has(oldfd) || gEpolls.has(oldfd) || gKernelConns.has(oldfd)) ||
        internalAddress(ra))
        return dup();
    // dup2 closes newfd as close does: release ours there first, once oldfd is known to be
    // valid (a failing dup2 leaves newfd open).
    if (real_fcntl()(oldfd, F_GETFD) < 0)
        return -1;
    releaseFd(newfd);
    int r = dup();
    if (r >= 0)
        afterDup(oldfd, r);
    return r;
}

} // namespace

// ---- Creation ---------------------------------------------------------------------------------

RS_EXPORT int socket(int domain, int type, int protocol) noexcept
{
    const void *ra = RS_CALLER();
    int fd = real_socket()(domain, type, protocol);
    if (fd < 0)
        return fd;
    if (internalCall(ra))
        return moveHigh(fd);
    forgetStale(fd);
    if (!candidate(domain, type, protocol) || fd >= FdTable<HybridSocket>::kMaxFd)
        return fd;
    const int saved = errno;
    try {
        NoCancel nc;
        EngineCall ec;
        const ShimConfig &config = shimConfig();
        if (config.enabled)
            installSocket(fd, std::make_shared<HybridSocket>(
                                  fd, domain, (type & SOCK_NONBLOCK) != 0, config));
    } catch (...) {
        // The socket stays on kernel TCP.
        noteInternalError();
    }
    errno = saved;
    return fd;
}

RS_EXPORT int socketpair(int domain, int type, int protocol, int sv[2]) noexcept
{
    const void *ra = RS_CALLER();
    int r = real_socketpair()(domain, type, protocol, sv);
    if (r == 0)
        placePair(ra, sv);
    return r;
}

RS_EXPORT int eventfd(unsigned int count, int flags) noexcept
{
    const void *ra = RS_CALLER();
    return placeNew(ra, real_eventfd()(count, flags));
}

RS_EXPORT int pipe(int fds[2]) noexcept
{
    const void *ra = RS_CALLER();
    int r = real_pipe()(fds);
    if (r == 0)
        placePair(ra, fds);
    return r;
}

RS_EXPORT int pipe2(int fds[2], int flags) noexcept
{
    const void *ra = RS_CALLER();
    int r = real_pipe2()(fds, flags);
    if (r == 0)
        placePair(ra, fds);
    return r;
}

RS_EXPORT int accept(int fd, sockaddr *addr, socklen_t *len)
{
    const void *ra = RS_CALLER();
    return acceptImpl(
        ra, [&] { return real_accept()(fd, addr, len); }, fd, addr, len, 0);
}

RS_EXPORT int accept4(int fd, sockaddr *addr, socklen_t *len, int flags)
{
    const void *ra = RS_CALLER();
    return acceptImpl(
        ra, [&] { return real_accept4()(fd, addr, len, flags); }, fd, addr, len, flags);
}

// ---- Setup and options ------------------------------------------------------------------------

RS_EXPORT int bind(int fd, const sockaddr *addr, socklen_t len) noexcept
{
    auto s = engineSocket(fd, RS_CALLER());
    if (!s)
        return real_bind()(fd, addr, len);
    return quiet([&] { return s->bind(addr, len); });
}

RS_EXPORT int listen(int fd, int backlog) noexcept
{
    auto s = engineSocket(fd, RS_CALLER());
    if (!s)
        return real_listen()(fd, backlog);
    return quiet([&] { return s->listen(backlog); });
}

RS_EXPORT int connect(int fd, const sockaddr *addr, socklen_t len)
{
    auto s = engineSocket(fd, RS_CALLER());
    if (!s)
        return real_connect()(fd, addr, len);
    return boundary([&]() -> int {
        pthread_testcancel();
        EngineCall ec;
        return s->connect(addr, len);
    });
}

RS_EXPORT int shutdown(int fd, int how) noexcept
{
    auto s = engineSocket(fd, RS_CALLER());
    if (!s)
        return real_shutdown()(fd, how);
    return quiet([&] { return s->shutdown(how); });
}

RS_EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len) noexcept
{
    auto s = engineSocket(fd, RS_CALLER());
    if (!s)
        return real_getsockopt()(fd, level, name, val, len);
    return quiet([&] { return s->getsockopt(level, name, val, len); });
}

RS_EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len) noexcept
{
    auto s = engineSocket(fd, RS_CALLER());
    if (!s)
        return real_setsockopt()(fd, level, name, val, len);
    return quiet([&] { return s->setsockopt(level, name, val, len); });
}

RS_EXPORT int getsockname(int fd, sockaddr *addr, socklen_t *len) noexcept
{
    auto s = engineSocket(fd, RS_CALLER());
    if (!s)
        return real_getsockname()(fd, addr, len);
    return quiet([&] { return s->getsockname(addr, len); });
}

RS_EXPORT int getpeername(int fd, sockaddr *addr, socklen_t *len) noexcept
{
    auto s = engineSocket(fd, RS_CALLER());
    if (!s)
        return real_getpeername()(fd, addr, len);
    return quiet([&] { return s->getpeername(addr, len); });
}

// ---- Descriptors ------------------------------------------------------------------------------

RS_EXPORT int close(int fd)
{
    if (__builtin_expect(
            tDepth == 0 && (gSockets.has(fd) || gEpolls.has(fd) || gKernelConns.has(fd)), 0) &&
        !internalAddress(RS_CALLER()))
        releaseFd(fd);
    return real_close()(fd);
}

RS_EXPORT int dup(int fd) noexcept
{
    int r = real_dup()(fd);
    if (r >= 0 && tDepth == 0 && !internalAddress(RS_CALLER()))
        afterDup(fd, r);
    return r;
}

RS_EXPORT int dup2(int oldfd, int newfd) noexcept
{
    return dupOnto(
        RS_CALLER(), [&] { return real_dup2()(oldfd, newfd); }, oldfd, newfd);
}

RS_EXPORT int dup3(int oldfd, int newfd, int flags) noexcept
{
    return dupOnto(
        RS_CALLER(), [&] { return real_dup3()(oldfd, newfd, flags); }, oldfd, newfd);
}

RS_EXPORT int fcntl(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *); // as glibc reads it: an int or a pointer, one register
    va_end(ap);
    return fcntlImpl(RS_CALLER(), real_fcntl(), fd, cmd, arg);
}

RS_EXPORT int fcntl64(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return fcntlImpl(RS_CALLER(), real_fcntl64(), fd, cmd, arg);
}

RS_EXPORT int ioctl(int fd, unsigned long request, ...) noexcept
{
    va_list ap;
    va_start(ap, request);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    if (request == FIONBIO || request == FIONREAD) {
        if (auto s = engineSocket(fd, RS_CALLER())) {
            if (request == FIONBIO) {
                return quiet([&]() -> int {
                    if (!arg)
                        return -EFAULT;
                    const bool on = *static_cast<int *>(arg) != 0;
                    int flags = s->getFlags();
                    if (flags < 0)
                        return flags;
                    return s->setFlags(on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK);
                });
            }
            if (dataMode(s->mode())) {
                return quiet([&]() -> int {
                    if (!arg)
                        return -EFAULT;
                    int bytes = 0;
                    int r = s->fionread(&bytes);
                    if (r < 0)
                        return r;
                    *static_cast<int *>(arg) = bytes;
                    return 0;
                });
            }
        }
    }
    return real_ioctl()(fd, request, arg);
}
