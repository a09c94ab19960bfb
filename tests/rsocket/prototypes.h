// SPDX-License-Identifier: MIT
// Compile-time checks of the rsocket prototypes and constants, included after the headers.
#ifndef RSTREAM_TESTS_RSOCKET_PROTOTYPES_H
#define RSTREAM_TESTS_RSOCKET_PROTOTYPES_H

#include <type_traits>

#define RSTREAM_EXPECT_TYPE(fn, type)                                                              \
    static_assert(std::is_same_v<decltype(&fn), type>, #fn " has the wrong prototype")

RSTREAM_EXPECT_TYPE(rsocket, int (*)(int, int, int));
RSTREAM_EXPECT_TYPE(rbind, int (*)(int, const struct sockaddr *, socklen_t));
RSTREAM_EXPECT_TYPE(rlisten, int (*)(int, int));
RSTREAM_EXPECT_TYPE(raccept, int (*)(int, struct sockaddr *, socklen_t *));
RSTREAM_EXPECT_TYPE(rconnect, int (*)(int, const struct sockaddr *, socklen_t));
RSTREAM_EXPECT_TYPE(rshutdown, int (*)(int, int));
RSTREAM_EXPECT_TYPE(rclose, int (*)(int));
RSTREAM_EXPECT_TYPE(rrecv, ssize_t (*)(int, void *, size_t, int));
RSTREAM_EXPECT_TYPE(rrecvfrom,
                    ssize_t (*)(int, void *, size_t, int, struct sockaddr *, socklen_t *));
RSTREAM_EXPECT_TYPE(rrecvmsg, ssize_t (*)(int, struct msghdr *, int));
RSTREAM_EXPECT_TYPE(rsend, ssize_t (*)(int, const void *, size_t, int));
RSTREAM_EXPECT_TYPE(rsendto, ssize_t (*)(int, const void *, size_t, int, const struct sockaddr *,
                                         socklen_t));
RSTREAM_EXPECT_TYPE(rsendmsg, ssize_t (*)(int, const struct msghdr *, int));
RSTREAM_EXPECT_TYPE(rread, ssize_t (*)(int, void *, size_t));
RSTREAM_EXPECT_TYPE(rreadv, ssize_t (*)(int, const struct iovec *, int));
RSTREAM_EXPECT_TYPE(rwrite, ssize_t (*)(int, const void *, size_t));
RSTREAM_EXPECT_TYPE(rwritev, ssize_t (*)(int, const struct iovec *, int));
RSTREAM_EXPECT_TYPE(rpoll, int (*)(struct pollfd *, nfds_t, int));
RSTREAM_EXPECT_TYPE(rselect, int (*)(int, fd_set *, fd_set *, fd_set *, struct timeval *));
RSTREAM_EXPECT_TYPE(rgetpeername, int (*)(int, struct sockaddr *, socklen_t *));
RSTREAM_EXPECT_TYPE(rgetsockname, int (*)(int, struct sockaddr *, socklen_t *));
RSTREAM_EXPECT_TYPE(rsetsockopt, int (*)(int, int, int, const void *, socklen_t));
RSTREAM_EXPECT_TYPE(rgetsockopt, int (*)(int, int, int, void *, socklen_t *));
RSTREAM_EXPECT_TYPE(rfcntl, int (*)(int, int, ...));
RSTREAM_EXPECT_TYPE(riomap, off_t (*)(int, void *, size_t, int, int, off_t));
RSTREAM_EXPECT_TYPE(riounmap, int (*)(int, void *, size_t));
RSTREAM_EXPECT_TYPE(riowrite, size_t (*)(int, const void *, size_t, off_t, int));
RSTREAM_EXPECT_TYPE(repoll_create, int (*)(int));
RSTREAM_EXPECT_TYPE(repoll_ctl, int (*)(int, int, int, struct epoll_event *));
RSTREAM_EXPECT_TYPE(repoll_wait, int (*)(int, struct epoll_event *, int, int));

#undef RSTREAM_EXPECT_TYPE

static_assert(SOL_RDMA == 0x10000);
static_assert(RDMA_SQSIZE == 0);
static_assert(RDMA_RQSIZE == 1);
static_assert(RDMA_INLINE == 2);
static_assert(RDMA_IOMAPSIZE == 3);
static_assert(RDMA_ROUTE == 4);

#endif
