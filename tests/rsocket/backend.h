// SPDX-License-Identifier: MIT
// The socket API as a table of function pointers: kernel sockets and librstream's r* functions.
#ifndef RSTREAM_TESTS_RSOCKET_BACKEND_H
#define RSTREAM_TESTS_RSOCKET_BACKEND_H

#include <cstdint>
#include <netinet/in.h>
#include <poll.h>
#include <string>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <utility>

#include "net.h"

namespace rstest {

struct Backend
{
    const char *name;
    int (*socket)(int domain, int type, int protocol);
    int (*bind)(int fd, const sockaddr *addr, socklen_t len);
    int (*listen)(int fd, int backlog);
    int (*accept)(int fd, sockaddr *addr, socklen_t *len);
    int (*connect)(int fd, const sockaddr *addr, socklen_t len);
    int (*shutdown)(int fd, int how);
    int (*close)(int fd);
    ssize_t (*recv)(int fd, void *buf, size_t len, int flags);
    ssize_t (*recvfrom)(int fd, void *buf, size_t len, int flags, sockaddr *src, socklen_t *srclen);
    ssize_t (*recvmsg)(int fd, msghdr *msg, int flags);
    ssize_t (*send)(int fd, const void *buf, size_t len, int flags);
    ssize_t (*sendto)(int fd, const void *buf, size_t len, int flags, const sockaddr *dst,
                      socklen_t dstlen);
    ssize_t (*sendmsg)(int fd, const msghdr *msg, int flags);
    ssize_t (*read)(int fd, void *buf, size_t len);
    ssize_t (*readv)(int fd, const iovec *iov, int iovcnt);
    ssize_t (*write)(int fd, const void *buf, size_t len);
    ssize_t (*writev)(int fd, const iovec *iov, int iovcnt);
    int (*poll)(pollfd *fds, nfds_t nfds, int timeout);
    int (*select)(int nfds, fd_set *r, fd_set *w, fd_set *e, timeval *timeout);
    int (*getpeername)(int fd, sockaddr *addr, socklen_t *len);
    int (*getsockname)(int fd, sockaddr *addr, socklen_t *len);
    int (*setsockopt)(int fd, int level, int name, const void *val, socklen_t len);
    int (*getsockopt)(int fd, int level, int name, void *val, socklen_t *len);
    int (*fcntl)(int fd, int cmd, long arg); // the variadic fcntl with one integer argument
    int (*epoll_create)();                   // epoll_create1(0) / repoll_create(1)
    int (*epoll_ctl)(int epfd, int op, int fd, epoll_event *ev);
    int (*epoll_wait)(int epfd, epoll_event *events, int maxevents, int timeout);
};

extern const Backend kKernel;
extern const Backend kRsocket;

// gtest parameter names.
std::string backendName(const Backend *b);

// The highest RLIMIT_NOFILE this process may have; raises the soft limit to it.
rlim_t raiseFileLimit();

// The port of an AF_INET or AF_INET6 address; loopback addresses are in net.h.
uint16_t portOf(const sockaddr_storage &ss);

} // namespace rstest

#endif
