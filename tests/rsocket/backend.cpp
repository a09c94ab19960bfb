// SPDX-License-Identifier: MIT
// The kernel and r* backends of the rsocket tests.

#include "backend.h"

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <rstream/rsocket.h>

namespace rstest {

namespace {

int kernelFcntl(int fd, int cmd, long arg)
{
    return ::fcntl(fd, cmd, arg);
}

int kernelEpollCreate()
{
    return ::epoll_create1(0);
}

int rFcntl(int fd, int cmd, long arg)
{
    return ::rfcntl(fd, cmd, arg);
}

int rEpollCreate()
{
    return ::repoll_create(1);
}

} // namespace

const Backend kKernel = {
    "kernel",    ::socket,          ::bind,        ::listen,      ::accept,     ::connect,
    ::shutdown,  ::close,           ::recv,        ::recvfrom,    ::recvmsg,    ::send,
    ::sendto,    ::sendmsg,         ::read,        ::readv,       ::write,      ::writev,
    ::poll,      ::select,          ::getpeername, ::getsockname, ::setsockopt, ::getsockopt,
    kernelFcntl, kernelEpollCreate, ::epoll_ctl,   ::epoll_wait,
};

const Backend kRsocket = {
    "rsocket",   ::rsocket,    ::rbind,        ::rlisten,      ::raccept,     ::rconnect,
    ::rshutdown, ::rclose,     ::rrecv,        ::rrecvfrom,    ::rrecvmsg,    ::rsend,
    ::rsendto,   ::rsendmsg,   ::rread,        ::rreadv,       ::rwrite,      ::rwritev,
    ::rpoll,     ::rselect,    ::rgetpeername, ::rgetsockname, ::rsetsockopt, ::rgetsockopt,
    rFcntl,      rEpollCreate, ::repoll_ctl,   ::repoll_wait,
};

std::string backendName(const Backend *b)
{
    return b->name;
}

rlim_t raiseFileLimit()
{
    rlimit rl{};
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 0;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    return rl.rlim_cur;
}

uint16_t portOf(const sockaddr_storage &ss)
{
    if (ss.ss_family == AF_INET)
        return ntohs(reinterpret_cast<const sockaddr_in &>(ss).sin_port);
    if (ss.ss_family == AF_INET6)
        return ntohs(reinterpret_cast<const sockaddr_in6 &>(ss).sin6_port);
    return 0;
}

} // namespace rstest
