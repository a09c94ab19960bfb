// SPDX-License-Identifier: MIT
// The one way the libraries reach the kernel: thin wrappers that return -errno.
//
// librstream.so and the tests run on libc's functions. The shim interposes those very names
// (socket, close, poll, epoll_wait...), so a call to ::close from inside the engine would
// re-enter the shim's own close; it binds this seam to the functions it forwards to (the next
// definitions, dlsym(RTLD_NEXT)) when it loads, and every kernel call made below the shim goes
// through here. As in liburing's syscall.h, the wrappers only convert: no policy lives here.
#pragma once

#include <atomic>
#include <cerrno>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/types.h>

namespace rstream::sys {

struct Calls
{
    int (*socket)(int, int, int);
    int (*bind)(int, const sockaddr *, socklen_t);
    int (*listen)(int, int);
    int (*accept4)(int, sockaddr *, socklen_t *, int);
    int (*connect)(int, const sockaddr *, socklen_t);
    int (*close)(int);
    int (*shutdown)(int, int);
    int (*setsockopt)(int, int, int, const void *, socklen_t);
    int (*getsockopt)(int, int, int, void *, socklen_t *);
    int (*getsockname)(int, sockaddr *, socklen_t *);
    int (*getpeername)(int, sockaddr *, socklen_t *);
    int (*fcntl)(int, int, ...);
    ssize_t (*read)(int, void *, size_t);
    ssize_t (*write)(int, const void *, size_t);
    ssize_t (*sendmsg)(int, const msghdr *, int);
    ssize_t (*recvmsg)(int, msghdr *, int);
    int (*poll)(pollfd *, nfds_t, int);
    int (*ppoll)(pollfd *, nfds_t, const timespec *, const sigset_t *);
    int (*epollCreate1)(int);
    int (*epollCtl)(int, int, int, epoll_event *);
    int (*epollWait)(int, epoll_event *, int, int);
    int (*epollPwait)(int, epoll_event *, int, int, const sigset_t *);
    int (*eventfd)(unsigned int, int);
    int (*timerfdCreate)(int, int);
    int (*pipe2)(int *, int);
    int (*reopen)(int, int); // a new open file description of what fd names (/proc/self/fd)
};

// libc's functions.
extern const Calls kLibc;
// The table in use: kLibc until bind() says otherwise.
extern constinit std::atomic<const Calls *> gCalls;

// Binds the seam to calls (which must outlive every use: a static table). Called once, when the
// shim loads, before it serves any socket.
inline void bind(const Calls *calls)
{
    gCalls.store(calls, std::memory_order_release);
}
inline const Calls &calls()
{
    return *gCalls.load(std::memory_order_acquire);
}

template <class T>
inline T ret(T r)
{
    return r < 0 ? T(-errno) : r;
}

inline int socket(int domain, int type, int protocol)
{
    return ret(calls().socket(domain, type, protocol));
}
inline int bind(int fd, const sockaddr *addr, socklen_t len)
{
    return ret(calls().bind(fd, addr, len));
}
inline int listen(int fd, int backlog)
{
    return ret(calls().listen(fd, backlog));
}
inline int accept4(int fd, sockaddr *addr, socklen_t *len, int flags)
{
    return ret(calls().accept4(fd, addr, len, flags));
}
inline int connect(int fd, const sockaddr *addr, socklen_t len)
{
    return ret(calls().connect(fd, addr, len));
}
inline int close(int fd)
{
    return ret(calls().close(fd));
}
inline int shutdown(int fd, int how)
{
    return ret(calls().shutdown(fd, how));
}
inline int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
    return ret(calls().setsockopt(fd, level, name, val, len));
}
inline int getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
    return ret(calls().getsockopt(fd, level, name, val, len));
}
inline int getsockname(int fd, sockaddr *addr, socklen_t *len)
{
    return ret(calls().getsockname(fd, addr, len));
}
inline int getpeername(int fd, sockaddr *addr, socklen_t *len)
{
    return ret(calls().getpeername(fd, addr, len));
}
// fcntl with an int argument (every command the libraries use).
inline int fcntl(int fd, int cmd, int arg = 0)
{
    return ret(calls().fcntl(fd, cmd, arg));
}
inline ssize_t read(int fd, void *buf, size_t len)
{
    return ret(calls().read(fd, buf, len));
}
inline ssize_t write(int fd, const void *buf, size_t len)
{
    return ret(calls().write(fd, buf, len));
}
inline ssize_t sendmsg(int fd, const msghdr *msg, int flags)
{
    return ret(calls().sendmsg(fd, msg, flags));
}
inline ssize_t recvmsg(int fd, msghdr *msg, int flags)
{
    return ret(calls().recvmsg(fd, msg, flags));
}
// Cancellation points and EINTR stay what they are in libc: the blocking calls sleep in the
// real syscall.
inline int poll(pollfd *fds, nfds_t nfds, int timeoutMs)
{
    return ret(calls().poll(fds, nfds, timeoutMs));
}
inline int ppoll(pollfd *fds, nfds_t nfds, const timespec *timeout, const sigset_t *mask)
{
    return ret(calls().ppoll(fds, nfds, timeout, mask));
}
inline int epollCreate1(int flags)
{
    return ret(calls().epollCreate1(flags));
}
inline int epollCtl(int epfd, int op, int fd, epoll_event *event)
{
    return ret(calls().epollCtl(epfd, op, fd, event));
}
inline int epollWait(int epfd, epoll_event *events, int maxevents, int timeoutMs)
{
    return ret(calls().epollWait(epfd, events, maxevents, timeoutMs));
}
inline int epollPwait(int epfd, epoll_event *events, int maxevents, int timeoutMs,
                      const sigset_t *mask)
{
    return ret(calls().epollPwait(epfd, events, maxevents, timeoutMs, mask));
}
inline int eventfd(unsigned int initval, int flags)
{
    return ret(calls().eventfd(initval, flags));
}
inline int timerfdCreate(int clock, int flags)
{
    return ret(calls().timerfdCreate(clock, flags));
}
inline int pipe2(int fds[2], int flags)
{
    return ret(calls().pipe2(fds, flags));
}
// Opens what fd names again (a pipe's other end, or both ends with O_RDWR), as a new open file
// description of the caller's own: its flags (O_NONBLOCK) are not shared with fd's.
inline int reopen(int fd, int flags)
{
    return ret(calls().reopen(fd, flags));
}
// libc's reopen(): what the seam's reopen calls without the shim.
int reopenLibc(int fd, int flags);

} // namespace rstream::sys
