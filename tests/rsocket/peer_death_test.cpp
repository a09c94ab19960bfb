// SPDX-License-Identifier: MIT
// A peer process killed (SIGKILL) while this one is blocked on the connection, in connect, recv,
// send, poll and epoll_wait: the call returns within a few seconds with what kernel TCP gives
// (EOF or an error, readiness), and other connections keep working. The peer is this binary run
// again with --peer or --listen, so that it starts its own fabric afresh.

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

#include "harness.h"

using namespace rstest;

namespace {

// The peer: connects to PORT with backend NAME and then never reads (its buffers fill when
// this side sends), until it is killed. chat: it first sends kChats messages of kChatSize
// bytes, kChatGapMs apart (so that this side sleeps between them); else it never writes.
constexpr int kChats = 3;
constexpr size_t kChatSize = 10;
constexpr int kChatGapMs = 30;
int runPeer(const char *backend, int port, bool chat)
{
    const Backend *b = std::string(backend) == "kernel" ? &kKernel : &kRsocket;
    int fd = b->socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = loopback4(static_cast<uint16_t>(port));
    if (fd < 0 || b->connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0)
        return 1;
    for (int i = 0; chat && i < kChats; i++) {
        usleep(kChatGapMs * 1000);
        const char msg[kChatSize] = {'c', 'h', 'a', 't'};
        if (b->send(fd, msg, sizeof(msg), MSG_NOSIGNAL) != ssize_t(sizeof(msg)))
            return 1;
    }
    // A chatting peer goes on looking at its socket (without reading): under the shim its
    // connection's switch to the fabric moves on only in its program's calls.
    for (; chat;) {
        pollfd p{fd, POLLIN, 0};
        (void)b->poll(&p, 1, 10);
        usleep(10000);
    }
    for (;;)
        pause();
}

// The peer as a server: listens on an ephemeral port, writes it (2 bytes) to fd out, and never
// accepts, until it is killed.
int runListener(const char *backend, int out)
{
    const Backend *b = std::string(backend) == "kernel" ? &kKernel : &kRsocket;
    int fd = b->socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = loopback4(0);
    if (fd < 0 || b->bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0 ||
        b->listen(fd, 8) != 0)
        return 1;
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if (b->getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len) != 0)
        return 1;
    const uint16_t port = portOf(ss);
    if (write(out, &port, sizeof(port)) != sizeof(port))
        return 1;
    for (;;)
        pause();
}

enum class Blocked
{
    Recv,
    Send,
    Poll,
    Epoll,
    // epoll_wait, edge-triggered for reading and writing as nginx waits, after the peer's
    // messages were read and a reply left unread by it.
    EpollAfterTraffic
};

class PeerDeath : public BackendTest
{
protected:
    // Starts the peer, accepts its connection: the descriptor, or -1.
    int acceptPeer(bool chat = false)
    {
        uint16_t port = 0;
        int lfd = newListener(AF_INET, &port);
        if (lfd < 0)
            return -1;
        pid_ = fork();
        if (pid_ == 0) {
            const std::string p = std::to_string(port);
            execl("/proc/self/exe", "peer_death_test", chat ? "--chat" : "--peer", b->name,
                  p.c_str(), nullptr);
            _exit(127);
        }
        pollfd p{lfd, POLLIN, 0};
        if (b->poll(&p, 1, 10000) != 1)
            return -1;
        return own(b->accept(lfd, nullptr, nullptr));
    }

    void killPeer()
    {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        pid_ = -1;
    }

    void TearDown() override
    {
        if (pid_ > 0)
            killPeer();
        BackendTest::TearDown();
    }

    // The call blocked on fd when the peer dies: its result and errno (or events), and how long
    // it took after the kill.
    void blockedWhenThePeerDies(Blocked what)
    {
        int fd = acceptPeer(what == Blocked::EpollAfterTraffic);
        ASSERT_GE(fd, 0);
        std::vector<uint8_t> buf(256 * 1024, 0x5a);
        int ep = -1;
        if (what == Blocked::EpollAfterTraffic) {
            ASSERT_EQ(b->fcntl(fd, F_SETFL, O_NONBLOCK), 0);
            ep = b->epoll_create();
            ASSERT_GE(ep, 0);
            epoll_event ev{};
            ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
            ASSERT_EQ(b->epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev), 0);
            // The peer's messages, each read to EAGAIN when epoll reports it (sleeping between).
            size_t got = 0;
            const auto t0 = std::chrono::steady_clock::now();
            while (got < kChats * kChatSize && msSince(t0) < 10000) {
                epoll_event out{};
                if (b->epoll_wait(ep, &out, 1, 1000) != 1)
                    continue;
                ssize_t n;
                while ((n = b->recv(fd, buf.data(), buf.size(), 0)) > 0)
                    got += static_cast<size_t>(n);
            }
            ASSERT_EQ(got, kChats * kChatSize);
            ASSERT_EQ(b->send(fd, buf.data(), 100, MSG_NOSIGNAL), 100);
            // Edges already reported are not reported again: the next wait blocks. (Under the
            // shim a connection still in its switch from kernel TCP reports EPOLLET as
            // level-triggered, until the switch is done.)
            epoll_event out{};
            const auto t1 = std::chrono::steady_clock::now();
            while (msSince(t1) < 5000 && b->epoll_wait(ep, &out, 1, 50) == 1) {
            }
        }
        if (what == Blocked::Send) {
            // Fill what the buffers take, so that the next send blocks.
            size_t total = 0;
            while (total < (64u << 20)) {
                const ssize_t n = b->send(fd, buf.data(), buf.size(), MSG_DONTWAIT);
                if (n > 0) {
                    total += static_cast<size_t>(n);
                    continue;
                }
                pollfd p{fd, POLLOUT, 0};
                if (b->poll(&p, 1, 300) == 0)
                    break;
            }
        }
        const std::vector<uint8_t> big(what == Blocked::Send ? 16u << 20 : 0, 0x5a);
        std::atomic<bool> done{false};
        long result = 0;
        int err = 0;
        std::thread t([&] {
            switch (what) {
            case Blocked::Recv:
                result = b->recv(fd, buf.data(), buf.size(), 0);
                break;
            case Blocked::Send:
                // More than the window can open by while it waits: on Linux 6.18 a receiver
                // that never reads still grows its buffer slowly (tcp_rmem's maximum is 32 MiB
                // here), and a 256 KiB send found room within the 300 ms.
                result = b->send(fd, big.data(), big.size(), MSG_NOSIGNAL);
                break;
            case Blocked::Poll: {
                pollfd p{fd, POLLIN, 0};
                result = b->poll(&p, 1, 20000) == 1 ? p.revents : -1;
                break;
            }
            case Blocked::Epoll: {
                const int e = b->epoll_create();
                epoll_event ev{};
                ev.events = EPOLLIN | EPOLLRDHUP;
                b->epoll_ctl(e, EPOLL_CTL_ADD, fd, &ev);
                epoll_event out{};
                result = b->epoll_wait(e, &out, 1, 20000) == 1 ? out.events : -1;
                b->close(e);
                break;
            }
            case Blocked::EpollAfterTraffic: {
                epoll_event out{};
                result = b->epoll_wait(ep, &out, 1, 20000) == 1 ? out.events : -1;
                break;
            }
            }
            err = errno;
            done = true;
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        EXPECT_FALSE(done.load()) << "the call did not block";
        const auto t0 = std::chrono::steady_clock::now();
        killPeer();
        t.join();
        const int64_t ms = msSince(t0);
        RecordProperty("ms_after_kill", std::to_string(ms));
        EXPECT_LT(ms, 5000);
        switch (what) {
        case Blocked::Recv:
            // EOF, or a reset (the peer had not read everything, or its end went away abruptly).
            EXPECT_TRUE(result == 0 || (result == -1 && err == ECONNRESET))
                << result << " " << strerror(err);
            break;
        case Blocked::Send:
            // An error, or (as Linux does) the bytes that went before it, then the error.
            if (result > 0) {
                result = b->send(fd, buf.data(), buf.size(), MSG_NOSIGNAL);
                err = errno;
            }
            EXPECT_TRUE(result == -1 && (err == EPIPE || err == ECONNRESET))
                << result << " " << strerror(err);
            break;
        case Blocked::Poll:
            EXPECT_TRUE(result > 0 && (result & (POLLIN | POLLHUP | POLLERR))) << result;
            break;
        case Blocked::Epoll:
        case Blocked::EpollAfterTraffic:
            EXPECT_TRUE(result > 0 && (result & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
                << result;
            break;
        }
        // The descriptor reports the end from now on, and another connection works.
        EXPECT_LE(b->recv(fd, buf.data(), 1, MSG_DONTWAIT), 0);
        if (ep >= 0)
            b->close(ep);
        expectNewPairWorks();
    }

    pid_t pid_ = -1;
};

// The server process dies while this side connects to it (its listener never accepts): the
// connect ends within a few seconds, and a connection it made reports the end.
TEST_P(PeerDeath, ConnectingWhenTheServerDies)
{
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_ = fork();
    if (pid_ == 0) {
        close(fds[0]);
        const std::string out = std::to_string(fds[1]);
        execl("/proc/self/exe", "peer_death_test", "--listen", b->name, out.c_str(), nullptr);
        _exit(127);
    }
    close(fds[1]);
    uint16_t port = 0;
    pollfd pp{fds[0], POLLIN, 0};
    ASSERT_EQ(::poll(&pp, 1, 10000), 1);
    ASSERT_EQ(read(fds[0], &port, sizeof(port)), ssize_t(sizeof(port)));
    close(fds[0]);
    int c = newSocket();
    std::atomic<bool> done{false};
    int r = 0, err = 0;
    std::thread t([&] {
        sockaddr_in a = loopback4(port);
        r = b->connect(c, reinterpret_cast<sockaddr *>(&a), sizeof(a));
        err = errno;
        done = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto t0 = std::chrono::steady_clock::now();
    killPeer();
    t.join();
    EXPECT_LT(msSince(t0), 5000);
    if (r == 0) {
        // Connected before the end (as kernel TCP does, from the listen queue): the end comes
        // with the next read.
        char ch;
        timeval tv{5, 0};
        ASSERT_EQ(b->setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
        const auto t1 = std::chrono::steady_clock::now();
        const ssize_t n = b->recv(c, &ch, 1, 0);
        EXPECT_TRUE(n == 0 || (n == -1 && errno == ECONNRESET)) << n << " " << strerror(errno);
        EXPECT_LT(msSince(t1), 5000);
    } else {
        EXPECT_TRUE(err == ECONNREFUSED || err == ECONNRESET || err == ETIMEDOUT) << strerror(err);
    }
}

// A client process killed right after it starts connecting (before, during or after the
// handshake) while this side is blocked in accept: accept either returns that connection, whose
// first read reports the end (EOF or ECONNRESET) within a few seconds, or goes on waiting and
// returns the next client's, as kernel TCP does; the next client's bytes come through intact.
TEST_P(PeerDeath, AcceptingWhenTheClientDies)
{
    uint16_t port = 0;
    int lfd = newListener(AF_INET, &port);
    ASSERT_GE(lfd, 0);
    for (int delayMs : {0, 2, 20, 200}) {
        SCOPED_TRACE("killed " + std::to_string(delayMs) + " ms after the fork");
        std::atomic<int> accepted{-2};
        std::thread server([&] { accepted = b->accept(lfd, nullptr, nullptr); });
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        ASSERT_EQ(accepted.load(), -2) << "accept did not block";
        pid_ = fork();
        if (pid_ == 0) {
            const std::string p = std::to_string(port);
            execl("/proc/self/exe", "peer_death_test", "--peer", b->name, p.c_str(), nullptr);
            _exit(127);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(delayMs));
        killPeer();
        // The next client connects (in a thread: the r* connect completes once it is accepted)
        // and says hello.
        int c = newSocket();
        std::atomic<int> connected{-2};
        std::thread client([&] {
            sockaddr_in a = loopback4(port);
            connected = b->connect(c, reinterpret_cast<sockaddr *>(&a), sizeof(a));
            if (connected == 0)
                b->send(c, "hi", 2, MSG_NOSIGNAL);
        });
        const auto t0 = std::chrono::steady_clock::now();
        while (accepted.load() == -2 && msSince(t0) < 10000)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        if (accepted.load() == -2)
            b->shutdown(lfd, SHUT_RDWR); // release the thread; the test has failed
        server.join();
        int fd = own(accepted.load());
        ASSERT_GE(fd, 0) << "accept: nothing within 10 s";
        timeval tv{5, 0};
        ASSERT_EQ(b->setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
        char got[2] = {};
        ssize_t n = b->recv(fd, got, 2, MSG_WAITALL);
        int err = errno;
        bool deadOne = n != 2;
        RecordProperty("dead_client_accepted_" + std::to_string(delayMs), deadOne ? 1 : 0);
        if (deadOne) {
            // The killed client's connection: the end, then the next client's.
            EXPECT_TRUE(n == 0 || (n == -1 && err == ECONNRESET)) << n << " " << strerror(err);
            pollfd p{lfd, POLLIN, 0};
            ASSERT_EQ(b->poll(&p, 1, 10000), 1) << "the next client never came";
            fd = own(b->accept(lfd, nullptr, nullptr));
            ASSERT_GE(fd, 0) << strerror(errno);
            ASSERT_EQ(b->setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
            n = b->recv(fd, got, 2, MSG_WAITALL);
        }
        client.join();
        EXPECT_EQ(connected.load(), 0) << strerror(errno);
        EXPECT_EQ(n, 2);
        EXPECT_EQ(memcmp(got, "hi", 2), 0);
        closeFd(fd);
        closeFd(c);
    }
}

TEST_P(PeerDeath, BlockedInRecv)
{
    blockedWhenThePeerDies(Blocked::Recv);
}

TEST_P(PeerDeath, BlockedInSend)
{
    blockedWhenThePeerDies(Blocked::Send);
}

TEST_P(PeerDeath, BlockedInPoll)
{
    blockedWhenThePeerDies(Blocked::Poll);
}

TEST_P(PeerDeath, BlockedInEpollWait)
{
    blockedWhenThePeerDies(Blocked::Epoll);
}

TEST_P(PeerDeath, BlockedInEdgeTriggeredEpollAfterTraffic)
{
    blockedWhenThePeerDies(Blocked::EpollAfterTraffic);
}

// A program that reads without blocking, or polls without a timeout, learns of the peer's death
// at its first call after it, as kernel TCP's reports the end at once. Over the fabric the
// endpoint going away was read from the EQ only at every 16th look of a busy program; a
// same-host poller that never slept never learnt (its looks read shared memory only).
TEST_P(PeerDeath, ANonblockingReaderLearnsAtItsNextCall)
{
    for (const bool polls : {false, true}) {
        SCOPED_TRACE(polls ? "poll" : "recv");
        int fd = acceptPeer();
        ASSERT_GE(fd, 0);
        ASSERT_EQ(b->fcntl(fd, F_SETFL, O_NONBLOCK), 0);
        char c;
        auto look = [&](int *err) -> long {
            errno = 0;
            long r;
            if (polls) {
                pollfd p{fd, POLLIN, 0};
                r = b->poll(&p, 1, 0) == 1 ? p.revents : 0;
            } else {
                r = b->recv(fd, &c, 1, 0);
            }
            *err = errno;
            return r;
        };
        int err = 0;
        // Calls that find nothing: 5, so that the death comes at neither the EQ's turn nor
        // the one after it.
        for (int i = 0; i < 5; i++)
            ASSERT_EQ(look(&err), polls ? 0 : -1) << strerror(err);
        killPeer();
        // Past the time a read that went dry is trusted without a look (0.5 ms), and the
        // same-host link's bound between two reads of its pipe (1 ms); short against the
        // progress thread's round over quiet connections (100 ms), which would notice too.
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
        const long r = look(&err);
        if (polls)
            EXPECT_TRUE(r & (POLLIN | POLLHUP | POLLERR))
                << "the first poll after the death: " << r;
        else
            EXPECT_TRUE(r == 0 || (r == -1 && err == ECONNRESET))
                << "the first read after the death: " << r << " " << strerror(err);
        closeFd(fd);
    }
    expectNewPairWorks();
}

INSTANTIATE_TEST_SUITE_P(Backends, PeerDeath, ::testing::ValuesIn(kBackends), paramName);

} // namespace

int main(int argc, char **argv)
{
    if (argc == 4 && std::string(argv[1]) == "--peer")
        return runPeer(argv[2], std::atoi(argv[3]), false);
    if (argc == 4 && std::string(argv[1]) == "--chat")
        return runPeer(argv[2], std::atoi(argv[3]), true);
    if (argc == 4 && std::string(argv[1]) == "--listen")
        return runListener(argv[2], std::atoi(argv[3]));
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
