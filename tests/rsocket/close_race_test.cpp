// SPDX-License-Identifier: MIT
// A descriptor closed while another thread is blocked on it (recv, send, poll, epoll_wait), and
// calls on it after close: the blocked call returns (within its own timeout at the latest), the
// calls after close fail with EBADF, as on kernel TCP, and nothing crashes or hangs.

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <sys/epoll.h>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "harness.h"

using namespace rstest;

namespace {

enum class Blocked
{
    Recv,
    Send,
    Poll,
    Epoll
};

class CloseRace : public BackendTest
{
protected:
    void closeWhileBlocked(Blocked what)
    {
        auto [c, s] = connectedPair();
        ASSERT_GE(s, 0);
        // The blocked calls end on their own after 2 s whatever close does (as on Linux, where a
        // call already blocked keeps the socket open until it returns).
        timeval tv{2, 0};
        ASSERT_EQ(b->setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
        ASSERT_EQ(b->setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)), 0);
        std::vector<uint8_t> buf(256 * 1024, 1);
        if (what == Blocked::Send) {
            // Until the buffers take nothing more for 300 ms (they may grow meanwhile).
            for (int i = 0; i < 400; i++) {
                if (b->send(c, buf.data(), buf.size(), MSG_DONTWAIT) >= 0 || errno != EAGAIN)
                    continue;
                pollfd p{c, POLLOUT, 0};
                if (b->poll(&p, 1, 300) == 0)
                    break;
            }
        }
        int ep = what == Blocked::Epoll ? own(b->epoll_create()) : -1;
        if (ep >= 0) {
            epoll_event ev{};
            ev.events = EPOLLIN;
            ASSERT_EQ(b->epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev), 0);
        }
        const std::vector<uint8_t> big(what == Blocked::Send ? 16u << 20 : 0, 1);
        std::atomic<bool> done{false};
        std::thread t([&, c = c] {
            switch (what) {
            case Blocked::Recv:
                b->recv(c, buf.data(), buf.size(), 0);
                break;
            case Blocked::Send:
                // More than the window opens by meanwhile (Linux 6.18 grows a receive buffer
                // nobody reads slowly: a 256 KiB send found room).
                b->send(c, big.data(), big.size(), MSG_NOSIGNAL);
                break;
            case Blocked::Poll: {
                pollfd p{c, POLLIN, 0};
                b->poll(&p, 1, 2000);
                break;
            }
            case Blocked::Epoll: {
                epoll_event out{};
                b->epoll_wait(ep, &out, 1, 2000);
                break;
            }
            }
            done = true;
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        const bool blocked = !done.load();
        const auto t0 = std::chrono::steady_clock::now();
        EXPECT_EQ(closeFd(c), 0);
        // Calls after close: EBADF.
        char ch;
        EXPECT_EQ(b->recv(c, &ch, 1, MSG_DONTWAIT), -1);
        EXPECT_EQ(errno, EBADF);
        EXPECT_EQ(b->send(c, "x", 1, MSG_NOSIGNAL), -1);
        EXPECT_EQ(errno, EBADF);
        // The peer goes away too; the blocked call must end by its own timeout at the latest.
        closeFd(s);
        t.join();
        EXPECT_TRUE(blocked) << "the call did not block";
        EXPECT_LT(msSince(t0), 7000);
        // The process still works.
        expectNewPairWorks();
    }
};

TEST_P(CloseRace, WhileBlockedInRecv)
{
    closeWhileBlocked(Blocked::Recv);
}

TEST_P(CloseRace, WhileBlockedInSend)
{
    closeWhileBlocked(Blocked::Send);
}

TEST_P(CloseRace, WhileBlockedInPoll)
{
    closeWhileBlocked(Blocked::Poll);
}

TEST_P(CloseRace, WhileBlockedInEpollWait)
{
    closeWhileBlocked(Blocked::Epoll);
}

INSTANTIATE_TEST_SUITE_P(Backends, CloseRace, ::testing::ValuesIn(kBackends), paramName);

} // namespace
