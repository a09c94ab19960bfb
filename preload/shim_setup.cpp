// SPDX-License-Identifier: MIT
// The Shim object's socket setup, descriptor management and socket options.

#include "shim_object.h"

namespace rstream::shim {

namespace {

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

} // namespace

bool Shim::candidate(int domain, int type, int protocol) const
{
    return (domain == AF_INET || domain == AF_INET6) && (type & 0xf) == SOCK_STREAM &&
           (protocol == 0 || protocol == IPPROTO_TCP);
}

// A new fd from the kernel: internal callers' go high, the program's replace stale entries.
int Shim::placeNew(const void *ra, int fd)
{
    if (fd < 0)
        return fd;
    if (internalCall(ra))
        return moveHigh(fd);
    forgetStale(fd);
    return fd;
}

// Same for a pair (pipe, socketpair).
void Shim::placePair(const void *ra, int fds[2])
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
void Shim::afterDup(int oldfd, int newfd)
{
    forgetStale(newfd);
    if (sockets_.has(oldfd))
        if (auto s = sockets_.get(oldfd))
            installSocket(newfd, std::move(s));
    if (epolls_.has(oldfd))
        if (auto e = epolls_.get(oldfd))
            epolls_.set(newfd, std::move(e));
    if (kernelConns_.has(oldfd))
        if (auto k = kernelConns_.get(oldfd))
            kernelConns_.set(newfd, std::move(k));
}

template <class Real>
int Shim::acceptImpl(const void *ra, Real kernel, int fd, sockaddr *addr, socklen_t *len, int flags)
{
    if (internalCall(ra))
        return moveHigh(kernel());
    auto s = engineSocket(fd, ra);
    if (!s) {
        int r = kernel();
        if (r >= 0) {
            forgetStale(r);
            // A listener of ours that serves kernel TCP only.
            if (tDepth == 0 && sockets_.has(fd))
                trackKernelAccept(fd, r, false, flags);
        }
        return r;
    }
    return boundary([&]() -> int {
        pthread_testcancel();
        std::shared_ptr<HybridSocket> fresh;
        sockaddr_storage peer;
        socklen_t plen = 0;
        int r;
        {
            EngineCall ec;
            r = s->accept(addr, len, flags, &fresh, &peer, &plen);
        }
        if (r < 0)
            return r;
        forgetStale(r);
        if (fresh) {
            if (!installSocket(r, std::move(fresh)))
                RS_LOG_FD(Error, r, "preload: beyond the fd table; its connection is lost");
        } else {
            trackKernelAccept(fd, r, true, flags, plen ? &peer : nullptr, plen);
        }
        return r;
    });
}

template <class Fn>
int Shim::fcntlImpl(const void *ra, Fn kernel, int fd, int cmd, void *arg)
{
    if (tDepth > 0)
        return kernel(fd, cmd, arg);
    switch (cmd) {
    case F_DUPFD:
    case F_DUPFD_CLOEXEC: {
        int r = kernel(fd, cmd, arg);
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
    return kernel(fd, cmd, arg);
}

template <class Dup>
int Shim::dupOnto(const void *ra, Dup kernel, int oldfd, int newfd)
{
    if (tDepth > 0 || oldfd == newfd || !(tracked(newfd) || tracked(oldfd)) || internalAddress(ra))
        return kernel();
    // dup2 closes newfd as close does: release ours there first, once oldfd is known to be
    // valid (a failing dup2 leaves newfd open).
    if (real.fcntl()(oldfd, F_GETFD) < 0)
        return -1;
    releaseFd(newfd);
    int r = kernel();
    if (r >= 0)
        afterDup(oldfd, r);
    return r;
}

// ---- Creation ---------------------------------------------------------------------------------

int Shim::socket(const void *ra, int domain, int type, int protocol)
{
    int fd = real.socket()(domain, type, protocol);
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
            installSocket(fd, std::make_shared<HybridSocket>(fd, domain,
                                                             (type & SOCK_NONBLOCK) != 0, config));
    } catch (...) {
        // The socket stays on kernel TCP.
        noteInternalError();
    }
    errno = saved;
    return fd;
}

int Shim::socketpair(const void *ra, int domain, int type, int protocol, int sv[2])
{
    int r = real.socketpair()(domain, type, protocol, sv);
    if (r == 0)
        placePair(ra, sv);
    return r;
}

int Shim::eventfd(const void *ra, unsigned int count, int flags)
{
    return placeNew(ra, real.eventfd()(count, flags));
}

int Shim::pipe(const void *ra, int fds[2])
{
    int r = real.pipe()(fds);
    if (r == 0)
        placePair(ra, fds);
    return r;
}

int Shim::pipe2(const void *ra, int fds[2], int flags)
{
    int r = real.pipe2()(fds, flags);
    if (r == 0)
        placePair(ra, fds);
    return r;
}

int Shim::accept(const void *ra, int fd, sockaddr *addr, socklen_t *len)
{
    return acceptImpl(
        ra, [&] { return real.accept()(fd, addr, len); }, fd, addr, len, 0);
}

int Shim::accept4(const void *ra, int fd, sockaddr *addr, socklen_t *len, int flags)
{
    return acceptImpl(
        ra, [&] { return real.accept4()(fd, addr, len, flags); }, fd, addr, len, flags);
}

// ---- Setup and options ------------------------------------------------------------------------

int Shim::bind(const void *ra, int fd, const sockaddr *addr, socklen_t len)
{
    auto s = engineSocket(fd, ra);
    if (!s)
        return real.bind()(fd, addr, len);
    return quiet([&] { return s->bind(addr, len); });
}

int Shim::listen(const void *ra, int fd, int backlog)
{
    auto s = engineSocket(fd, ra);
    if (!s)
        return real.listen()(fd, backlog);
    return quiet([&] { return s->listen(backlog); });
}

int Shim::connect(const void *ra, int fd, const sockaddr *addr, socklen_t len)
{
    auto s = engineSocket(fd, ra);
    if (!s)
        return real.connect()(fd, addr, len);
    return boundary([&]() -> int {
        pthread_testcancel();
        EngineCall ec;
        return s->connect(addr, len);
    });
}

int Shim::shutdown(const void *ra, int fd, int how)
{
    auto s = engineSocket(fd, ra);
    if (!s)
        return real.shutdown()(fd, how);
    return quiet([&] { return s->shutdown(how); });
}

int Shim::getsockopt(const void *ra, int fd, int level, int name, void *val, socklen_t *len)
{
    auto s = engineSocket(fd, ra);
    if (!s)
        return real.getsockopt()(fd, level, name, val, len);
    return quiet([&] { return s->getsockopt(level, name, val, len); });
}

int Shim::setsockopt(const void *ra, int fd, int level, int name, const void *val, socklen_t len)
{
    auto s = engineSocket(fd, ra);
    if (!s)
        return real.setsockopt()(fd, level, name, val, len);
    return quiet([&] { return s->setsockopt(level, name, val, len); });
}

int Shim::getsockname(const void *ra, int fd, sockaddr *addr, socklen_t *len)
{
    auto s = engineSocket(fd, ra);
    if (!s)
        return real.getsockname()(fd, addr, len);
    return quiet([&] { return s->getsockname(addr, len); });
}

int Shim::getpeername(const void *ra, int fd, sockaddr *addr, socklen_t *len)
{
    auto s = engineSocket(fd, ra);
    if (!s)
        return real.getpeername()(fd, addr, len);
    return quiet([&] { return s->getpeername(addr, len); });
}

// ---- Descriptors ------------------------------------------------------------------------------

int Shim::dup(const void *ra, int fd)
{
    int r = real.dup()(fd);
    if (r >= 0 && tDepth == 0 && !internalAddress(ra))
        afterDup(fd, r);
    return r;
}

int Shim::dup2(const void *ra, int oldfd, int newfd)
{
    return dupOnto(
        ra, [&] { return real.dup2()(oldfd, newfd); }, oldfd, newfd);
}

int Shim::dup3(const void *ra, int oldfd, int newfd, int flags)
{
    return dupOnto(
        ra, [&] { return real.dup3()(oldfd, newfd, flags); }, oldfd, newfd);
}

int Shim::fcntl(const void *ra, int fd, int cmd, void *arg)
{
    return fcntlImpl(ra, real.fcntl(), fd, cmd, arg);
}

int Shim::fcntl64(const void *ra, int fd, int cmd, void *arg)
{
    return fcntlImpl(ra, real.fcntl64(), fd, cmd, arg);
}

int Shim::ioctl(const void *ra, int fd, unsigned long request, void *arg)
{
    if (request == FIONBIO || request == FIONREAD) {
        if (auto s = engineSocket(fd, ra)) {
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
            if (dataMode(*s)) {
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
    return real.ioctl()(fd, request, arg);
}

} // namespace rstream::shim
