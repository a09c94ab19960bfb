/* SPDX-License-Identifier: MIT */
/* The rsocket-style API of librstream.so: librdmacm's rsockets function set, same prototypes. */
#ifndef RSTREAM_RSOCKET_H
#define RSTREAM_RSOCKET_H

#include <errno.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Every function below behaves like its socket counterpart (socket(2), bind(2), ...) on a
 * Linux TCP socket: it returns -1 and sets errno on failure. rsocket descriptors are ordinary
 * file descriptor numbers; rpoll, rselect and repoll_* accept rsockets and ordinary fds mixed.
 */
int rsocket(int domain, int type, int protocol);
int rbind(int socket, const struct sockaddr *addr, socklen_t addrlen);
int rlisten(int socket, int backlog);
int raccept(int socket, struct sockaddr *addr, socklen_t *addrlen);
int rconnect(int socket, const struct sockaddr *addr, socklen_t addrlen);
int rshutdown(int socket, int how);
int rclose(int socket);

ssize_t rrecv(int socket, void *buf, size_t len, int flags);
ssize_t rrecvfrom(int socket, void *buf, size_t len, int flags, struct sockaddr *src_addr,
                  socklen_t *addrlen);
ssize_t rrecvmsg(int socket, struct msghdr *msg, int flags);
ssize_t rsend(int socket, const void *buf, size_t len, int flags);
ssize_t rsendto(int socket, const void *buf, size_t len, int flags,
                const struct sockaddr *dest_addr, socklen_t addrlen);
ssize_t rsendmsg(int socket, const struct msghdr *msg, int flags);
ssize_t rread(int socket, void *buf, size_t count);
ssize_t rreadv(int socket, const struct iovec *iov, int iovcnt);
ssize_t rwrite(int socket, const void *buf, size_t count);
ssize_t rwritev(int socket, const struct iovec *iov, int iovcnt);

int rpoll(struct pollfd *fds, nfds_t nfds, int timeout);
int rselect(int nfds, fd_set *readfds, fd_set *writefds, fd_set *exceptfds,
            struct timeval *timeout);

int rgetpeername(int socket, struct sockaddr *addr, socklen_t *addrlen);
int rgetsockname(int socket, struct sockaddr *addr, socklen_t *addrlen);

/* Option level of the RDMA options; the values are librdmacm's. */
#define SOL_RDMA 0x10000
#ifndef RSOCKET_H
enum
{
    RDMA_SQSIZE,    /* int: send queue entries (the engine's send queue size) */
    RDMA_RQSIZE,    /* int: receive queue entries (the engine's receive queue size) */
    RDMA_INLINE,    /* int: inline data size; read back as the provider's inject size */
    RDMA_IOMAPSIZE, /* int: number of riomap windows */
    RDMA_ROUTE      /* path records: not supported (ENOPROTOOPT) */
};
#endif

/* rstream's own SOL_RDMA options, int values, settable before connect/listen. */
#define RSTREAM_SEND_BUF 0x100 /* send ring bytes (the send buffer size) */
#define RSTREAM_RECV_BUF 0x101 /* receive ring bytes (the receive buffer size) */
#define RSTREAM_TX_SIZE 0x102  /* send queue entries; same as RDMA_SQSIZE */
#define RSTREAM_RX_SIZE 0x103  /* receive queue entries; same as RDMA_RQSIZE */

int rsetsockopt(int socket, int level, int optname, const void *optval, socklen_t optlen);
int rgetsockopt(int socket, int level, int optname, void *optval, socklen_t *optlen);
int rfcntl(int socket, int cmd, ... /* arg */);

off_t riomap(int socket, void *buf, size_t len, int prot, int flags, off_t offset);
int riounmap(int socket, void *buf, size_t len);
size_t riowrite(int socket, const void *buf, size_t count, off_t offset, int flags);

/* epoll over rsockets and ordinary fds: level-triggered, EPOLLET and EPOLLONESHOT. Close the
 * returned descriptor with rclose(). */
int repoll_create(int size);
int repoll_ctl(int epfd, int op, int fd, struct epoll_event *event);
int repoll_wait(int epfd, struct epoll_event *events, int maxevents, int timeout);

#ifdef __cplusplus
}
#endif

/* Including <rdma/rsocket.h> after this header adds nothing and must not redefine the enum. */
#ifndef RSOCKET_H
#define RSOCKET_H
#endif

#endif /* RSTREAM_RSOCKET_H */
