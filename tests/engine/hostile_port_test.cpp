// SPDX-License-Identifier: MIT
// Hostile bytes at a listener's fabric port: kernel sockets that send random bytes, truncated or
// stalled connection requests and lying length fields to the tcp provider's connection manager,
// and requests whose private data (the rstream hello) is garbage. Each is dropped or rejected,
// the listener goes on serving a good client, nothing blocks it, and memory stays bounded.

#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <memory>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <random>
#include <sstream>
#include <string>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

#include "connection.h"
#include "listener.h"
#include "net.h"
#include "proc.h"
#include "wire.h"

using namespace rstream;
using rstest::countFds;
using rstest::loopback4;

namespace {

std::string gLogPath; // RSTREAM_LOG_FILE, set by main before the first line is logged

// The tcp provider's connection request (libfabric 1.17 prov/tcp, tcpx_conn_mgr.c): a 32-byte
// control header (version 3, type 0 = connreq, the private data length as a big-endian 16-bit
// word at offset 2, conn_data = 1 in host order at offset 24 to detect a byte-order mismatch),
// then the private data. The answer has the same header, type 1 (accept) or 6 (nack).
constexpr size_t kCmHeaderSize = 32;
constexpr uint8_t kCmVersion = 3;
constexpr uint8_t kCmConnReq = 0;
constexpr uint8_t kCmConnResp = 1;
constexpr uint8_t kCmNack = 6;

std::vector<uint8_t> cmHeader(uint16_t dataLen, uint8_t type = kCmConnReq)
{
    std::vector<uint8_t> h(kCmHeaderSize, 0);
    h[0] = kCmVersion;
    h[1] = type;
    const uint16_t be = htons(dataLen);
    std::memcpy(&h[2], &be, 2);
    const uint64_t one = 1;
    std::memcpy(&h[24], &one, 8);
    return h;
}

wire::Hello goodHello()
{
    wire::Hello h;
    h.flags = wire::kFlagGrow;
    h.ringKey = 1;
    h.ringSize = 4096;
    h.rxSlots = 16;
    return h;
}

std::vector<uint8_t> encoded(const wire::Hello &h)
{
    std::vector<uint8_t> v(wire::kHelloSize);
    wire::encodeHello(h, v.data());
    return v;
}

// A whole connection request carrying data as its private data.
std::vector<uint8_t> connRequest(const std::vector<uint8_t> &data)
{
    std::vector<uint8_t> r = cmHeader(static_cast<uint16_t>(data.size()));
    r.insert(r.end(), data.begin(), data.end());
    return r;
}

// Lines of the rstream log that contain what.
int logLines(const char *what)
{
    std::ifstream f(gLogPath);
    int n = 0;
    for (std::string line; std::getline(f, line);)
        if (line.find(what) != std::string::npos)
            n++;
    return n;
}

constexpr const char *kBadHelloLine = "rejecting a peer with a bad hello";

class HostilePort : public ::testing::Test
{
protected:
    void SetUp() override
    {
        settings_.provider = "tcp";
        settings_.connectTimeoutMs = 3000;
        listener_ = std::make_unique<Listener>(settings_);
        sockaddr_in a = loopback4(0);
        ASSERT_EQ(listener_->bind(reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0);
        ASSERT_EQ(listener_->listen(128), 0);
        sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        ASSERT_EQ(listener_->localAddress(&ss, &len), 0);
        port_ = ntohs(reinterpret_cast<sockaddr_in *>(&ss)->sin_port);
        ASSERT_NE(port_, 0);
    }

    void TearDown() override
    {
        for (int fd : raw_)
            ::close(fd);
    }

    // A kernel TCP connection to the listener's port, with receives bounded by 3 s.
    int rawConnect()
    {
        int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        EXPECT_GE(fd, 0) << strerror(errno);
        if (fd < 0)
            return -1;
        raw_.push_back(fd);
        sockaddr_in a = loopback4(port_);
        EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0) << strerror(errno);
        timeval tv{3, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return fd;
    }

    void rawClose(int fd)
    {
        for (auto it = raw_.begin(); it != raw_.end(); ++it)
            if (*it == fd) {
                raw_.erase(it);
                break;
            }
        ::close(fd);
    }

    void rawSend(int fd, const std::vector<uint8_t> &bytes, size_t n)
    {
        ASSERT_LE(n, bytes.size());
        ASSERT_EQ(::send(fd, bytes.data(), n, MSG_NOSIGNAL), ssize_t(n)) << strerror(errno);
    }

    // What the listener's side did with a raw connection within 3 s: the type of the control
    // header it answered with, -1 when it closed the connection without one, -2 when nothing
    // came.
    int rawAnswer(int fd)
    {
        uint8_t h[kCmHeaderSize];
        size_t got = 0;
        while (got < sizeof(h)) {
            const ssize_t n = ::recv(fd, h + got, sizeof(h) - got, 0);
            if (n == 0 || (n < 0 && errno == ECONNRESET))
                return -1;
            if (n < 0)
                return -2;
            got += size_t(n);
        }
        EXPECT_EQ(h[0], kCmVersion);
        return h[1];
    }

    // A well-behaved client connects while a thread accepts (5 s at most), and 64 KiB cross
    // intact: what must keep working whatever came before. Returns whether it did.
    bool servesGoodClient()
    {
        std::unique_ptr<Connection> accepted;
        int acceptResult = 1;
        std::thread server([&] { acceptResult = listener_->accept(&accepted, false, 5000); });
        Connection client(settings_);
        sockaddr_in a = loopback4(port_);
        const auto t0 = std::chrono::steady_clock::now();
        const int r = client.connect(reinterpret_cast<sockaddr *>(&a), sizeof(a));
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - t0)
                            .count();
        EXPECT_EQ(r, 0) << "connect: " << strerror(-r) << " after " << ms << " ms";
        if (r != 0) {
            // A stalled provider would keep the accepting thread: release what may hold it.
            for (int fd : raw_)
                ::shutdown(fd, SHUT_RDWR);
        }
        server.join();
        EXPECT_EQ(acceptResult, 0) << strerror(-acceptResult);
        if (r != 0 || acceptResult != 0 || !accepted)
            return false;
        std::vector<uint8_t> out(64 * 1024), in(out.size());
        std::mt19937 rng(port_);
        for (auto &b : out)
            b = static_cast<uint8_t>(rng());
        size_t off = 0;
        while (off < out.size()) {
            const ssize_t n = client.send(out.data() + off, out.size() - off, 0, 5000);
            EXPECT_GT(n, 0) << strerror(-n);
            if (n <= 0)
                return false;
            off += size_t(n);
            // The receiver drains as the sender goes: the ring is smaller than the message.
            const ssize_t m =
                accepted->recv(in.data() + (off - size_t(n)), size_t(n), kWaitAll, 5000);
            EXPECT_EQ(m, n) << strerror(-m);
            if (m != n)
                return false;
        }
        EXPECT_EQ(in, out);
        return in == out;
    }

    // No connection came of what was sent so far.
    void expectNothingAccepted()
    {
        std::unique_ptr<Connection> c;
        EXPECT_EQ(listener_->accept(&c, true, 0), -EAGAIN);
        EXPECT_FALSE(c);
    }

    Settings settings_;
    std::unique_ptr<Listener> listener_;
    uint16_t port_ = 0;
    std::vector<int> raw_;
};

// The format above is what this libfabric speaks: a whole request with a good hello is answered
// and accepted. Without this the truncation tests below would test garbage only.
TEST_F(HostilePort, RawRequestIsUnderstood)
{
    int fd = rawConnect();
    rawSend(fd, connRequest(encoded(goodHello())), kCmHeaderSize + wire::kHelloSize);
    std::unique_ptr<Connection> c;
    EXPECT_EQ(listener_->accept(&c, false, 5000), 0);
    const int answer = rawAnswer(fd);
    if (answer < 0)
        GTEST_SKIP() << "this libfabric's tcp provider does not speak the 1.17 CM format";
    EXPECT_EQ(answer, kCmConnResp);
    rawClose(fd);
    EXPECT_TRUE(servesGoodClient());
}

// Random bytes (seeded) of random lengths, then close: the provider drops each connection
// without a word to rstream.
TEST_F(HostilePort, RandomBytesAreDropped)
{
    std::mt19937 rng(20240615);
    for (int i = 0; i < 40; i++) {
        std::vector<uint8_t> junk(std::uniform_int_distribution<size_t>(1, 600)(rng));
        for (auto &b : junk)
            b = static_cast<uint8_t>(rng());
        SCOPED_TRACE("connection " + std::to_string(i) + ", " + std::to_string(junk.size()) +
                     " bytes starting " + std::to_string(junk[0]));
        int fd = rawConnect();
        rawSend(fd, junk, junk.size());
        // Dropped, or (a random header that passed) answered by a refusal.
        const int answer = rawAnswer(fd);
        EXPECT_TRUE(answer == -1 || answer == kCmNack) << answer;
        rawClose(fd);
    }
    expectNothingAccepted();
    EXPECT_TRUE(servesGoodClient());
}

// Every prefix length that matters of a real request (in the header, at its end, in the
// private data), then close.
TEST_F(HostilePort, TruncatedRequestsAreDropped)
{
    const std::vector<uint8_t> req = connRequest(encoded(goodHello()));
    for (size_t k : {size_t(1), size_t(8), kCmHeaderSize - 1, kCmHeaderSize, kCmHeaderSize + 1,
                     kCmHeaderSize + 20, req.size() - 1}) {
        SCOPED_TRACE("prefix of " + std::to_string(k) + " bytes");
        int fd = rawConnect();
        rawSend(fd, req, k);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        rawClose(fd);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    expectNothingAccepted();
    EXPECT_TRUE(servesGoodClient());
}

// Fewer bytes than a header from peers that then wait: the provider takes errno for why its
// short read failed, and EAGAIN for "try again later", so a stale EAGAIN in the thread that calls
// into the listener (common: the progress thread reads nonblocking fds) would keep each such
// peer half read for as long as it waits. Each is closed from this side at once, and nothing is
// left behind.
TEST_F(HostilePort, ShortRequestsAreDroppedWhileThePeerWaits)
{
    const int fdsBefore = countFds();
    const std::vector<uint8_t> req = connRequest(encoded(goodHello()));
    for (int i = 0; i < 10; i++) {
        SCOPED_TRACE("connection " + std::to_string(i));
        int fd = rawConnect();
        rawSend(fd, req, 5);
        for (int j = 0; j < 20; j++) {
            std::unique_ptr<Connection> c;
            errno = EAGAIN;
            EXPECT_EQ(listener_->accept(&c, true, 0), -EAGAIN);
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        EXPECT_EQ(rawAnswer(fd), -1) << "not closed while the peer waited";
        rawClose(fd);
    }
    for (int i = 0; i < 50 && countFds() > fdsBefore; i++)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_LE(countFds(), fdsBefore) << "the provider kept dropped peers' sockets";
    timespec c0, c1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    const long cpuMs = (c1.tv_sec - c0.tv_sec) * 1000 + (c1.tv_nsec - c0.tv_nsec) / 1000000;
    RecordProperty("idle_cpu_ms", std::to_string(cpuMs));
    EXPECT_LT(cpuMs, 60) << "the process spins after the peers went";
    EXPECT_TRUE(servesGoodClient());
}

// Peers that connect and then stall, after nothing, part of the header, the whole header (the
// provider then waits for the private data it announced) or part of the private data, and stay
// connected: a good client is served meanwhile, as a kernel listener serves others while a
// peer dawdles.
TEST_F(HostilePort, StalledRequestsDoNotBlockOthers)
{
    const std::vector<uint8_t> req = connRequest(encoded(goodHello()));
    for (size_t k : {size_t(0), size_t(1), kCmHeaderSize - 1, kCmHeaderSize, kCmHeaderSize + 1,
                     req.size() - 1}) {
        SCOPED_TRACE("stalled after " + std::to_string(k) + " bytes");
        int fd = rawConnect();
        if (k)
            rawSend(fd, req, k);
        // Let the provider see it before the good client comes.
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        EXPECT_TRUE(servesGoodClient());
        (void)fd; // stays open (and stalled) until the end of the test
    }
    expectNothingAccepted();
}

// A header announcing 65535 bytes of private data (the provider takes at most 256): with
// garbage after it the request is rejected by rstream (and logged); with a few bytes and a
// stall it blocks nobody.
TEST_F(HostilePort, HugeLengthField)
{
    const int before = logLines(kBadHelloLine);
    std::vector<uint8_t> req = cmHeader(0xffff);
    req.resize(kCmHeaderSize + 300, 0xa5);
    int fd = rawConnect();
    rawSend(fd, req, req.size());
    EXPECT_EQ(rawAnswer(fd), kCmNack);
    rawClose(fd);
    EXPECT_EQ(logLines(kBadHelloLine), before + 1);

    int stalled = rawConnect();
    rawSend(stalled, req, kCmHeaderSize + 10);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    expectNothingAccepted();
    EXPECT_TRUE(servesGoodClient());
}

// Connection requests that reach rstream with private data it must not believe: each is
// refused (a nack), logged, and costs nothing afterwards.
TEST_F(HostilePort, BadPrivateDataIsRejectedAndLogged)
{
    struct Case
    {
        const char *what;
        std::vector<uint8_t> data;
    };
    auto modified = [](void (*f)(wire::Hello &)) {
        wire::Hello h = goodHello();
        f(h);
        return encoded(h);
    };
    std::vector<uint8_t> garbage(wire::kHelloSize);
    std::mt19937 rng(7);
    for (auto &b : garbage)
        b = static_cast<uint8_t>(rng());
    std::vector<uint8_t> wrongMagic = encoded(goodHello());
    wrongMagic[0] ^= 0xff;
    std::vector<uint8_t> shortHello = encoded(goodHello());
    shortHello.resize(wire::kHelloSize - 1);
    std::vector<uint8_t> longGarbage(256);
    for (auto &b : longGarbage)
        b = static_cast<uint8_t>(rng());
    const std::vector<Case> cases = {
        {"random bytes", garbage},
        {"random 256 bytes", longGarbage},
        {"wrong magic", wrongMagic},
        {"one byte short", shortHello},
        {"no private data", {}},
        {"a future version", modified([](wire::Hello &h) { h.version = wire::kVersion + 1; })},
        {"version 0", modified([](wire::Hello &h) { h.version = 0; })},
        {"unknown flags", modified([](wire::Hello &h) { h.flags |= 0x8000; })},
        {"ring of 0 bytes", modified([](wire::Hello &h) { h.ringSize = 0; })},
        {"ring of 4 GiB - 1", modified([](wire::Hello &h) { h.ringSize = 0xffffffffu; })},
        {"ring of 2^28 + 1", modified([](wire::Hello &h) { h.ringSize = (1u << 28) + 1; })},
        {"no receive slots", modified([](wire::Hello &h) { h.rxSlots = 0; })},
        {"2^32 - 1 receive slots", modified([](wire::Hello &h) { h.rxSlots = 0xffffffffu; })},
        {"a ring address without kFlagVirtAddr",
         modified([](wire::Hello &h) { h.ringAddr = 0xdeadbeef000; })},
        {"2^32 - 1 windows", modified([](wire::Hello &h) { h.ioMapSize = 0xffffffffu; })},
    };
    const int before = logLines(kBadHelloLine);
    for (const Case &c : cases) {
        SCOPED_TRACE(c.what);
        int fd = rawConnect();
        const std::vector<uint8_t> req = connRequest(c.data);
        rawSend(fd, req, req.size());
        EXPECT_EQ(rawAnswer(fd), kCmNack);
        rawClose(fd);
    }
    expectNothingAccepted();
    EXPECT_EQ(logLines(kBadHelloLine) - before, int(cases.size()));
    EXPECT_TRUE(servesGoodClient());
}

// 200 garbage connects (random bytes and bad hellos, half each): the listener's process grows
// by less than 4 MiB and holds no descriptor more than before.
TEST_F(HostilePort, GarbageConnectsKeepMemoryBounded)
{
    std::mt19937 rng(99);
    auto garbageConnect = [&](int i) {
        int fd = rawConnect();
        std::vector<uint8_t> bytes;
        if (i % 2) {
            bytes.resize(std::uniform_int_distribution<size_t>(1, 300)(rng));
            for (auto &b : bytes)
                b = static_cast<uint8_t>(rng());
        } else {
            std::vector<uint8_t> hello(wire::kHelloSize);
            for (auto &b : hello)
                b = static_cast<uint8_t>(rng());
            bytes = connRequest(hello);
        }
        rawSend(fd, bytes, bytes.size());
        const int answer = rawAnswer(fd);
        EXPECT_TRUE(answer == -1 || answer == kCmNack)
            << answer << " for connect " << i << ": " << bytes.size() << " bytes";
        rawClose(fd);
    };
    // Warm up what the first requests allocate once (EQ entries, the log file...).
    for (int i = 0; i < 20; i++)
        garbageConnect(i);
    expectNothingAccepted();
    const long rssBefore = rstest::rssKiB();
    const int fdsBefore = countFds();
    for (int i = 0; i < 200; i++)
        garbageConnect(i);
    expectNothingAccepted();
    const long rssAfter = rstest::rssKiB();
    const long growthKiB = rssAfter - rssBefore;
    RecordProperty("rss_growth_kib", std::to_string(growthKiB));
    EXPECT_LT(growthKiB, 4 * 1024);
    // The provider closes what it dropped by the time it answers; give it a moment anyway.
    for (int i = 0; i < 50 && countFds() > fdsBefore; i++)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_LE(countFds(), fdsBefore);
    EXPECT_TRUE(servesGoodClient());
}

} // namespace

int main(int argc, char **argv)
{
    // The log lines of rejected requests are part of what is checked: info level, into a file
    // of this process's own.
    char path[] = "/tmp/rstream-hostile-port-XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0)
        return 1;
    ::close(fd);
    gLogPath = path;
    setenv("RSTREAM_LOG", "info", 1);
    setenv("RSTREAM_LOG_FILE", path, 1);
    ::testing::InitGoogleTest(&argc, argv);
    const int rc = RUN_ALL_TESTS();
    unlink(path);
    return rc;
}
