// SPDX-License-Identifier: MIT
// A same-host link's wake-up bytes: a poller that parks a connection again without having seen
// its fd readable reads the link's pipe only where the peer owes it a byte (it took one of this
// end's waiting words), a byte the peer wrote unasked is still read once the fd is seen, and a
// writer waiting for room is not woken by each small read.

#include <fcntl.h>
#include <poll.h>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

#include "samehost.h"
#include "samehost_fixture.h"

namespace rstream {
namespace {

class SameHostWake : public SameHostTest
{};

bool fdReadable(int fd)
{
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

// What epoll's parking does for a member it did not see woken: a look, then arm(&seq, false).
int armUnseen(Connection &c)
{
    ssize_t recv = 0, send = 0;
    c.peek(&recv, &send);
    uint64_t seq = 0;
    return c.arm(&seq, false);
}

TEST_F(SameHostWake, ArmReadsThePipeOnlyForAnOwedWakeUp)
{
    auto [c, s] = pair();
    ASSERT_TRUE(c && s);
    SameHostLink *link = s->testSameHostLink();
    ASSERT_NE(link, nullptr);
    // The first arm reads whatever the setup left; armed again with nothing owed, no read.
    ASSERT_EQ(armUnseen(*s), 0);
    const uint64_t base = link->testWakeReads();
    for (int i = 0; i < 50; i++)
        ASSERT_EQ(armUnseen(*s), 0);
    EXPECT_EQ(link->testWakeReads(), base) << "arms with nothing owed read the pipe";

    // The peer's send takes this end's waiting word and writes a byte: the next arm reads it.
    for (int round = 0; round < 5; round++) {
        SCOPED_TRACE(round);
        ASSERT_EQ(c->send("x", 1), 1);
        for (int i = 0; i < 2000 && !fdReadable(link->fd()); i++)
            usleep(1000);
        ASSERT_TRUE(fdReadable(link->fd())) << "the peer wrote no wake-up";
        const uint64_t before = link->testWakeReads();
        uint64_t seq = 0;
        EXPECT_EQ(s->arm(&seq, false), -EAGAIN); // its data came since the last look
        EXPECT_GT(link->testWakeReads(), before);
        EXPECT_FALSE(fdReadable(link->fd())) << "the owed byte was left";
        char b;
        ASSERT_EQ(s->recv(&b, 1, kNonBlock), 1);
        ASSERT_EQ(armUnseen(*s), 0);
    }

    // A byte the peer writes unasked (no word taken) is left by an arm that did not see the fd
    // readable (the sleep on the fd then ends at once), and read by the arm after it. The peer
    // writes into this end's pipe; here a writer of the test's own stands for it.
    const int writer =
        ::open(("/proc/self/fd/" + std::to_string(link->fd())).c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_GE(writer, 0);
    const char junk = 0;
    ASSERT_EQ(::write(writer, &junk, 1), 1);
    ::close(writer);
    for (int i = 0; i < 2000 && !fdReadable(link->fd()); i++)
        usleep(1000);
    ASSERT_TRUE(fdReadable(link->fd()));
    ASSERT_EQ(armUnseen(*s), 0);
    EXPECT_TRUE(fdReadable(link->fd()));
    ssize_t recv = 0, send = 0;
    s->peek(&recv, &send);
    uint64_t seq = 0;
    ASSERT_EQ(s->arm(&seq, true), 0);
    EXPECT_FALSE(fdReadable(link->fd())) << "a seen fd's byte was left";

    // The connection still works both ways.
    ASSERT_EQ(c->send("ping", 4), 4);
    char buf[4];
    ASSERT_EQ(s->recv(buf, 4, kWaitAll, 5000), 4);
    ASSERT_EQ(s->send("pong", 4), 4);
    ASSERT_EQ(c->recv(buf, 4, kWaitAll, 5000), 4);
    EXPECT_EQ(std::string(buf, 4), "pong");
}

// A poller waiting for room (a third of the ring free, when poll reports POLLOUT) sleeps through
// its peer's small reads: its arm after each finds nothing to look at, and the peer's read that
// frees a third wakes it. The arm used to fail at each read that moved the head (a writer of
// iperf3 -l 64 looked again, with two reads of its pipes, for every 64 B its server read).
TEST_F(SameHostWake, APollerWaitingForRoomSleepsThroughSmallReads)
{
    auto [c, s] = pair();
    ASSERT_TRUE(c && s);
    SameHostLink *link = c->testSameHostLink();
    ASSERT_NE(link, nullptr);
    const uint64_t ring = link->sendRing(), third = (ring + 2) / 3;
    std::vector<char> out(ring, 'x'), in(64);
    ASSERT_EQ(c->send(out.data(), out.size(), kNonBlock), ssize_t(ring));
    ssize_t recv = 0, send = 0;
    c->peek(&recv, &send); // a poller's look: no room
    ASSERT_EQ(send, 0);
    uint64_t seq = 0;
    ASSERT_EQ(c->arm(&seq, true), 0);
    uint64_t got = 0, failed = 0;
    while (got + 64 < third) {
        ASSERT_EQ(s->recv(in.data(), in.size(), kNonBlock), 64);
        got += 64;
        failed += c->arm(&seq, false) != 0;
    }
    EXPECT_EQ(failed, 0u) << "reads of 64 B that left less than a third free ended the sleep";
    EXPECT_FALSE(fdReadable(link->fd())) << "the peer woke the writer before a third was free";
    ASSERT_EQ(s->recv(in.data(), in.size(), kNonBlock), 64); // a third free now
    for (int i = 0; i < 2000 && !fdReadable(link->fd()); i++)
        usleep(1000);
    EXPECT_TRUE(fdReadable(link->fd())) << "the read that freed a third did not wake the writer";
    EXPECT_EQ(c->arm(&seq, true), -EAGAIN);
    c->peek(&recv, &send);
    EXPECT_GE(uint64_t(send), third);
}

// A server that answers requests a millisecond apart with blocking reads sleeps on its link's
// pipe and reads it once per request: the wake-up byte. Its look before sleeping used to count
// its client's read of the answer as a change (a second arm, a second read), and its read that
// found nothing asked the pipe about a peer that went about once a millisecond (what a read
// that does not sleep needs; one that sleeps learns it from the pipe): near two reads a request.
TEST_F(SameHostWake, ABlockingServerReadsItsPipeOncePerRequest)
{
    auto [c, s] = pair();
    ASSERT_TRUE(c && s);
    SameHostLink *link = s->testSameHostLink();
    ASSERT_NE(link, nullptr);
    constexpr int kRequests = 200;
    std::thread server([&, &s = s] {
        char buf[64];
        for (int i = 0; i < kRequests; i++) {
            if (s->recv(buf, sizeof(buf), kWaitAll, 5000) != ssize_t(sizeof(buf)) ||
                s->send(buf, sizeof(buf)) != ssize_t(sizeof(buf)))
                return;
        }
    });
    char req[64] = {}, ans[64];
    for (int i = 0; i < 3; i++) { // the setup's wake-ups read
        ASSERT_EQ(c->send(req, sizeof(req)), ssize_t(sizeof(req)));
        ASSERT_EQ(c->recv(ans, sizeof(ans), kWaitAll, 5000), ssize_t(sizeof(ans)));
    }
    const uint64_t before = link->testWakeReads();
    for (int i = 3; i < kRequests; i++) {
        usleep(1000);
        ASSERT_EQ(c->send(req, sizeof(req)), ssize_t(sizeof(req)));
        ASSERT_EQ(c->recv(ans, sizeof(ans), kWaitAll, 5000), ssize_t(sizeof(ans)));
    }
    server.join();
    const uint64_t reads = link->testWakeReads() - before, requests = kRequests - 3;
    EXPECT_LE(reads, requests + requests / 10)
        << "reads of the pipe for " << requests << " requests";
}

} // namespace
} // namespace rstream
