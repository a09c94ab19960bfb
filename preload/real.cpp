// SPDX-License-Identifier: MIT
// The real libc functions behind the interposers, found lazily with dlsym(RTLD_NEXT).

#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <sys/syscall.h>

#include <sys/timerfd.h>

#include "shim_object.h"

namespace rstream::shim {

namespace {

// Writes with the raw syscall: the real write may be the one that is missing.
void complain(const char *name)
{
    const char head[] = "librstream_preload.so: libc lacks ";
    const char tail[] = "; aborting\n";
    long r = syscall(SYS_write, STDERR_FILENO, head, sizeof(head) - 1);
    r = syscall(SYS_write, STDERR_FILENO, name, strlen(name));
    r = syscall(SYS_write, STDERR_FILENO, tail, sizeof(tail) - 1);
    (void)r;
}

int realPpoll(pollfd *fds, nfds_t nfds, const timespec *timeout, const sigset_t *mask)
{
    return shim().real.ppoll()(fds, nfds, timeout, mask);
}

int realEpollWait(int epfd, epoll_event *events, int maxevents, int timeout)
{
    return shim().real.epoll_wait()(epfd, events, maxevents, timeout);
}

int realEpollPwait(int epfd, epoll_event *events, int maxevents, int timeout, const sigset_t *mask)
{
    return shim().real.epoll_pwait()(epfd, events, maxevents, timeout, mask);
}

int realEpollCtl(int epfd, int op, int fd, epoll_event *event)
{
    return shim().real.epoll_ctl()(epfd, op, fd, event);
}

// Thin trampolines: they resolve on first use, so the tables below are constant-initialized
// and valid before any constructor has run.
int kSocket(int d, int t, int p)
{
    return shim().real.socket()(d, t, p);
}
int kBind(int fd, const sockaddr *a, socklen_t l)
{
    return shim().real.bind()(fd, a, l);
}
int kListen(int fd, int b)
{
    return shim().real.listen()(fd, b);
}
int kAccept4(int fd, sockaddr *a, socklen_t *l, int f)
{
    return shim().real.accept4()(fd, a, l, f);
}
int kConnect(int fd, const sockaddr *a, socklen_t l)
{
    return shim().real.connect()(fd, a, l);
}
int kClose(int fd)
{
    return shim().real.close()(fd);
}
int kShutdown(int fd, int how)
{
    return shim().real.shutdown()(fd, how);
}
int kSetsockopt(int fd, int level, int name, const void *v, socklen_t l)
{
    return shim().real.setsockopt()(fd, level, name, v, l);
}
int kGetsockopt(int fd, int level, int name, void *v, socklen_t *l)
{
    return shim().real.getsockopt()(fd, level, name, v, l);
}
int kGetsockname(int fd, sockaddr *a, socklen_t *l)
{
    return shim().real.getsockname()(fd, a, l);
}
int kGetpeername(int fd, sockaddr *a, socklen_t *l)
{
    return shim().real.getpeername()(fd, a, l);
}
int kFcntl(int fd, int cmd, ...)
{
    // As glibc's own fcntl: the third argument, when there is one, is read as a pointer-sized
    // value (an int or a pointer both travel in one register).
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return shim().real.fcntl()(fd, cmd, arg);
}

ssize_t kRead(int fd, void *b, size_t n)
{
    return shim().real.read()(fd, b, n);
}
ssize_t kWrite(int fd, const void *b, size_t n)
{
    return shim().real.write()(fd, b, n);
}
ssize_t kSendmsg(int fd, const msghdr *m, int f)
{
    return shim().real.sendmsg()(fd, m, f);
}
ssize_t kRecvmsg(int fd, msghdr *m, int f)
{
    return shim().real.recvmsg()(fd, m, f);
}
int kPoll(pollfd *fds, nfds_t n, int t)
{
    return shim().real.poll()(fds, n, t);
}
// The layers below create eventfds and epoll sets only for themselves: like every internal fd,
// they live above the program's range (moveHigh). Sockets made through the seam may be the
// program's (an accepted fabric connection's fd), so they stay where the kernel puts them.
int kEpollCreate1(int flags)
{
    return moveHigh(shim().real.epoll_create1()(flags));
}
int kEventfd(unsigned int v, int flags)
{
    return moveHigh(shim().real.eventfd()(v, flags));
}
int kTimerfdCreate(int clock, int flags)
{
    return moveHigh(::timerfd_create(clock, flags)); // not interposed: libc's own
}
int kPipe2(int fds[2], int flags)
{
    const int r = shim().real.pipe2()(fds, flags);
    if (r == 0) {
        fds[0] = moveHigh(fds[0]);
        fds[1] = moveHigh(fds[1]);
    }
    return r;
}
int kReopen(int fd, int flags)
{
    return moveHigh(sys::reopenLibc(fd, flags)); // open(2) is not interposed
}

// The kernel seam (src/base/kernel.h) as the layers below the shim see it: the functions the
// interposers forward to, never the interposers themselves.
constexpr sys::Calls gRealCalls = {
    .socket = kSocket,
    .bind = kBind,
    .listen = kListen,
    .accept4 = kAccept4,
    .connect = kConnect,
    .close = kClose,
    .shutdown = kShutdown,
    .setsockopt = kSetsockopt,
    .getsockopt = kGetsockopt,
    .getsockname = kGetsockname,
    .getpeername = kGetpeername,
    .fcntl = kFcntl,
    .read = kRead,
    .write = kWrite,
    .sendmsg = kSendmsg,
    .recvmsg = kRecvmsg,
    .poll = kPoll,
    .ppoll = realPpoll,
    .epollCreate1 = kEpollCreate1,
    .epollCtl = realEpollCtl,
    .epollWait = realEpollWait,
    .epollPwait = realEpollPwait,
    .eventfd = kEventfd,
    .timerfdCreate = kTimerfdCreate,
    .pipe2 = kPipe2,
    .reopen = kReopen,
};

} // namespace

void *resolveReal(std::atomic<void *> &slot, const char *name, const char *fallback)
{
    void *p = dlsym(RTLD_NEXT, name);
    if (!p && fallback)
        p = dlsym(RTLD_NEXT, fallback);
    if (!p) {
        complain(name);
        abort();
    }
    slot.store(p, std::memory_order_release);
    return p;
}

void RealFunctions::resolveAll()
{
#define RS_RESOLVE(name, fallback) (void)name();
    RS_REAL_LIST(RS_RESOLVE)
#undef RS_RESOLVE
    sys::bind(&gRealCalls);
}

} // namespace rstream::shim
