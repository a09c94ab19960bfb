// SPDX-License-Identifier: MIT
// The kernel seam's default binding: libc.

#include "kernel.h"

#include <cstdio>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

namespace rstream::sys {

int reopenLibc(int fd, int flags)
{
    char path[40];
    std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    return ::open(path, flags | O_CLOEXEC);
}

const Calls kLibc = {
    .socket = ::socket,
    .bind = ::bind,
    .listen = ::listen,
    .accept4 = ::accept4,
    .connect = ::connect,
    .close = ::close,
    .shutdown = ::shutdown,
    .setsockopt = ::setsockopt,
    .getsockopt = ::getsockopt,
    .getsockname = ::getsockname,
    .getpeername = ::getpeername,
    .fcntl = ::fcntl,
    .read = ::read,
    .write = ::write,
    .sendmsg = ::sendmsg,
    .recvmsg = ::recvmsg,
    .poll = ::poll,
    .ppoll = ::ppoll,
    .epollCreate1 = ::epoll_create1,
    .epollCtl = ::epoll_ctl,
    .epollWait = ::epoll_wait,
    .epollPwait = ::epoll_pwait,
    .eventfd = ::eventfd,
    .timerfdCreate = ::timerfd_create,
    .pipe2 = ::pipe2,
    .reopen = reopenLibc,
};

constinit std::atomic<const Calls *> gCalls{&kLibc};

} // namespace rstream::sys
