// SPDX-License-Identifier: MIT
// riomap/riounmap/riowrite through the rsocket API on loopback; meson runs it once per transport
// mode (RSTREAM_IWARP, RSTREAM_STRICT).

#include <algorithm>
#include <arpa/inet.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <rstream/rsocket.h>

#include "net.h"

namespace {

constexpr size_t kFail = static_cast<size_t>(-1);

class RiomapTest : public ::testing::Test
{
protected:
    void SetUp() override { signal(SIGPIPE, SIG_IGN); }

    void TearDown() override
    {
        for (int fd : {client_, server_, listener_})
            if (fd >= 0)
                rclose(fd);
    }

    // Connects client_ to server_; clientIoMaps >= 0 sets the client's RDMA_IOMAPSIZE first.
    void connectPair(int clientIoMaps = -1)
    {
        listener_ = rsocket(AF_INET, SOCK_STREAM, 0);
        ASSERT_GE(listener_, 0) << strerror(errno);
        sockaddr_in a = rstest::loopback4(0);
        ASSERT_EQ(rbind(listener_, reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0);
        ASSERT_EQ(rlisten(listener_, 8), 0);
        socklen_t len = sizeof(a);
        ASSERT_EQ(rgetsockname(listener_, reinterpret_cast<sockaddr *>(&a), &len), 0);
        client_ = rsocket(AF_INET, SOCK_STREAM, 0);
        ASSERT_GE(client_, 0);
        if (clientIoMaps >= 0) {
            ASSERT_EQ(
                rsetsockopt(client_, SOL_RDMA, RDMA_IOMAPSIZE, &clientIoMaps, sizeof(clientIoMaps)),
                0);
        }
        std::thread t([&] { server_ = raccept(listener_, nullptr, nullptr); });
        int r = rconnect(client_, reinterpret_cast<sockaddr *>(&a), sizeof(a));
        t.join();
        ASSERT_EQ(r, 0) << strerror(errno);
        ASSERT_GE(server_, 0) << strerror(errno);
    }

    static void sendByte(int fd, uint8_t v)
    {
        ASSERT_EQ(rsend(fd, &v, 1, 0), 1) << strerror(errno);
    }

    static uint8_t recvByte(int fd)
    {
        uint8_t v = 0;
        EXPECT_EQ(rrecv(fd, &v, 1, MSG_WAITALL), 1) << strerror(errno);
        return v;
    }

    // Maps buf on the server and lets the client know: a window is known to the peer once data
    // sent after riomap() has arrived.
    off_t mapOnServer(void *buf, size_t len, off_t offset = -1)
    {
        off_t off = riomap(server_, buf, len, PROT_WRITE, 0, offset);
        EXPECT_GE(off, 0) << strerror(errno);
        sendByte(server_, 'M');
        EXPECT_EQ(recvByte(client_), 'M');
        return off;
    }

    int listener_ = -1;
    int client_ = -1;
    int server_ = -1;
};

std::vector<uint8_t> pattern(size_t n, uint32_t seed)
{
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        v[i] = static_cast<uint8_t>(seed >> 16);
    }
    return v;
}

} // namespace

TEST_F(RiomapTest, WritesLandBeforeTheStreamDataSentAfterThem)
{
    connectPair();
    std::vector<uint8_t> window(256 * 1024, 0);
    off_t off = mapOnServer(window.data(), window.size());
    EXPECT_EQ(off, static_cast<off_t>(reinterpret_cast<uintptr_t>(window.data())));

    // Stream data before, a small and a large write (many send-ring chunks), then the note.
    auto before = pattern(100000, 1);
    auto small = pattern(100, 2);
    auto large = pattern(200000, 3);
    std::thread reader([&] {
        std::vector<uint8_t> got(before.size());
        ASSERT_EQ(rrecv(server_, got.data(), got.size(), MSG_WAITALL), ssize_t(got.size()));
        EXPECT_EQ(got, before);
    });
    ASSERT_EQ(rsend(client_, before.data(), before.size(), 0), ssize_t(before.size()));
    EXPECT_EQ(riowrite(client_, small.data(), small.size(), off + 7, 0), small.size());
    EXPECT_EQ(riowrite(client_, large.data(), large.size(), off + 4096, 0), large.size());
    sendByte(client_, 'D');
    reader.join();
    ASSERT_EQ(recvByte(server_), 'D');
    EXPECT_EQ(std::memcmp(window.data() + 7, small.data(), small.size()), 0);
    EXPECT_EQ(std::memcmp(window.data() + 4096, large.data(), large.size()), 0);
    EXPECT_EQ(window[0], 0);
    EXPECT_EQ(window[107], 0);
    EXPECT_EQ(window[4096 + large.size()], 0);
    EXPECT_EQ(riounmap(server_, window.data(), window.size()), 0);
}

TEST_F(RiomapTest, EveryWriteIsInPlaceWhenTheNextMessageArrives)
{
    connectPair();
    std::vector<uint32_t> window(1000, 0);
    off_t off = mapOnServer(window.data(), window.size() * sizeof(uint32_t));
    std::thread writer([&] {
        for (uint32_t i = 0; i < window.size(); i++) {
            uint32_t v = i * 2654435761u + 1;
            ASSERT_EQ(riowrite(client_, &v, sizeof(v), off + i * sizeof(v), 0), sizeof(v));
            ASSERT_EQ(rsend(client_, &i, sizeof(i), 0), ssize_t(sizeof(i)));
        }
    });
    for (uint32_t i = 0; i < window.size(); i++) {
        uint32_t got;
        ASSERT_EQ(rrecv(server_, &got, sizeof(got), MSG_WAITALL), ssize_t(sizeof(got)));
        ASSERT_EQ(got, i);
        ASSERT_EQ(window[i], i * 2654435761u + 1) << "write " << i;
    }
    writer.join();
}

TEST_F(RiomapTest, AGivenOffsetIsUsedAndWindowsMayNotOverlap)
{
    connectPair();
    std::vector<uint8_t> a(8192, 0), b(8192, 0);
    const off_t base = off_t(1) << 40;
    EXPECT_EQ(riomap(server_, a.data(), a.size(), PROT_WRITE, 0, base), base);
    errno = 0;
    EXPECT_EQ(riomap(server_, b.data(), b.size(), PROT_WRITE, 0, base + 8191), -1);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_EQ(riomap(server_, b.data(), b.size(), PROT_WRITE, 0, base + 8192), base + 8192);
    sendByte(server_, 'M');
    EXPECT_EQ(recvByte(client_), 'M');
    // One write may not span two windows, even adjacent ones.
    uint8_t buf[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    errno = 0;
    EXPECT_EQ(riowrite(client_, buf, sizeof(buf), base + 8184, 0), kFail);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_EQ(riowrite(client_, buf, 8, base + 8184, 0), 8u);
    EXPECT_EQ(riowrite(client_, buf + 8, 8, base + 8192, 0), 8u);
    sendByte(client_, 'D');
    EXPECT_EQ(recvByte(server_), 'D');
    EXPECT_EQ(std::memcmp(a.data() + 8184, buf, 8), 0);
    EXPECT_EQ(std::memcmp(b.data(), buf + 8, 8), 0);
}

TEST_F(RiomapTest, BadArgumentsAndBoundsAreRejected)
{
    std::vector<uint8_t> w(4096);
    int fresh = rsocket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fresh, 0);
    errno = 0;
    EXPECT_EQ(riomap(fresh, w.data(), w.size(), PROT_WRITE, 0, -1), -1);
    EXPECT_EQ(errno, ENOTCONN);
    EXPECT_EQ(riowrite(fresh, w.data(), 1, 0, 0), kFail);
    EXPECT_EQ(errno, ENOTCONN);
    rclose(fresh);
    errno = 0;
    EXPECT_EQ(riowrite(fresh, w.data(), 1, 0, 0), kFail);
    EXPECT_EQ(errno, EBADF);

    connectPair();
    for (int prot : {PROT_READ, PROT_READ | PROT_WRITE, PROT_EXEC}) {
        errno = 0;
        EXPECT_EQ(riomap(server_, w.data(), w.size(), prot, 0, -1), -1) << prot;
        EXPECT_EQ(errno, EINVAL);
    }
    errno = 0;
    EXPECT_EQ(riomap(server_, w.data(), w.size(), PROT_WRITE, 1, -1), -1);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_EQ(riomap(server_, w.data(), 0, PROT_WRITE, 0, -1), -1);
    EXPECT_EQ(riomap(server_, nullptr, 16, PROT_WRITE, 0, -1), -1);
    EXPECT_EQ(riomap(server_, w.data(), w.size(), PROT_WRITE, 0, -2), -1);
    EXPECT_EQ(riomap(server_, w.data(), 16, PROT_WRITE, 0, INT64_MAX - 8), -1);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_EQ(riounmap(server_, w.data(), w.size()), -1);
    EXPECT_EQ(errno, EINVAL);

    off_t off = mapOnServer(w.data(), w.size(), 0);
    ASSERT_EQ(off, 0);
    uint8_t b[64] = {};
    for (off_t at : {off_t(4096 - 63), off_t(4096), off_t(1) << 40}) {
        errno = 0;
        EXPECT_EQ(riowrite(client_, b, sizeof(b), at, 0), kFail) << at;
        EXPECT_EQ(errno, EINVAL);
    }
    EXPECT_EQ(riowrite(client_, b, sizeof(b), -1, 0), kFail);
    EXPECT_EQ(errno, EINVAL);
    // Only the mapping side has the window: the server cannot write into its own.
    EXPECT_EQ(riowrite(server_, b, sizeof(b), 0, 0), kFail);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_EQ(riowrite(client_, b, sizeof(b), 4096 - 64, 0), sizeof(b));
    EXPECT_EQ(riowrite(client_, b, 0, 0, 0), 0u);
    // The connection is as good as before.
    sendByte(client_, 'D');
    EXPECT_EQ(recvByte(server_), 'D');
    EXPECT_EQ(riounmap(server_, w.data(), w.size() - 1), -1);
    EXPECT_EQ(riounmap(server_, w.data(), w.size()), 0);
    EXPECT_EQ(riounmap(server_, w.data(), w.size()), -1);
}

TEST_F(RiomapTest, AfterUnmapTheWindowIsGoneForThePeer)
{
    connectPair();
    std::vector<uint8_t> w(4096, 0);
    off_t off = mapOnServer(w.data(), w.size());
    uint8_t v[8] = {9, 9, 9, 9, 9, 9, 9, 9};
    EXPECT_EQ(riowrite(client_, v, sizeof(v), off, 0), sizeof(v));
    sendByte(client_, 'D');
    EXPECT_EQ(recvByte(server_), 'D');
    EXPECT_EQ(w[0], 9);
    EXPECT_EQ(riounmap(server_, w.data(), w.size()), 0);
    sendByte(server_, 'U');
    EXPECT_EQ(recvByte(client_), 'U');
    errno = 0;
    EXPECT_EQ(riowrite(client_, v, sizeof(v), off, 0), kFail);
    EXPECT_EQ(errno, EINVAL);
    // Mapped again (maybe under the same id), it works again.
    off = mapOnServer(w.data(), w.size());
    v[0] = 7;
    EXPECT_EQ(riowrite(client_, v, 1, off + 100, 0), 1u);
    sendByte(client_, 'D');
    EXPECT_EQ(recvByte(server_), 'D');
    EXPECT_EQ(w[100], 7);
}

TEST_F(RiomapTest, ThePeersIoMapSizeBoundsTheWindows)
{
    connectPair(2);
    int v = -1;
    socklen_t len = sizeof(v);
    ASSERT_EQ(rgetsockopt(client_, SOL_RDMA, RDMA_IOMAPSIZE, &v, &len), 0);
    EXPECT_EQ(v, 2);
    ASSERT_EQ(rgetsockopt(server_, SOL_RDMA, RDMA_IOMAPSIZE, &v, &len), 0);
    EXPECT_EQ(v, 64); // the default
    // The table is sized with the endpoint.
    v = 8;
    errno = 0;
    EXPECT_EQ(rsetsockopt(client_, SOL_RDMA, RDMA_IOMAPSIZE, &v, sizeof(v)), -1);
    EXPECT_EQ(errno, EINVAL);

    std::vector<uint8_t> a(4096), b(4096), c(4096);
    EXPECT_GE(riomap(server_, a.data(), a.size(), PROT_WRITE, 0, -1), 0);
    EXPECT_GE(riomap(server_, b.data(), b.size(), PROT_WRITE, 0, -1), 0);
    errno = 0;
    EXPECT_EQ(riomap(server_, c.data(), c.size(), PROT_WRITE, 0, -1), -1);
    EXPECT_EQ(errno, ENOMEM);
    // Local-only mappings take no slot in the peer's table.
    EXPECT_GE(riomap(server_, c.data(), c.size(), PROT_NONE, 0, -1), 0);
    EXPECT_EQ(riounmap(server_, c.data(), c.size()), 0);
    EXPECT_EQ(riounmap(server_, a.data(), a.size()), 0);
    off_t off = mapOnServer(c.data(), c.size());
    uint8_t x = 42;
    EXPECT_EQ(riowrite(client_, &x, 1, off + 4095, 0), 1u);
    sendByte(client_, 'D');
    EXPECT_EQ(recvByte(server_), 'D');
    EXPECT_EQ(c[4095], 42);
}

TEST_F(RiomapTest, ANoMapsPeerRefusesEveryWindow)
{
    connectPair(0);
    std::vector<uint8_t> a(4096);
    errno = 0;
    EXPECT_EQ(riomap(server_, a.data(), a.size(), PROT_WRITE, 0, -1), -1);
    EXPECT_EQ(errno, ENOMEM);
    // The other way round is still open.
    off_t off = riomap(client_, a.data(), a.size(), PROT_WRITE, 0, -1);
    ASSERT_GE(off, 0);
    sendByte(client_, 'M');
    EXPECT_EQ(recvByte(server_), 'M');
    uint8_t x = 5;
    EXPECT_EQ(riowrite(server_, &x, 1, off, 0), 1u);
    sendByte(server_, 'D');
    EXPECT_EQ(recvByte(client_), 'D');
    EXPECT_EQ(a[0], 5);
}

TEST_F(RiomapTest, MappingChurnEndsInTheLastState)
{
    connectPair(4);
    std::vector<std::vector<uint8_t>> bufs(4, std::vector<uint8_t>(4096, 0));
    // The client polls meanwhile, as a program using the windows would: its engine answers each
    // withdrawal at once (a peer making no calls answers from the progress thread, within
    // 100 ms).
    std::atomic<bool> done{false};
    std::thread poller([&] {
        while (!done) {
            pollfd p{client_, POLLIN, 0};
            rpoll(&p, 1, 5);
        }
    });
    // Maps and unmaps faster than anything needs to travel; withdrawn announcements may never
    // leave. (In a function of its own: a failed ASSERT leaves it, the poller is still joined.)
    auto churn = [&] {
        for (int round = 0; round < 300; round++) {
            auto &b = bufs[round % 4];
            ASSERT_GE(riomap(server_, b.data(), b.size(), PROT_WRITE, 0, -1), 0) << round;
            if (round % 3 != 2)
                ASSERT_EQ(riounmap(server_, b.data(), b.size()), 0);
            else if (round > 290)
                break;
            else
                ASSERT_EQ(riounmap(server_, b.data(), b.size()), 0);
        }
    };
    churn();
    done = true;
    poller.join();
    off_t off = mapOnServer(bufs[0].data(), bufs[0].size());
    uint8_t x = 3;
    EXPECT_EQ(riowrite(client_, &x, 1, off + 1, 0), 1u);
    sendByte(client_, 'D');
    EXPECT_EQ(recvByte(server_), 'D');
    EXPECT_EQ(bufs[0][1], 3);
}

// riounmap() while the peer writes into the window as fast as it can: it returns once the
// peer's writes are in (no write lands after it), the peer's next riowrite() fails with EINVAL,
// and the connection carries on. Before, the window's region was closed under writes still
// arriving (the provider then reset the connection).
TEST_F(RiomapTest, UnmapUnderThePeersWritesLeavesNothingLanding)
{
    connectPair();
    std::vector<uint8_t> w(1 << 20, 0);
    off_t off = mapOnServer(w.data(), w.size());
    std::atomic<int> writerErrno{0};
    std::atomic<long> writes{0};
    std::thread writer([&] {
        const std::vector<uint8_t> chunk(256 * 1024, 0x42);
        for (;;) {
            for (size_t at = 0; at < w.size(); at += chunk.size()) {
                // (The window may go in the middle of one: a short write, then EINVAL.)
                if (riowrite(client_, chunk.data(), chunk.size(), off + off_t(at), 0) == kFail) {
                    writerErrno = errno;
                    return;
                }
                writes++;
            }
        }
    });
    while (writes < 8)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(riounmap(server_, w.data(), w.size()), 0);
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_LT(took, std::chrono::seconds(2));
    // The memory is ours again: whatever we put there stays.
    std::fill(w.begin(), w.end(), 0x11);
    writer.join();
    EXPECT_EQ(writerErrno.load(), EINVAL) << strerror(writerErrno.load());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(std::count(w.begin(), w.end(), 0x11), long(w.size())) << "a write landed late";
    sendByte(client_, 'A');
    EXPECT_EQ(recvByte(server_), 'A');
    sendByte(server_, 'B');
    EXPECT_EQ(recvByte(client_), 'B');
}

TEST_F(RiomapTest, CloseReleasesTheWindows)
{
    connectPair();
    std::vector<uint8_t> w(4096);
    off_t off = mapOnServer(w.data(), w.size());
    ASSERT_EQ(rclose(server_), 0);
    server_ = -1;
    // The peer's writes can no longer reach the buffer; they fail or the connection does.
    uint8_t x = 1;
    for (int i = 0; i < 100 && riowrite(client_, &x, 1, off, MSG_NOSIGNAL) == 1; i++)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(w[0], 0);
}
