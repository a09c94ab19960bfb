// SPDX-License-Identifier: MIT
// Socket semantics written once and run against kernel TCP sockets and the r* API alike.

#include <arpa/inet.h>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

#include "harness.h"

using namespace rstest;
using std::chrono::steady_clock;

namespace {

constexpr short kAll = POLLIN | POLLOUT | POLLRDHUP;

// A port nobody listens on: a kernel socket bound to it (not listening) keeps it reserved.
class ReservedPort
{
public:
    explicit ReservedPort(int family = AF_INET)
    {
        fd_ = ::socket(family, SOCK_STREAM, 0);
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
        EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr *>(&ss), len), 0);
        len = sizeof(ss);
        EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr *>(&ss), &len), 0);
        port_ = portOf(ss);
    }
    ~ReservedPort() { ::close(fd_); }
    uint16_t port() const { return port_; }

private:
    int fd_;
    uint16_t port_ = 0;
};

std::vector<uint8_t> pattern(size_t n, uint32_t seed)
{
    std::vector<uint8_t> v(n);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        v[i] = static_cast<uint8_t>(x);
    }
    return v;
}

using Semantics = BackendTest;

// ---- readiness ----

TEST_P(Semantics, PollFreshSocketIsOutAndHup)
{
    int fd = newSocket();
    EXPECT_EQ(pollOne(fd, kAll, 0), POLLOUT | POLLHUP);
}

TEST_P(Semantics, PollListenerReadableOnPendingConnection)
{
    uint16_t port = 0;
    int lfd = newListener(AF_INET, &port);
    EXPECT_EQ(pollOne(lfd, kAll, 0), 0);
    int c = newSocket();
    ASSERT_EQ(b->fcntl(c, F_SETFL, O_NONBLOCK), 0);
    auto a = loopback4(port);
    int rc = b->connect(c, reinterpret_cast<sockaddr *>(&a), sizeof(a));
    EXPECT_EQ(rc, -1);
    EXPECT_EQ(errno, EINPROGRESS);
    EXPECT_EQ(pollOne(lfd, kAll, 5000), POLLIN);
}

TEST_P(Semantics, PollConnectingHasNoEvents)
{
    // backlog 0: the accept queue holds one connection; the next SYN is dropped and that
    // client stays in SYN_SENT (the first retransmission comes after 1 s).
    uint16_t port = 0;
    int lfd = newListener(AF_INET, &port, 0);
    auto a = loopback4(port);
    int first = newSocket();
    ASSERT_EQ(b->fcntl(first, F_SETFL, O_NONBLOCK), 0);
    b->connect(first, reinterpret_cast<sockaddr *>(&a), sizeof(a));
    EXPECT_EQ(pollOne(lfd, POLLIN, 5000), POLLIN);
    EXPECT_EQ(waitFor(first, POLLOUT, POLLOUT), POLLOUT);
    int second = newSocket();
    ASSERT_EQ(b->fcntl(second, F_SETFL, O_NONBLOCK), 0);
    EXPECT_EQ(b->connect(second, reinterpret_cast<sockaddr *>(&a), sizeof(a)), -1);
    EXPECT_EQ(errno, EINPROGRESS);
    EXPECT_EQ(pollOne(second, kAll, 300), 0);
    // A second connect while the first is in progress.
    EXPECT_EQ(b->connect(second, reinterpret_cast<sockaddr *>(&a), sizeof(a)), -1);
    EXPECT_EQ(errno, EALREADY);
}

TEST_P(Semantics, PollConnectedIdleThenReadable)
{
    auto [c, s] = connectedPair();
    EXPECT_EQ(pollOne(c, kAll, 0), POLLOUT);
    EXPECT_EQ(pollOne(s, kAll, 0), POLLOUT);
    EXPECT_EQ(pollOne(c, POLLIN, 100), 0);
    ASSERT_EQ(b->send(s, "x", 1, 0), 1);
    EXPECT_EQ(waitFor(c, kAll, POLLIN), POLLIN | POLLOUT);
    char ch;
    EXPECT_EQ(b->recv(c, &ch, 1, 0), 1);
    EXPECT_EQ(pollOne(c, kAll, 0), POLLOUT);
}

TEST_P(Semantics, PollPeerShutdownWrite)
{
    auto [c, s] = connectedPair();
    ASSERT_EQ(b->shutdown(s, SHUT_WR), 0);
    EXPECT_EQ(waitFor(c, kAll, POLLRDHUP), POLLIN | POLLOUT | POLLRDHUP);
    char ch;
    EXPECT_EQ(b->recv(c, &ch, 1, 0), 0);
    // Our own side after shutdown(SHUT_WR): writable (a write fails at once), nothing to read.
    EXPECT_EQ(pollOne(s, kAll, 0), POLLOUT);
}

TEST_P(Semantics, PollBothShutdownIsHup)
{
    auto [c, s] = connectedPair();
    ASSERT_EQ(b->shutdown(s, SHUT_WR), 0);
    ASSERT_EQ(b->shutdown(c, SHUT_WR), 0);
    EXPECT_EQ(waitFor(c, kAll, POLLHUP), POLLIN | POLLOUT | POLLRDHUP | POLLHUP);
    EXPECT_EQ(waitFor(s, kAll, POLLHUP), POLLIN | POLLOUT | POLLRDHUP | POLLHUP);
}

TEST_P(Semantics, PollPeerResetIsErrHup)
{
    auto [c, s] = connectedPair();
    linger lg{1, 0};
    ASSERT_EQ(b->setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
    ASSERT_EQ(closeFd(s), 0);
    EXPECT_EQ(waitFor(c, kAll, POLLERR), POLLIN | POLLOUT | POLLRDHUP | POLLHUP | POLLERR);
    // POLLERR and POLLHUP are reported even when not asked for.
    EXPECT_EQ(pollOne(c, 0, 0), POLLHUP | POLLERR);
    char ch;
    EXPECT_EQ(b->recv(c, &ch, 1, 0), -1);
    EXPECT_EQ(errno, ECONNRESET);
    EXPECT_EQ(b->recv(c, &ch, 1, 0), 0);
    EXPECT_EQ(getInt(c, SOL_SOCKET, SO_ERROR), 0);
}

TEST_P(Semantics, PollClosedDescriptorIsNval)
{
    int fd = newSocket();
    ASSERT_EQ(closeFd(fd), 0);
    pollfd p[2] = {{fd, POLLIN, 0}, {-1, POLLIN, 0}};
    EXPECT_EQ(b->poll(p, 2, 0), 1);
    EXPECT_EQ(p[0].revents, POLLNVAL);
    EXPECT_EQ(p[1].revents, 0);
}

TEST_P(Semantics, PollTimesOut)
{
    auto [c, s] = connectedPair();
    (void)s;
    auto t0 = steady_clock::now();
    EXPECT_EQ(pollOne(c, POLLIN, 150), 0);
    EXPECT_GE(msSince(t0), 140);
    EXPECT_LT(msSince(t0), 2000);
}

TEST_P(Semantics, SendBufferFullClearsPollout)
{
    auto [c, s] = connectedPair();
    ASSERT_EQ(b->fcntl(c, F_SETFL, O_NONBLOCK), 0);
    std::vector<char> buf(65536, 'f');
    size_t sent = 0;
    for (int i = 0; i < 100000; i++) {
        ssize_t r = b->send(c, buf.data(), buf.size(), MSG_NOSIGNAL);
        if (r < 0) {
            EXPECT_EQ(errno, EAGAIN);
            break;
        }
        sent += r;
    }
    EXPECT_GT(sent, 0u);
    EXPECT_EQ(pollOne(c, POLLOUT, 0), 0);
    // Drain everything: POLLOUT comes back.
    std::vector<char> in(1 << 20);
    size_t got = 0;
    while (got < sent) {
        ssize_t r = b->recv(s, in.data(), in.size(), 0);
        ASSERT_GT(r, 0) << strerror(errno);
        got += r;
    }
    EXPECT_EQ(waitFor(c, POLLOUT, POLLOUT), POLLOUT);
}

TEST_P(Semantics, SelectReadWriteAndTimeout)
{
    auto [c, s] = connectedPair();
    fd_set r, w;
    FD_ZERO(&r);
    FD_SET(c, &r);
    timeval tv{0, 50000};
    auto t0 = steady_clock::now();
    EXPECT_EQ(b->select(c + 1, &r, nullptr, nullptr, &tv), 0);
    EXPECT_GE(msSince(t0), 45);
    EXPECT_FALSE(FD_ISSET(c, &r));
    EXPECT_EQ(tv.tv_sec, 0);
    EXPECT_EQ(tv.tv_usec, 0); // Linux writes back the time left
    ASSERT_EQ(b->send(s, "y", 1, 0), 1);
    FD_ZERO(&r);
    FD_ZERO(&w);
    FD_SET(c, &r);
    FD_SET(c, &w);
    tv = {5, 0};
    EXPECT_EQ(b->select(c + 1, &r, &w, nullptr, &tv), 2);
    EXPECT_TRUE(FD_ISSET(c, &r));
    EXPECT_TRUE(FD_ISSET(c, &w));
}

// The time left is written back for a select over descriptors the kernel answers for (a pipe)
// too, whether it was answered at once or after a wait.
TEST_P(Semantics, SelectWritesBackTheTimeLeft)
{
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    fd_set r;
    FD_ZERO(&r);
    FD_SET(p[0], &r);
    std::thread writer([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        EXPECT_EQ(write(p[1], "x", 1), 1);
    });
    timeval tv{5, 0};
    EXPECT_EQ(b->select(p[0] + 1, &r, nullptr, nullptr, &tv), 1);
    writer.join();
    const long leftMs = tv.tv_sec * 1000 + tv.tv_usec / 1000;
    EXPECT_LE(leftMs, 4920) << "the wait was not counted";
    EXPECT_GT(leftMs, 3000);
    // Ready at once: next to nothing taken.
    FD_ZERO(&r);
    FD_SET(p[0], &r);
    tv = {5, 0};
    EXPECT_EQ(b->select(p[0] + 1, &r, nullptr, nullptr, &tv), 1);
    EXPECT_GT(tv.tv_sec * 1000 + tv.tv_usec / 1000, 4900);
    EXPECT_LE(tv.tv_sec * 1000000 + tv.tv_usec, 5000000);
    close(p[0]);
    close(p[1]);
}

TEST_P(Semantics, SelectClosedDescriptorIsEbadf)
{
    int fd = newSocket();
    ASSERT_EQ(closeFd(fd), 0);
    fd_set r;
    FD_ZERO(&r);
    FD_SET(fd, &r);
    timeval tv{0, 0};
    EXPECT_EQ(b->select(fd + 1, &r, nullptr, nullptr, &tv), -1);
    EXPECT_EQ(errno, EBADF);
}

// ---- data transfer and receive flags ----

TEST_P(Semantics, EofAfterPeerClose)
{
    auto [c, s] = connectedPair();
    ASSERT_EQ(b->send(s, "abc", 3, 0), 3);
    ASSERT_EQ(closeFd(s), 0);
    char buf[8];
    EXPECT_EQ(b->recv(c, buf, sizeof(buf), MSG_WAITALL), 3);
    EXPECT_EQ(memcmp(buf, "abc", 3), 0);
    EXPECT_EQ(b->recv(c, buf, sizeof(buf), 0), 0);
    EXPECT_EQ(b->recv(c, buf, sizeof(buf), 0), 0);
    EXPECT_EQ(b->read(c, buf, sizeof(buf)), 0);
}

TEST_P(Semantics, ZeroLengthRecvAndSend)
{
    // Linux: a zero-length recv waits like any other (for one byte to be there), then returns 0.
    auto [c, s] = connectedPair();
    char buf[4];
    EXPECT_EQ(b->recv(c, buf, 0, MSG_DONTWAIT), -1);
    EXPECT_EQ(errno, EAGAIN);
    EXPECT_EQ(b->send(s, buf, 0, 0), 0);
    ASSERT_EQ(b->send(s, "d", 1, 0), 1);
    ASSERT_EQ(waitFor(c, POLLIN, POLLIN), POLLIN);
    EXPECT_EQ(b->recv(c, buf, 0, 0), 0);
    EXPECT_EQ(b->recv(c, buf, sizeof(buf), 0), 1);
}

TEST_P(Semantics, MsgPeek)
{
    auto [c, s] = connectedPair();
    ASSERT_EQ(b->send(s, "hello", 5, 0), 5);
    ASSERT_EQ(waitFor(c, POLLIN, POLLIN), POLLIN);
    char buf[16] = {};
    EXPECT_EQ(b->recv(c, buf, sizeof(buf), MSG_PEEK), 5);
    EXPECT_STREQ(buf, "hello");
    memset(buf, 0, sizeof(buf));
    EXPECT_EQ(b->recv(c, buf, 2, MSG_PEEK), 2);
    EXPECT_STREQ(buf, "he");
    memset(buf, 0, sizeof(buf));
    EXPECT_EQ(b->recv(c, buf, sizeof(buf), 0), 5);
    EXPECT_STREQ(buf, "hello");
    EXPECT_EQ(b->recv(c, buf, sizeof(buf), MSG_DONTWAIT | MSG_PEEK), -1);
    EXPECT_EQ(errno, EAGAIN);
}

TEST_P(Semantics, MsgWaitall)
{
    auto [c, s] = connectedPair();
    auto data = pattern(3000, 1);
    std::thread t([&, s = s] {
        for (int i = 0; i < 3; i++) {
            std::this_thread::sleep_for(std::chrono::milliseconds(30));
            EXPECT_EQ(b->send(s, data.data() + i * 1000, 1000, 0), 1000);
        }
    });
    std::vector<uint8_t> in(3000);
    EXPECT_EQ(b->recv(c, in.data(), in.size(), MSG_WAITALL), 3000);
    t.join();
    EXPECT_EQ(in, data);
}

TEST_P(Semantics, MsgWaitallReturnsShortAtEof)
{
    auto [c, s] = connectedPair();
    ASSERT_EQ(b->send(s, "abcd", 4, 0), 4);
    ASSERT_EQ(b->shutdown(s, SHUT_WR), 0);
    char buf[64];
    EXPECT_EQ(b->recv(c, buf, sizeof(buf), MSG_WAITALL), 4);
}

TEST_P(Semantics, MsgDontwait)
{
    auto [c, s] = connectedPair();
    char buf[4];
    EXPECT_EQ(b->recv(c, buf, sizeof(buf), MSG_DONTWAIT), -1);
    EXPECT_EQ(errno, EAGAIN);
    ASSERT_EQ(b->send(s, "z", 1, 0), 1);
    ASSERT_EQ(waitFor(c, POLLIN, POLLIN), POLLIN);
    EXPECT_EQ(b->recv(c, buf, sizeof(buf), MSG_DONTWAIT), 1);
    // The descriptor itself stayed blocking.
    EXPECT_EQ(b->fcntl(c, F_GETFL, 0) & O_NONBLOCK, 0);
}

TEST_P(Semantics, MsgTruncDiscards)
{
    auto [c, s] = connectedPair();
    ASSERT_EQ(b->send(s, "abcdef", 6, 0), 6);
    ASSERT_EQ(waitFor(c, POLLIN, POLLIN), POLLIN);
    EXPECT_EQ(b->recv(c, nullptr, 3, MSG_TRUNC), 3);
    char buf[8] = {};
    EXPECT_EQ(b->recv(c, buf, sizeof(buf) - 1, 0), 3);
    EXPECT_STREQ(buf, "def");
}

TEST_P(Semantics, ReadWriteVectors)
{
    auto [c, s] = connectedPair();
    char a[] = "one", bb[] = "two", cc[] = "three";
    iovec out[3] = {{a, 3}, {bb, 3}, {cc, 5}};
    EXPECT_EQ(b->writev(s, out, 3), 11);
    EXPECT_EQ(b->write(s, "!", 1), 1);
    char x[4] = {}, y[9] = {};
    iovec in[2] = {{x, 3}, {y, 8}};
    ASSERT_EQ(b->recv(c, x, 0, 0), 0);
    ASSERT_EQ(waitFor(c, POLLIN, POLLIN), POLLIN);
    size_t got = 0;
    while (got < 11) {
        // Advance the vector past what has arrived so far.
        iovec cur[2];
        int n = 0;
        size_t skip = got;
        for (auto &v : in) {
            if (skip >= v.iov_len) {
                skip -= v.iov_len;
                continue;
            }
            cur[n++] = {static_cast<char *>(v.iov_base) + skip, v.iov_len - skip};
            skip = 0;
        }
        ssize_t r = b->readv(c, cur, n);
        ASSERT_GT(r, 0) << strerror(errno);
        got += r;
    }
    EXPECT_STREQ(x, "one");
    EXPECT_STREQ(y, "twothree");
    char z = 0;
    EXPECT_EQ(b->read(c, &z, 1), 1);
    EXPECT_EQ(z, '!');
}

TEST_P(Semantics, SendmsgRecvmsg)
{
    auto [c, s] = connectedPair();
    char a[] = "head", bb[] = "tail";
    iovec out[2] = {{a, 4}, {bb, 4}};
    msghdr m{};
    m.msg_iov = out;
    m.msg_iovlen = 2;
    EXPECT_EQ(b->sendmsg(s, &m, MSG_NOSIGNAL), 8);
    char buf[9] = {};
    iovec in[2] = {{buf, 2}, {buf + 2, 6}};
    msghdr r{};
    sockaddr_storage name{};
    r.msg_name = &name;
    r.msg_namelen = sizeof(name);
    r.msg_iov = in;
    r.msg_iovlen = 2;
    EXPECT_EQ(b->recvmsg(c, &r, MSG_WAITALL), 8);
    EXPECT_STREQ(buf, "headtail");
    EXPECT_EQ(r.msg_flags, 0);
    EXPECT_EQ(r.msg_namelen, 0u); // TCP reports no source address
}

TEST_P(Semantics, SendtoRecvfromOnConnectedSocket)
{
    auto [c, s] = connectedPair();
    // TCP ignores the destination of sendto on a connected socket.
    auto bogus = loopback4(9);
    EXPECT_EQ(b->sendto(s, "to", 2, 0, reinterpret_cast<sockaddr *>(&bogus), sizeof(bogus)), 2);
    EXPECT_EQ(b->sendto(s, "!!", 2, 0, nullptr, 0), 2);
    char buf[4] = {};
    sockaddr_storage from{};
    socklen_t len = sizeof(from);
    EXPECT_EQ(b->recvfrom(c, buf, 4, MSG_WAITALL, reinterpret_cast<sockaddr *>(&from), &len), 4);
    EXPECT_EQ(memcmp(buf, "to!!", 4), 0);
    EXPECT_EQ(len, 0u); // TCP reports no source address
}

TEST_P(Semantics, HalfClose)
{
    auto [c, s] = connectedPair();
    ASSERT_EQ(b->send(c, "request", 7, 0), 7);
    ASSERT_EQ(b->shutdown(c, SHUT_WR), 0);
    char buf[16] = {};
    EXPECT_EQ(b->recv(s, buf, sizeof(buf), MSG_WAITALL), 7);
    EXPECT_STREQ(buf, "request");
    EXPECT_EQ(b->recv(s, buf, sizeof(buf), 0), 0);
    // The other direction still works.
    ASSERT_EQ(b->send(s, "reply", 5, 0), 5);
    ASSERT_EQ(closeFd(s), 0);
    memset(buf, 0, sizeof(buf));
    EXPECT_EQ(b->recv(c, buf, sizeof(buf), MSG_WAITALL), 5);
    EXPECT_STREQ(buf, "reply");
    EXPECT_EQ(b->recv(c, buf, sizeof(buf), 0), 0);
}

TEST_P(Semantics, ShutdownReadReturnsEof)
{
    auto [c, s] = connectedPair();
    (void)s;
    ASSERT_EQ(b->shutdown(c, SHUT_RD), 0);
    char ch;
    EXPECT_EQ(b->recv(c, &ch, 1, 0), 0);
    EXPECT_EQ(pollOne(c, kAll, 0), POLLIN | POLLOUT | POLLRDHUP);
}

TEST_P(Semantics, AllDataDeliveredBeforeEofAfterClose)
{
    auto [c, s] = connectedPair();
    constexpr size_t kSize = 1 << 20;
    auto data = pattern(kSize, 7);
    std::thread t([&, s = s] {
        sendAll(s, data.data(), data.size());
        EXPECT_EQ(closeFd(s), 0);
    });
    std::vector<uint8_t> in(kSize + 100);
    size_t got = 0;
    for (;;) {
        ssize_t r = b->recv(c, in.data() + got, in.size() - got, 0);
        ASSERT_GE(r, 0) << strerror(errno);
        if (r == 0)
            break;
        got += r;
    }
    t.join();
    ASSERT_EQ(got, kSize);
    in.resize(kSize);
    EXPECT_TRUE(in == data);
}

TEST_P(Semantics, LargeTransfersBothDirections)
{
    auto [c, s] = connectedPair();
    constexpr size_t kSize = 16 << 20;
    auto up = pattern(kSize, 11), down = pattern(kSize, 12);
    std::vector<uint8_t> gotUp(kSize), gotDown(kSize);
    std::thread t1([&, c = c] { sendAll(c, up.data(), kSize); });
    std::thread t2([&, s = s] { sendAll(s, down.data(), kSize); });
    std::thread t3([&, s = s] { recvAll(s, gotUp.data(), kSize); });
    recvAll(c, gotDown.data(), kSize);
    t1.join();
    t2.join();
    t3.join();
    EXPECT_TRUE(gotUp == up);
    EXPECT_TRUE(gotDown == down);
}

TEST_P(Semantics, ConnectSendCloseBeforeAccept)
{
    uint16_t port = 0;
    int lfd = newListener(AF_INET, &port);
    int c = newSocket();
    ASSERT_EQ(b->fcntl(c, F_SETFL, O_NONBLOCK), 0);
    auto a = loopback4(port);
    b->connect(c, reinterpret_cast<sockaddr *>(&a), sizeof(a));
    // Whether connect completes before accept is the backend's business; the data must not be
    // lost either way. Accept from another thread so that a connect that waits for it can end.
    int s = -1;
    std::thread t([&] { s = b->accept(lfd, nullptr, nullptr); });
    ASSERT_EQ(waitFor(c, POLLOUT, POLLOUT), POLLOUT);
    ASSERT_EQ(b->send(c, "bye", 3, 0), 3);
    ASSERT_EQ(closeFd(c), 0);
    t.join();
    ASSERT_GE(own(s), 0);
    char buf[8];
    EXPECT_EQ(b->recv(s, buf, sizeof(buf), MSG_WAITALL), 3);
    EXPECT_EQ(b->recv(s, buf, sizeof(buf), 0), 0);
}

TEST_P(Semantics, ConnectCompletesWithoutAccept)
{
    // The kernel completes the handshake for a listener that has not called accept yet.
    uint16_t port = 0;
    int lfd = newListener(AF_INET, &port);
    int c = newSocket();
    ASSERT_EQ(b->fcntl(c, F_SETFL, O_NONBLOCK), 0);
    auto a = loopback4(port);
    EXPECT_EQ(b->connect(c, reinterpret_cast<sockaddr *>(&a), sizeof(a)), -1);
    EXPECT_EQ(errno, EINPROGRESS);
    EXPECT_EQ(waitFor(c, POLLOUT, POLLOUT, 3000), POLLOUT);
    EXPECT_EQ(getInt(c, SOL_SOCKET, SO_ERROR), 0);
    EXPECT_GE(own(b->accept(lfd, nullptr, nullptr)), 0);
}

// ---- O_NONBLOCK ----

TEST_P(Semantics, NonblockingViaFcntl)
{
    uint16_t port = 0;
    int lfd = newListener(AF_INET, &port);
    int fl = b->fcntl(lfd, F_GETFL, 0);
    EXPECT_EQ(fl & O_ACCMODE, O_RDWR);
    EXPECT_EQ(fl & O_NONBLOCK, 0);
    ASSERT_EQ(b->fcntl(lfd, F_SETFL, fl | O_NONBLOCK), 0);
    EXPECT_EQ(b->fcntl(lfd, F_GETFL, 0), fl | O_NONBLOCK);
    EXPECT_EQ(b->accept(lfd, nullptr, nullptr), -1);
    EXPECT_EQ(errno, EAGAIN);

    int c = newSocket();
    ASSERT_EQ(b->fcntl(c, F_SETFL, O_NONBLOCK), 0);
    auto a = loopback4(port);
    EXPECT_EQ(b->connect(c, reinterpret_cast<sockaddr *>(&a), sizeof(a)), -1);
    EXPECT_EQ(errno, EINPROGRESS);
    ASSERT_EQ(pollOne(lfd, POLLIN, 5000), POLLIN);
    int s = own(b->accept(lfd, nullptr, nullptr));
    ASSERT_GE(s, 0) << strerror(errno);
    EXPECT_EQ(waitFor(c, POLLOUT, POLLOUT), POLLOUT);
    EXPECT_EQ(getInt(c, SOL_SOCKET, SO_ERROR), 0);
    // connect again: the first call after completion reports success, the next EISCONN.
    EXPECT_EQ(b->connect(c, reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0) << strerror(errno);
    EXPECT_EQ(b->connect(c, reinterpret_cast<sockaddr *>(&a), sizeof(a)), -1);
    EXPECT_EQ(errno, EISCONN);

    // An accepted socket does not inherit O_NONBLOCK from the listener.
    EXPECT_EQ(b->fcntl(s, F_GETFL, 0) & O_NONBLOCK, 0);
    char buf[4];
    EXPECT_EQ(b->recv(c, buf, sizeof(buf), 0), -1);
    EXPECT_EQ(errno, EAGAIN);
    EXPECT_EQ(b->read(c, buf, sizeof(buf)), -1);
    EXPECT_EQ(errno, EAGAIN);
    ASSERT_EQ(b->send(s, "n", 1, 0), 1);
    ASSERT_EQ(waitFor(c, POLLIN, POLLIN), POLLIN);
    EXPECT_EQ(b->recv(c, buf, sizeof(buf), 0), 1);
    // Back to blocking.
    ASSERT_EQ(b->fcntl(c, F_SETFL, 0), 0);
    EXPECT_EQ(b->fcntl(c, F_GETFL, 0) & O_NONBLOCK, 0);
}

TEST_P(Semantics, FcntlFdFlags)
{
    int fd = newSocket();
    EXPECT_EQ(b->fcntl(fd, F_GETFD, 0), 0);
    EXPECT_EQ(b->fcntl(fd, F_SETFD, FD_CLOEXEC), 0);
    EXPECT_EQ(b->fcntl(fd, F_GETFD, 0), FD_CLOEXEC);
}

// ---- connection errors ----

TEST_P(Semantics, ConnectRefusedBlocking)
{
    ReservedPort port;
    int c = newSocket();
    auto a = loopback4(port.port());
    EXPECT_EQ(b->connect(c, reinterpret_cast<sockaddr *>(&a), sizeof(a)), -1);
    EXPECT_EQ(errno, ECONNREFUSED);
    EXPECT_EQ(getInt(c, SOL_SOCKET, SO_ERROR), 0); // reported once, by connect
}

TEST_P(Semantics, ConnectRefusedNonblocking)
{
    ReservedPort port;
    int c = newSocket();
    ASSERT_EQ(b->fcntl(c, F_SETFL, O_NONBLOCK), 0);
    auto a = loopback4(port.port());
    EXPECT_EQ(b->connect(c, reinterpret_cast<sockaddr *>(&a), sizeof(a)), -1);
    EXPECT_EQ(errno, EINPROGRESS);
    EXPECT_EQ(waitFor(c, POLLOUT, POLLERR), POLLOUT | POLLERR | POLLHUP);
    EXPECT_EQ(getInt(c, SOL_SOCKET, SO_ERROR), ECONNREFUSED);
    EXPECT_EQ(getInt(c, SOL_SOCKET, SO_ERROR), 0);
}

TEST_P(Semantics, ConnectTwiceIsEisconn)
{
    auto [c, s] = connectedPair();
    (void)s;
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    ASSERT_EQ(b->getpeername(c, reinterpret_cast<sockaddr *>(&peer), &len), 0);
    EXPECT_EQ(b->connect(c, reinterpret_cast<sockaddr *>(&peer), len), -1);
    EXPECT_EQ(errno, EISCONN);
}

TEST_P(Semantics, UnconnectedSocketErrors)
{
    int fd = newSocket();
    char buf[4];
    EXPECT_EQ(b->recv(fd, buf, sizeof(buf), 0), -1);
    EXPECT_EQ(errno, ENOTCONN);
    EXPECT_EQ(b->read(fd, buf, sizeof(buf)), -1);
    EXPECT_EQ(errno, ENOTCONN);
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    EXPECT_EQ(b->getpeername(fd, reinterpret_cast<sockaddr *>(&ss), &len), -1);
    EXPECT_EQ(errno, ENOTCONN);
    EXPECT_EQ(b->shutdown(fd, SHUT_RDWR), -1);
    EXPECT_EQ(errno, ENOTCONN);
    EXPECT_EQ(b->send(fd, "x", 1, MSG_NOSIGNAL), -1);
    EXPECT_EQ(errno, EPIPE);
    // An unbound socket's name is the wildcard address, port 0.
    len = sizeof(ss);
    EXPECT_EQ(b->getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len), 0);
    EXPECT_EQ(len, sizeof(sockaddr_in));
    EXPECT_EQ(ss.ss_family, AF_INET);
    EXPECT_EQ(portOf(ss), 0);
    EXPECT_EQ(reinterpret_cast<sockaddr_in &>(ss).sin_addr.s_addr, htonl(INADDR_ANY));
}

TEST_P(Semantics, SendAfterShutdownIsEpipe)
{
    auto [c, s] = connectedPair();
    (void)s;
    ASSERT_EQ(b->shutdown(c, SHUT_WR), 0);
    EXPECT_EQ(b->send(c, "x", 1, MSG_NOSIGNAL), -1);
    EXPECT_EQ(errno, EPIPE);
}

std::atomic<int> gSigpipes{0};
std::atomic<pthread_t> gSigpipeThread{};

void onSigpipe(int)
{
    gSigpipes++;
    gSigpipeThread = pthread_self();
}

TEST_P(Semantics, SendAfterShutdownRaisesSigpipe)
{
    auto [c, s] = connectedPair();
    (void)s;
    struct sigaction sa
    {
    }, old{};
    sa.sa_handler = onSigpipe;
    sigemptyset(&sa.sa_mask);
    ASSERT_EQ(sigaction(SIGPIPE, &sa, &old), 0);
    gSigpipes = 0;
    ASSERT_EQ(b->shutdown(c, SHUT_WR), 0);
    EXPECT_EQ(b->send(c, "x", 1, MSG_NOSIGNAL), -1);
    EXPECT_EQ(gSigpipes.load(), 0);
    EXPECT_EQ(b->send(c, "x", 1, 0), -1);
    EXPECT_EQ(errno, EPIPE);
    // Linux delivers it to the sending thread before send returns.
    EXPECT_EQ(gSigpipes.load(), 1);
    EXPECT_TRUE(pthread_equal(gSigpipeThread.load(), pthread_self()));
    EXPECT_EQ(b->write(c, "x", 1), -1);
    EXPECT_EQ(errno, EPIPE);
    EXPECT_EQ(gSigpipes.load(), 2);
    sigaction(SIGPIPE, &old, nullptr);
}

TEST_P(Semantics, BadDescriptors)
{
    // -1 and a descriptor number that is not open.
    int closed = newSocket();
    ASSERT_EQ(closeFd(closed), 0);
    for (int fd : {-1, closed}) {
        SCOPED_TRACE(fd);
        char buf[4];
        sockaddr_storage ss{};
        socklen_t len = sizeof(ss);
        auto a = loopback4(1);
        int v = 1;
        iovec iov{buf, sizeof(buf)};
        msghdr m{};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        EXPECT_EQ(b->close(fd), -1);
        EXPECT_EQ(errno, EBADF);
        EXPECT_EQ(b->bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)), -1);
        EXPECT_EQ(errno, EBADF);
        EXPECT_EQ(b->listen(fd, 1), -1);
        EXPECT_EQ(errno, EBADF);
        EXPECT_EQ(b->accept(fd, nullptr, nullptr), -1);
        EXPECT_EQ(errno, EBADF);
        EXPECT_EQ(b->connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)), -1);
        EXPECT_EQ(errno, EBADF);
        EXPECT_EQ(b->shutdown(fd, SHUT_RDWR), -1);
        EXPECT_EQ(errno, EBADF);
        EXPECT_EQ(b->recv(fd, buf, sizeof(buf), 0), -1);
        EXPECT_EQ(errno, EBADF);
        EXPECT_EQ(b->recvfrom(fd, buf, sizeof(buf), 0, nullptr, nullptr), -1);
        EXPECT_EQ(errno, EBADF);
        EXPECT_EQ(b->recvmsg(fd, &m, 0), -1);
        EXPECT_EQ(errno, EBADF);
        EXPECT_EQ(b->send(fd, buf, sizeof(buf), MSG_NOSIGNAL), -1);
        EXPECT_EQ(errno, EBADF);
        EXPECT_EQ(b->sendto(fd, buf, sizeof(buf), MSG_NOSIGNAL, nullptr, 0), -1);
        EXPECT_EQ(errno, EBADF);
        EXPECT_EQ(b->sendmsg(fd, &m, MSG_NOSIGNAL), -1);
        EXPECT_EQ(errno, EBADF);
        EXPECT_EQ(b->read(fd, buf, sizeof(buf)), -1);
        EXPECT_EQ(errno, EBADF);
        EXPECT_EQ(b->readv(fd, &iov, 1), -1);
        EXPECT_EQ(errno, EBADF);
        EXPECT_EQ(b->write(fd, buf, sizeof(buf)), -1);
        EXPECT_EQ(errno, EBADF);
        EXPECT_EQ(b->writev(fd, &iov, 1), -1);
        EXPECT_EQ(errno, EBADF);
        EXPECT_EQ(b->getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len), -1);
        EXPECT_EQ(errno, EBADF);
        EXPECT_EQ(b->getpeername(fd, reinterpret_cast<sockaddr *>(&ss), &len), -1);
        EXPECT_EQ(errno, EBADF);
        EXPECT_EQ(b->setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &v, sizeof(v)), -1);
        EXPECT_EQ(errno, EBADF);
        len = sizeof(v);
        EXPECT_EQ(b->getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &v, &len), -1);
        EXPECT_EQ(errno, EBADF);
        EXPECT_EQ(b->fcntl(fd, F_GETFL, 0), -1);
        EXPECT_EQ(errno, EBADF);
    }
}

TEST_P(Semantics, InvalidArguments)
{
    auto a = loopback4(0);
    int fd = newSocket();
    // bind twice
    ASSERT_EQ(b->bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0);
    EXPECT_EQ(b->bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)), -1);
    EXPECT_EQ(errno, EINVAL);
    // accept on a socket that does not listen
    EXPECT_EQ(b->accept(fd, nullptr, nullptr), -1);
    EXPECT_EQ(errno, EINVAL);
    // a short address
    int fd2 = newSocket();
    EXPECT_EQ(b->bind(fd2, reinterpret_cast<sockaddr *>(&a), sizeof(a) - 1), -1);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_EQ(b->connect(fd2, reinterpret_cast<sockaddr *>(&a), sizeof(a) - 1), -1);
    EXPECT_EQ(errno, EINVAL);
    // the wrong family
    auto a6 = loopback6(0);
    EXPECT_EQ(b->bind(fd2, reinterpret_cast<sockaddr *>(&a6), sizeof(a6)), -1);
    EXPECT_EQ(errno, EAFNOSUPPORT);
    // shutdown with a bad how
    auto [c, s] = connectedPair();
    (void)s;
    EXPECT_EQ(b->shutdown(c, 42), -1);
    EXPECT_EQ(errno, EINVAL);
    // listen on a connected socket
    EXPECT_EQ(b->listen(c, 1), -1);
    EXPECT_EQ(errno, EINVAL);
    // option values that are too short
    char one = 1;
    EXPECT_EQ(b->setsockopt(c, SOL_SOCKET, SO_KEEPALIVE, &one, 1), -1);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_EQ(b->setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, 1), -1);
    EXPECT_EQ(errno, EINVAL);
    int v = 0;
    socklen_t len = sizeof(v);
    EXPECT_EQ(b->getsockopt(c, SOL_SOCKET, 0x7777, &v, &len), -1);
    EXPECT_EQ(errno, ENOPROTOOPT);
    // epoll-style and socket creation errors
    EXPECT_EQ(b->socket(AF_INET, SOCK_STREAM, IPPROTO_UDP), -1);
    EXPECT_EQ(errno, EPROTONOSUPPORT);
}

TEST_P(Semantics, AddressInUse)
{
    uint16_t port = 0;
    int lfd = newListener(AF_INET, &port);
    (void)lfd;
    auto a = loopback4(port);
    int fd = newSocket();
    EXPECT_EQ(b->bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)), -1);
    EXPECT_EQ(errno, EADDRINUSE);
    // SO_REUSEADDR does not help against a listener.
    int fd2 = newSocket();
    ASSERT_EQ(setInt(fd2, SOL_SOCKET, SO_REUSEADDR, 1), 0);
    EXPECT_EQ(b->bind(fd2, reinterpret_cast<sockaddr *>(&a), sizeof(a)), -1);
    EXPECT_EQ(errno, EADDRINUSE);
}

TEST_P(Semantics, ReuseaddrBindsABoundPort)
{
    int x = newSocket(), y = newSocket(), z = newSocket();
    EXPECT_EQ(getInt(x, SOL_SOCKET, SO_REUSEADDR), 0);
    ASSERT_EQ(setInt(x, SOL_SOCKET, SO_REUSEADDR, 1), 0);
    EXPECT_EQ(getInt(x, SOL_SOCKET, SO_REUSEADDR), 1);
    ASSERT_EQ(setInt(y, SOL_SOCKET, SO_REUSEADDR, 1), 0);
    auto a = loopback4(0);
    ASSERT_EQ(b->bind(x, reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0);
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    ASSERT_EQ(b->getsockname(x, reinterpret_cast<sockaddr *>(&ss), &len), 0);
    a.sin_port = reinterpret_cast<sockaddr_in &>(ss).sin_port;
    if (a.sin_port == 0)
        GTEST_SKIP() << "the port is assigned at listen";
    // Both with SO_REUSEADDR, neither listening: allowed. Without it: EADDRINUSE.
    EXPECT_EQ(b->bind(y, reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0);
    EXPECT_EQ(b->bind(z, reinterpret_cast<sockaddr *>(&a), sizeof(a)), -1);
    EXPECT_EQ(errno, EADDRINUSE);
}

TEST_P(Semantics, BindAssignsPortBeforeListen)
{
    int fd = newSocket();
    auto a = loopback4(0);
    ASSERT_EQ(b->bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0);
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    ASSERT_EQ(b->getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len), 0);
    EXPECT_NE(portOf(ss), 0);
}

// ---- options ----

TEST_P(Semantics, RcvtimeoTimesOut)
{
    auto [c, s] = connectedPair();
    (void)s;
    timeval tv{0, 200000};
    ASSERT_EQ(b->setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    timeval back{};
    socklen_t len = sizeof(back);
    ASSERT_EQ(b->getsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &back, &len), 0);
    EXPECT_EQ(len, sizeof(back));
    EXPECT_EQ(back.tv_sec, 0);
    EXPECT_EQ(back.tv_usec, 200000);
    char ch;
    auto t0 = steady_clock::now();
    EXPECT_EQ(b->recv(c, &ch, 1, 0), -1);
    EXPECT_EQ(errno, EAGAIN);
    EXPECT_GE(msSince(t0), 180);
    EXPECT_LT(msSince(t0), 1500);
    // A timeout of zero means none.
    tv = {0, 0};
    ASSERT_EQ(b->setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    // An invalid one.
    tv = {0, 1000000};
    EXPECT_EQ(b->setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), -1);
    EXPECT_EQ(errno, EDOM);
}

TEST_P(Semantics, SndtimeoTimesOut)
{
    uint16_t port = 0;
    int lfd = newListener(AF_INET, &port);
    int c = newSocket();
    // Small buffers on both ends so that the pipe fills quickly.
    ASSERT_EQ(setInt(c, SOL_SOCKET, SO_SNDBUF, 4096), 0);
    ASSERT_EQ(setInt(lfd, SOL_SOCKET, SO_RCVBUF, 4096), 0);
    auto a = loopback4(port);
    int s = connectAccept(lfd, c, reinterpret_cast<sockaddr *>(&a), sizeof(a));
    ASSERT_GE(s, 0);
    timeval tv{0, 200000};
    ASSERT_EQ(b->setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)), 0);
    timeval back{};
    socklen_t len = sizeof(back);
    ASSERT_EQ(b->getsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &back, &len), 0);
    EXPECT_EQ(back.tv_usec, 200000);
    std::vector<char> buf(65536, 's');
    bool timedOut = false;
    for (int i = 0; i < 500 && !timedOut; i++) {
        auto t0 = steady_clock::now();
        ssize_t r = b->send(c, buf.data(), buf.size(), MSG_NOSIGNAL);
        if (r < 0) {
            EXPECT_EQ(errno, EAGAIN);
            EXPECT_GE(msSince(t0), 180);
            EXPECT_LT(msSince(t0), 1500);
            timedOut = true;
        }
    }
    EXPECT_TRUE(timedOut);
}

TEST_P(Semantics, SoErrorOfFreshSocketIsZero)
{
    int fd = newSocket();
    EXPECT_EQ(getInt(fd, SOL_SOCKET, SO_ERROR), 0);
    EXPECT_EQ(getInt(fd, SOL_SOCKET, SO_TYPE), SOCK_STREAM);
    EXPECT_EQ(getInt(fd, SOL_SOCKET, SO_DOMAIN), AF_INET);
    EXPECT_EQ(getInt(fd, SOL_SOCKET, SO_PROTOCOL), IPPROTO_TCP);
    EXPECT_EQ(getInt(fd, SOL_SOCKET, SO_ACCEPTCONN), 0);
    uint16_t port = 0;
    int lfd = newListener(AF_INET, &port);
    EXPECT_EQ(getInt(lfd, SOL_SOCKET, SO_ACCEPTCONN), 1);
}

TEST_P(Semantics, Keepalive)
{
    int fd = newSocket();
    EXPECT_EQ(getInt(fd, SOL_SOCKET, SO_KEEPALIVE), 0);
    ASSERT_EQ(setInt(fd, SOL_SOCKET, SO_KEEPALIVE, 1), 0);
    EXPECT_EQ(getInt(fd, SOL_SOCKET, SO_KEEPALIVE), 1);
    ASSERT_EQ(setInt(fd, IPPROTO_TCP, TCP_KEEPIDLE, 30), 0);
    EXPECT_EQ(getInt(fd, IPPROTO_TCP, TCP_KEEPIDLE), 30);
    ASSERT_EQ(setInt(fd, IPPROTO_TCP, TCP_KEEPINTVL, 5), 0);
    EXPECT_EQ(getInt(fd, IPPROTO_TCP, TCP_KEEPINTVL), 5);
    ASSERT_EQ(setInt(fd, IPPROTO_TCP, TCP_KEEPCNT, 3), 0);
    EXPECT_EQ(getInt(fd, IPPROTO_TCP, TCP_KEEPCNT), 3);
    for (int bad : {0, -1, 32768}) {
        SCOPED_TRACE(bad);
        EXPECT_EQ(setInt(fd, IPPROTO_TCP, TCP_KEEPIDLE, bad), -1);
        EXPECT_EQ(errno, EINVAL);
        EXPECT_EQ(setInt(fd, IPPROTO_TCP, TCP_KEEPINTVL, bad), -1);
        EXPECT_EQ(errno, EINVAL);
    }
    for (int bad : {0, -1, 128}) {
        SCOPED_TRACE(bad);
        EXPECT_EQ(setInt(fd, IPPROTO_TCP, TCP_KEEPCNT, bad), -1);
        EXPECT_EQ(errno, EINVAL);
    }
    EXPECT_EQ(getInt(fd, IPPROTO_TCP, TCP_KEEPIDLE), 30);
    EXPECT_EQ(getInt(fd, IPPROTO_TCP, TCP_KEEPINTVL), 5);
    EXPECT_EQ(getInt(fd, IPPROTO_TCP, TCP_KEEPCNT), 3);
    ASSERT_EQ(setInt(fd, SOL_SOCKET, SO_KEEPALIVE, 0), 0);
    EXPECT_EQ(getInt(fd, SOL_SOCKET, SO_KEEPALIVE), 0);
}

TEST_P(Semantics, KeepaliveOnConnectedSocket)
{
    auto [c, s] = connectedPair();
    (void)s;
    ASSERT_EQ(setInt(c, SOL_SOCKET, SO_KEEPALIVE, 1), 0);
    ASSERT_EQ(setInt(c, IPPROTO_TCP, TCP_KEEPIDLE, 60), 0);
    EXPECT_EQ(getInt(c, SOL_SOCKET, SO_KEEPALIVE), 1);
    EXPECT_EQ(getInt(c, IPPROTO_TCP, TCP_KEEPIDLE), 60);
}

TEST_P(Semantics, Linger)
{
    int fd = newSocket();
    linger lg{-1, -1};
    socklen_t len = sizeof(lg);
    ASSERT_EQ(b->getsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, &len), 0);
    EXPECT_EQ(len, sizeof(lg));
    EXPECT_EQ(lg.l_onoff, 0);
    EXPECT_EQ(lg.l_linger, 0);
    lg = {1, 5};
    ASSERT_EQ(b->setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
    lg = {};
    len = sizeof(lg);
    ASSERT_EQ(b->getsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, &len), 0);
    EXPECT_EQ(lg.l_onoff, 1);
    EXPECT_EQ(lg.l_linger, 5);
    EXPECT_EQ(b->setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg) - 1), -1);
    EXPECT_EQ(errno, EINVAL);
}

TEST_P(Semantics, BufferSizesAreDoubled)
{
    int fd = newSocket();
    ASSERT_EQ(setInt(fd, SOL_SOCKET, SO_RCVBUF, 65536), 0);
    ASSERT_EQ(setInt(fd, SOL_SOCKET, SO_SNDBUF, 65536), 0);
    EXPECT_EQ(getInt(fd, SOL_SOCKET, SO_RCVBUF), 131072);
    EXPECT_EQ(getInt(fd, SOL_SOCKET, SO_SNDBUF), 131072);
    // The sizes survive connect (they were set before it).
    uint16_t port = 0;
    int lfd = newListener(AF_INET, &port);
    auto a = loopback4(port);
    int s = connectAccept(lfd, fd, reinterpret_cast<sockaddr *>(&a), sizeof(a));
    ASSERT_GE(s, 0);
    EXPECT_EQ(getInt(fd, SOL_SOCKET, SO_RCVBUF), 131072);
    EXPECT_EQ(getInt(fd, SOL_SOCKET, SO_SNDBUF), 131072);
    // Data flows with them.
    auto data = pattern(1 << 20, 3);
    std::vector<uint8_t> in(data.size());
    std::thread t([&] { sendAll(fd, data.data(), data.size()); });
    recvAll(s, in.data(), in.size());
    t.join();
    EXPECT_TRUE(in == data);
}

TEST_P(Semantics, NoDelay)
{
    auto [c, s] = connectedPair();
    (void)s;
    EXPECT_EQ(getInt(c, IPPROTO_TCP, TCP_NODELAY), 0);
    ASSERT_EQ(setInt(c, IPPROTO_TCP, TCP_NODELAY, 1), 0);
    EXPECT_EQ(getInt(c, IPPROTO_TCP, TCP_NODELAY), 1);
    ASSERT_EQ(setInt(c, IPPROTO_TCP, TCP_NODELAY, 7), 0);
    EXPECT_EQ(getInt(c, IPPROTO_TCP, TCP_NODELAY), 1);
    ASSERT_EQ(setInt(c, IPPROTO_TCP, TCP_NODELAY, 0), 0);
    EXPECT_EQ(getInt(c, IPPROTO_TCP, TCP_NODELAY), 0);
}

// Options nobody set read back what Linux answers for a fresh socket (sysctls included), on a
// fresh and on a connected socket.
TEST_P(Semantics, UnsetOptionsReadLinuxDefaults)
{
    struct Opt
    {
        int level, name;
        const char *what;
    };
    const Opt opts[] = {
        {SOL_SOCKET, SO_PRIORITY, "SO_PRIORITY"},
        {SOL_SOCKET, SO_OOBINLINE, "SO_OOBINLINE"},
        {SOL_SOCKET, SO_DONTROUTE, "SO_DONTROUTE"},
        {SOL_SOCKET, SO_MARK, "SO_MARK"},
        {SOL_SOCKET, SO_RCVLOWAT, "SO_RCVLOWAT"},
        {IPPROTO_TCP, TCP_CORK, "TCP_CORK"},
        {IPPROTO_TCP, TCP_QUICKACK, "TCP_QUICKACK"},
        {IPPROTO_TCP, TCP_USER_TIMEOUT, "TCP_USER_TIMEOUT"},
        {IPPROTO_TCP, TCP_DEFER_ACCEPT, "TCP_DEFER_ACCEPT"},
        {IPPROTO_TCP, TCP_LINGER2, "TCP_LINGER2"},
        {IPPROTO_TCP, TCP_SYNCNT, "TCP_SYNCNT"},
        {IPPROTO_IP, IP_TOS, "IP_TOS"},
        {IPPROTO_IP, IP_TTL, "IP_TTL"},
    };
    int probe = ::socket(AF_INET, SOCK_STREAM, 0); // the kernel's answers, whatever b is
    ASSERT_GE(probe, 0);
    auto [c, s] = connectedPair();
    (void)s;
    int fresh = newSocket();
    for (const Opt &o : opts) {
        int want = -1;
        socklen_t l = sizeof(want);
        ASSERT_EQ(::getsockopt(probe, o.level, o.name, &want, &l), 0) << o.what;
        EXPECT_EQ(getInt(fresh, o.level, o.name), want) << o.what << ", fresh socket";
        EXPECT_EQ(getInt(c, o.level, o.name), want) << o.what << ", connected socket";
    }
    ::close(probe);
}

// Accepted sockets inherit the listener's options as Linux's clone of the listening socket does.
TEST_P(Semantics, AcceptedSocketsInheritOptions)
{
    uint16_t port;
    int l = newListener(AF_INET, &port);
    ASSERT_EQ(setInt(l, IPPROTO_IP, IP_TTL, 33), 0);
    ASSERT_EQ(setInt(l, IPPROTO_TCP, TCP_USER_TIMEOUT, 5000), 0);
    ASSERT_EQ(setInt(l, IPPROTO_TCP, TCP_LINGER2, 30), 0);
    ASSERT_EQ(setInt(l, SOL_SOCKET, SO_RCVLOWAT, 7), 0);
    int c = newSocket();
    auto a = loopback4(port);
    int s = connectAccept(l, c, reinterpret_cast<sockaddr *>(&a), sizeof(a));
    ASSERT_GE(s, 0);
    EXPECT_EQ(getInt(s, IPPROTO_IP, IP_TTL), 33);
    EXPECT_EQ(getInt(s, IPPROTO_TCP, TCP_USER_TIMEOUT), 5000);
    EXPECT_EQ(getInt(s, IPPROTO_TCP, TCP_LINGER2), 30);
    EXPECT_EQ(getInt(s, SOL_SOCKET, SO_RCVLOWAT), 7);
    // The connecting side keeps its own.
    EXPECT_EQ(getInt(c, IPPROTO_TCP, TCP_USER_TIMEOUT), 0);
}

// TCP_CORK holds what does not fill a segment until the cork comes off, or for 200 ms at most;
// the option is inherited by accepted sockets.
TEST_P(Semantics, CorkHoldsPartialDataUntilUncorked)
{
    auto [c, s] = connectedPair();
    EXPECT_EQ(getInt(c, IPPROTO_TCP, TCP_CORK), 0);
    ASSERT_EQ(setInt(c, IPPROTO_TCP, TCP_CORK, 5), 0);
    EXPECT_EQ(getInt(c, IPPROTO_TCP, TCP_CORK), 1);
    ASSERT_EQ(b->send(c, "abc", 3, 0), 3);
    ASSERT_EQ(b->send(c, "de", 2, 0), 2);
    EXPECT_EQ(pollOne(s, POLLIN, 50), 0) << "corked data arrived at once";
    ASSERT_EQ(setInt(c, IPPROTO_TCP, TCP_CORK, 0), 0);
    EXPECT_EQ(pollOne(s, POLLIN, 1000), POLLIN);
    char buf[8] = {};
    EXPECT_EQ(b->recv(s, buf, sizeof(buf), MSG_WAITALL | MSG_DONTWAIT), 5);
    EXPECT_STREQ(buf, "abcde");
}

TEST_P(Semantics, CorkedDataGoesAfterTwoHundredMilliseconds)
{
    auto [c, s] = connectedPair();
    ASSERT_EQ(setInt(c, IPPROTO_TCP, TCP_CORK, 1), 0);
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(b->send(c, "x", 1, 0), 1);
    EXPECT_EQ(pollOne(s, POLLIN, 2000), POLLIN);
    int64_t ms = msSince(t0);
    EXPECT_GE(ms, 150) << "corked data went out early";
    EXPECT_LT(ms, 1000) << "corked data waited past the 200 ms ceiling";
    char ch = 0;
    EXPECT_EQ(b->recv(s, &ch, 1, 0), 1);
    EXPECT_EQ(ch, 'x');
}

TEST_P(Semantics, CorkIsInheritedAndLetsFullDataGo)
{
    uint16_t port;
    int l = newListener(AF_INET, &port);
    ASSERT_EQ(setInt(l, IPPROTO_TCP, TCP_CORK, 1), 0);
    int c = newSocket();
    auto a = loopback4(port);
    int s = connectAccept(l, c, reinterpret_cast<sockaddr *>(&a), sizeof(a));
    ASSERT_GE(s, 0);
    EXPECT_EQ(getInt(s, IPPROTO_TCP, TCP_CORK), 1);
    EXPECT_EQ(getInt(c, IPPROTO_TCP, TCP_CORK), 0);
    // Much more than a segment, corked: the full segments leave at once.
    std::vector<char> big(1 << 20, 'y');
    ASSERT_GT(b->send(s, big.data(), big.size(), MSG_DONTWAIT), 0) << strerror(errno);
    std::vector<char> got(big.size());
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(pollOne(c, POLLIN, 1000), POLLIN);
    EXPECT_LT(msSince(t0), 150) << "full segments waited for the cork";
    ssize_t n = b->recv(c, got.data(), got.size(), MSG_DONTWAIT);
    EXPECT_GT(n, 0);
}

// MSG_MORE holds a send's data as TCP_CORK does, until a send without it.
TEST_P(Semantics, MsgMoreHoldsUntilASendWithoutIt)
{
    auto [c, s] = connectedPair();
    ASSERT_EQ(b->send(c, "head", 4, MSG_MORE), 4);
    EXPECT_EQ(pollOne(s, POLLIN, 50), 0) << "MSG_MORE data arrived at once";
    ASSERT_EQ(b->send(c, "+body", 5, 0), 5);
    EXPECT_EQ(pollOne(s, POLLIN, 1000), POLLIN);
    char buf[16] = {};
    EXPECT_EQ(b->recv(s, buf, 9, MSG_WAITALL), 9);
    EXPECT_STREQ(buf, "head+body");
    // Alone, it waits 200 ms at most.
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(b->send(c, "z", 1, MSG_MORE), 1);
    EXPECT_EQ(pollOne(s, POLLIN, 2000), POLLIN);
    EXPECT_GE(msSince(t0), 150);
    EXPECT_LT(msSince(t0), 1000);
}

// Closing, or shutting down the write side, sends what the cork held.
TEST_P(Semantics, ShutdownSendsCorkedData)
{
    auto [c, s] = connectedPair();
    ASSERT_EQ(setInt(c, IPPROTO_TCP, TCP_CORK, 1), 0);
    ASSERT_EQ(b->send(c, "bye", 3, 0), 3);
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(b->shutdown(c, SHUT_WR), 0);
    char buf[8] = {};
    EXPECT_EQ(b->recv(s, buf, sizeof(buf), MSG_WAITALL), 3);
    EXPECT_LT(msSince(t0), 150) << "shutdown waited for the cork";
    EXPECT_STREQ(buf, "bye");
}

TEST_P(Semantics, MaxSegIsPositive)
{
    auto [c, s] = connectedPair();
    (void)s;
    EXPECT_GT(getInt(c, IPPROTO_TCP, TCP_MAXSEG), 0);
}

TEST_P(Semantics, TcpInfo)
{
    uint16_t port = 0;
    int lfd = newListener(AF_INET, &port);
    tcp_info ti{};
    socklen_t len = sizeof(ti);
    ASSERT_EQ(b->getsockopt(lfd, IPPROTO_TCP, TCP_INFO, &ti, &len), 0);
    EXPECT_EQ(ti.tcpi_state, TCP_LISTEN);
    int fresh = newSocket();
    len = sizeof(ti);
    ASSERT_EQ(b->getsockopt(fresh, IPPROTO_TCP, TCP_INFO, &ti, &len), 0);
    EXPECT_EQ(ti.tcpi_state, TCP_CLOSE);

    auto [c, s] = connectedPair();
    ASSERT_TRUE(sendAll(c, "ping", 4));
    char buf[4];
    ASSERT_TRUE(recvAll(s, buf, 4));
    for (int fd : {c, s}) {
        ti = {};
        len = sizeof(ti);
        ASSERT_EQ(b->getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len), 0);
        EXPECT_GT(len, 0u);
        EXPECT_LE(len, sizeof(ti));
        EXPECT_EQ(ti.tcpi_state, TCP_ESTABLISHED);
        EXPECT_EQ(ti.tcpi_total_retrans, 0u);
        EXPECT_GT(ti.tcpi_rtt, 0u);
    }
    // A short buffer gets a prefix.
    uint8_t prefix[8] = {};
    len = sizeof(prefix);
    ASSERT_EQ(b->getsockopt(c, IPPROTO_TCP, TCP_INFO, prefix, &len), 0);
    EXPECT_EQ(len, sizeof(prefix));
    EXPECT_EQ(prefix[0], TCP_ESTABLISHED);
}

// ---- signals and cancellation ----

void onSigusr1(int) {}

void installSigusr1(bool restart, struct sigaction *old)
{
    struct sigaction sa
    {};
    sa.sa_handler = onSigusr1;
    sa.sa_flags = restart ? SA_RESTART : 0;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, old);
}

TEST_P(Semantics, BlockingRecvInterruptedBySignal)
{
    auto [c, s] = connectedPair();
    (void)s;
    struct sigaction old
    {};
    installSigusr1(false, &old);
    pthread_t self = pthread_self();
    std::thread killer([self] {
        std::this_thread::sleep_for(std::chrono::milliseconds(150));
        pthread_kill(self, SIGUSR1);
    });
    char ch;
    auto t0 = steady_clock::now();
    ssize_t r = b->recv(c, &ch, 1, 0);
    int err = errno;
    killer.join();
    EXPECT_EQ(r, -1);
    EXPECT_EQ(err, EINTR);
    EXPECT_LT(msSince(t0), 3000);
    sigaction(SIGUSR1, &old, nullptr);
}

TEST_P(Semantics, BlockingRecvRestartedWithSaRestart)
{
    auto [c, s] = connectedPair();
    struct sigaction old
    {};
    installSigusr1(true, &old);
    pthread_t self = pthread_self();
    std::thread killer([&, self, s = s] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        pthread_kill(self, SIGUSR1);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        EXPECT_EQ(b->send(s, "k", 1, 0), 1);
    });
    char ch = 0;
    ssize_t r = b->recv(c, &ch, 1, 0);
    killer.join();
    EXPECT_EQ(r, 1) << strerror(errno);
    EXPECT_EQ(ch, 'k');
    sigaction(SIGUSR1, &old, nullptr);
}

TEST_P(Semantics, BlockingAcceptInterruptedBySignal)
{
    uint16_t port = 0;
    int lfd = newListener(AF_INET, &port);
    struct sigaction old
    {};
    installSigusr1(false, &old);
    pthread_t self = pthread_self();
    std::thread killer([self] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        pthread_kill(self, SIGUSR1);
    });
    int r = b->accept(lfd, nullptr, nullptr);
    int err = errno;
    killer.join();
    EXPECT_EQ(r, -1);
    EXPECT_EQ(err, EINTR);
    sigaction(SIGUSR1, &old, nullptr);
}

TEST_P(Semantics, CancelThreadBlockedInRecv)
{
    auto [c, s] = connectedPair();
    struct Arg
    {
        const Backend *b;
        int fd;
        std::atomic<bool> entered{false};
    } arg{b, c};
    pthread_t th;
    ASSERT_EQ(pthread_create(
                  &th, nullptr,
                  [](void *p) -> void * {
                      auto *a = static_cast<Arg *>(p);
                      char ch;
                      a->entered = true;
                      a->b->recv(a->fd, &ch, 1, 0);
                      return nullptr;
                  },
                  &arg),
              0);
    while (!arg.entered)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_EQ(pthread_cancel(th), 0);
    void *ret = nullptr;
    ASSERT_EQ(pthread_join(th, &ret), 0);
    EXPECT_EQ(ret, PTHREAD_CANCELED);
    // The socket is still usable afterwards.
    ASSERT_EQ(b->send(s, "q", 1, 0), 1);
    char ch = 0;
    EXPECT_EQ(b->recv(c, &ch, 1, 0), 1);
    EXPECT_EQ(ch, 'q');
}

// ---- addresses ----

void expectSameAddress(const sockaddr_storage &x, const sockaddr_storage &y)
{
    ASSERT_EQ(x.ss_family, y.ss_family);
    if (x.ss_family == AF_INET) {
        auto &a = reinterpret_cast<const sockaddr_in &>(x);
        auto &c = reinterpret_cast<const sockaddr_in &>(y);
        EXPECT_EQ(a.sin_addr.s_addr, c.sin_addr.s_addr);
        EXPECT_EQ(a.sin_port, c.sin_port);
    } else {
        auto &a = reinterpret_cast<const sockaddr_in6 &>(x);
        auto &c = reinterpret_cast<const sockaddr_in6 &>(y);
        EXPECT_EQ(memcmp(&a.sin6_addr, &c.sin6_addr, sizeof(in6_addr)), 0);
        EXPECT_EQ(a.sin6_port, c.sin6_port);
    }
}

struct Names
{
    sockaddr_storage self{}, peer{};
    socklen_t selfLen = sizeof(sockaddr_storage), peerLen = sizeof(sockaddr_storage);
};

Names namesOf(const Backend *b, int fd)
{
    Names n;
    EXPECT_EQ(b->getsockname(fd, reinterpret_cast<sockaddr *>(&n.self), &n.selfLen), 0)
        << strerror(errno);
    EXPECT_EQ(b->getpeername(fd, reinterpret_cast<sockaddr *>(&n.peer), &n.peerLen), 0)
        << strerror(errno);
    return n;
}

TEST_P(Semantics, NamesMatchBetweenEnds)
{
    uint16_t port = 0;
    int lfd = newListener(AF_INET, &port);
    int c = newSocket();
    auto a = loopback4(port);
    int s = -1;
    sockaddr_storage fromAccept{};
    socklen_t acceptLen = sizeof(fromAccept);
    std::thread t(
        [&] { s = b->accept(lfd, reinterpret_cast<sockaddr *>(&fromAccept), &acceptLen); });
    ASSERT_EQ(b->connect(c, reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0) << strerror(errno);
    t.join();
    ASSERT_GE(own(s), 0);
    Names cn = namesOf(b, c), sn = namesOf(b, s);
    EXPECT_EQ(cn.selfLen, sizeof(sockaddr_in));
    EXPECT_EQ(cn.peerLen, sizeof(sockaddr_in));
    EXPECT_EQ(acceptLen, sizeof(sockaddr_in));
    expectSameAddress(cn.self, sn.peer);
    expectSameAddress(cn.peer, sn.self);
    expectSameAddress(fromAccept, sn.peer);
    EXPECT_EQ(portOf(cn.peer), port);
    EXPECT_NE(portOf(cn.self), port);
    // A short buffer: truncated, with the full length reported.
    sockaddr_storage small{};
    socklen_t len = 4;
    EXPECT_EQ(b->getsockname(c, reinterpret_cast<sockaddr *>(&small), &len), 0);
    EXPECT_EQ(len, sizeof(sockaddr_in));
    EXPECT_EQ(small.ss_family, AF_INET);
    EXPECT_EQ(memcmp(&small, &cn.self, 4), 0);
    EXPECT_EQ(reinterpret_cast<sockaddr_in &>(small).sin_addr.s_addr, 0u);
}

TEST_P(Semantics, Ipv6Loopback)
{
    auto [c, s] = connectedPair(AF_INET6);
    ASSERT_GE(c, 0);
    ASSERT_GE(s, 0);
    Names cn = namesOf(b, c), sn = namesOf(b, s);
    EXPECT_EQ(cn.selfLen, sizeof(sockaddr_in6));
    EXPECT_EQ(cn.self.ss_family, AF_INET6);
    EXPECT_TRUE(IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<sockaddr_in6 &>(cn.peer).sin6_addr));
    expectSameAddress(cn.self, sn.peer);
    expectSameAddress(cn.peer, sn.self);
    ASSERT_TRUE(sendAll(c, "six", 3));
    char buf[3];
    ASSERT_TRUE(recvAll(s, buf, 3));
    EXPECT_EQ(memcmp(buf, "six", 3), 0);
    EXPECT_EQ(getInt(c, SOL_SOCKET, SO_DOMAIN), AF_INET6);
}

TEST_P(Semantics, V4MappedClientToIpv4Listener)
{
    uint16_t port = 0;
    int lfd = newListener(AF_INET, &port);
    int c = newSocket(AF_INET6);
    ASSERT_EQ(setInt(c, IPPROTO_IPV6, IPV6_V6ONLY, 0), 0);
    EXPECT_EQ(getInt(c, IPPROTO_IPV6, IPV6_V6ONLY), 0);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(port);
    ASSERT_EQ(inet_pton(AF_INET6, "::ffff:127.0.0.1", &a.sin6_addr), 1);
    int s = connectAccept(lfd, c, reinterpret_cast<sockaddr *>(&a), sizeof(a));
    ASSERT_GE(s, 0);
    Names cn = namesOf(b, c), sn = namesOf(b, s);
    ASSERT_EQ(cn.peer.ss_family, AF_INET6);
    auto &peer6 = reinterpret_cast<sockaddr_in6 &>(cn.peer);
    EXPECT_TRUE(IN6_IS_ADDR_V4MAPPED(&peer6.sin6_addr));
    EXPECT_EQ(memcmp(&peer6.sin6_addr, &a.sin6_addr, sizeof(in6_addr)), 0);
    EXPECT_EQ(ntohs(peer6.sin6_port), port);
    ASSERT_EQ(sn.peer.ss_family, AF_INET);
    auto &speer = reinterpret_cast<sockaddr_in &>(sn.peer);
    EXPECT_EQ(speer.sin_addr.s_addr, htonl(INADDR_LOOPBACK));
    EXPECT_EQ(speer.sin_port, reinterpret_cast<sockaddr_in6 &>(cn.self).sin6_port);
    ASSERT_TRUE(sendAll(c, "map", 3));
    char buf[3];
    ASSERT_TRUE(recvAll(s, buf, 3));
    EXPECT_EQ(memcmp(buf, "map", 3), 0);
}

TEST_P(Semantics, V6OnlyRefusesMappedAddress)
{
    int c = newSocket(AF_INET6);
    ASSERT_EQ(setInt(c, IPPROTO_IPV6, IPV6_V6ONLY, 1), 0);
    EXPECT_EQ(getInt(c, IPPROTO_IPV6, IPV6_V6ONLY), 1);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(9);
    ASSERT_EQ(inet_pton(AF_INET6, "::ffff:127.0.0.1", &a.sin6_addr), 1);
    EXPECT_EQ(b->connect(c, reinterpret_cast<sockaddr *>(&a), sizeof(a)), -1);
    EXPECT_EQ(errno, ENETUNREACH);
}

INSTANTIATE_TEST_SUITE_P(Backends, Semantics, ::testing::ValuesIn(kBackends), paramName);

} // namespace
