// SPDX-License-Identifier: MIT
// A process's same-host inbox: what a third party sends there is never taken for a link, and an
// honest sender's arrival is taken whenever its bytes come.

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <string>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

#include "hint_pass.h"
#include "samehost.h"
#include "samehost_fixture.h"
#include "samehost_setup.h"

namespace rstream {
namespace {

const SameHostRings kRings{256 * 1024, 256 * 1024, 256 * 1024};

class SameHostInbox : public SameHostTest
{};
// A UNIX stream socket connected to this process's inbox, as any local process can make one.
int connectInbox(const std::string &name)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path + 1, name.data(), name.size());
    if (::connect(fd, reinterpret_cast<sockaddr *>(&a),
                  socklen_t(offsetof(sockaddr_un, sun_path) + 1 + name.size())) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

// What an accepting end sends to an inbox: the token, and when memfd >= 0 the region and the
// two pipe ends (pipes false: the region three times, no pipe at all).
ssize_t sendArrival(int fd, uint64_t token, int memfd, bool pipes = true)
{
    iovec iov{&token, sizeof(token)};
    int fds[3] = {memfd, memfd, memfd};
    int a[2] = {-1, -1}, b[2] = {-1, -1};
    if (memfd >= 0 && pipes && (pipe2(a, O_CLOEXEC) < 0 || pipe2(b, O_CLOEXEC) < 0))
        return -1;
    if (pipes) {
        fds[1] = a[0];
        fds[2] = b[1];
    }
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(fds))] = {};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    if (memfd >= 0) {
        m.msg_control = control;
        m.msg_controllen = sizeof(control);
        cmsghdr *cm = CMSG_FIRSTHDR(&m);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(fds));
        std::memcpy(CMSG_DATA(cm), fds, sizeof(fds));
    }
    const ssize_t r = sendmsg(fd, &m, MSG_NOSIGNAL);
    for (int p : {a[0], a[1], b[0], b[1]})
        if (p >= 0)
            close(p);
    return r;
}
TEST_F(SameHostInbox, ForgedArrivalsAtTheInboxAreNotTaken)
{
    auto [c0, s0] = pair(); // the inbox exists from the first offer on
    ASSERT_TRUE(c0 && s0);
    const std::string name = sameHostInboxName();
    ASSERT_FALSE(name.empty());
    // A third party knows the inbox's name (abstract sockets are listed in /proc/net/unix) and
    // sends regions of its own, with tokens it made up.
    std::vector<int> forged;
    for (int i = 0; i < 4; i++) {
        const int fd = connectInbox(name);
        ASSERT_GE(fd, 0);
        const int memfd = memfd_create("forged", MFD_CLOEXEC);
        // Half of them without a region at all.
        ASSERT_EQ(sendArrival(fd, 0x1234 + i, i % 2 == 0 ? memfd : -1), ssize_t(sizeof(uint64_t)));
        close(memfd);
        forged.push_back(fd);
    }
    std::unique_ptr<SameHostLink> link;
    EXPECT_EQ(collectSameHost(0x1235, 100, &link), -ETIMEDOUT); // sent without a region
    // An unsealed region is refused, even under a token that matches.
    EXPECT_EQ(collectSameHost(0x1234, 100, &link), -EPROTO);
    EXPECT_FALSE(link);
    // So is a good region whose wake-up ends are not pipes.
    {
        const int fd = connectInbox(name);
        ASSERT_GE(fd, 0);
        int memfd = -1;
        std::unique_ptr<SameHostLink> mine;
        ASSERT_EQ(SameHostLink::create(shm::kMinRing, shm::kMinRing, &memfd, &mine), 0);
        ASSERT_EQ(sendArrival(fd, 0x4321, memfd, false), ssize_t(sizeof(uint64_t)));
        close(memfd);
        EXPECT_EQ(collectSameHost(0x4321, 1000, &link), -EPROTO);
        EXPECT_FALSE(link);
        forged.push_back(fd);
    }
    // Real connections go on being made, each with its own region.
    for (int i = 0; i < 3; i++) {
        auto [c, s] = pair();
        ASSERT_TRUE(c && s);
        ASSERT_EQ(s->send("real", 4), 4);
        char buf[4];
        ASSERT_EQ(c->recv(buf, 4, kWaitAll, 5000), 4);
        EXPECT_EQ(std::memcmp(buf, "real", 4), 0);
    }
    for (int fd : forged)
        close(fd);
}

// A sender's connect and its write are two steps: an arrival accepted in between is kept until
// the write comes (and taken then), not dropped as if it had sent nothing.
TEST_F(SameHostInbox, ArrivalAcceptedBeforeItsWriteIsKept)
{
    auto [c0, s0] = pair(); // the inbox exists from the first offer on
    ASSERT_TRUE(c0 && s0);
    const std::string name = sameHostInboxName();
    ASSERT_FALSE(name.empty());
    const int fd = connectInbox(name);
    ASSERT_GE(fd, 0);
    const uint64_t token = 0x5eed5eed5eed5eedull;
    std::unique_ptr<SameHostLink> link;
    // The inbox accepts the silent socket while it looks for this token.
    EXPECT_EQ(collectSameHost(token, 50, &link), -ETIMEDOUT);
    // Then the sender writes: a region as an accepting end makes it, under the token.
    int memfd = -1;
    std::unique_ptr<SameHostLink> mine;
    ASSERT_EQ(SameHostLink::create(shm::kMinRing, shm::kMinRing, &memfd, &mine), 0);
    ASSERT_EQ(sendArrival(fd, token, memfd), ssize_t(sizeof(token)));
    close(memfd);
    ASSERT_EQ(collectSameHost(token, 1000, &link), 0);
    ASSERT_TRUE(link);
    EXPECT_EQ(link->recvRing(), shm::kMinRing);
    // The sender's pipes are blocking (sendArrival() makes them so): the link reads and writes
    // through descriptions of its own, nonblocking whatever the sender does with its own.
    EXPECT_TRUE(fcntl(link->fd(), F_GETFL) & O_NONBLOCK);
    close(fd);
}

TEST_F(SameHostInbox, ALinkSentToANameTheInboxAnswersToCarriesAConnection)
{
    // The preload shim's in-band setup: no fabric at all, a name the server's process adds to
    // its inbox, a link the client makes and sends there with a token both ends know.
    const std::string name = "rstream-test-up/" + std::to_string(getpid());
    {
        SameHostOffer nobody;
        EXPECT_EQ(nobody.open(name, kRings), -ECONNREFUSED); // nothing answers there yet
    }
    ASSERT_EQ(addSameHostName(name), 0);
    EXPECT_EQ(addSameHostName(name), -EADDRINUSE);
    const uint64_t token = 0x1234567890abcdefull;
    // A third party's arrivals at the name: the token alone, and a wrong token with a region.
    const int forged = connectInbox(name);
    ASSERT_GE(forged, 0);
    ASSERT_EQ(sendArrival(forged, token, -1), ssize_t(sizeof(token)));
    close(forged);

    SameHostOffer offer;
    ASSERT_EQ(offer.open(name, kRings), 0);
    sockaddr_in client{}, server{};
    client.sin_family = server.sin_family = AF_INET;
    client.sin_addr.s_addr = server.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    client.sin_port = htons(40000);
    server.sin_port = htons(80);
    Connection a;
    ASSERT_EQ(a.adoptSameHost(offer.takeLink(), reinterpret_cast<sockaddr *>(&client),
                              sizeof(client), reinterpret_cast<sockaddr *>(&server),
                              sizeof(server)),
              0);
    ASSERT_EQ(offer.send(token), 0);
    std::unique_ptr<SameHostLink> link;
    EXPECT_EQ(collectSameHost(token + 1, 0, &link), -ETIMEDOUT); // not another token's
    ASSERT_EQ(collectSameHost(token, 1000, &link), 0);
    auto b = std::make_unique<Connection>();
    ASSERT_EQ(b->adoptSameHost(std::move(link), reinterpret_cast<sockaddr *>(&server),
                               sizeof(server), reinterpret_cast<sockaddr *>(&client),
                               sizeof(client)),
              0);
    EXPECT_TRUE(a.sameHost());
    EXPECT_TRUE(b->sameHost());
    EXPECT_EQ(collectSameHost(token, 0, &link), -ETIMEDOUT); // taken once

    // A connection like any other: bytes both ways, its addresses, and the end.
    char buf[16] = {};
    ASSERT_EQ(a.send("hello", 5), 5);
    ASSERT_EQ(b->recv(buf, sizeof(buf), 0, 5000), 5);
    EXPECT_EQ(std::string(buf, 5), "hello");
    ASSERT_EQ(b->send("bye", 3), 3);
    ASSERT_EQ(a.recv(buf, sizeof(buf), 0, 5000), 3);
    EXPECT_EQ(std::string(buf, 3), "bye");
    sockaddr_storage peer{};
    socklen_t plen = sizeof(peer);
    ASSERT_EQ(a.peerAddress(&peer, &plen), 0);
    EXPECT_EQ(reinterpret_cast<sockaddr_in &>(peer).sin_port, htons(80));
    Connection::close(std::move(b));
    EXPECT_EQ(a.recv(buf, sizeof(buf), 0, 5000), 0);
    // Made once: a connected connection takes no other link.
    SameHostOffer again;
    ASSERT_EQ(again.open(name, kRings), 0);
    EXPECT_EQ(a.adoptSameHost(again.takeLink(), reinterpret_cast<sockaddr *>(&client),
                              sizeof(client), reinterpret_cast<sockaddr *>(&server),
                              sizeof(server)),
              -EISCONN);
}

TEST_F(SameHostInbox, ALinksArrivalWakesAPollerWaitingForIt)
{
    // A server asleep on a connection whose client sends a link must wake for it: the fds the
    // inbox gives a waiter turn readable when a link comes, and the waiter then learns that
    // its link is there.
    const std::string name = "rstream-test-wake/" + std::to_string(getpid());
    const uint64_t token = 0x0badc0ffee0ddf00ull;
    std::vector<pollfd> fds;
    ASSERT_EQ(addSameHostName(name), 0);
    ASSERT_EQ(sameHostWaitFds(token, 0, &fds), 0);
    ASSERT_FALSE(fds.empty());
    EXPECT_EQ(poll(fds.data(), fds.size(), 0), 0);
    {
        // Every socket that waits asks; a pass gets the fds once.
        HintPass pass;
        std::vector<pollfd> first, second;
        EXPECT_EQ(sameHostWaitFds(token, HintPass::current(), &first), 0);
        EXPECT_EQ(sameHostWaitFds(token + 1, HintPass::current(), &second), 0);
        EXPECT_FALSE(first.empty());
        EXPECT_TRUE(second.empty());
    }

    // Another connection's link wakes the waiter too, which then keeps waiting for its own.
    std::atomic<int> woke{-1};
    std::thread sleeper([&] {
        std::vector<pollfd> mine = fds;
        woke = poll(mine.data(), mine.size(), 5000);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    SameHostOffer other;
    ASSERT_EQ(other.open(name, kRings), 0);
    ASSERT_EQ(other.send(token + 1), 0);
    sleeper.join();
    EXPECT_GT(woke.load(), 0) << "the link's arrival did not wake the poller";
    fds.clear();
    EXPECT_EQ(sameHostWaitFds(token, 0, &fds), 0);
    EXPECT_EQ(poll(fds.data(), fds.size(), 0), 0) << "still readable after the look";

    SameHostOffer mine;
    ASSERT_EQ(mine.open(name, kRings), 0);
    ASSERT_EQ(mine.send(token), 0);
    ASSERT_EQ(poll(fds.data(), fds.size(), 5000), 1);
    fds.clear();
    EXPECT_EQ(sameHostWaitFds(token, 0, &fds), -EAGAIN); // here: a look takes it
    std::unique_ptr<SameHostLink> link;
    EXPECT_EQ(collectSameHost(token, 0, &link), 0);
    EXPECT_EQ(collectSameHost(token + 1, 0, &link), 0);
}

} // namespace
} // namespace rstream
