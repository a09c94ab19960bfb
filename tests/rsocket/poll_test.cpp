// SPDX-License-Identifier: MIT
// poll at scale, concurrent use of one socket, and epoll semantics (repoll_* against epoll_*).

#include <atomic>
#include <chrono>
#include <cstring>
#include <poll.h>
#include <string>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

#include "harness.h"

using namespace rstest;

namespace {

using Poll = BackendTest;

TEST_P(Poll, ThousandConnections)
{
    constexpr int kConns = 1000;
    rlim_t limit = raiseFileLimit();
    // Each side of an r* connection holds a few descriptors of its own.
    if (limit < 12 * kConns)
        GTEST_SKIP() << "RLIMIT_NOFILE hard limit " << limit << " is too low";
    auto t0 = std::chrono::steady_clock::now();
    uint16_t port = 0;
    int lfd = newListener(AF_INET, &port, 4096);
    ASSERT_GE(lfd, 0);
    std::vector<int> clients, servers;
    std::atomic<bool> failed{false};
    std::thread acceptor([&] {
        for (int i = 0; i < kConns && !failed; i++) {
            pollfd p{lfd, POLLIN, 0};
            if (b->poll(&p, 1, 10000) != 1) {
                failed = true;
                break;
            }
            int s = b->accept(lfd, nullptr, nullptr);
            if (s < 0) {
                ADD_FAILURE() << "accept " << i << ": " << strerror(errno);
                failed = true;
                break;
            }
            servers.push_back(s);
        }
    });
    auto a = loopback4(port);
    for (int i = 0; i < kConns && !failed; i++) {
        int c = b->socket(AF_INET, SOCK_STREAM, 0);
        if (c < 0) {
            ADD_FAILURE() << "socket " << i << ": " << strerror(errno);
            failed = true;
            break;
        }
        clients.push_back(c);
        if (b->connect(c, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0) {
            ADD_FAILURE() << "connect " << i << ": " << strerror(errno);
            failed = true;
        }
    }
    acceptor.join();
    for (int fd : clients)
        own(fd);
    for (int fd : servers)
        own(fd);
    ASSERT_FALSE(failed);
    ASSERT_EQ(servers.size(), size_t(kConns));
    std::cout << "connected " << kConns << " in " << msSince(t0) << " ms\n";

    // Which server socket belongs to which client does not matter: send from every third
    // server, and the readable clients must be exactly as many; then identify them by content.
    std::vector<pollfd> pfds(kConns);
    for (int i = 0; i < kConns; i++)
        pfds[i] = {clients[i], POLLIN, 0};
    EXPECT_EQ(b->poll(pfds.data(), pfds.size(), 0), 0);
    int expected = 0;
    for (int i = 0; i < kConns; i += 3) {
        uint32_t tag = i;
        ASSERT_EQ(b->send(servers[i], &tag, sizeof(tag), 0), ssize_t(sizeof(tag)));
        expected++;
    }
    // Wait until all have arrived (poll reports the count of ready descriptors).
    int n = 0;
    for (int tries = 0; tries < 200; tries++) {
        for (auto &p : pfds)
            p.revents = 0;
        n = b->poll(pfds.data(), pfds.size(), 100);
        if (n == expected)
            break;
        ASSERT_LE(n, expected);
    }
    ASSERT_EQ(n, expected);
    int counted = 0;
    std::vector<bool> seen(kConns, false);
    for (int i = 0; i < kConns; i++) {
        if (pfds[i].revents == 0)
            continue;
        ASSERT_EQ(pfds[i].revents, POLLIN);
        counted++;
        uint32_t tag = ~0u;
        ASSERT_EQ(b->recv(clients[i], &tag, sizeof(tag), MSG_WAITALL), ssize_t(sizeof(tag)));
        ASSERT_LT(tag, uint32_t(kConns));
        EXPECT_EQ(tag % 3, 0u);
        EXPECT_FALSE(seen[tag]);
        seen[tag] = true;
    }
    EXPECT_EQ(counted, expected);
    // Now every connection gets one message; every one is reported.
    for (int i = 0; i < kConns; i++) {
        uint32_t tag = i;
        ASSERT_EQ(b->send(servers[i], &tag, sizeof(tag), 0), ssize_t(sizeof(tag)));
    }
    for (int tries = 0; tries < 200; tries++) {
        n = b->poll(pfds.data(), pfds.size(), 100);
        if (n == kConns)
            break;
    }
    ASSERT_EQ(n, kConns);
    for (int i = 0; i < kConns; i++) {
        EXPECT_EQ(pfds[i].revents, POLLIN);
        uint32_t tag;
        ASSERT_EQ(b->recv(clients[i], &tag, sizeof(tag), MSG_WAITALL), ssize_t(sizeof(tag)));
    }
    EXPECT_EQ(b->poll(pfds.data(), pfds.size(), 0), 0);
    std::cout << "done in " << msSince(t0) << " ms\n";
}

TEST_P(Poll, ConcurrentSendersAndReceiversOnOneSocket)
{
    auto [c, s] = connectedPair();
    ASSERT_GE(c, 0);
    constexpr size_t kPerSender = 8 << 20;
    std::atomic<uint64_t> counts[3] = {};
    auto sender = [&, c = c](uint8_t value) {
        std::vector<uint8_t> buf(4096 + value * 1000, value);
        size_t left = kPerSender;
        while (left > 0) {
            size_t n = std::min(left, buf.size());
            ssize_t r = b->send(c, buf.data(), n, MSG_NOSIGNAL);
            if (r <= 0) {
                ADD_FAILURE() << "send: " << strerror(errno);
                return;
            }
            left -= r;
        }
    };
    auto receiver = [&, s = s] {
        std::vector<uint8_t> buf(3000);
        for (;;) {
            ssize_t r = b->recv(s, buf.data(), buf.size(), 0);
            if (r < 0) {
                ADD_FAILURE() << "recv: " << strerror(errno);
                return;
            }
            if (r == 0)
                return;
            uint64_t local[3] = {};
            for (ssize_t i = 0; i < r; i++)
                local[buf[i] < 3 ? buf[i] : 0]++;
            for (int k = 0; k < 3; k++)
                counts[k] += local[k];
        }
    };
    std::thread r1(receiver), r2(receiver);
    std::thread s1(sender, 1), s2(sender, 2);
    s1.join();
    s2.join();
    ASSERT_EQ(b->shutdown(c, SHUT_WR), 0);
    r1.join();
    r2.join();
    EXPECT_EQ(counts[0].load(), 0u);
    EXPECT_EQ(counts[1].load(), kPerSender);
    EXPECT_EQ(counts[2].load(), kPerSender);
}

// A listener on loopback and a connection accepted from it: lfd, c (the client), s.
class PollListener : public BackendTest
{
protected:
    void SetUp() override
    {
        BackendTest::SetUp();
        uint16_t port = 0;
        lfd = newListener(AF_INET, &port);
        ASSERT_GE(lfd, 0);
        addr = loopback4(port);
        c = newSocket(AF_INET);
        ASSERT_GE(c, 0);
        s = connectAccept(lfd, c, reinterpret_cast<sockaddr *>(&addr), sizeof(addr));
        ASSERT_GE(s, 0);
    }

    int lfd = -1, c = -1, s = -1;
    sockaddr_in addr{};
};

// A select() loop's set: a listener beside a connection that brings data. The listener is not
// readable while only data comes, turns readable once a client has connected (a look right after
// the connect returns), stays so until the accept, and the connection's readiness is reported
// beside it each time (the shim looks at a listener through one epoll of its fds).
TEST_P(PollListener, ListenerBesideABusyConnection)
{
    const bool kernel = std::string(b->name) == "kernel";
    char byte = 'x';
    auto ready = [&](int timeoutMs, short *lrev, short *srev) {
        pollfd p[2] = {{lfd, POLLIN, 0}, {s, POLLIN, 0}};
        const int n = b->poll(p, 2, timeoutMs);
        *lrev = p[0].revents;
        *srev = p[1].revents;
        return n;
    };
    auto selected = [&](bool *l, bool *sr) {
        fd_set r;
        FD_ZERO(&r);
        FD_SET(lfd, &r);
        FD_SET(s, &r);
        timeval tv{0, 0};
        const int n = b->select(std::max(lfd, s) + 1, &r, nullptr, nullptr, &tv);
        *l = FD_ISSET(lfd, &r);
        *sr = FD_ISSET(s, &r);
        return n;
    };
    short lrev, srev;
    bool lsel, ssel;
    for (int round = 0; round < 50; round++) {
        ASSERT_EQ(b->send(c, &byte, 1, 0), 1);
        ASSERT_EQ(ready(5000, &lrev, &srev), 1) << "round " << round;
        EXPECT_EQ(lrev, 0) << "round " << round;
        EXPECT_EQ(srev, POLLIN) << "round " << round;
        ASSERT_EQ(selected(&lsel, &ssel), 1) << "round " << round;
        EXPECT_FALSE(lsel);
        EXPECT_TRUE(ssel);
        ASSERT_EQ(b->recv(s, &byte, 1, 0), 1);
        ASSERT_EQ(ready(0, &lrev, &srev), 0) << "round " << round;
    }
    for (int client = 0; client < 3; client++) {
        int c2 = newSocket(AF_INET);
        ASSERT_GE(c2, 0);
        int rc = -1;
        std::thread t(
            [&] { rc = b->connect(c2, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)); });
        if (kernel) {
            // connect() returns with the connection in the listener's queue.
            t.join();
            ASSERT_EQ(rc, 0) << strerror(errno);
            ASSERT_EQ(ready(0, &lrev, &srev), 1);
        } else {
            ASSERT_EQ(ready(10000, &lrev, &srev), 1); // the r* connect may wait for the accept
        }
        EXPECT_EQ(lrev, POLLIN);
        EXPECT_EQ(srev, 0);
        ASSERT_EQ(selected(&lsel, &ssel), 1);
        EXPECT_TRUE(lsel);
        EXPECT_FALSE(ssel);
        ASSERT_EQ(b->send(c, &byte, 1, 0), 1);
        ASSERT_EQ(ready(5000, &lrev, &srev), 2);
        EXPECT_EQ(lrev, POLLIN);
        EXPECT_EQ(srev, POLLIN);
        int a = own(b->accept(lfd, nullptr, nullptr));
        ASSERT_GE(a, 0) << strerror(errno);
        if (t.joinable())
            t.join();
        EXPECT_EQ(rc, 0);
        ASSERT_EQ(ready(0, &lrev, &srev), 1);
        EXPECT_EQ(lrev, 0);
        EXPECT_EQ(srev, POLLIN);
        ASSERT_EQ(b->recv(s, &byte, 1, 0), 1);
        ASSERT_EQ(ready(0, &lrev, &srev), 0);
        // The new connection carries bytes both ways.
        ASSERT_EQ(b->send(c2, &byte, 1, 0), 1);
        ASSERT_EQ(b->recv(a, &byte, 1, 0), 1);
        ASSERT_EQ(b->send(a, &byte, 1, 0), 1);
        ASSERT_EQ(b->recv(c2, &byte, 1, 0), 1);
        closeFd(c2);
        closeFd(a);
    }
}

// A client without the shim (raw system calls, as a peer that does not preload it) reaches the
// listener's kernel side: the loop's look finds it at once as well.
TEST_P(PollListener, ListenerBesideABusyConnectionSeesAPlainClient)
{
    if (std::string(b->name) != "kernel")
        GTEST_SKIP() << "an r* listener has no kernel side";
    char byte = 'x';
    for (int round = 0; round < 20; round++) {
        ASSERT_EQ(b->send(c, &byte, 1, 0), 1);
        pollfd p[2] = {{lfd, POLLIN, 0}, {s, POLLIN, 0}};
        ASSERT_EQ(b->poll(p, 2, 5000), 1);
        EXPECT_EQ(p[0].revents, 0);
        ASSERT_EQ(b->recv(s, &byte, 1, 0), 1);
    }
    const int raw = static_cast<int>(syscall(SYS_socket, AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_GE(raw, 0) << strerror(errno);
    ASSERT_EQ(syscall(SYS_connect, raw, &addr, sizeof(addr)), 0) << strerror(errno);
    pollfd p[2] = {{lfd, POLLIN, 0}, {s, POLLIN, 0}};
    ASSERT_EQ(b->poll(p, 2, 0), 1);
    EXPECT_EQ(p[0].revents, POLLIN);
    EXPECT_EQ(p[1].revents, 0);
    int a = own(b->accept(lfd, nullptr, nullptr));
    ASSERT_GE(a, 0) << strerror(errno);
    p[0].revents = p[1].revents = 0;
    EXPECT_EQ(b->poll(p, 2, 0), 0);
    ASSERT_EQ(syscall(SYS_write, raw, "y", 1), 1);
    ASSERT_EQ(b->recv(a, &byte, 1, 0), 1);
    EXPECT_EQ(byte, 'y');
    syscall(SYS_close, raw);
}

// ---- epoll ----

class Epoll : public BackendTest
{
protected:
    int newEpoll()
    {
        int ep = own(b->epoll_create());
        EXPECT_GE(ep, 0) << strerror(errno);
        return ep;
    }

    int add(int ep, int fd, uint32_t events, uint64_t data)
    {
        epoll_event ev{};
        ev.events = events;
        ev.data.u64 = data;
        return b->epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }

    // Waits; returns the events reported (at most 8).
    std::vector<epoll_event> wait(int ep, int timeoutMs)
    {
        epoll_event evs[8];
        int n = b->epoll_wait(ep, evs, 8, timeoutMs);
        EXPECT_GE(n, 0) << strerror(errno);
        return std::vector<epoll_event>(evs, evs + std::max(n, 0));
    }
};

constexpr uint64_t kTag = 0xdeadbeefcafef00dull;

TEST_P(Epoll, LevelTriggered)
{
    auto [c, s] = connectedPair();
    int ep = newEpoll();
    ASSERT_EQ(add(ep, c, EPOLLIN, kTag), 0);
    EXPECT_TRUE(wait(ep, 0).empty());
    ASSERT_EQ(b->send(s, "ab", 2, 0), 2);
    auto evs = wait(ep, 5000);
    ASSERT_EQ(evs.size(), 1u);
    EXPECT_EQ(evs[0].events, uint32_t(EPOLLIN));
    // A copy: epoll_event is packed on x86-64, and gtest's macros take references.
    EXPECT_EQ(uint64_t{evs[0].data.u64}, kTag);
    // Still there while unread.
    evs = wait(ep, 0);
    ASSERT_EQ(evs.size(), 1u);
    char buf[2];
    ASSERT_EQ(b->recv(c, buf, 1, 0), 1);
    EXPECT_EQ(wait(ep, 0).size(), 1u);
    ASSERT_EQ(b->recv(c, buf, 1, 0), 1);
    EXPECT_TRUE(wait(ep, 50).empty());
}

TEST_P(Epoll, Writable)
{
    auto [c, s] = connectedPair();
    (void)s;
    int ep = newEpoll();
    ASSERT_EQ(add(ep, c, EPOLLIN | EPOLLOUT | EPOLLRDHUP, 7), 0);
    auto evs = wait(ep, 0);
    ASSERT_EQ(evs.size(), 1u);
    EXPECT_EQ(evs[0].events, uint32_t(EPOLLOUT));
    EXPECT_EQ(uint64_t{evs[0].data.u64}, 7u);
}

TEST_P(Epoll, EdgeTriggered)
{
    auto [c, s] = connectedPair();
    int ep = newEpoll();
    ASSERT_EQ(add(ep, c, EPOLLIN | EPOLLET, kTag), 0);
    ASSERT_EQ(b->send(s, "1", 1, 0), 1);
    auto evs = wait(ep, 5000);
    ASSERT_EQ(evs.size(), 1u);
    EXPECT_EQ(evs[0].events, uint32_t(EPOLLIN));
    EXPECT_EQ(uint64_t{evs[0].data.u64}, kTag);
    // Not again while the byte sits unread.
    EXPECT_TRUE(wait(ep, 100).empty());
    // A new arrival is a new edge.
    ASSERT_EQ(b->send(s, "2", 1, 0), 1);
    evs = wait(ep, 5000);
    ASSERT_EQ(evs.size(), 1u);
    EXPECT_EQ(evs[0].events, uint32_t(EPOLLIN));
    EXPECT_TRUE(wait(ep, 100).empty());
    char buf[2];
    EXPECT_EQ(b->recv(c, buf, 2, MSG_WAITALL), 2);
    EXPECT_EQ(memcmp(buf, "12", 2), 0);
    EXPECT_TRUE(wait(ep, 50).empty());
}

TEST_P(Epoll, OneShot)
{
    auto [c, s] = connectedPair();
    int ep = newEpoll();
    ASSERT_EQ(add(ep, c, EPOLLIN | EPOLLONESHOT, 1), 0);
    ASSERT_EQ(b->send(s, "1", 1, 0), 1);
    auto evs = wait(ep, 5000);
    ASSERT_EQ(evs.size(), 1u);
    EXPECT_EQ(uint64_t{evs[0].data.u64}, 1u);
    EXPECT_TRUE(wait(ep, 50).empty());
    ASSERT_EQ(b->send(s, "2", 1, 0), 1);
    EXPECT_TRUE(wait(ep, 100).empty());
    // Re-armed, with new data.
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLONESHOT;
    ev.data.u64 = 2;
    ASSERT_EQ(b->epoll_ctl(ep, EPOLL_CTL_MOD, c, &ev), 0);
    evs = wait(ep, 5000);
    ASSERT_EQ(evs.size(), 1u);
    EXPECT_EQ(evs[0].events, uint32_t(EPOLLIN));
    EXPECT_EQ(uint64_t{evs[0].data.u64}, 2u);
    EXPECT_TRUE(wait(ep, 50).empty());
}

TEST_P(Epoll, MixedWithPipe)
{
    auto [c, s] = connectedPair();
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    int ep = newEpoll();
    ASSERT_EQ(add(ep, c, EPOLLIN, 100), 0);
    ASSERT_EQ(add(ep, p[0], EPOLLIN, 200), 0);
    EXPECT_TRUE(wait(ep, 0).empty());
    ASSERT_EQ(write(p[1], "p", 1), 1);
    auto evs = wait(ep, 5000);
    ASSERT_EQ(evs.size(), 1u);
    EXPECT_EQ(uint64_t{evs[0].data.u64}, 200u);
    EXPECT_EQ(evs[0].events, uint32_t(EPOLLIN));
    ASSERT_EQ(b->send(s, "s", 1, 0), 1);
    for (int i = 0; i < 100 && evs.size() < 2; i++)
        evs = wait(ep, 50);
    ASSERT_EQ(evs.size(), 2u);
    uint64_t sum = evs[0].data.u64 + evs[1].data.u64;
    EXPECT_EQ(sum, 300u);
    // A wait that sleeps is woken by the pipe alone.
    char ch;
    ASSERT_EQ(read(p[0], &ch, 1), 1);
    ASSERT_EQ(b->recv(c, &ch, 1, 0), 1);
    std::thread t([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        EXPECT_EQ(write(p[1], "q", 1), 1);
    });
    auto t0 = std::chrono::steady_clock::now();
    evs = wait(ep, 5000);
    t.join();
    EXPECT_LT(msSince(t0), 2000);
    ASSERT_EQ(evs.size(), 1u);
    EXPECT_EQ(uint64_t{evs[0].data.u64}, 200u);
    close(p[0]);
    close(p[1]);
}

TEST_P(Epoll, PointerDataAndPeerEvents)
{
    auto [c, s] = connectedPair();
    int ep = newEpoll();
    int marker = 0;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.ptr = &marker;
    ASSERT_EQ(b->epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev), 0);
    ASSERT_EQ(b->shutdown(s, SHUT_WR), 0);
    std::vector<epoll_event> evs;
    for (int i = 0; i < 100; i++) {
        evs = wait(ep, 50);
        if (!evs.empty() && (evs[0].events & EPOLLRDHUP))
            break;
    }
    ASSERT_EQ(evs.size(), 1u);
    EXPECT_EQ(evs[0].events, uint32_t(EPOLLIN | EPOLLRDHUP));
    EXPECT_EQ(static_cast<void *>(evs[0].data.ptr), &marker);
    // A reset adds EPOLLERR and EPOLLHUP, reported without being asked for.
    linger lg{1, 0};
    ASSERT_EQ(b->setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
    ASSERT_EQ(closeFd(s), 0);
    for (int i = 0; i < 100; i++) {
        evs = wait(ep, 50);
        if (!evs.empty() && (evs[0].events & EPOLLERR))
            break;
    }
    ASSERT_EQ(evs.size(), 1u);
    EXPECT_EQ(evs[0].events, uint32_t(EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR));
}

TEST_P(Epoll, CtlDel)
{
    auto [c, s] = connectedPair();
    int ep = newEpoll();
    ASSERT_EQ(add(ep, c, EPOLLIN, 1), 0);
    ASSERT_EQ(b->send(s, "x", 1, 0), 1);
    EXPECT_EQ(wait(ep, 5000).size(), 1u);
    ASSERT_EQ(b->epoll_ctl(ep, EPOLL_CTL_DEL, c, nullptr), 0);
    EXPECT_TRUE(wait(ep, 50).empty());
    // And back again.
    ASSERT_EQ(add(ep, c, EPOLLIN, 2), 0);
    auto evs = wait(ep, 0);
    ASSERT_EQ(evs.size(), 1u);
    EXPECT_EQ(uint64_t{evs[0].data.u64}, 2u);
}

TEST_P(Epoll, ClosedDescriptorLeavesTheSet)
{
    auto [c, s] = connectedPair();
    (void)s;
    int ep = newEpoll();
    ASSERT_EQ(add(ep, c, EPOLLOUT, 1), 0);
    EXPECT_EQ(wait(ep, 0).size(), 1u);
    ASSERT_EQ(closeFd(c), 0);
    EXPECT_TRUE(wait(ep, 50).empty());
}

TEST_P(Epoll, Errors)
{
    auto [c, s] = connectedPair();
    int ep = newEpoll();
    ASSERT_EQ(add(ep, c, EPOLLIN, 1), 0);
    EXPECT_EQ(add(ep, c, EPOLLIN, 1), -1);
    EXPECT_EQ(errno, EEXIST);
    epoll_event ev{};
    ev.events = EPOLLIN;
    EXPECT_EQ(b->epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev), -1);
    EXPECT_EQ(errno, ENOENT);
    EXPECT_EQ(b->epoll_ctl(ep, EPOLL_CTL_DEL, s, &ev), -1);
    EXPECT_EQ(errno, ENOENT);
    EXPECT_EQ(b->epoll_ctl(ep, EPOLL_CTL_ADD, -1, &ev), -1);
    EXPECT_EQ(errno, EBADF);
    EXPECT_EQ(b->epoll_ctl(-1, EPOLL_CTL_ADD, c, &ev), -1);
    EXPECT_EQ(errno, EBADF);
    EXPECT_EQ(b->epoll_ctl(ep, EPOLL_CTL_ADD, ep, &ev), -1);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_EQ(b->epoll_ctl(ep, 99, c, &ev), -1);
    EXPECT_EQ(errno, EINVAL);
    epoll_event evs[1];
    EXPECT_EQ(b->epoll_wait(ep, evs, 0, 0), -1);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_EQ(b->epoll_wait(-1, evs, 1, 0), -1);
    EXPECT_EQ(errno, EBADF);
    // A socket is not an epoll descriptor.
    EXPECT_EQ(b->epoll_wait(c, evs, 1, 0), -1);
    EXPECT_EQ(errno, EINVAL);
}

TEST_P(Epoll, WaitTimesOut)
{
    int ep = newEpoll();
    auto t0 = std::chrono::steady_clock::now();
    epoll_event evs[1];
    EXPECT_EQ(b->epoll_wait(ep, evs, 1, 120), 0);
    EXPECT_GE(msSince(t0), 110);
    EXPECT_LT(msSince(t0), 2000);
}

INSTANTIATE_TEST_SUITE_P(Backends, Poll, ::testing::ValuesIn(kBackends), paramName);
INSTANTIATE_TEST_SUITE_P(Backends, PollListener, ::testing::ValuesIn(kBackends), paramName);
INSTANTIATE_TEST_SUITE_P(Backends, Epoll, ::testing::ValuesIn(kBackends), paramName);

} // namespace
