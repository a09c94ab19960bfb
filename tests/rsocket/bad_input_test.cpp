// SPDX-License-Identifier: MIT
// Bad input from the application that semantics_test.cpp does not try: descriptors that are not
// sockets, NULL and odd-sized addresses, foreign families, unknown levels, commands and types;
// the same errno as the kernel's, on kernel TCP, through librstream and (e2e) under the shim.

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "harness.h"

using namespace rstest;

namespace {

using BadInput = BackendTest;

// The result and errno of a call, for one-line comparisons: {-1, errno} or {result, 0}.
struct Res
{
    long r;
    int err;
    bool operator==(const Res &) const = default;
};

Res res(long r)
{
    return {r, r < 0 ? errno : 0};
}

std::ostream &operator<<(std::ostream &os, const Res &x)
{
    return os << x.r << " (" << (x.err ? strerror(x.err) : "no error") << ")";
}

Res kFail(int err)
{
    return {-1, err};
}

// NULL, empty, short and oversized addresses, and families an IPv4 socket does not take.
TEST_P(BadInput, Addresses)
{
    int fd = newSocket();
    auto a = loopback4(1);
    EXPECT_EQ(res(b->bind(fd, nullptr, sizeof(a))), kFail(EFAULT));
    EXPECT_EQ(res(b->bind(fd, reinterpret_cast<sockaddr *>(&a), 0)), kFail(EINVAL));
    EXPECT_EQ(res(b->connect(fd, nullptr, sizeof(a))), kFail(EFAULT));
    EXPECT_EQ(res(b->connect(fd, reinterpret_cast<sockaddr *>(&a), 0)), kFail(EINVAL));
    // Longer than any address: the kernel refuses more than sockaddr_storage.
    char big[sizeof(sockaddr_storage) + 8] = {};
    memcpy(big, &a, sizeof(a));
    EXPECT_EQ(res(b->bind(fd, reinterpret_cast<sockaddr *>(big), sizeof(big))), kFail(EINVAL));
    sockaddr_un un{};
    un.sun_family = AF_UNIX;
    strcpy(un.sun_path, "/nonexistent");
    EXPECT_EQ(res(b->connect(fd, reinterpret_cast<sockaddr *>(&un), sizeof(un))),
              kFail(EAFNOSUPPORT));
    // The address out parameters.
    socklen_t len = sizeof(sockaddr_storage);
    EXPECT_EQ(res(b->getsockname(fd, nullptr, &len)), kFail(EFAULT));
    sockaddr_storage ss{};
    EXPECT_EQ(res(b->getsockname(fd, reinterpret_cast<sockaddr *>(&ss), nullptr)), kFail(EFAULT));
    // A short buffer is filled as far as it goes, and the length says the whole size.
    len = 4;
    EXPECT_EQ(res(b->getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len)), (Res{0, 0}));
    EXPECT_EQ(len, sizeof(sockaddr_in));
}

// Socket creation, option levels and names, fcntl commands, shutdown and listen arguments.
TEST_P(BadInput, UnknownArguments)
{
    EXPECT_EQ(res(b->socket(12345, SOCK_STREAM, 0)), kFail(EAFNOSUPPORT));
    int fd = newSocket();
    int v = 1;
    socklen_t len = sizeof(v);
    EXPECT_EQ(res(b->setsockopt(fd, 12345, 1, &v, sizeof(v))), kFail(ENOPROTOOPT));
    EXPECT_EQ(res(b->setsockopt(fd, SOL_SOCKET, 0x7777, &v, sizeof(v))), kFail(ENOPROTOOPT));
    EXPECT_EQ(res(b->setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, nullptr, sizeof(v))), kFail(EFAULT));
    len = sizeof(v);
    EXPECT_EQ(res(b->getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, nullptr, &len)), kFail(EFAULT));
    EXPECT_EQ(res(b->getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &v, nullptr)), kFail(EFAULT));
    EXPECT_EQ(res(b->fcntl(fd, 12345, 0)), kFail(EINVAL));
    // shutdown's how is checked before the connection state.
    EXPECT_EQ(res(b->shutdown(fd, 42)), kFail(EINVAL));
}

// Use after close: the closed number is EBADF for the calls semantics_test.cpp leaves out.
TEST_P(BadInput, UseAfterClose)
{
    auto [c, s] = connectedPair();
    ASSERT_GE(s, 0);
    ASSERT_EQ(closeFd(c), 0);
    pollfd p{c, POLLIN, 0};
    EXPECT_EQ(b->poll(&p, 1, 0), 1);
    EXPECT_EQ(p.revents, POLLNVAL);
    int ep = b->epoll_create();
    ASSERT_GE(ep, 0);
    epoll_event ev{};
    ev.events = EPOLLIN;
    EXPECT_EQ(res(b->epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev)), kFail(EBADF));
    EXPECT_EQ(res(b->close(c)), kFail(EBADF));
    b->close(ep);
    // The peer sees the end.
    char ch;
    EXPECT_EQ(b->recv(s, &ch, 1, 0), 0);
}

// An address longer than sockaddr_storage, socket() of an unknown type, getsockopt at an
// unknown level: librstream gave ECONNREFUSED, EPROTONOSUPPORT and ENOPROTOOPT (found by these
// tests).
TEST_P(BadInput, AddressLengthTypeAndLevel)
{
    int fd = newSocket();
    auto a = loopback4(1);
    char big[sizeof(sockaddr_storage) + 8] = {};
    memcpy(big, &a, sizeof(a));
    EXPECT_EQ(res(b->connect(fd, reinterpret_cast<sockaddr *>(big), sizeof(big))), kFail(EINVAL));
    EXPECT_EQ(res(b->socket(AF_INET, 12345, 0)), kFail(EINVAL));
    // Linux's TCP answers a get at an unknown level with EOPNOTSUPP (a set with ENOPROTOOPT).
    int v = 1;
    socklen_t len = sizeof(v);
    EXPECT_EQ(res(b->getsockopt(fd, 12345, 1, &v, &len)), kFail(EOPNOTSUPP));
}

// A pipe's descriptor is no socket: ENOTSOCK from every socket call (librstream said EBADF).
TEST_P(BadInput, NonSocketDescriptor)
{
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    auto a = loopback4(1);
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    int v = 1;
    socklen_t vlen = sizeof(v);
    const int fd = p[0];
    EXPECT_EQ(res(b->bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a))), kFail(ENOTSOCK));
    EXPECT_EQ(res(b->listen(fd, 1)), kFail(ENOTSOCK));
    EXPECT_EQ(res(b->accept(fd, nullptr, nullptr)), kFail(ENOTSOCK));
    EXPECT_EQ(res(b->connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a))), kFail(ENOTSOCK));
    EXPECT_EQ(res(b->shutdown(fd, SHUT_RDWR)), kFail(ENOTSOCK));
    EXPECT_EQ(res(b->getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len)), kFail(ENOTSOCK));
    EXPECT_EQ(res(b->getpeername(fd, reinterpret_cast<sockaddr *>(&ss), &len)), kFail(ENOTSOCK));
    EXPECT_EQ(res(b->setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &v, sizeof(v))), kFail(ENOTSOCK));
    EXPECT_EQ(res(b->getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &v, &vlen)), kFail(ENOTSOCK));
    char buf[4];
    EXPECT_EQ(res(b->recv(fd, buf, sizeof(buf), MSG_DONTWAIT)), kFail(ENOTSOCK));
    EXPECT_EQ(res(b->send(p[1], buf, sizeof(buf), MSG_NOSIGNAL)), kFail(ENOTSOCK));
    close(p[0]);
    close(p[1]);
}

INSTANTIATE_TEST_SUITE_P(Backends, BadInput, ::testing::ValuesIn(kBackends), paramName);

} // namespace
