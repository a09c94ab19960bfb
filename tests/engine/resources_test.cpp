// SPDX-License-Identifier: MIT
// Resources under faults and churn: a failed memory registration fails that connection only
// (with an errno, never a hang), and a soak of several processes connecting, transferring
// checked data and closing leaves the process's fds, RSS and live connections where they were.
//
// RSTREAM_SOAK_SECONDS (default 6) and RSTREAM_SOAK_PROCESSES (default 3) size the soak; its
// clients are this binary run again (SoakClient.DISABLED_Run, RSTREAM_SOAK_CLIENT).

#include <arpa/inet.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <malloc.h>
#include <memory>
#include <netinet/in.h>
#include <poll.h>
#include <random>
#include <signal.h>
#include <string>
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
#include "respawn.h"
#include "sanitizers.h"

using namespace rstream;
using rstest::countFds;
using rstest::describeFds;
using rstest::trimmedRssKiB;

namespace {

using Clock = std::chrono::steady_clock;

long envLong(const char *name, long dflt)
{
    const char *v = getenv(name);
    return v && *v ? strtol(v, nullptr, 0) : dflt;
}

// Descriptors and live connections once the closes have run: a graceful close delivers in
// the background, and the progress thread lets an endpoint go just after its owner did. Waits up
// to 5 s for them to come down to want (any count when want < 0) and live connections to
// wantLive (any when < 0); returns the fds.
int fdsSettled(int want, long wantLive = -1)
{
    int n = countFds();
    for (int i = 0; i < 250 && ((want >= 0 && n > want) ||
                                (wantLive >= 0 && Connection::liveCount() > wantLive));
         i++) {
        usleep(20 * 1000);
        n = countFds();
    }
    return n;
}

// The fd count once it has not moved for 100 ms (at most 5 s).
int fdsStable()
{
    int n = countFds();
    for (int i = 0, same = 0; i < 250 && same < 5; i++) {
        usleep(20 * 1000);
        const int m = countFds();
        same = m == n ? same + 1 : 0;
        n = m;
    }
    return n;
}

// The registration fault: fails the next `failures` registrations with -ENOMEM.
std::atomic<int> failures{0};
std::atomic<int> failed{0};
int failRegistration(size_t, uint64_t)
{
    if (failures.fetch_sub(1) > 0) {
        failed++;
        return -ENOMEM;
    }
    return 0;
}

struct FaultGuard
{
    explicit FaultGuard(int n)
    {
        failures = n;
        failed = 0;
        Connection::testRegisterFault = failRegistration;
    }
    ~FaultGuard() { Connection::testRegisterFault = nullptr; }
};

// The pattern of a transfer: a byte stream from a seed, so either end can check it.
void fillPattern(uint8_t *p, size_t n, uint32_t seed)
{
    std::minstd_rand g(seed | 1);
    for (size_t i = 0; i < n; i++)
        p[i] = static_cast<uint8_t>(g() >> 7);
}

class Resources : public ::testing::Test
{
protected:
    void SetUp() override
    {
        s_.provider = "tcp";
        l_ = std::make_unique<Listener>(s_);
        sockaddr_in any = rstest::loopback4(0);
        ASSERT_EQ(l_->bind(reinterpret_cast<sockaddr *>(&any), sizeof(any)), 0);
        ASSERT_EQ(l_->listen(512), 0);
        sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        ASSERT_EQ(l_->localAddress(&ss, &len), 0);
        a_ = rstest::loopback4(ntohs(reinterpret_cast<sockaddr_in *>(&ss)->sin_port));
    }

    // A connected pair through this process's listener, carrying a word each way.
    void expectPairWorks()
    {
        std::unique_ptr<Connection> server;
        std::thread t([&] { EXPECT_EQ(l_->accept(&server, false, 10000), 0); });
        Connection client(s_);
        int r = client.connect(addr(), sizeof(a_));
        t.join();
        ASSERT_EQ(r, 0) << strerror(-r);
        ASSERT_TRUE(server);
        uint32_t v = 0x5eed;
        ASSERT_EQ(client.send(&v, 4), 4);
        uint32_t got = 0;
        ASSERT_EQ(server->recv(&got, 4, kWaitAll, 5000), 4);
        EXPECT_EQ(got, v);
        ASSERT_EQ(server->send(&got, 4), 4);
        got = 0;
        ASSERT_EQ(client.recv(&got, 4, kWaitAll, 5000), 4);
        EXPECT_EQ(got, v);
    }

    sockaddr *addr() { return reinterpret_cast<sockaddr *>(&a_); }

    Settings s_;
    std::unique_ptr<Listener> l_;
    sockaddr_in a_{};
};

} // namespace

// The connecting side's registration fails: connect fails at once with ENOMEM, nothing stays
// behind, and the next connect works.
TEST_F(Resources, RegistrationFailureFailsTheConnect)
{
    expectPairWorks(); // the domain and the progress thread exist before the baseline
    const int fds0 = countFds();
    const long live0 = Connection::liveCount();
    for (bool nonblock : {false, true}) {
        FaultGuard fault(1);
        auto t0 = Clock::now();
        int r;
        {
            Connection c(s_);
            r = c.connect(addr(), sizeof(a_), nonblock);
            if (r == -EINPROGRESS) {
                while ((r = c.connectResult()) == -EINPROGRESS &&
                       Clock::now() - t0 < std::chrono::seconds(10))
                    usleep(1000);
            }
        }
        EXPECT_EQ(failed.load(), 1) << "the fault was not reached";
        EXPECT_EQ(r, -ENOMEM) << (nonblock ? "nonblocking: " : "blocking: ") << strerror(-r);
        EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
    }
    // The listener never heard of those connections: it has nothing to accept.
    std::unique_ptr<Connection> none;
    EXPECT_EQ(l_->accept(&none, true, 0), -EAGAIN);
    EXPECT_EQ(fdsSettled(fds0, live0), fds0);
    EXPECT_EQ(Connection::liveCount(), live0);
    expectPairWorks();
}

// The accepting side's registration fails: the listener's accept gives no connection for it,
// the peer's connect ends (an error within its connect timeout, not a hang), the listener
// goes on accepting, and a connection made before it is untouched. The peer is a child process,
// so that only the accepting side fails.
TEST_F(Resources, RegistrationFailureFailsTheAccept)
{
#ifdef RSTREAM_TEST_ASAN
    // libfabric 1.20's tcp provider leaks 40 bytes (calloc'd in libfabric, presumably the
    // connection request's handle) when an endpoint made from a request closes before
    // fi_accept, and LeakSanitizer fails the run for it; the build without ASan runs this.
    GTEST_SKIP() << "libfabric leaks the request of an endpoint closed before fi_accept";
#endif
    expectPairWorks();
    // A connection made before the fault, kept open across it.
    std::unique_ptr<Connection> keptServer;
    Connection keptClient(s_);
    {
        std::thread t([&] { EXPECT_EQ(l_->accept(&keptServer, false, 10000), 0); });
        ASSERT_EQ(keptClient.connect(addr(), sizeof(a_)), 0);
        t.join();
        ASSERT_TRUE(keptServer);
    }
    // This thread's engine wake fd (made at its first sleep, kept for the thread's life) exists
    // before the baseline: under load the waits above may all have ended in their spin, and a
    // first sleep below would then count it as a descriptor left behind.
    uint32_t none = 0;
    EXPECT_LT(keptServer->recv(&none, sizeof(none), 0, 30), 0); // nothing comes: it sleeps
    const int fds0 = countFds();
    const long live0 = Connection::liveCount();

    int toParent[2];
    ASSERT_EQ(pipe(toParent), 0);
    Settings cs = s_;
    cs.connectTimeoutMs = 1500;
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        // The connect that meets the fault, then one that must work: errno of each, or 0.
        close(toParent[0]);
        int rcs[2] = {0, 0};
        for (int &rc : rcs) {
            Connection c(cs);
            rc = c.connect(addr(), sizeof(a_));
            if (rc == 0) {
                uint32_t v = 7;
                if (c.send(&v, 4) != 4 || c.recv(&v, 4, kWaitAll, 5000) != 4 || v != 7)
                    rc = -EIO;
            }
        }
        _exit(write(toParent[1], rcs, sizeof(rcs)) == sizeof(rcs) ? 0 : 1);
    }
    close(toParent[1]);
    {
        FaultGuard fault(1);
        // The failed request is answered inside accept(), which goes on waiting; the child's
        // second connect is the one it returns.
        std::unique_ptr<Connection> server;
        int r = l_->accept(&server, false, 15000);
        ASSERT_EQ(r, 0) << strerror(-r);
        EXPECT_EQ(failed.load(), 1) << "the fault was not reached";
        uint32_t v = 0;
        ASSERT_EQ(server->recv(&v, 4, kWaitAll, 5000), 4);
        ASSERT_EQ(server->send(&v, 4), 4);
        int rcs[2] = {1, 1};
        ASSERT_EQ(read(toParent[0], rcs, sizeof(rcs)), ssize_t(sizeof(rcs)));
        EXPECT_LT(rcs[0], 0) << "the connect whose accept failed succeeded";
        EXPECT_TRUE(rcs[0] == -ECONNREFUSED || rcs[0] == -ECONNRESET || rcs[0] == -ETIMEDOUT)
            << "the connect whose accept failed: " << strerror(-rcs[0]);
        EXPECT_EQ(rcs[1], 0) << "the next connect: " << strerror(-rcs[1]);
    }
    close(toParent[0]);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;

    // The connection made before still carries data.
    uint32_t v = 42;
    ASSERT_EQ(keptClient.send(&v, 4), 4);
    v = 0;
    ASSERT_EQ(keptServer->recv(&v, 4, kWaitAll, 5000), 4);
    EXPECT_EQ(v, 42u);
    EXPECT_EQ(fdsSettled(fds0, live0), fds0);
    EXPECT_EQ(Connection::liveCount(), live0);
}

namespace {

// One client process of the soak: until the deadline, connections that each send a checked
// message of a random size (a length and seed header, then the pattern), read the echo back
// and check it, and close; one in eight closes without reading the echo. Its own fds and live
// connections must come back to what they were after its first connection (none live: the
// process is a fresh one, see SoakClient below). Returns 0 or the step that failed, with the
// errno on stderr.
int soakClient(const Settings &s, const sockaddr_in &a, double seconds, unsigned seed, int *count)
{
    std::minstd_rand g(seed);
    std::vector<uint8_t> out(64 * 1024), in(64 * 1024);
    int fds0 = -1;
    long live0 = -1;
    std::string fdsBefore;
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    for (int i = 0; Clock::now() < end || i == 0; i++) {
        const uint32_t hdr[2] = {static_cast<uint32_t>(g() % out.size() + 1),
                                 static_cast<uint32_t>(g())};
        const size_t n = hdr[0];
        fillPattern(out.data(), n, hdr[1]);
        {
            // The first connection never spins, and waits where nothing can come (the server
            // answers only after the header): it sleeps, and this thread makes its wake-up
            // eventfd (wait.cpp, one per thread, kept) before the baseline. Its echo alone did
            // not always: one that had arrived before the recv needed no sleep, and the
            // eventfd made later read as a leak (seen once in a clean-clone run).
            Settings first = s;
            first.pollUs = 0;
            auto c = std::make_unique<Connection>(i == 0 ? first : s);
            int r = c->connect(reinterpret_cast<const sockaddr *>(&a), sizeof(a));
            if (r < 0) {
                fprintf(stderr, "soak client: connect %d: %s\n", i, strerror(-r));
                return 10;
            }
            if (i == 0) {
                uint8_t b;
                const ssize_t w = c->recv(&b, 1, 0, 20);
                if (w != -EAGAIN && w != -ETIMEDOUT) {
                    fprintf(stderr, "soak client: a wait before the header: %zd\n", w);
                    return 16;
                }
            }
            if (c->send(hdr, sizeof(hdr)) != ssize_t(sizeof(hdr))) {
                fprintf(stderr, "soak client: send header %d\n", i);
                return 11;
            }
            for (size_t off = 0; off < n;) {
                ssize_t w = c->send(out.data() + off, n - off);
                if (w <= 0) {
                    fprintf(stderr, "soak client: send %d: %s\n", i, strerror(int(-w)));
                    return 12;
                }
                off += size_t(w);
            }
            if (g() % 8 != 0) {
                ssize_t got = c->recv(in.data(), n, kWaitAll, 10000);
                if (got != ssize_t(n) || memcmp(in.data(), out.data(), n) != 0) {
                    fprintf(stderr, "soak client: echo %d: %zd of %zu bytes%s\n", i, got, n,
                            got == ssize_t(n) ? ", differing" : "");
                    return 13;
                }
            }
            // Graceful, as close(2): what was sent is delivered after it returns.
            Connection::close(std::move(c));
        }
        ++*count;
        if (i == 0) {
            live0 = 0;
            // All closed: the count of a process with none open, once it has stopped moving
            // (the provider closes a connection's fds after the connection is gone: a count
            // taken at once had four more, and the end's count then looked like fds given back
            // that were never the program's).
            fdsSettled(-1, live0);
            fds0 = fdsStable();
            fdsBefore = describeFds();
        }
    }
    const int fds1 = fdsSettled(fds0, live0);
    if (fds1 > fds0 || Connection::liveCount() != live0) {
        fprintf(stderr,
                "soak client: %d fds and %ld live connections after, %d and %ld before; fds "
                "after: %s; before: %s\n",
                fds1, Connection::liveCount(), fds0, live0, describeFds().c_str(),
                fdsBefore.c_str());
        return 14;
    }
    return 0;
}

// The soak's server side: accepts until told to stop, one thread per connection, each reading
// the header and message, checking the pattern and echoing it, then waiting for the close.
struct SoakServer
{
    Listener &l;
    std::atomic<bool> stop{false};
    std::atomic<long> served{0}, bad{0};
    // Each connection's thread, and whether it is done: done ones are joined as it goes (a
    // thread not joined keeps its stack mapped, and tens of thousands reach vm.max_map_count).
    std::vector<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>> workers;

    void serve(std::unique_ptr<Connection> c)
    {
        uint32_t hdr[2];
        ssize_t hr = c->recv(hdr, sizeof(hdr), kWaitAll, 10000);
        if (hr != ssize_t(sizeof(hdr)) || hdr[0] > 64 * 1024) {
            fprintf(stderr, "soak server: header: %zd\n", hr);
            bad++;
            return;
        }
        std::vector<uint8_t> got(hdr[0]), want(hdr[0]);
        fillPattern(want.data(), want.size(), hdr[1]);
        ssize_t dr = c->recv(got.data(), got.size(), kWaitAll, 10000);
        if (dr != ssize_t(got.size()) || got != want) {
            fprintf(stderr, "soak server: data: %zd of %zu bytes or differing\n", dr, got.size());
            bad++;
            return;
        }
        // The client may close without reading: the echo's send may then fail, as on TCP.
        for (size_t off = 0; off < got.size();) {
            ssize_t w = c->send(got.data() + off, got.size() - off, 0, 10000);
            if (w <= 0)
                break;
            off += size_t(w);
        }
        uint8_t eof;
        c->recv(&eof, 1, 0, 10000);
        Connection::close(std::move(c));
        served++;
    }

    void run()
    {
        while (!stop) {
            std::unique_ptr<Connection> c;
            int r = l.accept(&c, false, 100);
            if (r == -ETIMEDOUT || r == -EINTR)
                continue;
            if (r < 0) {
                fprintf(stderr, "soak server: accept: %d\n", r);
                bad++;
                continue;
            }
            for (size_t i = 0; i < workers.size();) {
                if (workers[i].second->load()) {
                    workers[i].first.join();
                    workers[i] = std::move(workers.back());
                    workers.pop_back();
                } else {
                    i++;
                }
            }
            auto done = std::make_shared<std::atomic<bool>>(false);
            std::thread t(
                [this, done](std::unique_ptr<Connection> conn) {
                    serve(std::move(conn));
                    *done = true;
                },
                std::move(c));
            workers.emplace_back(std::move(t), done);
        }
        for (auto &w : workers)
            w.first.join();
        workers.clear();
    }
};

// The soak's clients are this binary run again (SoakClient.DISABLED_Run), not fork children:
// a child forked from this multithreaded process inherits whatever locks its other threads
// held at the fork, and ASan's allocator (GCC 12's) takes no care of its own, so under ASan
// children hung in a malloc in most runs (seen: all three children of a round waiting in
// SizeClassAllocator64::GetFromAllocator, with no thread left to unlock it; the round's server
// thread had just started, and a new thread's first allocations take those locks), leaving the
// server's recv of the header to time out and the parent blocked on the child. A fork child also
// starts with the parent's Connection::liveCount(), connections it will never destroy (afterFork
// lets the parent's adopted ones go), which read as a closed connection of its own left alive.
// posix_spawn runs nothing of this process in the child but the exec.
constexpr char kSoakClientEnv[] = "RSTREAM_SOAK_CLIENT"; // "port seconds seed"

// Starts a soak client that writes its count of connections to *resultFd; its pid or -errno.
pid_t spawnSoakClient(uint16_t port, double seconds, unsigned seed, int *resultFd)
{
    int fd[2];
    if (pipe2(fd, O_CLOEXEC) < 0)
        return -errno;
    char arg[128];
    snprintf(arg, sizeof(arg), "%s=%u %.3f %u", kSoakClientEnv, unsigned(port), seconds, seed);
    // The result on fd 3; gtest's chatter to /dev/null, the client's errors and sanitizer
    // reports to stderr.
    const pid_t pid =
        rstest::spawnSelf("SoakClient.DISABLED_Run", arg, fd[1], {kSoakClientEnv}, true);
    close(fd[1]);
    if (pid < 0) {
        close(fd[0]);
        return pid;
    }
    *resultFd = fd[0];
    return pid;
}

} // namespace

// A soak client, run only as spawnSoakClient() starts it.
TEST(SoakClient, DISABLED_Run)
{
    const char *arg = getenv(kSoakClientEnv);
    ASSERT_NE(arg, nullptr) << "run by the soak only";
    unsigned port = 0, seed = 0;
    double seconds = 0;
    ASSERT_EQ(sscanf(arg, "%u %lf %u", &port, &seconds, &seed), 3) << arg;
    Settings s;
    s.provider = "tcp";
    int count = 0;
    const int rc = soakClient(s, rstest::loopback4(uint16_t(port)), seconds, seed, &count);
    EXPECT_EQ(rc, 0) << "the step that failed";
    EXPECT_EQ(write(3, &count, sizeof(count)), ssize_t(sizeof(count)));
}

// Several processes open, use and close connections to this one for RSTREAM_SOAK_SECONDS;
// every transfer is checked at both ends, and this process's fds, live connections and RSS
// (after malloc_trim) come back to where they were after a first round, as do each client's.
TEST_F(Resources, SoakLeavesNothingBehind)
{
    const double seconds = double(envLong("RSTREAM_SOAK_SECONDS", 6));
    const int procs = static_cast<int>(envLong("RSTREAM_SOAK_PROCESSES", 3));
    auto round = [&](double secs, long *served, long *bad, int *conns) {
        SoakServer srv{*l_};
        std::thread server([&] { srv.run(); });
        std::vector<pid_t> pids;
        std::vector<int> pipes;
        for (int p = 0; p < procs; p++) {
            int fd = -1;
            const pid_t pid = spawnSoakClient(ntohs(a_.sin_port), secs, 1000u + unsigned(p), &fd);
            EXPECT_GT(pid, 0) << "posix_spawn: " << strerror(-pid);
            if (pid <= 0)
                break;
            pids.push_back(pid);
            pipes.push_back(fd);
        }
        // A client that hangs fails the test rather than the run: each has its seconds, its
        // connect and recv timeouts (10 s) and start-up to report in.
        const auto deadline = Clock::now() + std::chrono::duration<double>(secs + 60);
        *conns = 0;
        for (size_t p = 0; p < pids.size(); p++) {
            int status = 0, count = 0;
            pollfd pfd{pipes[p], POLLIN, 0};
            const auto left =
                std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
            if (poll(&pfd, 1, int(std::max<int64_t>(0, left.count()))) != 1) {
                ADD_FAILURE() << "soak client " << p << " did not finish: killed";
                kill(pids[p], SIGKILL);
            } else {
                EXPECT_EQ(read(pipes[p], &count, sizeof(count)), ssize_t(sizeof(count)))
                    << "soak client " << p << " gave no count";
            }
            close(pipes[p]);
            EXPECT_EQ(waitpid(pids[p], &status, 0), pids[p]);
            EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
                << "soak client " << p << ": status " << status;
            *conns += count;
        }
        srv.stop = true;
        server.join();
        *served = srv.served;
        *bad = srv.bad;
    };

    long served = 0, bad = 0;
    int conns = 0;
    // A short first round: the domain, the progress thread and malloc's arenas settle.
    round(0.5, &served, &bad, &conns);
    ASSERT_FALSE(HasFailure());
    const int fds0 = countFds();
    const long live0 = Connection::liveCount();
    const long rss0 = trimmedRssKiB();

    auto t0 = Clock::now();
    round(seconds, &served, &bad, &conns);
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    const int fds1 = fdsSettled(fds0, live0);
    const long live1 = Connection::liveCount();
    const long rss1 = trimmedRssKiB();
    printf("soak: %d processes, %.1f s: %d connections (%.0f/s), %ld served and checked, %ld "
           "failed; fds %d -> %d, live connections %ld -> %ld, RSS %ld -> %ld KiB\n",
           procs, took, conns, conns / took, served, bad, fds0, fds1, live0, live1, rss0, rss1);
    EXPECT_EQ(bad, 0) << "server-side failures (accept, short or wrong data)";
    EXPECT_EQ(served, conns) << "connections the clients made and the server did not serve";
    EXPECT_GT(conns, procs * 10) << "the soak made too few connections to mean anything";
    EXPECT_EQ(fds1, fds0);
    EXPECT_EQ(live1, live0);
#ifndef RSTREAM_TEST_ASAN // ASan's quarantine holds freed memory
    EXPECT_LE(rss1 - rss0, 8192) << "RSS grew by " << rss1 - rss0 << " KiB over the soak";
#endif
}
