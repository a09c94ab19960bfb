// SPDX-License-Identifier: MIT
// The Shim object: the real-function table, the fd tables and one method per interposed call.
#pragma once

#include <algorithm>
#include <vector>

#include "fabric.h"
#include "provider_sends.h"
#include "shim.h"

namespace rstream::shim {

// The exported functions (entry.cpp) are one line each: they pass their caller's return address
// (RS_CALLER(), which only they can take) and their arguments to the method of the same name.
// Methods return as the C call does (-1 and errno); nothing leaves them as an exception but a
// thread cancellation's forced unwind. Setup and descriptors are in shim_setup.cpp, the data
// path in shim_data.cpp (its kernel fast paths inline, below), poll, select and epoll in
// shim_poll.cpp, fork in fork.cpp and the table bookkeeping in common.cpp.
//
// One instance, constant-initialized and trivially destructible: the interposers are called
// before any constructor has run (from other libraries' constructors) and after every destructor
// (sockets still open at exit are never torn down).
class Shim
{
public:
    constexpr Shim() = default;
    Shim(const Shim &) = delete;
    Shim &operator=(const Shim &) = delete;

    RealFunctions real;

    // ---- Creation, setup and options (shim_setup.cpp) ----
    int socket(const void *ra, int domain, int type, int protocol);
    int socketpair(const void *ra, int domain, int type, int protocol, int sv[2]);
    int eventfd(const void *ra, unsigned int count, int flags);
    int pipe(const void *ra, int fds[2]);
    int pipe2(const void *ra, int fds[2], int flags);
    int accept(const void *ra, int fd, sockaddr *addr, socklen_t *len);
    int accept4(const void *ra, int fd, sockaddr *addr, socklen_t *len, int flags);
    int bind(const void *ra, int fd, const sockaddr *addr, socklen_t len);
    int listen(const void *ra, int fd, int backlog);
    int connect(const void *ra, int fd, const sockaddr *addr, socklen_t len);
    int shutdown(const void *ra, int fd, int how);
    int getsockopt(const void *ra, int fd, int level, int name, void *val, socklen_t *len);
    int setsockopt(const void *ra, int fd, int level, int name, const void *val, socklen_t len);
    int getsockname(const void *ra, int fd, sockaddr *addr, socklen_t *len);
    int getpeername(const void *ra, int fd, sockaddr *addr, socklen_t *len);

    // ---- Descriptors (shim_setup.cpp; close inline) ----
    int close(const void *ra, int fd);
    int dup(const void *ra, int fd);
    int dup2(const void *ra, int oldfd, int newfd);
    int dup3(const void *ra, int oldfd, int newfd, int flags);
    // arg: the variadic argument as glibc reads it, an int or a pointer in one register.
    int fcntl(const void *ra, int fd, int cmd, void *arg);
    int fcntl64(const void *ra, int fd, int cmd, void *arg);
    int ioctl(const void *ra, int fd, unsigned long request, void *arg);

    // ---- Files (inline): a file libfabric is better without (fabricHidesFile) ----
    FILE *fopen(const char *path, const char *mode);
    FILE *fopen64(const char *path, const char *mode);
    // Whether to say that path does not exist (errno ENOENT set), as fabricHidesFile() asks.
    static bool hidden(const char *path)
    {
        if (__builtin_expect(!fabricHidesFile(path), 1))
            return false;
        errno = ENOENT;
        return true;
    }

    // ---- Data (shim_data.cpp; the per-message calls inline) ----
    ssize_t recv(const void *ra, int fd, void *buf, size_t len, int flags);
    ssize_t recvfrom(const void *ra, int fd, void *buf, size_t len, int flags, sockaddr *from,
                     socklen_t *fromlen);
    ssize_t read(const void *ra, int fd, void *buf, size_t len);
    ssize_t recvmsg(const void *ra, int fd, msghdr *msg, int flags);
    int recvmmsg(const void *ra, int fd, mmsghdr *vec, unsigned int vlen, int flags,
                 timespec *timeout);
    ssize_t readv(const void *ra, int fd, const iovec *iov, int iovcnt);
    ssize_t send(const void *ra, int fd, const void *buf, size_t len, int flags);
    ssize_t sendto(const void *ra, int fd, const void *buf, size_t len, int flags,
                   const sockaddr *to, socklen_t tolen);
    ssize_t sendmsg(const void *ra, int fd, const msghdr *msg, int flags);
    int sendmmsg(const void *ra, int fd, mmsghdr *vec, unsigned int vlen, int flags);
    ssize_t write(const void *ra, int fd, const void *buf, size_t len);
    ssize_t writev(const void *ra, int fd, const iovec *iov, int iovcnt);
    ssize_t sendfile(const void *ra, int outFd, int inFd, off_t *offset, size_t count);
    ssize_t sendfile64(const void *ra, int outFd, int inFd, off64_t *offset, size_t count);
    // The fortified variants (__read_chk...): glibc's contract for these is to abort through
    // __chk_fail when the length exceeds the buffer the compiler saw; otherwise they are the
    // plain calls.
    ssize_t read_chk(const void *ra, int fd, void *buf, size_t nbytes, size_t buflen);
    ssize_t recv_chk(const void *ra, int fd, void *buf, size_t len, size_t buflen, int flags);
    ssize_t recvfrom_chk(const void *ra, int fd, void *buf, size_t len, size_t buflen, int flags,
                         sockaddr *from, socklen_t *fromlen);

    // ---- poll, select, epoll (shim_poll.cpp) ----
    int poll(const void *ra, pollfd *fds, nfds_t nfds, int timeout);
    int ppoll(const void *ra, pollfd *fds, nfds_t nfds, const timespec *timeout,
              const sigset_t *mask);
    int poll_chk(const void *ra, pollfd *fds, nfds_t nfds, int timeout, size_t fdslen);
    int ppoll_chk(const void *ra, pollfd *fds, nfds_t nfds, const timespec *timeout,
                  const sigset_t *ss, size_t fdslen);
    int select(const void *ra, int nfds, fd_set *r, fd_set *w, fd_set *e, timeval *timeout);
    int pselect(const void *ra, int nfds, fd_set *r, fd_set *w, fd_set *e, const timespec *timeout,
                const sigset_t *mask);
    int epoll_create(const void *ra, int size);
    int epoll_create1(const void *ra, int flags);
    int epoll_ctl(const void *ra, int epfd, int op, int fd, epoll_event *event);
    int epoll_wait(const void *ra, int epfd, epoll_event *events, int maxevents, int timeout);
    int epoll_pwait(const void *ra, int epfd, epoll_event *events, int maxevents, int timeout,
                    const sigset_t *mask);

    // ---- Processes (fork.cpp, exec.cpp) ----
    // At load: TCP connections inherited across exec join the table, to be upgraded (exec.cpp).
    void adoptInheritedSockets();
    pid_t fork();
    pid_t vfork();
    int daemon(int nochdir, int noclose);

    // ---- Signal handlers (signals.cpp): through sigtrack's trampoline (RSTREAM_SIGNAL_TRACK) ----
    int sigaction(int sig, const struct sigaction *act, struct sigaction *old);
    sighandler_t signal(int sig, sighandler_t handler);
    sighandler_t sysv_signal(int sig, sighandler_t handler);
    sighandler_t sigset(int sig, sighandler_t disposition);
    int siginterrupt(int sig, int flag);

    // ---- The tables (common.cpp) ----

    // The pollable behind fd (the poller's SocketResolver, through resolvePollable).
    std::shared_ptr<Pollable> pollable(int fd);
    // Calls f once for every distinct socket in the table (dups share one object).
    template <class F>
    void forEachSocket(F &&f);

private:
    // The socket at fd when fd is ours, the caller (return address ra) is the program's and
    // the engine (not the kernel) may answer for it. Only fds in the table pay for the caller
    // check.
    std::shared_ptr<HybridSocket> engineSocket(int fd, const void *ra);
    // The socket when the engine carries fd's data; null when the kernel fd answers (not ours,
    // or a socket whose path is the kernel's or not decided yet).
    std::shared_ptr<HybridSocket> dataSocket(int fd, const void *ra);
    // False when fd is beyond what the table tracks (the socket then stays on the kernel).
    bool installSocket(int fd, std::shared_ptr<HybridSocket> s);
    // Whether any table has fd.
    bool tracked(int fd) const
    {
        return sockets_.has(fd) || epolls_.has(fd) || kernelConns_.has(fd);
    }
    // The program closes fd (close, or dup2/dup3 onto it): forget what we had there.
    void releaseFd(int fd);
    // A new fd number came from the kernel through a path we see: any entry left at that number
    // by a close we did not see (close_range, a raw syscall) is stale and goes.
    void forgetStale(int fd)
    {
        if (__builtin_expect(tracked(fd), 0))
            releaseFd(fd);
    }
    // fd was accepted on kernel TCP from listener (its fd listenFd, with accept4's flags):
    // records it as a fallback, kernel_peer when the listener has a fabric side (dual), else
    // the listener's reason.
    // peer: the connection's peer address when accept4 gave it (null: not known).
    void trackKernelAccept(int listenFd, int fd, bool dual, int flags,
                           const sockaddr_storage *peer = nullptr, socklen_t plen = 0);

    // shim_setup.cpp
    bool candidate(int domain, int type, int protocol) const;
    int placeNew(const void *ra, int fd);
    void placePair(const void *ra, int fds[2]);
    void afterDup(int oldfd, int newfd);
    template <class Real>
    int acceptImpl(const void *ra, Real kernel, int fd, sockaddr *addr, socklen_t *len, int flags);
    template <class Fn>
    int fcntlImpl(const void *ra, Fn kernel, int fd, int cmd, void *arg);
    template <class Dup>
    int dupOnto(const void *ra, Dup kernel, int oldfd, int newfd);

    // shim_data.cpp: the engine's side of the inline data calls.
    ssize_t recvEngine(HybridSocket &s, void *buf, size_t len, int flags);
    ssize_t recvfromEngine(HybridSocket &s, void *buf, size_t len, int flags, sockaddr *from,
                           socklen_t *fromlen);
    ssize_t recvmsgEngine(HybridSocket &s, msghdr *msg, int flags);
    ssize_t readvEngine(HybridSocket &s, const iovec *iov, int iovcnt);
    ssize_t sendEngine(HybridSocket &s, const void *buf, size_t len, int flags);
    ssize_t sendmsgEngine(HybridSocket &s, const msghdr *msg, int flags);
    ssize_t writevEngine(HybridSocket &s, const iovec *iov, int iovcnt);

    // shim_poll.cpp
    bool engineFd(int fd, const void *ra, int &callerChecked);
    bool anyEngine(const pollfd *fds, nfds_t nfds, const void *ra);
    bool anyEngine(int nfds, const fd_set *r, const fd_set *w, const fd_set *e, const void *ra);
    std::shared_ptr<ShimEpoll> engineEpoll(int epfd, const void *ra);
    int epollCreated(const void *ra, int fd);

    FdTable<HybridSocket> sockets_;
    FdTable<ShimEpoll> epolls_;
    // Connections the program accepted on kernel TCP (no HybridSocket: their calls go straight
    // to the kernel), for the statistics and the live export; dups share the record.
    FdTable<ConnRecord> kernelConns_;
    // One past the highest fd ever installed in sockets_: the bound for walks over the table
    // (stats, fork). Zero at start, as everything here: the object lives in .bss.
    std::atomic<int> fdBound_{0};
};

extern constinit Shim gShim;

inline Shim &shim()
{
    return gShim;
}

template <class F>
void Shim::forEachSocket(F &&f)
{
    std::vector<HybridSocket *> seen;
    const int bound = fdBound_.load(std::memory_order_acquire);
    for (int fd = 0; fd < bound; fd++) {
        if (!sockets_.has(fd))
            continue;
        auto s = sockets_.get(fd);
        if (!s || std::find(seen.begin(), seen.end(), s.get()) != seen.end())
            continue;
        seen.push_back(s.get());
        f(*s);
    }
}

// ---- Inline fast paths ------------------------------------------------------------------------
// The calls made per message, and close: the kernel path (not our fd, or the caller is
// internal) costs what it did before the Shim object, one table look-up and the real call.

inline int Shim::close(const void *ra, int fd)
{
    if (__builtin_expect(tDepth == 0 && tracked(fd), 0) && !internalAddress(ra))
        releaseFd(fd);
    return real.close()(fd);
}

inline FILE *Shim::fopen(const char *path, const char *mode)
{
    return hidden(path) ? nullptr : real.fopen()(path, mode);
}

inline FILE *Shim::fopen64(const char *path, const char *mode)
{
    return hidden(path) ? nullptr : real.fopen64()(path, mode);
}

// A socket send passed through to the kernel: when it is the provider's, made inside one of the
// engine's posts, the engine learns whether the kernel took it whole (provider_sends.h). The
// provider sends its data with send and sendmsg; its wake-up signal is a write(), not counted.
inline ssize_t passedSend(ssize_t r, size_t len, int flags)
{
    noteProviderSend(r, len, flags);
    return r;
}

inline std::shared_ptr<HybridSocket> Shim::dataSocket(int fd, const void *ra)
{
    auto s = engineSocket(fd, ra);
    if (s && !dataMode(*s))
        return nullptr;
    return s;
}

inline ssize_t Shim::recv(const void *ra, int fd, void *buf, size_t len, int flags)
{
    auto s = dataSocket(fd, ra);
    if (!s)
        return real.recv()(fd, buf, len, flags);
    return recvEngine(*s, buf, len, flags);
}

inline ssize_t Shim::recvfrom(const void *ra, int fd, void *buf, size_t len, int flags,
                              sockaddr *from, socklen_t *fromlen)
{
    auto s = dataSocket(fd, ra);
    if (!s)
        return real.recvfrom()(fd, buf, len, flags, from, fromlen);
    return recvfromEngine(*s, buf, len, flags, from, fromlen);
}

inline ssize_t Shim::read(const void *ra, int fd, void *buf, size_t len)
{
    auto s = dataSocket(fd, ra);
    if (!s)
        return real.read()(fd, buf, len);
    return recvEngine(*s, buf, len, 0);
}

inline ssize_t Shim::recvmsg(const void *ra, int fd, msghdr *msg, int flags)
{
    auto s = dataSocket(fd, ra);
    if (!s)
        return real.recvmsg()(fd, msg, flags);
    return recvmsgEngine(*s, msg, flags);
}

inline ssize_t Shim::readv(const void *ra, int fd, const iovec *iov, int iovcnt)
{
    auto s = dataSocket(fd, ra);
    if (!s)
        return real.readv()(fd, iov, iovcnt);
    return readvEngine(*s, iov, iovcnt);
}

inline ssize_t Shim::send(const void *ra, int fd, const void *buf, size_t len, int flags)
{
    auto s = dataSocket(fd, ra);
    if (!s)
        return passedSend(real.send()(fd, buf, len, flags), len, flags);
    return sendEngine(*s, buf, len, flags);
}

inline ssize_t Shim::sendto(const void *ra, int fd, const void *buf, size_t len, int flags,
                            const sockaddr *to, socklen_t tolen)
{
    auto s = dataSocket(fd, ra);
    if (!s)
        return passedSend(real.sendto()(fd, buf, len, flags, to, tolen), len, flags);
    return sendEngine(*s, buf, len, flags); // the address is ignored, as on connected TCP
}

inline ssize_t Shim::sendmsg(const void *ra, int fd, const msghdr *msg, int flags)
{
    auto s = dataSocket(fd, ra);
    if (!s) {
        const ssize_t r = real.sendmsg()(fd, msg, flags);
        noteProviderSendmsg(r, msg, flags);
        return r;
    }
    return sendmsgEngine(*s, msg, flags);
}

inline ssize_t Shim::write(const void *ra, int fd, const void *buf, size_t len)
{
    auto s = dataSocket(fd, ra);
    if (!s)
        return real.write()(fd, buf, len);
    return sendEngine(*s, buf, len, 0);
}

inline ssize_t Shim::writev(const void *ra, int fd, const iovec *iov, int iovcnt)
{
    auto s = dataSocket(fd, ra);
    if (!s)
        return real.writev()(fd, iov, iovcnt);
    return writevEngine(*s, iov, iovcnt);
}

inline ssize_t Shim::read_chk(const void *ra, int fd, void *buf, size_t nbytes, size_t buflen)
{
    if (nbytes > buflen)
        __chk_fail();
    return read(ra, fd, buf, nbytes);
}

inline ssize_t Shim::recv_chk(const void *ra, int fd, void *buf, size_t len, size_t buflen,
                              int flags)
{
    if (len > buflen)
        __chk_fail();
    return recv(ra, fd, buf, len, flags);
}

inline ssize_t Shim::recvfrom_chk(const void *ra, int fd, void *buf, size_t len, size_t buflen,
                                  int flags, sockaddr *from, socklen_t *fromlen)
{
    if (len > buflen)
        __chk_fail();
    return recvfrom(ra, fd, buf, len, flags, from, fromlen);
}

} // namespace rstream::shim
