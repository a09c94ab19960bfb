// SPDX-License-Identifier: MIT
// librstream.so: the rsocket-style C API. Every entry point converts the engine's -errno once.
// The exported set and its symbol versions are defined by librstream.map.

#include <rstream/rsocket.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdarg>
#include <cxxabi.h>
#include <fcntl.h>
#include <new>
#include <pthread.h>
#include <unistd.h>

#include "boundary.h"
#include "crash.h"
#include "fdtable.h"
#include "kernel.h"
#include "log.h"
#include "poller.h"
#include "socket.h"

using namespace rstream;

static_assert(SOL_RDMA == kSolRdma && RDMA_SQSIZE == kRdmaSqSize && RDMA_RQSIZE == kRdmaRqSize &&
              RDMA_INLINE == kRdmaInline && RDMA_IOMAPSIZE == kRdmaIoMapSize &&
              RDMA_ROUTE == kRdmaRoute && RSTREAM_SEND_BUF == kSendBuf &&
              RSTREAM_RECV_BUF == kRecvBuf && RSTREAM_TX_SIZE == kTxSize &&
              RSTREAM_RX_SIZE == kRxSize);

namespace {

// Before libfabric is loaded (on first use, fiload.cpp), so that its libraries leave SIGINT and
// SIGTERM to the program (see resetFabricSignalHandlers).
__attribute__((constructor)) void rsocketInit()
{
    resetFabricSignalHandlers();
}

FdTable<Socket> &sockets()
{
    static auto *table = new FdTable<Socket>(); // never destroyed: used from atexit handlers
    return *table;
}

FdTable<EpollSet> &epolls()
{
    static auto *table = new FdTable<EpollSet>();
    return *table;
}

std::shared_ptr<Socket> resolve(int fd)
{
    return sockets().get(fd);
}

// Why fd is no rsocket: -ENOTSOCK when it is open (a pipe, a file, a kernel socket), as the
// kernel answers a socket call on a descriptor that is no socket, else -EBADF.
int notOurs(int fd)
{
    return sys::fcntl(fd, F_GETFD) >= 0 ? -ENOTSOCK : -EBADF;
}

std::shared_ptr<Pollable> resolvePollable(int fd)
{
    return sockets().get(fd);
}

int spinUs()
{
    return static_cast<int>(Settings::fromEnv().pollUs);
}

void internalError()
{
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true))
        RS_LOG(Error, "internal error in the rsocket API (reported as EIO)");
}

template <class F>
auto boundary(F &&f) -> decltype(f())
{
    return cBoundary(std::forward<F>(f), internalError);
}

// A real kernel socket stands for each rsocket, so rsocket numbers never collide with other
// fds, fit fd_set like any fd, and close-on-exec and fstat behave.
int placeholder(int domain, int type)
{
    return sys::socket(domain, SOCK_STREAM | (type & (SOCK_CLOEXEC | SOCK_NONBLOCK)), 0);
}

int install(int fd, std::shared_ptr<Socket> s)
{
    if (!sockets().set(fd, std::move(s))) {
        sys::close(fd);
        return -EMFILE;
    }
    return fd;
}

ssize_t doSend(int fd, const iovec *iov, int iovcnt, int flags)
{
    auto s = resolve(fd);
    if (!s)
        return notOurs(fd);
    if (iovcnt < 0 || iovcnt > IOV_MAX)
        return -EINVAL;
    ssize_t r = s->send(iov, iovcnt, flags);
    if (r == -EPIPE && !(flags & MSG_NOSIGNAL))
        pthread_kill(pthread_self(), SIGPIPE); // to the calling thread, as the kernel does
    return r;
}

ssize_t doRecv(int fd, const iovec *iov, int iovcnt, int flags)
{
    auto s = resolve(fd);
    if (!s)
        return notOurs(fd);
    if (iovcnt < 0 || iovcnt > IOV_MAX)
        return -EINVAL;
    return s->recv(iov, iovcnt, flags);
}

} // namespace

extern "C" {

__attribute__((visibility("default"))) int rsocket(int domain, int type, int protocol)
{
    return boundary([&]() -> int {
        std::shared_ptr<Socket> s;
        int ret = Socket::create(domain, type, protocol, &s);
        if (ret < 0)
            return ret;
        int fd = placeholder(domain, type);
        if (fd < 0)
            return fd;
        return install(fd, std::move(s));
    });
}

__attribute__((visibility("default"))) int rbind(int socket, const struct sockaddr *addr,
                                                 socklen_t addrlen)
{
    return boundary([&]() -> int {
        auto s = resolve(socket);
        return s ? s->bind(addr, addrlen) : notOurs(socket);
    });
}

__attribute__((visibility("default"))) int rlisten(int socket, int backlog)
{
    return boundary([&]() -> int {
        auto s = resolve(socket);
        return s ? s->listen(backlog) : notOurs(socket);
    });
}

__attribute__((visibility("default"))) int raccept(int socket, struct sockaddr *addr,
                                                   socklen_t *addrlen)
{
    pthread_testcancel();
    return boundary([&]() -> int {
        auto s = resolve(socket);
        if (!s)
            return notOurs(socket);
        // The descriptor first, as Linux does: at RLIMIT_NOFILE accept fails with EMFILE and
        // the connection stays queued, rather than being taken and dropped.
        int fd = placeholder(s->family(), SOCK_CLOEXEC);
        if (fd < 0)
            return fd;
        std::shared_ptr<Socket> ns;
        int ret = s->accept(&ns, addr, addrlen);
        if (ret < 0) {
            sys::close(fd);
            return ret;
        }
        return install(fd, std::move(ns));
    });
}

__attribute__((visibility("default"))) int rconnect(int socket, const struct sockaddr *addr,
                                                    socklen_t addrlen)
{
    pthread_testcancel();
    return boundary([&]() -> int {
        auto s = resolve(socket);
        return s ? s->connect(addr, addrlen) : notOurs(socket);
    });
}

__attribute__((visibility("default"))) int rshutdown(int socket, int how)
{
    return boundary([&]() -> int {
        auto s = resolve(socket);
        return s ? s->shutdown(how) : notOurs(socket);
    });
}

__attribute__((visibility("default"))) int rclose(int socket)
{
    return boundary([&]() -> int {
        if (auto s = sockets().take(socket)) {
            // The table lets go first, so the number cannot be found again once reused.
            sys::close(socket);
            s.reset(); // the connection closes when its last user is done, as in the kernel
            return 0;
        }
        if (auto e = epolls().take(socket)) {
            sys::close(socket);
            return 0;
        }
        return sys::close(socket);
    });
}

__attribute__((visibility("default"))) ssize_t rrecv(int socket, void *buf, size_t len, int flags)
{
    pthread_testcancel();
    return boundary([&]() -> ssize_t {
        iovec iov{buf, len};
        return doRecv(socket, &iov, 1, flags);
    });
}

__attribute__((visibility("default"))) ssize_t rrecvfrom(int socket, void *buf, size_t len,
                                                         int flags, struct sockaddr *src_addr,
                                                         socklen_t *addrlen)
{
    pthread_testcancel();
    return boundary([&]() -> ssize_t {
        iovec iov{buf, len};
        ssize_t r = doRecv(socket, &iov, 1, flags);
        if (r >= 0 && src_addr && addrlen)
            *addrlen = 0; // a stream socket reports no source address
        return r;
    });
}

__attribute__((visibility("default"))) ssize_t rrecvmsg(int socket, struct msghdr *msg, int flags)
{
    pthread_testcancel();
    return boundary([&]() -> ssize_t {
        if (!msg)
            return -EFAULT;
        ssize_t r = doRecv(socket, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
        if (r >= 0) {
            msg->msg_namelen = 0;
            msg->msg_controllen = 0;
            msg->msg_flags = 0;
        }
        return r;
    });
}

__attribute__((visibility("default"))) ssize_t rsend(int socket, const void *buf, size_t len,
                                                     int flags)
{
    pthread_testcancel();
    return boundary([&]() -> ssize_t {
        iovec iov{const_cast<void *>(buf), len};
        return doSend(socket, &iov, 1, flags);
    });
}

__attribute__((visibility("default"))) ssize_t
rsendto(int socket, const void *buf, size_t len, int flags, const struct sockaddr *, socklen_t)
{
    pthread_testcancel();
    return boundary([&]() -> ssize_t {
        // As TCP: the destination of a connected stream socket is ignored.
        iovec iov{const_cast<void *>(buf), len};
        return doSend(socket, &iov, 1, flags);
    });
}

__attribute__((visibility("default"))) ssize_t rsendmsg(int socket, const struct msghdr *msg,
                                                        int flags)
{
    pthread_testcancel();
    return boundary([&]() -> ssize_t {
        if (!msg)
            return -EFAULT;
        return doSend(socket, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
    });
}

__attribute__((visibility("default"))) ssize_t rread(int socket, void *buf, size_t count)
{
    pthread_testcancel();
    return boundary([&]() -> ssize_t {
        iovec iov{buf, count};
        return doRecv(socket, &iov, 1, 0);
    });
}

__attribute__((visibility("default"))) ssize_t rreadv(int socket, const struct iovec *iov,
                                                      int iovcnt)
{
    pthread_testcancel();
    return boundary([&]() -> ssize_t { return doRecv(socket, iov, iovcnt, 0); });
}

__attribute__((visibility("default"))) ssize_t rwrite(int socket, const void *buf, size_t count)
{
    pthread_testcancel();
    return boundary([&]() -> ssize_t {
        iovec iov{const_cast<void *>(buf), count};
        return doSend(socket, &iov, 1, 0);
    });
}

__attribute__((visibility("default"))) ssize_t rwritev(int socket, const struct iovec *iov,
                                                       int iovcnt)
{
    pthread_testcancel();
    return boundary([&]() -> ssize_t { return doSend(socket, iov, iovcnt, 0); });
}

__attribute__((visibility("default"))) int rpoll(struct pollfd *fds, nfds_t nfds, int timeout)
{
    pthread_testcancel();
    return boundary(
        [&]() -> int { return pollFds(fds, nfds, timeout, nullptr, resolvePollable, spinUs()); });
}

__attribute__((visibility("default"))) int rselect(int nfds, fd_set *readfds, fd_set *writefds,
                                                   fd_set *exceptfds, struct timeval *timeout)
{
    pthread_testcancel();
    return boundary([&]() -> int {
        return selectFds(nfds, readfds, writefds, exceptfds, timeout, nullptr, resolvePollable,
                         spinUs());
    });
}

__attribute__((visibility("default"))) int rgetpeername(int socket, struct sockaddr *addr,
                                                        socklen_t *addrlen)
{
    return boundary([&]() -> int {
        auto s = resolve(socket);
        return s ? s->peerAddress(addr, addrlen) : notOurs(socket);
    });
}

__attribute__((visibility("default"))) int rgetsockname(int socket, struct sockaddr *addr,
                                                        socklen_t *addrlen)
{
    return boundary([&]() -> int {
        auto s = resolve(socket);
        return s ? s->localAddress(addr, addrlen) : notOurs(socket);
    });
}

__attribute__((visibility("default"))) int rsetsockopt(int socket, int level, int optname,
                                                       const void *optval, socklen_t optlen)
{
    return boundary([&]() -> int {
        auto s = resolve(socket);
        return s ? s->setsockopt(level, optname, optval, optlen) : notOurs(socket);
    });
}

__attribute__((visibility("default"))) int rgetsockopt(int socket, int level, int optname,
                                                       void *optval, socklen_t *optlen)
{
    return boundary([&]() -> int {
        auto s = resolve(socket);
        return s ? s->getsockopt(level, optname, optval, optlen) : notOurs(socket);
    });
}

__attribute__((visibility("default"))) int rfcntl(int socket, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    long arg = va_arg(ap, long);
    va_end(ap);
    return boundary([&]() -> int {
        auto s = resolve(socket);
        if (!s)
            return -EBADF; // (fcntl is no socket call: nothing to say of other descriptors)
        switch (cmd) {
        case F_GETFL: {
            int fl = sys::fcntl(socket, F_GETFL);
            if (fl < 0)
                return fl;
            return s->nonblocking() ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
        }
        case F_SETFL:
            s->setNonblocking(arg & O_NONBLOCK);
            return std::min(sys::fcntl(socket, F_SETFL, static_cast<int>(arg)), 0);
        case F_GETFD:
        case F_SETFD:
        case F_GETOWN:
        case F_SETOWN:
            return sys::fcntl(socket, cmd, static_cast<int>(arg));
        default:
            // Duplicating an rsocket is not supported: a copy would not be an rsocket.
            return -EINVAL;
        }
    });
}

__attribute__((visibility("default"))) off_t riomap(int socket, void *buf, size_t len, int prot,
                                                    int flags, off_t offset)
{
    return boundary([&]() -> off_t {
        auto s = resolve(socket);
        return s ? s->riomap(buf, len, prot, flags, offset) : notOurs(socket);
    });
}

__attribute__((visibility("default"))) int riounmap(int socket, void *buf, size_t len)
{
    return boundary([&]() -> int {
        auto s = resolve(socket);
        return s ? s->riounmap(buf, len) : notOurs(socket);
    });
}

// size_t as in librdmacm: an error is (size_t)-1 with errno set.
__attribute__((visibility("default"))) size_t riowrite(int socket, const void *buf, size_t count,
                                                       off_t offset, int flags)
{
    pthread_testcancel();
    ssize_t r = boundary([&]() -> ssize_t {
        auto s = resolve(socket);
        if (!s)
            return notOurs(socket);
        ssize_t n = s->riowrite(buf, count, offset, flags);
        if (n == -EPIPE && !(flags & MSG_NOSIGNAL))
            pthread_kill(pthread_self(), SIGPIPE); // it behaves like rwrite
        return n;
    });
    return static_cast<size_t>(r);
}

__attribute__((visibility("default"))) int repoll_create(int size)
{
    return boundary([&]() -> int {
        if (size <= 0)
            return -EINVAL;
        int fd = sys::epollCreate1(EPOLL_CLOEXEC);
        if (fd < 0)
            return fd;
        if (!epolls().set(fd, std::make_shared<EpollSet>(fd))) {
            sys::close(fd);
            return -EMFILE;
        }
        return fd;
    });
}

__attribute__((visibility("default"))) int repoll_ctl(int epfd, int op, int fd,
                                                      struct epoll_event *event)
{
    return boundary([&]() -> int {
        auto set = epolls().get(epfd);
        auto s = resolve(fd);
        if (!set && sys::fcntl(epfd, F_GETFD) < 0)
            return -EBADF; // the epoll fd is checked first, as Linux does
        if (!set) {
            if (s)
                return -EINVAL; // a kernel epoll instance cannot watch an rsocket
            return std::min(sys::epollCtl(epfd, op, fd, event), 0);
        }
        return set->ctl(op, fd, event, s);
    });
}

__attribute__((visibility("default"))) int repoll_wait(int epfd, struct epoll_event *events,
                                                       int maxevents, int timeout)
{
    pthread_testcancel();
    return boundary([&]() -> int {
        auto set = epolls().get(epfd);
        if (!set)
            return sys::epollWait(epfd, events, maxevents, timeout);
        return set->wait(events, maxevents, timeout, nullptr, spinUs());
    });
}

} // extern "C"
