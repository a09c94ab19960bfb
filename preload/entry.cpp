// SPDX-License-Identifier: MIT
// The exported interposers: one line each into the Shim object (shim_object.h).

#include <cstdarg>

#include "shim_object.h"

using rstream::shim::shim;

// Each passes RS_CALLER(), its own return address: only the exported function itself can take
// it. noexcept where glibc declares the function so (the methods then run engine calls with
// cancellation off); the others are cancellation points.

// ---- Creation ---------------------------------------------------------------------------------

RS_EXPORT int socket(int domain, int type, int protocol) noexcept
{
    return shim().socket(RS_CALLER(), domain, type, protocol);
}

RS_EXPORT int socketpair(int domain, int type, int protocol, int sv[2]) noexcept
{
    return shim().socketpair(RS_CALLER(), domain, type, protocol, sv);
}

RS_EXPORT int eventfd(unsigned int count, int flags) noexcept
{
    return shim().eventfd(RS_CALLER(), count, flags);
}

RS_EXPORT int pipe(int fds[2]) noexcept
{
    return shim().pipe(RS_CALLER(), fds);
}

RS_EXPORT int pipe2(int fds[2], int flags) noexcept
{
    return shim().pipe2(RS_CALLER(), fds, flags);
}

RS_EXPORT int accept(int fd, sockaddr *addr, socklen_t *len)
{
    return shim().accept(RS_CALLER(), fd, addr, len);
}

RS_EXPORT int accept4(int fd, sockaddr *addr, socklen_t *len, int flags)
{
    return shim().accept4(RS_CALLER(), fd, addr, len, flags);
}

// ---- Setup and options ------------------------------------------------------------------------

RS_EXPORT int bind(int fd, const sockaddr *addr, socklen_t len) noexcept
{
    return shim().bind(RS_CALLER(), fd, addr, len);
}

RS_EXPORT int listen(int fd, int backlog) noexcept
{
    return shim().listen(RS_CALLER(), fd, backlog);
}

RS_EXPORT int connect(int fd, const sockaddr *addr, socklen_t len)
{
    return shim().connect(RS_CALLER(), fd, addr, len);
}

RS_EXPORT int shutdown(int fd, int how) noexcept
{
    return shim().shutdown(RS_CALLER(), fd, how);
}

RS_EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len) noexcept
{
    return shim().getsockopt(RS_CALLER(), fd, level, name, val, len);
}

RS_EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len) noexcept
{
    return shim().setsockopt(RS_CALLER(), fd, level, name, val, len);
}

RS_EXPORT int getsockname(int fd, sockaddr *addr, socklen_t *len) noexcept
{
    return shim().getsockname(RS_CALLER(), fd, addr, len);
}

RS_EXPORT int getpeername(int fd, sockaddr *addr, socklen_t *len) noexcept
{
    return shim().getpeername(RS_CALLER(), fd, addr, len);
}

// ---- Descriptors ------------------------------------------------------------------------------

RS_EXPORT int close(int fd)
{
    return shim().close(RS_CALLER(), fd);
}

RS_EXPORT int dup(int fd) noexcept
{
    return shim().dup(RS_CALLER(), fd);
}

RS_EXPORT int dup2(int oldfd, int newfd) noexcept
{
    return shim().dup2(RS_CALLER(), oldfd, newfd);
}

RS_EXPORT int dup3(int oldfd, int newfd, int flags) noexcept
{
    return shim().dup3(RS_CALLER(), oldfd, newfd, flags);
}

// The variadic argument, as glibc reads it: an int or a pointer, one register. Only the
// variadic function itself can read it.

RS_EXPORT int fcntl(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return shim().fcntl(RS_CALLER(), fd, cmd, arg);
}

RS_EXPORT int fcntl64(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return shim().fcntl64(RS_CALLER(), fd, cmd, arg);
}

RS_EXPORT int ioctl(int fd, unsigned long request, ...) noexcept
{
    va_list ap;
    va_start(ap, request);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return shim().ioctl(RS_CALLER(), fd, request, arg);
}

// ---- Files ------------------------------------------------------------------------------------

RS_EXPORT FILE *fopen(const char *path, const char *mode)
{
    return shim().fopen(path, mode);
}

RS_EXPORT FILE *fopen64(const char *path, const char *mode)
{
    return shim().fopen64(path, mode);
}

// ---- recv -------------------------------------------------------------------------------------

RS_EXPORT ssize_t recv(int fd, void *buf, size_t len, int flags)
{
    return shim().recv(RS_CALLER(), fd, buf, len, flags);
}

RS_EXPORT ssize_t recvfrom(int fd, void *buf, size_t len, int flags, sockaddr *from,
                           socklen_t *fromlen)
{
    return shim().recvfrom(RS_CALLER(), fd, buf, len, flags, from, fromlen);
}

RS_EXPORT ssize_t read(int fd, void *buf, size_t len)
{
    return shim().read(RS_CALLER(), fd, buf, len);
}

RS_EXPORT ssize_t recvmsg(int fd, msghdr *msg, int flags)
{
    return shim().recvmsg(RS_CALLER(), fd, msg, flags);
}

RS_EXPORT int recvmmsg(int fd, mmsghdr *vec, unsigned int vlen, int flags, timespec *timeout)
{
    return shim().recvmmsg(RS_CALLER(), fd, vec, vlen, flags, timeout);
}

RS_EXPORT ssize_t readv(int fd, const iovec *iov, int iovcnt)
{
    return shim().readv(RS_CALLER(), fd, iov, iovcnt);
}

// ---- send -------------------------------------------------------------------------------------

RS_EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags)
{
    return shim().send(RS_CALLER(), fd, buf, len, flags);
}

RS_EXPORT ssize_t sendto(int fd, const void *buf, size_t len, int flags, const sockaddr *to,
                         socklen_t tolen)
{
    return shim().sendto(RS_CALLER(), fd, buf, len, flags, to, tolen);
}

RS_EXPORT ssize_t sendmsg(int fd, const msghdr *msg, int flags)
{
    return shim().sendmsg(RS_CALLER(), fd, msg, flags);
}

RS_EXPORT int sendmmsg(int fd, mmsghdr *vec, unsigned int vlen, int flags)
{
    return shim().sendmmsg(RS_CALLER(), fd, vec, vlen, flags);
}

RS_EXPORT ssize_t write(int fd, const void *buf, size_t len)
{
    return shim().write(RS_CALLER(), fd, buf, len);
}

RS_EXPORT ssize_t writev(int fd, const iovec *iov, int iovcnt)
{
    return shim().writev(RS_CALLER(), fd, iov, iovcnt);
}

RS_EXPORT ssize_t sendfile(int outFd, int inFd, off_t *offset, size_t count) noexcept
{
    return shim().sendfile(RS_CALLER(), outFd, inFd, offset, count);
}

RS_EXPORT ssize_t sendfile64(int outFd, int inFd, off64_t *offset, size_t count) noexcept
{
    return shim().sendfile64(RS_CALLER(), outFd, inFd, offset, count);
}

// ---- Fortified variants -----------------------------------------------------------------------

RS_EXPORT ssize_t __read_chk(int fd, void *buf, size_t nbytes, size_t buflen)
{
    return shim().read_chk(RS_CALLER(), fd, buf, nbytes, buflen);
}

RS_EXPORT ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags)
{
    return shim().recv_chk(RS_CALLER(), fd, buf, len, buflen, flags);
}

RS_EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t len, size_t buflen, int flags,
                                 sockaddr *from, socklen_t *fromlen)
{
    return shim().recvfrom_chk(RS_CALLER(), fd, buf, len, buflen, flags, from, fromlen);
}

RS_EXPORT int __poll_chk(pollfd *fds, nfds_t nfds, int timeout, size_t fdslen)
{
    return shim().poll_chk(RS_CALLER(), fds, nfds, timeout, fdslen);
}

RS_EXPORT int __ppoll_chk(pollfd *fds, nfds_t nfds, const timespec *timeout, const sigset_t *ss,
                          size_t fdslen)
{
    return shim().ppoll_chk(RS_CALLER(), fds, nfds, timeout, ss, fdslen);
}

// ---- poll, select -----------------------------------------------------------------------------

RS_EXPORT int poll(pollfd *fds, nfds_t nfds, int timeout)
{
    return shim().poll(RS_CALLER(), fds, nfds, timeout);
}

RS_EXPORT int ppoll(pollfd *fds, nfds_t nfds, const timespec *timeout, const sigset_t *mask)
{
    return shim().ppoll(RS_CALLER(), fds, nfds, timeout, mask);
}

RS_EXPORT int select(int nfds, fd_set *r, fd_set *w, fd_set *e, timeval *timeout)
{
    return shim().select(RS_CALLER(), nfds, r, w, e, timeout);
}

RS_EXPORT int pselect(int nfds, fd_set *r, fd_set *w, fd_set *e, const timespec *timeout,
                      const sigset_t *mask)
{
    return shim().pselect(RS_CALLER(), nfds, r, w, e, timeout, mask);
}

// ---- epoll ------------------------------------------------------------------------------------

RS_EXPORT int epoll_create(int size) noexcept
{
    return shim().epoll_create(RS_CALLER(), size);
}

RS_EXPORT int epoll_create1(int flags) noexcept
{
    return shim().epoll_create1(RS_CALLER(), flags);
}

RS_EXPORT int epoll_ctl(int epfd, int op, int fd, epoll_event *event) noexcept
{
    return shim().epoll_ctl(RS_CALLER(), epfd, op, fd, event);
}

RS_EXPORT int epoll_wait(int epfd, epoll_event *events, int maxevents, int timeout)
{
    return shim().epoll_wait(RS_CALLER(), epfd, events, maxevents, timeout);
}

RS_EXPORT int epoll_pwait(int epfd, epoll_event *events, int maxevents, int timeout,
                          const sigset_t *mask)
{
    return shim().epoll_pwait(RS_CALLER(), epfd, events, maxevents, timeout, mask);
}

// ---- Processes --------------------------------------------------------------------------------

RS_EXPORT pid_t fork(void) noexcept
{
    return shim().fork();
}

RS_EXPORT pid_t vfork(void) noexcept
{
    return shim().vfork();
}

RS_EXPORT int daemon(int nochdir, int noclose) noexcept
{
    return shim().daemon(nochdir, noclose);
}

// ---- Signal handlers ----------------------------------------------------------------------------

RS_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old) noexcept
{
    return shim().sigaction(sig, act, old);
}

RS_EXPORT sighandler_t signal(int sig, sighandler_t handler) noexcept
{
    return shim().signal(sig, handler);
}

// glibc's other names for the same two functions: bsd_signal and ssignal are signal;
// __sysv_signal is what signal() names under strict X/Open (-D_XOPEN_SOURCE).
RS_EXPORT sighandler_t bsd_signal(int sig, sighandler_t handler) noexcept; // X/Open only
RS_EXPORT sighandler_t bsd_signal(int sig, sighandler_t handler) noexcept
{
    return shim().signal(sig, handler);
}

RS_EXPORT sighandler_t ssignal(int sig, sighandler_t handler) noexcept
{
    return shim().signal(sig, handler);
}

RS_EXPORT sighandler_t sysv_signal(int sig, sighandler_t handler) noexcept
{
    return shim().sysv_signal(sig, handler);
}

RS_EXPORT sighandler_t __sysv_signal(int sig, sighandler_t handler) noexcept
{
    return shim().sysv_signal(sig, handler);
}

RS_EXPORT sighandler_t sigset(int sig, sighandler_t disposition) noexcept
{
    return shim().sigset(sig, disposition);
}

RS_EXPORT int siginterrupt(int sig, int flag) noexcept
{
    return shim().siginterrupt(sig, flag);
}
