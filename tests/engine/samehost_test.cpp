// SPDX-License-Identifier: MIT
// The same-host transport: when it is chosen, and what a hostile or vanished peer can do to it.
// (The stream semantics run in engine_test's "samehost" mode, with every other test of it.)

#include <cerrno>
#include <chrono>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <fstream>
#include <signal.h>
#include <string>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

#include "samehost_fixture.h"
#include "samehost_setup.h"
#include "sanitizers.h"

namespace rstream {
namespace {

class SameHost : public SameHostTest
{};

// Mappings of same-host regions in this process.
int regionMappings()
{
    std::ifstream maps("/proc/self/maps");
    std::string line;
    int n = 0;
    while (std::getline(maps, line))
        n += line.find("memfd:rstream-samehost") != std::string::npos;
    return n;
}

TEST_F(SameHost, ChosenWhenBothEndsAllowIt)
{
    Settings on = settings(), off = settings();
    off.sameHost = false;
    for (auto [client, server] : {std::pair{on, on}, {on, off}, {off, on}, {off, off}}) {
        auto [c, s] = EngineTest::pair(client, server); // checks sameHost() on both ends
        ASSERT_TRUE(c && s);
        ASSERT_EQ(c->send("ping", 4), 4);
        char buf[4];
        ASSERT_EQ(s->recv(buf, 4, kWaitAll, 5000), 4);
        EXPECT_EQ(std::memcmp(buf, "ping", 4), 0);
    }
}

TEST_F(SameHost, RegionIsNoFileAndGoesWithTheConnection)
{
    const int before = regionMappings();
    {
        auto [c, s] = pair();
        ASSERT_TRUE(c && s);
        // One region, mapped by each end: not a file in /dev/shm or anywhere else.
        EXPECT_EQ(regionMappings(), before + 2);
        DIR *d = opendir("/dev/shm");
        if (d) {
            while (dirent *e = readdir(d))
                EXPECT_EQ(std::string(e->d_name).find("samehost"), std::string::npos) << e->d_name;
            closedir(d);
        }
        Connection::close(std::move(c));
        Connection::close(std::move(s));
    }
    EXPECT_EQ(regionMappings(), before);
}

TEST_F(SameHost, ThirdProcessCannotReachTheRegion)
{
    if (geteuid() != 0)
        GTEST_SKIP() << "needs root to become another user";
    auto [c, s] = pair();
    ASSERT_TRUE(c && s);
    ASSERT_EQ(c->send("secret", 6), 6);
    // Another user on this machine looks for the memory through /proc: the region is no file,
    // its fd is closed once mapped, and map_files needs CAP_SYS_ADMIN over this process.
    const pid_t parent = getpid();
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0)
            _exit(2);
        const std::string dir = "/proc/" + std::to_string(parent) + "/map_files";
        DIR *d = opendir(dir.c_str());
        if (d) {
            while (dirent *e = readdir(d)) {
                if (e->d_name[0] == '.')
                    continue;
                int fd = open((dir + "/" + e->d_name).c_str(), O_RDONLY);
                if (fd >= 0)
                    _exit(3);
            }
            closedir(d);
        }
        const std::string fds = "/proc/" + std::to_string(parent) + "/fd";
        d = opendir(fds.c_str());
        if (d) {
            while (dirent *e = readdir(d)) {
                char target[256] = {};
                if (readlink((fds + "/" + e->d_name).c_str(), target, sizeof(target) - 1) > 0 &&
                    std::strstr(target, "rstream-samehost"))
                    _exit(4);
            }
            closedir(d);
        }
        _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "2: no setuid, 3: a mapping opened, 4: an fd visible";
}

// A peer writes the shared words of a direction badly: its connection is reset, the bytes
// outside the region are never touched, and other connections go on.
TEST_F(SameHost, CorruptIndicesResetOnlyThatConnection)
{
    auto [okc, oks] = pair();
    ASSERT_TRUE(okc && oks);
    struct Case
    {
        const char *what;
        void (*corrupt)(SameHostLink *reader, SameHostLink *writer);
        bool readerSide;
    };
    const Case cases[] = {
        {"tail a ring and more ahead",
         [](SameHostLink *r, SameHostLink *) {
             r->testRecvDir()->tail.v.store(4 + r->recvRing() + 1);
         },
         true},
        {"tail far past the end",
         [](SameHostLink *r, SameHostLink *) { r->testRecvDir()->tail.v.store(~0ull - 7); }, true},
        {"tail moving back",
         [](SameHostLink *r, SameHostLink *) { r->testRecvDir()->tail.v.store(2); }, true},
        {"unknown flag",
         [](SameHostLink *r, SameHostLink *) { r->testRecvDir()->flags.v.store(1u << 20); }, true},
        {"head past tail",
         [](SameHostLink *, SameHostLink *w) { w->testSendDir()->head.v.store(1ull << 40); },
         false},
    };
    for (const Case &k : cases) {
        SCOPED_TRACE(k.what);
        auto [c, s] = pairWithSixInFlight();
        ASSERT_TRUE(c && s);
        char buf[16];
        k.corrupt(c->testSameHostLink(), s->testSameHostLink());
        // The end that reads the bad word resets; the other learns it from the reset flag.
        Connection &victim = k.readerSide ? *c : *s;
        Connection &other = k.readerSide ? *s : *c;
        ssize_t r =
            k.readerSide ? victim.recv(buf, sizeof(buf), 0, 5000) : victim.send("x", 1, 0, 5000);
        EXPECT_EQ(r, -ECONNRESET);
        EXPECT_EQ(victim.recv(buf, sizeof(buf), kNonBlock), -ECONNRESET);
        EXPECT_EQ(victim.send("y", 1, kNonBlock), -ECONNRESET);
        EXPECT_EQ(other.recv(buf, sizeof(buf), 0, 5000), -ECONNRESET);
    }
    ASSERT_EQ(okc->send("still", 5), 5);
    char buf[5];
    ASSERT_EQ(oks->recv(buf, 5, kWaitAll, 5000), 5);
    EXPECT_EQ(std::memcmp(buf, "still", 5), 0);
}

// A peer killed while this end waits to write (its ring full) or only polls without blocking:
// noticed within a bounded time, and the region is unmapped with the connection.
TEST_F(SameHost, PeerKilledIsNoticedByWritersAndPollers)
{
    for (bool blockingWriter : {true, false}) {
        SCOPED_TRACE(blockingWriter ? "blocked writer" : "nonblocking poller");
        auto l = listen(settings());
        const uint16_t port = port_;
        const int before = regionMappings();
        pid_t pid = fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            Connection c(settings());
            sockaddr_in a = loopback4(port);
            if (c.connect(reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0 || !c.sameHost())
                _exit(1);
            c.send("r", 1);
            pause(); // reads nothing
            _exit(0);
        }
        std::unique_ptr<Connection> s;
        ASSERT_EQ(l->accept(&s, false, 10000), 0);
        char b;
        ASSERT_EQ(s->recv(&b, 1, 0, 10000), 1);
        ASSERT_TRUE(s->sameHost());
        std::thread killer([pid] {
            usleep(200000);
            kill(pid, SIGKILL);
        });
        const auto t0 = std::chrono::steady_clock::now();
        ssize_t r = 0;
        if (blockingWriter) {
            std::vector<uint8_t> big(8 << 20, 1);
            size_t sent = 0;
            while (sent < big.size() &&
                   (r = s->send(big.data() + sent, big.size() - sent, 0, 10000)) > 0)
                sent += size_t(r);
            EXPECT_LT(sent, big.size());
            EXPECT_TRUE(r == -EPIPE || r == -ECONNRESET) << r;
        } else {
            while ((r = s->recv(&b, 1, kNonBlock)) == -EAGAIN)
                usleep(100);
            // It read nothing of ours: its end closed, as the kernel closes a dead process's.
            EXPECT_EQ(r, 0);
        }
        EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
        killer.join();
        waitpid(pid, nullptr, 0);
        s.reset();
        EXPECT_EQ(regionMappings(), before);
    }
}

TEST_F(SameHost, ClosedPeerGivesEpipeAndHalfCloseKeepsWriting)
{
    auto [c, s] = pair();
    ASSERT_TRUE(c && s);
    // Half close: the peer still reads.
    ASSERT_EQ(c->shutdown(SHUT_WR), 0);
    char b;
    EXPECT_EQ(s->recv(&b, 1, 0, 5000), 0);
    EXPECT_EQ(s->send("z", 1), 1);
    EXPECT_EQ(c->recv(&b, 1, 0, 5000), 1);
    EXPECT_EQ(c->send("q", 1), -EPIPE);
    // Closed: writes fail.
    Connection::close(std::move(c));
    EXPECT_EQ(s->send("w", 1), -EPIPE);
    // Unread bytes at close reset the peer, as the kernel's RST.
    auto [c2, s2] = pair();
    ASSERT_EQ(s2->send("unread", 6), 6);
    ASSERT_EQ(c2->peekRecv(), 6);
    Connection::close(std::move(c2));
    EXPECT_EQ(s2->recv(&b, 1, 0, 5000), -ECONNRESET);
}

TEST_F(SameHost, SleepersWakeAndIdleCostsNoCpu)
{
    auto [c, s] = pair();
    ASSERT_TRUE(c && s);
    // A blocking reader sleeps in the kernel (no spinning past the cap) and wakes for data.
    // Bindings named in the capture: clang 14 cannot capture a structured binding implicitly.
    std::thread reader([&, &s = s] {
        char buf[8];
        EXPECT_EQ(s->recv(buf, 8, kWaitAll, 5000), 8);
    });
    usleep(300000);
    timespec t0, t1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    usleep(300000);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
    const double cpuMs = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    EXPECT_LT(cpuMs, 30.0) << "a sleeping reader used CPU";
    ASSERT_EQ(c->send("wake up!", 8), 8);
    reader.join();
}

} // namespace
} // namespace rstream

namespace rstream {
namespace {

long rssKib()
{
    std::ifstream st("/proc/self/status");
    std::string line;
    while (std::getline(st, line))
        if (line.rfind("VmRSS:", 0) == 0)
            return std::stol(line.substr(6));
    return -1;
}

int openFds()
{
    int n = 0;
    if (DIR *d = opendir("/proc/self/fd")) {
        while (dirent *e = readdir(d))
            n += e->d_name[0] != '.';
        closedir(d);
    }
    return n;
}

// Once a same-host link is up, the fabric endpoint of the setup is closed and its rings freed:
// an idle connection holds its link's two pipe fds and the pages its rings touched.
TEST_F(SameHost, IdleConnectionsHoldTwoDescriptorsAndLittleMemory)
{
    constexpr int kPairs = 100;
    std::vector<std::pair<std::unique_ptr<Connection>, std::unique_ptr<Connection>>> pairs;
    auto warm = pair(); // the domain, the progress thread, the inbox: once per process
    ASSERT_TRUE(warm.first && warm.second);
    ASSERT_EQ(warm.first->send("w", 1), 1);
    char b;
    ASSERT_EQ(warm.second->recv(&b, 1, 0, 5000), 1);
    const int fds0 = openFds();
    const long rss0 = rssKib();
    for (int i = 0; i < kPairs; i++) {
        auto p = pair();
        ASSERT_TRUE(p.first && p.second);
        ASSERT_EQ(p.first->send("x", 1), 1);
        ASSERT_EQ(p.second->recv(&b, 1, 0, 5000), 1);
        ASSERT_EQ(p.second->send("y", 1), 1);
        ASSERT_EQ(p.first->recv(&b, 1, 0, 5000), 1);
        pairs.push_back(std::move(p));
    }
    const double fdsPerEnd = double(openFds() - fds0) / (2 * kPairs);
    const double kibPerEnd = double(rssKib() - rss0) / (2 * kPairs);
    RecordProperty("fds_per_end", std::to_string(fdsPerEnd));
    RecordProperty("rss_kib_per_end", std::to_string(kibPerEnd));
    std::printf("idle same-host connection end: %.2f fds, %.1f KiB resident\n", fdsPerEnd,
                kibPerEnd);
    EXPECT_LE(fdsPerEnd, 2.01) << "the setup's endpoint or socket was not closed";
    // Each end maps the region (its touched pages count in each mapping): the header and a page
    // of each ring, 12 KiB, plus the connection's own structures. (Sanitizers' shadow memory
    // and quarantine make RSS meaningless there.)
#if !defined(RSTREAM_TEST_ASAN) && !defined(RSTREAM_TEST_TSAN)
    EXPECT_LT(kibPerEnd, 64.0);
#endif
}

} // namespace
} // namespace rstream

namespace rstream {
namespace {

// After a transfer, a same-host connection quiet for ringIdleMs gives its rings' pages back
// (each end its send ring, once the peer has read it all), and the stream goes on intact.
TEST_F(SameHost, IdleRingsGiveTheirPagesBack)
{
    Settings st = settings();
    st.ringIdleMs = 200;
    auto [c, s] = EngineTest::pair(st, st);
    ASSERT_TRUE(c && s);
    std::mt19937 rng(11);
    for (int round = 0; round < 2; round++) {
        SCOPED_TRACE(round);
        std::vector<uint8_t> a(4 << 20), r(a.size());
        for (auto &x : a)
            x = static_cast<uint8_t>(rng());
        std::thread writer([&, &c = c] {
            std::mt19937 g(round);
            sendAll(*c, a.data(), a.size(), g, 300000);
        });
        std::mt19937 g(round + 100);
        recvAll(*s, r.data(), r.size(), g, 65536);
        writer.join();
        ASSERT_EQ(checksum(a.data(), a.size()), checksum(r.data(), r.size()));
        const size_t busy = c->ringResidentBytes();
        EXPECT_GT(busy, size_t(128 << 10)) << "the ring was not in use";
        const uint64_t before = c->ringReleases();
        size_t idle = busy;
        for (int i = 0; i < 300 && (idle = c->ringResidentBytes()) > 8192; i++)
            usleep(10000);
        EXPECT_LE(idle, 8192u) << "still resident after 3 s idle: " << idle;
        EXPECT_GT(c->ringReleases(), before);
    }
}

} // namespace
} // namespace rstream

namespace rstream {
namespace {

// Readiness looks from other threads race the sender and the receiver for the words they check
// (what was seen of the peer's head and tail): progress must never look like a step back.
TEST_F(SameHost, ConcurrentLooksNeverMistakeProgressForCorruption)
{
    auto [c, s] = pair();
    ASSERT_TRUE(c && s);
    constexpr size_t kTotal = 16 << 20;
    std::atomic<bool> done{false};
    std::vector<std::thread> lookers;
    for (Connection *x : {c.get(), s.get(), c.get(), s.get()})
        lookers.emplace_back([&, x] {
            ssize_t r, w;
            while (!done.load(std::memory_order_relaxed))
                x->peek(&r, &w);
        });
    std::thread writer([&, &c = c] {
        std::vector<uint8_t> buf(1500);
        size_t sent = 0;
        uint8_t v = 0;
        while (sent < kTotal) {
            for (auto &b : buf)
                b = v++;
            const size_t n = std::min(buf.size(), kTotal - sent);
            const ssize_t r = c->send(buf.data(), n, 0, 20000);
            ASSERT_GT(r, 0) << strerror(int(-r));
            v = static_cast<uint8_t>(v - (n - size_t(r)));
            sent += size_t(r);
        }
    });
    std::vector<uint8_t> buf(1000);
    size_t got = 0;
    uint8_t expect = 0;
    bool intact = true;
    while (got < kTotal) {
        const ssize_t r = s->recv(buf.data(), buf.size(), 0, 20000);
        ASSERT_GT(r, 0) << "at " << got << ": " << strerror(int(-r));
        for (ssize_t i = 0; i < r; i++)
            intact &= buf[i] == expect++;
        got += size_t(r);
    }
    writer.join();
    done = true;
    for (auto &t : lookers)
        t.join();
    EXPECT_TRUE(intact);
}

// A writer that filled the ring sleeps until a third of it is free, as the kernel wakes a
// writer: a reader taking small pieces does not wake it for each (a system call on the reader's
// side, a wake-up on the writer's). A peer's absurd request only delays its own wake-up until
// the ring is empty.
TEST_F(SameHost, BlockedWriterWakesForAThirdOfTheRing)
{
    for (const uint64_t asked : {uint64_t(0), ~uint64_t(0)}) {
        SCOPED_TRACE(asked ? "the peer asks for more than the ring" : "an honest peer");
        auto [c, s] = pair();
        ASSERT_TRUE(c && s);
        SameHostLink *reader = s->testSameHostLink();
        // The ring grows once the writer fills it: what it waits in is the grown ring.
        const uint64_t ring = c->testSameHostLink()->sendRingMax();
        ASSERT_GT(ring, reader->recvRing());
        std::vector<uint8_t> out(ring + 4096), in(out.size());
        for (size_t i = 0; i < out.size(); i++)
            out[i] = uint8_t(i * 7 + 1);
        std::atomic<ssize_t> sent{0};
        std::thread writer([&, &c = c] { sent = c->send(out.data(), out.size(), 0, 20000); });
        // The writer fills the ring and goes to sleep, asking for a third of it.
        std::atomic<uint64_t> &waiting = reader->testRecvDir()->writerWaiting.v;
        for (int i = 0; i < 5000 && !waiting.load(); i++)
            usleep(1000);
        ASSERT_EQ(waiting.load(), (ring + 2) / 3);
        if (asked)
            waiting.store(asked);
        size_t got = 0;
        auto take = [&, &s = s](size_t n) {
            const ssize_t r = s->recv(in.data() + got, n, kWaitAll, 5000);
            ASSERT_EQ(r, ssize_t(n));
            got += n;
        };
        // 64 B at a time up to just short of a third: the writer is not woken, and what was
        // read is not written again yet.
        while (got + 64 < (ring + 2) / 3)
            take(64);
        usleep(20000);
        EXPECT_EQ(reader->readable(), ring - got);
        EXPECT_EQ(waiting.load(), asked ? asked : (ring + 2) / 3);
        EXPECT_EQ(sent.load(), 0);
        if (!asked) {
            take(64); // a third free: woken now, and it writes into it
            for (int i = 0; i < 5000 && reader->readable() <= ring - got; i++)
                usleep(1000);
            EXPECT_GT(reader->readable(), ring - got);
        }
        while (got < in.size())
            take(std::min<size_t>(4096, in.size() - got));
        writer.join();
        EXPECT_EQ(sent.load(), ssize_t(out.size()));
        EXPECT_EQ(in, out);
    }
}

} // namespace
} // namespace rstream
