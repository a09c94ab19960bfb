// SPDX-License-Identifier: MIT
// epoll's ready list (src/socket/epoll_ready.cpp): a wait looks only at the members that may be
// ready, as the kernel's does, and still reports every event: data that arrives at a parked
// member, progress another thread made on it, a member closed and its number reused. And what a
// poll's look at an idle same-host member costs, a poll's wait for room, and a signal during a
// wait's spin (src/socket/poller.cpp).

#include <atomic>
#include <chrono>
#include <fcntl.h>
#include <iterator>
#include <memory>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <thread>
#include <time.h>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

#include "epoll_fixture.h"
#include "interrupt.h"
#include "kernel.h"
#include "poller.h"
#include "samehost.h"
#include "settings.h"
#include "socket.h"

namespace rstream {
namespace {

using rstest_epoll::EpollReady;
using rstest_epoll::kModes;

// An idle listener parks too (on its request and queue fds), and a connect wakes it: waits
// between connects look at nothing, and every connect is reported.
TEST_P(EpollReady, IdleListenerIsParkedAndWokenByAConnect)
{
    addListener();
    epoll_event out[8];
    for (int round = 0; round < 3; round++) {
        SCOPED_TRACE(round);
        ASSERT_TRUE(parked(1));
        const uint64_t before = set_->looks();
        for (int i = 0; i < 100; i++)
            ASSERT_EQ(set_->wait(out, 8, 0, nullptr, 0), 0);
        EXPECT_EQ(set_->looks() - before, 0u) << "waits looked at an idle listener";
        auto c = std::make_shared<Socket>(AF_INET, settings_);
        std::thread t(
            [&] { EXPECT_EQ(c->connect(reinterpret_cast<sockaddr *>(&addr_), sizeof(addr_)), 0); });
        ASSERT_EQ(set_->wait(out, 8, 5000, nullptr, 50), 1);
        // A copy: epoll_event is packed on x86-64, and gtest's macros take references.
        EXPECT_EQ(uint64_t{out[0].data.u64}, 999u);
        EXPECT_TRUE(out[0].events & EPOLLIN);
        std::shared_ptr<Socket> s;
        ASSERT_EQ(listener_->accept(&s, nullptr, nullptr), 0);
        t.join();
        pairs_.emplace_back(c, s);
    }
}

// With every member idle and parked, waits look at none of them; data for one member wakes it
// alone, and the wait reports it.
TEST_P(EpollReady, IdleMembersAreNotLookedAt)
{
    constexpr int kPairs = 48;
    connectPairs(kPairs);
    ASSERT_TRUE(parked(kPairs)) << set_->parkedCount() << " of " << kPairs << " parked";
    epoll_event out[8];
    const uint64_t before = set_->looks();
    for (int i = 0; i < 100; i++)
        ASSERT_EQ(set_->wait(out, 8, 0, nullptr, 0), 0);
    EXPECT_EQ(set_->looks() - before, 0u) << "waits looked at idle members";
    for (int k : {7, 31, 7}) {
        sendByte(*pairs_[k].first);
        const uint64_t at = set_->looks();
        ASSERT_EQ(set_->wait(out, 8, 5000, nullptr, 50), 1);
        EXPECT_EQ(uint64_t{out[0].data.u64}, uint64_t(k));
        EXPECT_TRUE(out[0].events & EPOLLIN);
        EXPECT_LE(set_->looks() - at, 4u) << "a wait looked at more than the member woken";
        char b;
        iovec v{&b, 1};
        ASSERT_EQ(pairs_[k].second->recv(&v, 1, 0), 1);
        ASSERT_TRUE(parked(kPairs));
    }
}

// Progress made outside the wait on a parked member (another thread's look, which takes what
// arrived) still makes the next wait report it at once. On tcp the wait fd stays signalled until
// the next arm; where reading the queue resets it (verbs), the connection's mark wakes the member.
TEST_P(EpollReady, ProgressOutsideTheWaitWakesTheMember)
{
    connectPairs(4);
    epoll_event out[4];
    for (int round = 0; round < 20; round++) {
        ASSERT_TRUE(parked(4));
        sendByte(*pairs_[2].first);
        // Until the byte is there, as the program's other thread would look.
        const auto t0 = std::chrono::steady_clock::now();
        while (!(pairs_[2].second->pollEvents(POLLIN) & POLLIN))
            ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
        const auto t1 = std::chrono::steady_clock::now();
        ASSERT_EQ(set_->wait(out, 4, 3000, nullptr, 0), 1) << "round " << round;
        EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::milliseconds(1000));
        EXPECT_EQ(uint64_t{out[0].data.u64}, 2u);
        char b;
        iovec v{&b, 1};
        ASSERT_EQ(pairs_[2].second->recv(&v, 1, 0), 1);
    }
}

// A member taken out of the set and put back at every request (redis-benchmark's pattern): it is
// reported each time, and data for it while it is out is neither reported nor ends a wait early
// (its wait fd may stay in the hint epoll, under a key no member has). Same-host: a member whose
// request its peer read (a change the look sees, with no wake-up byte) parks again without
// reading its link's pipe.
TEST_P(EpollReady, MemberTakenOutAndPutBackIsReportedEachTime)
{
    connectPairs(2);
    epoll_event out[8];
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = 0;
    const std::shared_ptr<Socket> member = pairs_[0].second;
    for (int round = 0; round < 10; round++) {
        SCOPED_TRACE(round);
        ASSERT_TRUE(parked(2));
        ASSERT_EQ(set_->ctl(EPOLL_CTL_DEL, 1000, nullptr, member), 0);
        sendByte(*pairs_[0].first);
        const auto t0 = std::chrono::steady_clock::now();
        EXPECT_EQ(set_->wait(out, 8, 40, nullptr, 0), 0);
        EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(35));
        ASSERT_EQ(set_->ctl(EPOLL_CTL_ADD, 1000, &ev, member), 0);
        ASSERT_EQ(set_->wait(out, 8, 3000, nullptr, 0), 1);
        EXPECT_EQ(uint64_t{out[0].data.u64}, 0u);
        char b;
        iovec v{&b, 1};
        ASSERT_EQ(member->recv(&v, 1, 0), 1);
    }
    if (!GetParam().sameHost)
        return;
    ASSERT_TRUE(parked(2));
    SameHostLink *link = member->connection()->testSameHostLink();
    ASSERT_NE(link, nullptr);
    const uint64_t reads = link->testWakeReads();
    for (int round = 0; round < 20; round++) {
        sendByte(*member);
        char b;
        iovec v{&b, 1};
        pairs_[0].first->setNonblocking(false);
        ASSERT_EQ(pairs_[0].first->recv(&v, 1, 0), 1);
        ASSERT_EQ(set_->ctl(EPOLL_CTL_DEL, 1000, nullptr, member), 0);
        ASSERT_EQ(set_->ctl(EPOLL_CTL_ADD, 1000, &ev, member), 0);
        ASSERT_TRUE(parked(2));
    }
    EXPECT_EQ(link->testWakeReads(), reads) << "parked again with no wake-up owed";
    EXPECT_GE(set_->looks(), 20u);
}

// A member closed while parked leaves the set; its number, reused by a new member, reports the
// new member's events only.
TEST_P(EpollReady, ClosedMemberLeavesAndItsNumberIsReused)
{
    connectPairs(3);
    ASSERT_TRUE(parked(3));
    // Close member 1 (the program's close drops the socket, as the shim's fd table does).
    auto gone = pairs_[1];
    pairs_.erase(pairs_.begin() + 1);
    gone.second->close();
    gone.first->close();
    gone = {};
    connectPairs(1); // in the set under 1000 + 0 ... : re-add under member 1's number
    auto fresh = pairs_.back();
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = 77;
    ASSERT_EQ(set_->ctl(EPOLL_CTL_ADD, 1001, &ev, fresh.second), 0)
        << "the closed member's number is free again";
    epoll_event out[8];
    sendByte(*fresh.first);
    int n = set_->wait(out, 8, 5000, nullptr, 0);
    ASSERT_GE(n, 1);
    bool seen = false;
    for (int i = 0; i < n; i++)
        seen |= out[i].data.u64 == 77;
    EXPECT_TRUE(seen);
}

// Kernel fds in the program's epoll (a pipe here) beside parked members: a wait reports them at
// once and a sleeping wait wakes for them, whether the set could nest the kernel's epoll in its
// hint epoll or (with the program's epoll nested too deep for that) asks it apart.
TEST_P(EpollReady, KernelFdsBesideParkedMembersAreReported)
{
    for (bool deep : {false, true}) {
        SCOPED_TRACE(deep ? "kernel epoll too deep to nest" : "kernel epoll nested");
        TearDown();
        pairs_.clear();
        SetUp();
        std::vector<int> chain;
        if (deep) {
            // epfd_ -> e1 -> e2 -> e3 -> e4: as deep as the kernel allows (EPOLL_MAX_NESTS).
            int top = epfd_;
            for (int i = 0; i < 4; i++) {
                const int e = sys::epollCreate1(EPOLL_CLOEXEC);
                ASSERT_GE(e, 0);
                epoll_event ev{};
                ev.events = EPOLLIN;
                ev.data.u64 = 1000;
                ASSERT_EQ(sys::epollCtl(top, EPOLL_CTL_ADD, e, &ev), 0) << "level " << i;
                chain.push_back(e);
                top = e;
            }
        }
        int p[2];
        ASSERT_EQ(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = 99;
        ASSERT_EQ(sys::epollCtl(epfd_, EPOLL_CTL_ADD, p[0], &ev), 0);
        connectPairs(3);
        ASSERT_TRUE(parked(3));
        EXPECT_EQ(set_->kernelNested(), !deep);
        epoll_event out[8];
        ASSERT_EQ(write(p[1], "k", 1), 1);
        int n = set_->wait(out, 8, 0, nullptr, 0);
        ASSERT_EQ(n, 1);
        EXPECT_EQ(uint64_t{out[0].data.u64}, 99u);
        char b;
        ASSERT_EQ(read(p[0], &b, 1), 1);
        ASSERT_TRUE(parked(3));
        // A wait asleep with every member parked wakes for the pipe.
        std::thread writer([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            EXPECT_EQ(write(p[1], "k", 1), 1);
        });
        const auto t0 = std::chrono::steady_clock::now();
        n = set_->wait(out, 8, 5000, nullptr, 0);
        writer.join();
        EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
        ASSERT_EQ(n, 1);
        EXPECT_EQ(uint64_t{out[0].data.u64}, 99u);
        // And the members still report their own events beside it.
        sendByte(*pairs_[1].first);
        n = set_->wait(out, 8, 5000, nullptr, 0);
        ASSERT_GE(n, 1);
        bool member = false, pipe = false;
        for (int i = 0; i < n; i++) {
            member |= out[i].data.u64 == 1;
            pipe |= out[i].data.u64 == 99;
        }
        EXPECT_TRUE(member);
        EXPECT_TRUE(pipe) << "the unread pipe stays readable (level-triggered)";
        close(p[0]);
        close(p[1]);
        for (int e : chain)
            sys::close(e);
    }
}

// A program's epoll nested as deep as the kernel allows after the set nested the kernel's epoll
// in its hint epoll: the program's epoll_ctl succeeds as without the shim (the hint epoll's
// level goes), and the chain's events are still reported.
TEST_P(EpollReady, ProgramNestingAsDeepAsTheKernelAllowsStillWorks)
{
    connectPairs(2);
    ASSERT_TRUE(parked(2));
    ASSERT_TRUE(set_->kernelNested());
    // e1 -> e2 -> e3 -> e4 -> pipe, then epfd_ -> e1: four levels below the program's epoll.
    int p[2];
    ASSERT_EQ(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
    std::vector<int> chain;
    int below = p[0];
    for (int i = 0; i < 4; i++) {
        const int e = sys::epollCreate1(EPOLL_CLOEXEC);
        ASSERT_GE(e, 0);
        epoll_event ev{};
        ev.events = EPOLLIN;
        ASSERT_EQ(sys::epollCtl(e, EPOLL_CTL_ADD, below, &ev), 0) << "level " << i;
        chain.push_back(e);
        below = e;
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = 55;
    EXPECT_EQ(set_->ctl(EPOLL_CTL_ADD, below, &ev, nullptr), 0);
    EXPECT_FALSE(set_->kernelNested());
    ASSERT_TRUE(parked(2));
    std::thread writer([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        EXPECT_EQ(write(p[1], "k", 1), 1);
    });
    epoll_event out[4];
    const int n = set_->wait(out, 4, 5000, nullptr, 0);
    writer.join();
    ASSERT_EQ(n, 1);
    EXPECT_EQ(uint64_t{out[0].data.u64}, 55u);
    close(p[0]);
    close(p[1]);
    for (int e : chain)
        sys::close(e);
}

std::atomic<int> gPpolls{0};
int countingPpoll(pollfd *fds, nfds_t n, const timespec *t, const sigset_t *mask)
{
    gPpolls++;
    return ::ppoll(fds, n, t, mask);
}
std::shared_ptr<Pollable> gPollMembers[2];
std::shared_ptr<Pollable> pollMember(int fd)
{
    return fd >= 1000 && fd < 1002 ? gPollMembers[fd - 1000] : nullptr;
}

// poll and select over shim sockets only (iperf3's client: its control and data connections):
// an idle same-host member, armed by an earlier sleep, is looked at in shared memory, without
// the system call a check of its fd would cost, and a poll answered at once makes none at all.
TEST_P(EpollReady, PollOfAnIdleSameHostMemberMakesNoSystemCall)
{
    if (!GetParam().sameHost)
        GTEST_SKIP() << "a fabric member's armed fd is checked: that spares the provider's calls";
    connectPairs(2);
    gPollMembers[0] = pairs_[0].second; // idle
    gPollMembers[1] = pairs_[1].first;  // writable
    pollfd idle{1000, POLLIN, 0};
    // Times out: the member was armed before the sleep.
    ASSERT_EQ(pollFds(&idle, 1, 30, nullptr, pollMember, 0), 0);
    static sys::Calls table = [] {
        sys::Calls t = sys::kLibc;
        t.ppoll = countingPpoll;
        return t;
    }();
    sys::bind(&table);
    gPpolls = 0;
    pollfd both[2] = {{1000, POLLIN, 0}, {1001, POLLOUT, 0}};
    const int r = pollFds(both, 2, 1000, nullptr, pollMember, 0);
    const int ppolls = gPpolls.load();
    sys::bind(&sys::kLibc);
    gPollMembers[0].reset();
    gPollMembers[1].reset();
    EXPECT_EQ(r, 1);
    EXPECT_EQ(both[0].revents, 0);
    EXPECT_EQ(both[1].revents, POLLOUT);
    EXPECT_EQ(ppolls, 0) << "the look checked the idle member's fd";
}

// A poll that waits for room (POLLOUT on a full ring) of a peer that reads slowly (here a ring
// each 60 ms) sleeps at once, even with a 500 ms spin allowed: room comes as the peer reads, a
// little at a time, and a spin catching each piece burnt a CPU (iperf3 -l 64's writer used
// 88 % of one, 25 % without). Its CPU time says so. Twice: the first wait has no rate to go
// by, the second the 60 ms of the first (RoomRate).
TEST_P(EpollReady, PollForRoomOfASlowReaderSleepsWithoutSpinning)
{
    connectPairs(1);
    Socket &w = *pairs_[0].second; // nonblocking
    Socket &r = *pairs_[0].first;
    std::vector<char> buf(65536, 'x');
    gPollMembers[0] = pairs_[0].second;
    for (int round = 0; round < 2; round++) {
        SCOPED_TRACE(round);
        size_t queued = 0;
        for (;;) {
            iovec v{buf.data(), buf.size()};
            const ssize_t n = w.send(&v, 1, 0);
            if (n <= 0) {
                ASSERT_EQ(n, -EAGAIN);
                break;
            }
            queued += static_cast<size_t>(n);
        }
        std::thread reader([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(60));
            for (size_t got = 0; got < queued;) {
                iovec v{buf.data(), buf.size()};
                const ssize_t n = r.recv(&v, 1, 0);
                ASSERT_GT(n, 0);
                got += static_cast<size_t>(n);
            }
        });
        timespec t0{}, t1{};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
        pollfd p{1000, POLLOUT, 0};
        const int n = pollFds(&p, 1, 5000, nullptr, pollMember, 500000);
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
        reader.join();
        EXPECT_EQ(n, 1);
        EXPECT_EQ(p.revents, POLLOUT);
        const int64_t cpuUs = (t1.tv_sec - t0.tv_sec) * 1000000 + (t1.tv_nsec - t0.tv_nsec) / 1000;
        RecordProperty(round ? "poll_cpu_us_second" : "poll_cpu_us_first", int(cpuUs));
        EXPECT_LT(cpuUs, 20000) << "the poll spun for room";
    }
    gPollMembers[0].reset();
}

// A signal that comes while a poll or an epoll wait spins (here up to 300 ms) ends it with
// EINTR, as one that comes during the kernel's own call does. It used to run its handler and
// the wait slept on to its timeout: nginx under the shim at times did not stop on SIGQUIT.
// Each wait runs on a thread of its own, so that its spin has learnt nothing yet and spins
// the whole cap.
TEST_P(EpollReady, SignalDuringTheSpinEndsTheWaitWithEintr)
{
    connectPairs(1);
    gPollMembers[0] = pairs_[0].second; // idle
    // Tracked as under the shim (sigtrack's trampoline), no signal is held during the spin.
    for (const bool epoll : {false, true}) {
        for (const bool tracked : {false, true}) {
            SCOPED_TRACE(std::string(epoll ? "epoll" : "poll") + (tracked ? ", tracked" : ""));
            const auto i = rstest::interruptAfter30ms(
                [&] {
                    pollfd p{1000, POLLIN, 0};
                    epoll_event out[4];
                    return epoll ? set_->wait(out, 4, 3000, nullptr, 300000)
                                 : pollFds(&p, 1, 3000, nullptr, pollMember, 300000);
                },
                tracked);
            rstest::expectInterruptedSpin(i, tracked);
        }
    }
    gPollMembers[0].reset();
}

INSTANTIATE_TEST_SUITE_P(Modes, EpollReady, ::testing::ValuesIn(kModes),
                         [](const auto &p) { return std::string(p.param.name); });

// The set's fd -> entry index: low fds in a vector, high ones (past 65536, where a program that
// raised its limit may have sockets) in a map, each found, moved and erased alone.
TEST(EpollIndex, LowAndHighFdsAreKeptApart)
{
    FdIndex index;
    const int fds[] = {0, 3, 1023, 65535, 65536, 70000, 1 << 30};
    for (size_t i = 0; i < std::size(fds); i++)
        EXPECT_EQ(index.find(fds[i]), FdIndex::npos) << fds[i];
    for (size_t i = 0; i < std::size(fds); i++)
        index.set(fds[i], i * 10);
    for (size_t i = 0; i < std::size(fds); i++)
        EXPECT_EQ(index.find(fds[i]), i * 10) << fds[i];
    EXPECT_EQ(index.find(4), FdIndex::npos) << "a number between two set ones";
    EXPECT_EQ(index.find(65537), FdIndex::npos);
    EXPECT_EQ(index.find(-1), FdIndex::npos);
    index.set(70000, 7);
    index.erase(3);
    index.erase(65536);
    EXPECT_EQ(index.find(3), FdIndex::npos);
    EXPECT_EQ(index.find(65536), FdIndex::npos);
    EXPECT_EQ(index.find(70000), 7u);
    EXPECT_EQ(index.find(1023), 20u);
    index.erase(5000000); // never set: nothing happens
    EXPECT_EQ(index.find(1 << 30), 60u);
}

} // namespace
} // namespace rstream
