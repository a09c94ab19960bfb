// SPDX-License-Identifier: MIT
// What an emulated epoll wait costs in system calls (src/socket/epoll_set.cpp): one sleep for
// parked members, one look for members looked at by their fds, and a signal that still ends
// the sleep.

#include <atomic>
#include <chrono>
#include <memory>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "epoll_fixture.h"
#include "interrupt.h"
#include "kernel.h"
#include "poller.h"
#include "sanitizers.h"
#include "settings.h"
#include "socket.h"

namespace rstream {
namespace {

using rstest_epoll::EpollReady;
using rstest_epoll::kModes;

// The calls of one thread (the one that sets tCounting): the progress thread's are not counted.
thread_local bool tCounting = false;
std::atomic<int> gWaitPpolls{0}, gEpollWaits{0}, gEpollPwaits{0}, gWrites{0}, gEpollCtls{0};
int threadPpoll(pollfd *fds, nfds_t n, const timespec *t, const sigset_t *mask)
{
    gWaitPpolls += tCounting;
    return ::ppoll(fds, n, t, mask);
}
int threadEpollWait(int ep, epoll_event *ev, int n, int t)
{
    gEpollWaits += tCounting;
    return ::epoll_wait(ep, ev, n, t);
}
ssize_t threadWrite(int fd, const void *buf, size_t len)
{
    gWrites += tCounting;
    return ::write(fd, buf, len);
}
int threadEpollPwait(int ep, epoll_event *ev, int n, int t, const sigset_t *mask)
{
    gEpollPwaits += tCounting;
    return ::epoll_pwait(ep, ev, n, t, mask);
}
int threadEpollCtl(int ep, int op, int fd, epoll_event *ev)
{
    gEpollCtls += tCounting;
    return ::epoll_ctl(ep, op, fd, ev);
}
const sys::Calls &threadCountingCalls()
{
    static const sys::Calls table = [] {
        sys::Calls t = sys::kLibc;
        t.epollCtl = threadEpollCtl;
        t.ppoll = threadPpoll;
        t.epollWait = threadEpollWait;
        t.epollPwait = threadEpollPwait;
        t.write = threadWrite;
        return t;
    }();
    return table;
}

// The busy-member tests: rounds of one message per member, each round's messages sent 200 us
// after the last was read; a round counts as quiet when its members were without data for less
// than kBusyQuietNs (below the millisecond after which a same-host member of a few parks).
constexpr int kBusyRounds = 40;
constexpr int64_t kBusyQuietNs = 800'000;

int64_t steadyNs()
{
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Counts this thread's writes (tCounting) from zero, through the counting calls.
void countWrites()
{
    sys::bind(&threadCountingCalls());
    gWrites = 0;
}

// A wait whose members are all parked sleeps in one epoll_pwait of the hint epoll, and what
// that returns is what the look after it takes: no ppoll, no epoll_wait after the sleep, none
// between the registration and the sleep (there were an epoll_wait there, a ppoll to sleep in
// and an epoll_wait after it: three calls more for each request of a mostly idle server), and
// none before it (a wait that does not spin sleeps at once: the look's epoll_wait was one more).
// A listener woken by a connect is reported without a look at its fds: its fd that fired says
// so (a ppoll less for each connection accepted). A wake-up may come before the provider has the
// whole message or request (then a look more finds it, or a sleep more waits for it: under TSan
// often, and for a fabric member's byte when the tests run two at a time): one quiet round of up
// to eight data rounds suffices, and of up to 24 connects (a fabric connect is two steps, and
// with two of these tests at once half the connects woke at the first: eight failed 1 run in 15).
TEST_P(EpollReady, ParkedMembersSleepInOneEpollPwait)
{
    addListener();
    connectPairs(3);
    const sys::Calls &table = threadCountingCalls();
    epoll_event out[4];
    int quietData = 0, quietConnects = 0;
    for (int round = 0; round < 32; round++) {
        SCOPED_TRACE(round);
        const bool connect = round >= 8;
        if (connect ? quietConnects > 0 : quietData > 0) {
            if (connect)
                break;
            round = 7; // on to the connects
            continue;
        }
        ASSERT_TRUE(parked(4)) << set_->parkedCount() << " of 4 parked";
        const size_t pair = size_t(round) % pairs_.size();
        auto c = std::make_shared<Socket>(AF_INET, settings_);
        std::thread t([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            if (connect)
                EXPECT_EQ(c->connect(reinterpret_cast<sockaddr *>(&addr_), sizeof(addr_)), 0);
            else
                sendByte(*pairs_[pair].first);
        });
        sys::bind(&table);
        gWaitPpolls = gEpollWaits = gEpollPwaits = 0;
        tCounting = true;
        const int n = set_->wait(out, 4, 5000, nullptr, 0);
        tCounting = false;
        sys::bind(&sys::kLibc);
        const int ppolls = gWaitPpolls, waits = gEpollWaits, pwaits = gEpollPwaits;
        ASSERT_EQ(n, 1);
        // A copy: epoll_event is packed on x86-64, and gtest's macros take references.
        EXPECT_EQ(uint64_t{out[0].data.u64}, connect ? 999u : uint64_t(pair));
        EXPECT_TRUE(out[0].events & EPOLLIN);
        // One sleep in the hint epoll, no ppoll beside it and no look before it: every member
        // parked and no spin, the sleep is the look (the look after it takes its events).
        const bool quiet = pwaits == 1 && ppolls == 0 && waits == 0;
        if (connect) {
            quietConnects += quiet;
            std::shared_ptr<Socket> s;
            ASSERT_EQ(listener_->accept(&s, nullptr, nullptr), 0);
            t.join();
            s->close();
            c->close();
        } else {
            quietData += quiet;
            EXPECT_EQ(ppolls, 0) << "a ppoll beside the sleep";
            t.join();
            char b;
            iovec v{&b, 1};
            ASSERT_EQ(pairs_[pair].second->recv(&v, 1, 0), 1);
        }
    }
    EXPECT_EQ(quietData, 1) << "every data round slept more than once in the hint epoll";
#if !defined(RSTREAM_TEST_ASAN) && !defined(RSTREAM_TEST_TSAN)
    // Under the sanitizers the listener's wake-up came before the whole request in all eight
    // connects of one ASan run: the count there says nothing of the look.
    EXPECT_EQ(quietConnects, 1) << "every connect's wake-up was looked at again";
#endif
}

// Members still active when the wait runs out of looks (new ones, here) are parked by the wait
// itself before it sleeps, and it sleeps the same way: no eventfd registered, no look more.
TEST_P(EpollReady, MembersParkedBeforeTheSleepSleepInOneEpollPwait)
{
    connectPairs(2);
    const sys::Calls &table = threadCountingCalls();
    std::thread t([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        sendByte(*pairs_[1].first);
    });
    sys::bind(&table);
    gWaitPpolls = gEpollWaits = gEpollPwaits = 0;
    tCounting = true;
    epoll_event out[4];
    const int n = set_->wait(out, 4, 5000, nullptr, 0);
    tCounting = false;
    sys::bind(&sys::kLibc);
    t.join();
    ASSERT_EQ(n, 1);
    EXPECT_EQ(uint64_t{out[0].data.u64}, 1u);
    EXPECT_EQ(gEpollPwaits.load(), 1) << "not one sleep in the hint epoll";
    // The set's first look is a ppoll (its hint epoll is made during it); none after it.
    EXPECT_LE(gWaitPpolls.load(), 1) << "a ppoll beside the sleep";
}

// A signal during that sleep ends the wait with EINTR, as it ends the kernel's epoll_wait.
TEST_P(EpollReady, SignalDuringTheSleepEndsTheWaitWithEintr)
{
    // Also with the handler through sigtrack's trampoline (the shim's way), which holds nothing.
    connectPairs(2);
    for (const bool tracked : {false, true}) {
        SCOPED_TRACE(tracked ? "tracked" : "held");
        ASSERT_TRUE(parked(2));
        const auto i = rstest::interruptAfter30ms(
            [&] {
                epoll_event out[4];
                return set_->wait(out, 4, 3000, nullptr, 0);
            },
            tracked);
        EXPECT_EQ(i.handlers, 1);
        EXPECT_EQ(i.result, -EINTR) << "after " << i.ms << " ms";
        EXPECT_LT(i.ms, 2000) << "the wait slept on after the signal";
    }
}

// A wait with a member looked at by its fds (a listener that was just reported, here; under the
// shim, a socket in its upgrade) asks the hint epoll in the same ppoll and takes its wake-ups
// with an epoll_wait only when it has some. A look that finds nothing is one system call, as
// the kernel's epoll_wait is (it was an epoll_wait and a ppoll: a shimmed client's connection
// is in its upgrade for all of its waits but the last). A wake-up there is still taken.
TEST_P(EpollReady, ALookAtMemberFdsIsOneSystemCall)
{
    addListener();
    connectPairs(2);
    ASSERT_TRUE(parked(3)) << set_->parkedCount() << " of 3 parked";
    auto c = std::make_shared<Socket>(AF_INET, settings_);
    std::thread t(
        [&] { EXPECT_EQ(c->connect(reinterpret_cast<sockaddr *>(&addr_), sizeof(addr_)), 0); });
    epoll_event out[4];
    ASSERT_EQ(set_->wait(out, 4, 5000, nullptr, 0), 1);
    EXPECT_EQ(uint64_t{out[0].data.u64}, 999u);
    std::shared_ptr<Socket> s;
    ASSERT_EQ(listener_->accept(&s, nullptr, nullptr), 0);
    t.join();

    const sys::Calls &table = threadCountingCalls();
    auto counted = [&](int timeoutMs) {
        sys::bind(&table);
        gWaitPpolls = gEpollWaits = gEpollPwaits = 0;
        tCounting = true;
        const int n = set_->wait(out, 4, timeoutMs, nullptr, 0);
        tCounting = false;
        sys::bind(&sys::kLibc);
        return n;
    };
    // The listener is active (reported by the wait before), the pairs parked.
    ASSERT_EQ(counted(0), 0);
    EXPECT_EQ(gWaitPpolls.load(), 1) << "the look is not one ppoll";
    EXPECT_EQ(gEpollWaits.load(), 0) << "an epoll_wait beside the look's ppoll";

    // A parked member woken: the look's ppoll sees the hint epoll readable, and its wake-up
    // is taken and reported in the same wait.
    sendByte(*pairs_[1].first);
    int n = 0;
    for (int i = 0; i < 200 && n == 0; i++) {
        n = set_->wait(out, 4, 0, nullptr, 0);
        if (n == 0)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_EQ(n, 1);
    EXPECT_EQ(uint64_t{out[0].data.u64}, 1u);
    EXPECT_TRUE(out[0].events & EPOLLIN);
    s->close();
    c->close();
}

// A fabric member that parks again on its wait fd keeps the fd's registration in the hint epoll
// (lasting, edge-triggered): a request that wakes it, is read, and leaves it to park again costs
// no epoll_ctl. It was an EPOLL_CTL_MOD per request (one-shot), a seventh of a busy fabric
// server's system calls. Every message still wakes the sleep, over 40 rounds. A same-host
// member re-registers (one-shot) at each parking: its count shows that the counter counts.
TEST_P(EpollReady, FabricMemberParksAgainWithoutReRegistering)
{
    connectPairs(2);
    ASSERT_TRUE(parked(2)) << set_->parkedCount() << " of 2 parked";
    const sys::Calls &table = threadCountingCalls();
    epoll_event out[4];
    int ctls = 0, rounds = 0;
    for (int round = 0; round < 42; round++) {
        SCOPED_TRACE(round);
        std::thread t([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
            sendByte(*pairs_[round % 2].first);
        });
        sys::bind(&table);
        gEpollCtls = 0;
        tCounting = true;
        int n = 0;
        while (n == 0)
            n = set_->wait(out, 4, 5000, nullptr, 0);
        tCounting = false;
        sys::bind(&sys::kLibc);
        t.join();
        ASSERT_EQ(n, 1);
        EXPECT_EQ(uint64_t{out[0].data.u64}, uint64_t(round % 2));
        char b;
        iovec v{&b, 1};
        ASSERT_EQ(pairs_[round % 2].second->recv(&v, 1, 0), 1);
        // The first two rounds make each member's registration lasting.
        if (round >= 2) {
            ctls += gEpollCtls;
            rounds++;
        }
        // The member parks again (its look finds nothing) before the next message.
        ASSERT_EQ(set_->wait(out, 4, 0, nullptr, 0), 0);
    }
    if (GetParam().sameHost)
        EXPECT_GE(ctls, rounds) << "a same-host member re-registers at every parking";
    else
        EXPECT_LE(ctls, rounds / 10) << ctls << " epoll_ctl calls in " << rounds << " rounds";
}

// A same-host member of a set of a few, busy (its program's waits find something, or poll with
// no timeout), stays active between its messages instead of being armed after 50 us of quiet:
// its look reads shared memory, while an armed member makes its peer write a wake-up byte for
// each message. nginx answering wrk's five connections a thread at -c 10 wrote one per answer,
// and the server was the busier end: its rate rose by a fifth without them.
TEST_P(EpollReady, BusyFewSameHostMembersCostThePeerNoWakeUps)
{
    if (!GetParam().sameHost)
        GTEST_SKIP() << "a fabric member's look arms it: no wake-up byte to spare";
#ifdef RSTREAM_TEST_TSAN
    // As BusyMembers: a clean-clone TSan run failed it again after two widenings of its
    // margins (its thread stalls exceed the millisecond this judges): judged in the other
    // builds, which run the same code without TSan's stalls.
    GTEST_SKIP() << "timing of a busy member under TSan";
#endif
    connectPairs(2);
    countWrites();
    constexpr int kRounds = kBusyRounds;
    constexpr int64_t kQuietNs = kBusyQuietNs;
    auto now = steadyNs;
    std::atomic<int> received{0};
    std::atomic<int64_t> receivedAt{now()};
    int quietRounds = 0, wokenQuietRounds = 0;
    std::thread sender([&] {
        tCounting = true;
        for (int i = 0; i < kRounds; i++) {
            // The next message 200 us after the last was read: quiet for longer than 50 us.
            while (received.load() < i)
                std::this_thread::yield();
            std::this_thread::sleep_for(std::chrono::microseconds(200));
            // The member can have been quiet at most from the last read (before this send:
            // once sent, its byte can be read at once) to the end of this send, where its
            // parking would have been seen (a TSan run's send took long enough for the member
            // to park during it). A loaded machine makes that longer than the millisecond at
            // times: such rounds do not count, nor the first, which finds the member armed by
            // its setup.
            const int64_t lastRead = receivedAt.load();
            const int before = gWrites.load();
            sendByte(*pairs_[0].first);
            const bool quiet = i > 0 && now() - lastRead < kQuietNs;
            quietRounds += quiet;
            wokenQuietRounds += quiet && gWrites.load() != before;
        }
        tCounting = false;
    });
    epoll_event out[4];
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (received.load() < kRounds && std::chrono::steady_clock::now() < until) {
        // The member's quiet starts no earlier than the wait that finds its byte: stamped
        // before that wait, a round counts as quiet only if it was (under TSan the read alone
        // can take a fifth of the margin, and a clean-clone run counted a round the member
        // had in fact been quiet for longer than it may be).
        const int64_t waitedFrom = now();
        if (set_->wait(out, 4, 0, nullptr, 0) != 1)
            continue;
        ASSERT_EQ(uint64_t{out[0].data.u64}, 0u);
        char b;
        iovec v{&b, 1};
        ASSERT_EQ(pairs_[0].second->recv(&v, 1, 0), 1);
        receivedAt = waitedFrom;
        received++;
    }
    sender.join();
    sys::bind(&sys::kLibc);
    ASSERT_EQ(received.load(), kRounds);
    if (quietRounds < kRounds / 4)
        GTEST_SKIP() << "only " << quietRounds << " messages came soon enough to tell (load)";
    EXPECT_EQ(wokenQuietRounds, 0)
        << "wake-up bytes written for " << quietRounds << " messages to a busy member";
}

// Same-host members of a set of a few (up to 64 active), busy (its program's waits find
// something, or poll with no timeout), stay active between their messages instead of being
// armed after 50 us of quiet: a look reads shared memory, while an armed member makes its peer
// write a wake-up byte for each message. nginx answering wrk's five connections a thread at -c
// 10 wrote one per answer, and the server was the busier end: its rate rose by a fifth without
// them. redis-benchmark's 50 connections, each answered every 100-250 us, were over the
// earlier limit of 32: 25 % more requests a second with them kept active.
class BusyMembers : public EpollReady
{
protected:
    // members pairs; each round one byte to each member, 200 us after the last round was read:
    // whether any was sent with a wake-up byte (rounds after a quiet of at most 0.8 ms only).
    // readd: each member is deleted from the set and added again twice once read, as
    // redis-benchmark does at every answer (once when it reads it, once when it has written
    // the next request).
    void run(int members, bool readd = false)
    {
#ifdef RSTREAM_TEST_TSAN
        // Under TSan, 50 members' reads and sends take near the millisecond, and a clean-clone
        // run saw wake-ups in 2 of 34 rounds measured as quiet: judged in the other builds.
        GTEST_SKIP() << "timing of 50 members under TSan";
#endif
        connectPairs(members);
        countWrites();
        constexpr int kRounds = kBusyRounds;
        constexpr int64_t kQuietNs = kBusyQuietNs;
        auto now = steadyNs;
        std::atomic<int> received{0};
        std::atomic<int64_t> firstReadAt{now()}; // the first read of the last round
        int quietRounds = 0, wokenQuietRounds = 0;
        std::thread sender([&] {
            tCounting = true;
            for (int i = 0; i < kRounds; i++) {
                while (received.load() < i * members)
                    std::this_thread::yield();
                std::this_thread::sleep_for(std::chrono::microseconds(200));
                // Each member was quiet at most from the first read of the last round (taken
                // before the sends: the first byte sent can be read at once) to the end of this
                // round's sends. A loaded machine (a sanitizer's) makes that longer than the
                // millisecond at times, reading or sending 50 of them: such rounds do not
                // count, nor the first three (the members armed by their setup are woken by the
                // first, and some still armed at the second and, rarely, the third).
                const int64_t lastRound = firstReadAt.load();
                const int before = gWrites.load();
                for (int m = 0; m < members; m++)
                    sendByte(*pairs_[size_t(m)].first);
                const bool quiet = i > 2 && now() - lastRound < kQuietNs;
                quietRounds += quiet;
                wokenQuietRounds += quiet && gWrites.load() != before;
            }
            tCounting = false;
        });
        epoll_event out[64];
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (received.load() < kRounds * members && std::chrono::steady_clock::now() < until) {
            const int n = set_->wait(out, 64, 0, nullptr, 0);
            for (int k = 0; k < n; k++) {
                const uint64_t m = out[k].data.u64;
                ASSERT_LT(m, uint64_t(members));
                char b;
                iovec v{&b, 1};
                ASSERT_EQ(pairs_[m].second->recv(&v, 1, 0), 1);
                if (received.load() % members == 0)
                    firstReadAt = now();
                received++;
                for (int again = 0; readd && again < 2; again++) {
                    const int fd = 1000 + int(m);
                    ASSERT_EQ(set_->ctl(EPOLL_CTL_DEL, fd, nullptr, pairs_[m].second), 0);
                    epoll_event ev{};
                    ev.events = EPOLLIN;
                    ev.data.u64 = m;
                    ASSERT_EQ(set_->ctl(EPOLL_CTL_ADD, fd, &ev, pairs_[m].second), 0);
                }
            }
        }
        sender.join();
        sys::bind(&sys::kLibc);
        ASSERT_EQ(received.load(), kRounds * members);
        if (quietRounds < kRounds / 4)
            GTEST_SKIP() << "only " << quietRounds << " rounds came soon enough to tell (load)";
        // A loaded machine showed one such round now and then: the quiet was measured from the
        // first read of the round itself when that came before the sends ended (fixed above).
        // The margin stays, against every round (38 of 38) with a limit of 32.
        EXPECT_LE(wokenQuietRounds, quietRounds / 4)
            << "wake-up bytes written in " << wokenQuietRounds << " of " << quietRounds
            << " rounds to " << members << " busy members";
    }
};

TEST_P(BusyMembers, FiftyBusySameHostMembersCostThePeerNoWakeUps)
{
    if (!GetParam().sameHost)
        GTEST_SKIP() << "a fabric member's look arms it: no wake-up byte to spare";
    run(50);
}

// The members of a program that deletes and adds them again at every answer are still 50: the
// keys of the entries gone since the last look counted too, and made them look like up to 100
// (redis-benchmark -P 16: its server wrote 189,000 wake-up bytes a second, 9,000 now).
TEST_P(BusyMembers, FiftyReAddedSameHostMembersCostThePeerNoWakeUps)
{
    if (!GetParam().sameHost)
        GTEST_SKIP() << "a fabric member's look arms it: no wake-up byte to spare";
    run(50, true);
}

// The count parking goes by, exactly: the keys of the entries gone since the last look are
// not members (with them, 50 members deleted and added twice each counted as 150).
TEST_P(BusyMembers, MembersDeletedAndAddedAgainCountOnce)
{
    connectPairs(50);
    EXPECT_EQ(set_->activeCount(), 50u);
    for (int m = 0; m < 50; m++) {
        for (int again = 0; again < 2; again++) {
            ASSERT_EQ(set_->ctl(EPOLL_CTL_DEL, 1000 + m, nullptr, pairs_[size_t(m)].second), 0);
            epoll_event ev{};
            ev.events = EPOLLIN;
            ev.data.u64 = uint64_t(m);
            ASSERT_EQ(set_->ctl(EPOLL_CTL_ADD, 1000 + m, &ev, pairs_[size_t(m)].second), 0);
        }
    }
    EXPECT_EQ(set_->activeCount(), 50u);
    ASSERT_EQ(set_->ctl(EPOLL_CTL_DEL, 1000, nullptr, pairs_[0].second), 0);
    EXPECT_EQ(set_->activeCount(), 49u);
    ASSERT_TRUE(parked(49)); // idle members park: not active any more
    EXPECT_EQ(set_->activeCount(), 0u);
}

// Only a wait on a connection spins: one on a listener alone (under the shim, on kernel TCP
// sockets alone too) sleeps at once, as the kernel's would, while one with a connection looks
// again and again up to the cap before it sleeps.
TEST_P(EpollReady, OnlyAWaitOnAConnectionSpins)
{
    addListener();
    ASSERT_TRUE(parked(1));
    const sys::Calls &table = threadCountingCalls();
    epoll_event out[4];
    auto calls = [&](int spinUs) {
        sys::bind(&table);
        gWaitPpolls = gEpollWaits = gEpollPwaits = 0;
        tCounting = true;
        EXPECT_EQ(set_->wait(out, 4, 30, nullptr, spinUs), 0);
        tCounting = false;
        sys::bind(&sys::kLibc);
        return gWaitPpolls.load() + gEpollWaits.load() + gEpollPwaits.load();
    };
    // A cap of 20 ms of the wait's 30: a spin's looks yield the CPU, and beside a loaded
    // sanitizer run 2 ms of them made only 3 looks.
    EXPECT_EQ(calls(20000), 1) << "a wait on a listener alone spun";
    connectPairs(1);
    ASSERT_TRUE(parked(2));
    EXPECT_GT(calls(20000), 3) << "a wait with a connection did not spin";
}

// A member as the program's socket, counting how often a wait asks it for its connection.
class CountingMember : public Pollable
{
public:
    explicit CountingMember(std::shared_ptr<Socket> s) : s_(std::move(s)) {}
    int pollEvents(int events) override { return s_->pollEvents(events); }
    int prepareWait(std::vector<pollfd> *fds, int events) override
    {
        return s_->prepareWait(fds, events);
    }
    void addWaiter(int eventFd, std::vector<std::shared_ptr<Connection>> *registered) override
    {
        s_->addWaiter(eventFd, registered);
    }
    uint64_t generation(int events) override { return s_->generation(events); }
    std::shared_ptr<Connection> hintConnection() override
    {
        asks++;
        return s_->hintConnection();
    }
    std::atomic<int> asks{0};

private:
    std::shared_ptr<Socket> s_;
};

// A member whose connection the set watches already is not asked for its connection at each
// look (two locks and two reference counts for each member of each wait, a seventh of a
// same-host client's time): its look says which connection it touched. It is still woken for
// every message, in waits that sleep and in waits that look.
TEST_P(EpollReady, AWatchedMemberIsNotAskedForItsConnectionAtEachLook)
{
    connectPairs(1);
    ASSERT_EQ(set_->ctl(EPOLL_CTL_DEL, 1000, nullptr, pairs_[0].second), 0);
    auto member = std::make_shared<CountingMember>(pairs_[0].second);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = 7;
    ASSERT_EQ(set_->ctl(EPOLL_CTL_ADD, 2000, &ev, member), 0);
    epoll_event out[4];
    constexpr int kRounds = 30;
    for (int i = 0; i < kRounds; i++) {
        // Looks that find nothing, then a message that a sleeping wait (odd rounds) or a
        // looking one (even rounds) reports.
        for (int k = 0; k < 3; k++)
            ASSERT_EQ(set_->wait(out, 4, 0, nullptr, 0), 0);
        if (i % 2) {
            std::thread sender([&] {
                std::this_thread::sleep_for(std::chrono::milliseconds(2));
                sendByte(*pairs_[0].first);
            });
            ASSERT_EQ(set_->wait(out, 4, 5000, nullptr, 0), 1) << "round " << i;
            sender.join();
        } else {
            sendByte(*pairs_[0].first);
            int n = 0;
            for (int t = 0; t < 5000 && n == 0; t++) {
                n = set_->wait(out, 4, 0, nullptr, 0);
                if (n == 0)
                    std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
            ASSERT_EQ(n, 1) << "round " << i;
        }
        EXPECT_EQ(uint64_t{out[0].data.u64}, 7u); // a copy: epoll_event is packed
        char b;
        iovec v{&b, 1};
        ASSERT_EQ(pairs_[0].second->recv(&v, 1, 0), 1);
    }
    // The first look asks (nothing is watched yet); a look of the program's thread may meet
    // the set unready once. Every look asked before (68 and 149 times here).
    EXPECT_LE(member->asks.load(), 3) << "asked for its connection " << member->asks.load()
                                      << " times in " << kRounds << " rounds";
}

INSTANTIATE_TEST_SUITE_P(Modes, EpollReady, ::testing::ValuesIn(kModes),
                         [](const auto &p) { return std::string(p.param.name); });
INSTANTIATE_TEST_SUITE_P(Modes, BusyMembers, ::testing::ValuesIn(kModes),
                         [](const auto &p) { return std::string(p.param.name); });

} // namespace
} // namespace rstream
