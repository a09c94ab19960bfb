// SPDX-License-Identifier: MIT
// Many connections in one process: file descriptors and memory per connection, the time to
// open, use and close them, and that idle connections cost the progress thread nothing.
//
// ManyConnectionsInOneProcess keeps both ends in this process, so every connection counts twice
// (a client and a server endpoint). ServerEndpointsInOneProcess keeps the server ends only, the
// clients being in a child process, so that one process holds as many connections as its
// descriptor limit allows. RSTREAM_SCALE_CONNECTIONS (default 2000),
// RSTREAM_SCALE_SERVER_CONNECTIONS (default 1000), RSTREAM_SCALE_BUF (ring bytes per direction,
// default 4k) and RSTREAM_SCALE_QUEUE (queue entries, default 384) size the runs;
// scripts/scale-test runs them with the default rings.

#include <algorithm>
#include <arpa/inet.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <malloc.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

#include "connection.h"
#include "listener.h"
#include "net.h"
#include "proc.h"

using namespace rstream;
using rstest::countFds;
using rstest::cpuSeconds;
using rstest::rssKiB;

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t0)
{
    return std::chrono::duration<double>(Clock::now() - t0).count();
}




long envLong(const char *name, long dflt)
{
    const char *v = getenv(name);
    return v && *v ? strtol(v, nullptr, 0) : dflt;
}

using rstest::loopback4;

// Raises the hard fd limit to at least want where this process may (CAP_SYS_RESOURCE), and the
// soft limit with it; a limit that stays too low makes the caller skip.
void raiseHardLimit(long want, rlimit *rl)
{
    if (rl->rlim_max != RLIM_INFINITY && long(rl->rlim_max) < want) {
        rlimit more{rlim_t(want), rlim_t(want)};
        if (setrlimit(RLIMIT_NOFILE, &more) == 0)
            *rl = more;
    }
}

// Sized by the environment (see above): the fd soft limit raised to the hard one, since every
// endpoint holds a few, and a loopback listener at a_.
class Scale : public ::testing::Test
{
protected:
    void SetUp() override
    {
        getrlimit(RLIMIT_NOFILE, &rl_);
        rl_.rlim_cur = rl_.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl_);
        buf_ = static_cast<size_t>(envLong("RSTREAM_SCALE_BUF", 4096));
        s_.provider = "tcp";
        ASSERT_EQ(s_.setSendBuf(buf_), 0);
        ASSERT_EQ(s_.setRecvBuf(buf_), 0);
        if (long q = envLong("RSTREAM_SCALE_QUEUE", 0)) {
            ASSERT_EQ(s_.setTxSize(q), 0);
            ASSERT_EQ(s_.setRxSize(q), 0);
        }
        l_ = std::make_unique<Listener>(s_);
        sockaddr_in any = loopback4(0);
        ASSERT_EQ(l_->bind(reinterpret_cast<sockaddr *>(&any), sizeof(any)), 0);
        ASSERT_EQ(l_->listen(4096), 0);
        sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        ASSERT_EQ(l_->localAddress(&ss, &len), 0);
        a_ = loopback4(ntohs(reinterpret_cast<sockaddr_in *>(&ss)->sin_port));
    }

    rlimit rl_{};
    size_t buf_ = 0;
    Settings s_;
    std::unique_ptr<Listener> l_;
    sockaddr_in a_{};
};

} // namespace

TEST_F(Scale, ManyConnectionsInOneProcess)
{
    const int n = static_cast<int>(envLong("RSTREAM_SCALE_CONNECTIONS", 2000));
    const size_t buf = buf_;
    const rlimit rl = rl_;
    const Settings &s = s_;
    Listener &l = *l_;
    sockaddr_in a = a_;

    std::vector<std::unique_ptr<Connection>> servers(n), clients(n);
    std::atomic<int> accepted{0};
    std::atomic<bool> acceptFailed{false};
    auto acceptAll = [&](int from, int to) {
        for (int i = from; i < to; i++) {
            int r = l.accept(&servers[i], false, 30000);
            if (r < 0) {
                ADD_FAILURE() << "accept " << i << ": " << strerror(-r);
                acceptFailed = true;
                return;
            }
            accepted++;
        }
    };
    // One pair first: the domain and the progress thread are shared and not counted.
    {
        std::thread t([&] { acceptAll(0, 1); });
        clients[0] = std::make_unique<Connection>(s);
        ASSERT_EQ(clients[0]->connect(reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0);
        t.join();
    }
    const int fds0 = countFds();
    const long rss0 = rssKiB();
    if (long(rl.rlim_cur) < fds0 + 8L * n)
        GTEST_SKIP() << "RLIMIT_NOFILE " << rl.rlim_cur << " is too low for " << n
                     << " connections (raise the hard limit)";

    // Connect nonblocking, a window at a time, as a server under load would be connected to.
    auto t0 = Clock::now();
    std::thread acceptor([&] { acceptAll(1, n); });
    const int window = 256;
    int started = 1, done = 1;
    std::vector<int> pending;
    while (done < n && !acceptFailed) {
        while (started < n && int(pending.size()) < window) {
            clients[started] = std::make_unique<Connection>(s);
            int r = clients[started]->connect(reinterpret_cast<sockaddr *>(&a), sizeof(a), true);
            ASSERT_EQ(r, -EINPROGRESS) << "connection " << started << ": " << strerror(-r);
            pending.push_back(started++);
        }
        for (size_t k = 0; k < pending.size();) {
            int r = clients[pending[k]]->connectResult();
            if (r == -EINPROGRESS) {
                k++;
                continue;
            }
            ASSERT_EQ(r, 0) << "connection " << pending[k] << ": " << strerror(-r);
            pending[k] = pending.back();
            pending.pop_back();
            done++;
        }
        if (!pending.empty())
            usleep(200);
    }
    acceptor.join();
    ASSERT_FALSE(acceptFailed);
    const double connectSec = secondsSince(t0);
    const int fds1 = countFds();
    const long rss1 = rssKiB();
    const double fdsPerEndpoint = double(fds1 - fds0) / (2.0 * (n - 1));
    const double kibPerConnection = double(rss1 - rss0) / double(n - 1);

    // Every connection carries a message each way (accepts come in any order: servers echo).
    t0 = Clock::now();
    for (int i = 0; i < n; i++) {
        uint32_t v = i;
        ASSERT_EQ(clients[i]->send(&v, 4), 4) << i;
    }
    for (int i = 0; i < n; i++) {
        uint32_t v = 0;
        ASSERT_EQ(servers[i]->recv(&v, 4, kWaitAll, 10000), 4) << i;
        ASSERT_EQ(servers[i]->send(&v, 4), 4) << i;
    }
    for (int i = 0; i < n; i++) {
        uint32_t v = 0;
        ASSERT_EQ(clients[i]->recv(&v, 4, kWaitAll, 10000), 4) << i;
        ASSERT_EQ(v, uint32_t(i));
    }
    const double exchangeSec = secondsSince(t0);

    // Idle: the progress thread must sleep, not poll thousands of connections.
    usleep(300 * 1000); // background credit returns settle
    const double cpu0 = cpuSeconds();
    usleep(1000 * 1000);
    const double idleCpuMs = (cpuSeconds() - cpu0) * 1000;

    t0 = Clock::now();
    clients.clear();
    servers.clear();
    const double closeSec = secondsSince(t0);

    printf("scale: %d connections (%d endpoints), rings %zu B each way\n", n, 2 * n, buf);
    printf("scale: connect %.2f s (%.0f/s), exchange %.2f s, close %.2f s\n", connectSec,
           (n - 1) / connectSec, exchangeSec, closeSec);
    printf("scale: %.2f fds per endpoint, %.1f KiB RSS per connection (both ends), %ld MiB "
           "total; idle CPU %.1f ms/s\n",
           fdsPerEndpoint, kibPerConnection, rss1 / 1024, idleCpuMs);
    RecordProperty("connections", n);
    RecordProperty("fds_per_endpoint_x100", static_cast<int>(fdsPerEndpoint * 100));
    RecordProperty("kib_per_connection", static_cast<int>(kibPerConnection));
    RecordProperty("connect_ms", static_cast<int>(connectSec * 1000));
    RecordProperty("idle_cpu_ms_per_s", static_cast<int>(idleCpuMs));
    // Measured on tcp: 4 fds per endpoint (socket, wait set epoll fd and its signal pair).
    EXPECT_LE(fdsPerEndpoint, 4.05);
    EXPECT_LT(idleCpuMs, 50.0);
}

// The server ends of n connections in this process, their clients in a child: what one process
// holds when its peers are elsewhere, as a server's are.
TEST_F(Scale, ServerEndpointsInOneProcess)
{
    const int n = static_cast<int>(envLong("RSTREAM_SCALE_SERVER_CONNECTIONS", 1000));
    // A pair first, as above: the domain, the progress thread and their allocations stay, and
    // what is left after the close is compared with what there was after it.
    {
        std::unique_ptr<Connection> server;
        std::thread t([&] { EXPECT_EQ(l_->accept(&server, false, 30000), 0); });
        Connection client(s_);
        EXPECT_EQ(client.connect(reinterpret_cast<sockaddr *>(&a_), sizeof(a_)), 0);
        t.join();
        ASSERT_TRUE(server);
    }
    malloc_trim(0); // what an earlier test freed is not this one's (see below)
    const int fds0 = countFds();
    const long rss0 = rssKiB();
    const long live0 = Connection::liveCount();
    if (long(rl_.rlim_cur) < fds0 + 4L * n + 64)
        raiseHardLimit(fds0 + 4L * n + 64, &rl_);
    if (long(rl_.rlim_cur) < fds0 + 4L * n + 64)
        GTEST_SKIP() << "RLIMIT_NOFILE " << rl_.rlim_cur << " is too low for " << n
                     << " connections, and the hard limit cannot be raised";

    // The child connects them all, sends a word on each and reads its echo, says so, and
    // waits to be told to go.
    int toParent[2], toChild[2];
    ASSERT_EQ(pipe(toParent), 0);
    ASSERT_EQ(pipe(toChild), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        close(toParent[0]);
        close(toChild[1]);
        int rc = 0;
        {
            std::vector<std::unique_ptr<Connection>> clients(n);
            for (int i = 0; i < n && !rc; i++) {
                clients[i] = std::make_unique<Connection>(s_);
                if (clients[i]->connect(reinterpret_cast<sockaddr *>(&a_), sizeof(a_)) != 0)
                    rc = 2;
            }
            for (int i = 0; i < n && !rc; i++) {
                uint32_t v = i;
                if (clients[i]->send(&v, 4) != 4)
                    rc = 3;
            }
            for (int i = 0; i < n && !rc; i++) {
                uint32_t v = ~0u;
                if (clients[i]->recv(&v, 4, kWaitAll, 30000) != 4 || v != uint32_t(i))
                    rc = 4;
            }
            char c = rc ? 'f' : 'd';
            if (write(toParent[1], &c, 1) != 1 || read(toChild[0], &c, 1) != 1)
                rc = rc ? rc : 5;
        }
        _exit(rc);
    }
    close(toParent[1]);
    close(toChild[0]);

    auto t0 = Clock::now();
    std::vector<std::unique_ptr<Connection>> servers(n);
    for (int i = 0; i < n; i++) {
        int r = l_->accept(&servers[i], false, 30000);
        ASSERT_EQ(r, 0) << "accept " << i << ": " << strerror(-r);
    }
    const double acceptSec = secondsSince(t0);
    const int fds1 = countFds();
    const long rss1 = rssKiB();
    // Echo each word: the child checks that every connection got its own back.
    for (int i = 0; i < n; i++) {
        uint32_t v = 0;
        ASSERT_EQ(servers[i]->recv(&v, 4, kWaitAll, 30000), 4) << i;
        ASSERT_EQ(servers[i]->send(&v, 4), 4) << i;
    }
    char c = 0;
    ASSERT_EQ(read(toParent[0], &c, 1), 1);
    EXPECT_EQ(c, 'd') << "the child's connections failed";
    usleep(300 * 1000);
    const double cpu0 = cpuSeconds();
    usleep(1000 * 1000);
    const double idleCpuMs = (cpuSeconds() - cpu0) * 1000;
    c = 'x';
    EXPECT_EQ(write(toChild[1], &c, 1), 1);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
    t0 = Clock::now();
    servers.clear();
    close(toParent[0]);
    close(toChild[1]);
    // Closed, every connection gives back its descriptors at once and its memory (the rings
    // and endpoint are unmapped; libfabric's and malloc's free lists may keep a little).
    int fds2 = countFds();
    for (int i = 0; i < 100 && fds2 > fds0; i++) {
        usleep(20 * 1000);
        fds2 = countFds();
    }
    const double closeSec = secondsSince(t0);
    // Most of an idle endpoint's RSS (450 of 540 KiB on tcp) is the 459,200-byte pool libfabric
    // mallocs at its first fi_recv. glibc keeps those blocks once freed (its mmap threshold
    // rises past their size after the first is unmapped, so the rest come from the heap), so
    // RSS stays at its peak until malloc_trim: that measures whether the memory went back to
    // malloc, i.e. that nothing leaked. ASan's allocator keeps freed memory in quarantine.
    const long rssKept = rssKiB();
    malloc_trim(0);
    const long rss2 = rssKiB();
    const long live2 = Connection::liveCount();
    printf("scale: closed in %.2f s: %d fds (%d before, %d held); RSS %ld KiB (%ld before, %ld "
           "held, %ld after the close until malloc_trim); %ld connections alive (%ld before)\n",
           closeSec, fds2, fds0, fds1, rss2, rss0, rss1, rssKept, live2, live0);
    EXPECT_EQ(fds2, fds0) << "descriptors left after closing every connection";
    EXPECT_EQ(live2, live0) << "connections left alive after closing every one";
#ifndef __SANITIZE_ADDRESS__
    // At most a tenth of what the connections held (or 8 MiB) may stay.
    EXPECT_LE(rss2 - rss0, std::max(8192L, (rss1 - rss0) / 10))
        << "RSS " << rss0 << " KiB before, " << rss1 << " held, " << rss2 << " after closing";
#endif

    const double fdsPerConnection = double(fds1 - fds0) / n;
    printf("scale: %d server endpoints in one process (clients in another), rings %zu B\n", n,
           buf_);
    printf("scale: accepted in %.2f s (%.0f/s); %.2f fds per connection, %d fds in all (limit "
           "%ld); %.1f KiB RSS per connection; idle CPU %.1f ms/s\n",
           acceptSec, n / acceptSec, fdsPerConnection, fds1, long(rl_.rlim_cur),
           double(rss1 - rss0) / n, idleCpuMs);
    RecordProperty("server_connections", n);
    EXPECT_LE(fdsPerConnection, 4.05);
    EXPECT_LT(idleCpuMs, 50.0);
}
