// SPDX-License-Identifier: MIT
// The kernel seam's default binding: libc.

#include "kernel.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

namespace rstream::sys {

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
    .eventfd = ::eventfd,
    .timerfdCreate = ::timerfd_create,
};

constinit std::atomic<const Calls *> gCalls{&kLibc};

} // namespace rstream::sys
