// SPDX-License-Identifier: MIT
// The fixture shared by the rsocket tests: a backend parameter, owned descriptors, connected pairs.
#ifndef RSTREAM_TESTS_RSOCKET_HARNESS_H
#define RSTREAM_TESTS_RSOCKET_HARNESS_H

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <netinet/in.h>

#include <gtest/gtest.h>

#include "backend.h"

namespace rstest {

inline const Backend *const kBackends[] = {&kKernel, &kRsocket};

inline std::string paramName(const ::testing::TestParamInfo<const Backend *> &info)
{
    return info.param->name;
}

inline int64_t msSince(std::chrono::steady_clock::time_point t0)
{
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 t0)
        .count();
}

class BackendTest : public ::testing::TestWithParam<const Backend *>
{
protected:
    void SetUp() override { b = GetParam(); }

    void TearDown() override
    {
        for (auto it = owned_.rbegin(); it != owned_.rend(); ++it)
            b->close(*it);
        owned_.clear();
    }

    int own(int fd)
    {
        if (fd >= 0)
            owned_.push_back(fd);
        return fd;
    }

    // Closes an owned descriptor now.
    int closeFd(int fd)
    {
        for (auto it = owned_.begin(); it != owned_.end(); ++it) {
            if (*it == fd) {
                owned_.erase(it);
                break;
            }
        }
        return b->close(fd);
    }

    int newSocket(int family = AF_INET)
    {
        int fd = own(b->socket(family, SOCK_STREAM, 0));
        EXPECT_GE(fd, 0) << strerror(errno);
        return fd;
    }

    int setInt(int fd, int level, int name, int value)
    {
        return b->setsockopt(fd, level, name, &value, sizeof(value));
    }

    int getInt(int fd, int level, int name)
    {
        int v = -12345;
        socklen_t len = sizeof(v);
        EXPECT_EQ(b->getsockopt(fd, level, name, &v, &len), 0) << strerror(errno);
        EXPECT_EQ(len, sizeof(v));
        return v;
    }

    // A listener bound to port 0 of the loopback address of family; its port is read back after
    // listen (the r* backend may assign it only there).
    int newListener(int family, uint16_t *port, int backlog = 128)
    {
        int fd = newSocket(family);
        if (fd < 0)
            return -1;
        sockaddr_storage ss{};
        socklen_t len;
        if (family == AF_INET6) {
            auto a = loopback6(0);
            memcpy(&ss, &a, sizeof(a));
            len = sizeof(a);
        } else {
            auto a = loopback4(0);
            memcpy(&ss, &a, sizeof(a));
            len = sizeof(a);
        }
        EXPECT_EQ(b->bind(fd, reinterpret_cast<sockaddr *>(&ss), len), 0) << strerror(errno);
        EXPECT_EQ(b->listen(fd, backlog), 0) << strerror(errno);
        len = sizeof(ss);
        EXPECT_EQ(b->getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len), 0);
        *port = portOf(ss);
        EXPECT_NE(*port, 0);
        return fd;
    }

    // Connects client to addr while this thread accepts on lfd (the r* backend may complete
    // connect only once the peer accepts). Returns the accepted descriptor.
    int connectAccept(int lfd, int client, const sockaddr *addr, socklen_t len)
    {
        int rc = -1, err = 0;
        std::thread t([&] {
            rc = b->connect(client, addr, len);
            err = errno;
        });
        pollfd p{lfd, POLLIN, 0};
        int n = b->poll(&p, 1, 10000);
        int server = -1;
        if (n == 1)
            server = own(b->accept(lfd, nullptr, nullptr));
        EXPECT_EQ(n, 1) << "no connection to accept within 10 s";
        if (server < 0)
            b->shutdown(client, SHUT_RDWR);
        t.join();
        EXPECT_EQ(rc, 0) << "connect: " << strerror(err);
        EXPECT_GE(server, 0) << "accept: " << strerror(errno);
        return server;
    }

    // A connected pair over loopback of family: {client, server}.
    std::pair<int, int> connectedPair(int family = AF_INET)
    {
        uint16_t port = 0;
        int lfd = newListener(family, &port);
        int c = newSocket(family);
        if (lfd < 0 || c < 0)
            return {-1, -1};
        int s;
        if (family == AF_INET6) {
            auto a = loopback6(port);
            s = connectAccept(lfd, c, reinterpret_cast<sockaddr *>(&a), sizeof(a));
        } else {
            auto a = loopback4(port);
            s = connectAccept(lfd, c, reinterpret_cast<sockaddr *>(&a), sizeof(a));
        }
        closeFd(lfd);
        return {c, s};
    }

    // A fresh connected pair carries a few bytes: what a failure elsewhere must leave working.
    void expectNewPairWorks()
    {
        auto [c, s] = connectedPair();
        ASSERT_GE(s, 0);
        ASSERT_EQ(b->send(c, "ok", 2, 0), 2);
        char got[2];
        EXPECT_EQ(b->recv(s, got, 2, MSG_WAITALL), 2);
        EXPECT_EQ(memcmp(got, "ok", 2), 0);
    }

    // poll of one descriptor: its revents, or -1 when poll itself fails, 0 on timeout.
    int pollOne(int fd, short events, int timeoutMs)
    {
        pollfd p{fd, events, 0};
        int n = b->poll(&p, 1, timeoutMs);
        if (n < 0)
            return -1;
        return n == 0 ? 0 : p.revents;
    }

    // Polls until revents has all of want (or 5 s pass); returns the last revents.
    int waitFor(int fd, short events, short want, int timeoutMs = 5000)
    {
        auto t0 = std::chrono::steady_clock::now();
        int r = 0;
        do {
            r = pollOne(fd, events, 50);
            if (r > 0 && (r & want) == want)
                return r;
        } while (msSince(t0) < timeoutMs);
        return r;
    }

    bool sendAll(int fd, const void *p, size_t n, int flags = MSG_NOSIGNAL)
    {
        size_t off = 0;
        while (off < n) {
            ssize_t r = b->send(fd, static_cast<const char *>(p) + off, n - off, flags);
            if (r <= 0) {
                ADD_FAILURE() << "send at " << off << " of " << n << ": " << r << " "
                              << strerror(errno);
                return false;
            }
            off += r;
        }
        return true;
    }

    // Receives exactly n bytes; false on EOF or an error.
    bool recvAll(int fd, void *p, size_t n)
    {
        size_t off = 0;
        while (off < n) {
            ssize_t r = b->recv(fd, static_cast<char *>(p) + off, n - off, 0);
            if (r <= 0) {
                ADD_FAILURE() << "recv at " << off << " of " << n << ": " << r << " "
                              << strerror(errno);
                return false;
            }
            off += r;
        }
        return true;
    }

    const Backend *b = nullptr;
    std::vector<int> owned_;
};

} // namespace rstest

#endif
