// SPDX-License-Identifier: MIT
// How much a connection buffers before its reader reads, against kernel TCP: programs that write
// a request of some size and only then read (in one thread, or both peers writing first) must
// not block forever where the kernel's buffers take it.

#include <chrono>
#include <cstring>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "harness.h"

using namespace rstest;

namespace {

using Buffering = BackendTest;

std::vector<uint8_t> bytes(size_t n, uint8_t seed)
{
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; i++)
        v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 12));
    return v;
}

// Writes all of data without anyone reading, nonblocking with poll in between: how many bytes
// went before nothing more was accepted for quietMs (all of them when the buffers take it).
size_t writeUnread(const Backend *b, int fd, const std::vector<uint8_t> &data, int quietMs)
{
    size_t sent = 0;
    while (sent < data.size()) {
        const ssize_t n = b->send(fd, data.data() + sent, data.size() - sent, MSG_DONTWAIT);
        if (n > 0) {
            sent += static_cast<size_t>(n);
            continue;
        }
        if (n < 0 && errno != EAGAIN)
            break;
        pollfd p{fd, POLLOUT, 0};
        if (b->poll(&p, 1, quietMs) != 1)
            break; // the buffers are full
    }
    return sent;
}

bool readExactly(const Backend *b, int fd, std::vector<uint8_t> *out, size_t n)
{
    out->resize(n);
    size_t got = 0;
    while (got < n) {
        pollfd p{fd, POLLIN, 0};
        if (b->poll(&p, 1, 10000) != 1)
            return false;
        const ssize_t r = b->recv(fd, out->data() + got, n - got, 0);
        if (r <= 0)
            return false;
        got += static_cast<size_t>(r);
    }
    return true;
}

// size bytes written with nobody reading must all be taken, then read back in order.
void writtenUnreadThenRead(const Backend *b, int c, int s, size_t size, uint8_t seed)
{
    const auto data = bytes(size, seed);
    ASSERT_EQ(writeUnread(b, c, data, 2000), data.size()) << "the buffers took less";
    std::vector<uint8_t> got;
    ASSERT_TRUE(readExactly(b, s, &got, data.size()));
    EXPECT_TRUE(got == data);
}

// One thread writes a 100 KB request and only then reads its answer (the peer reads only after
// the whole request was written).
TEST_P(Buffering, RequestWrittenBeforeTheReaderReads)
{
    auto [c, s] = connectedPair();
    ASSERT_GE(s, 0);
    writtenUnreadThenRead(b, c, s, 100 * 1024, 1);
}

// Both peers write 100 KB first, then read what the other wrote: with too little buffering both
// block in their writes for good.
TEST_P(Buffering, BothPeersWriteFirst)
{
    auto [c, s] = connectedPair();
    ASSERT_GE(s, 0);
    const auto up = bytes(100 * 1024, 2), down = bytes(100 * 1024, 3);
    size_t upSent = 0;
    std::thread t([&, c = c] { upSent = writeUnread(b, c, up, 2000); });
    const size_t downSent = writeUnread(b, s, down, 2000);
    t.join();
    ASSERT_EQ(upSent, up.size());
    ASSERT_EQ(downSent, down.size());
    std::vector<uint8_t> gotUp, gotDown;
    ASSERT_TRUE(readExactly(b, s, &gotUp, up.size()));
    ASSERT_TRUE(readExactly(b, c, &gotDown, down.size()));
    EXPECT_TRUE(gotUp == up);
    EXPECT_TRUE(gotDown == down);
}

// Half a megabyte unread (kernel TCP on loopback takes several), then every byte in order.
TEST_P(Buffering, HalfAMegabyteUnread)
{
    auto [c, s] = connectedPair();
    ASSERT_GE(s, 0);
    writtenUnreadThenRead(b, c, s, 512 * 1024, 4);
}

// An explicit SO_RCVBUF and SO_SNDBUF bound the buffering, as the kernel's do: the writer is
// held back well before half a megabyte, and what it wrote arrives whole.
TEST_P(Buffering, ExplicitBufferSizesBoundIt)
{
    auto [c, s] = connectedPair();
    ASSERT_GE(s, 0);
    ASSERT_EQ(setInt(c, SOL_SOCKET, SO_SNDBUF, 16 * 1024), 0);
    ASSERT_EQ(setInt(s, SOL_SOCKET, SO_RCVBUF, 16 * 1024), 0);
    const auto data = bytes(512 * 1024, 5);
    const size_t sent = writeUnread(b, c, data, 300);
    EXPECT_GT(sent, 0u);
    EXPECT_LT(sent, data.size());
    std::vector<uint8_t> got;
    ASSERT_TRUE(readExactly(b, s, &got, sent));
    EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin()));
}

// A peer that lives but never reads: a blocked send waits for as long as it lives, unless
// TCP_USER_TIMEOUT bounds it; then the send ends and the connection fails with ETIMEDOUT (Linux
// counts a zero window that lasts as data not taken).
TEST_P(Buffering, UserTimeoutEndsASendThePeerNeverTakes)
{
    auto [c, s] = connectedPair();
    ASSERT_GE(s, 0);
    EXPECT_EQ(setInt(c, IPPROTO_TCP, TCP_USER_TIMEOUT, -1), -1);
    EXPECT_EQ(errno, EINVAL);
    ASSERT_EQ(setInt(c, IPPROTO_TCP, TCP_USER_TIMEOUT, 300), 0);
    EXPECT_EQ(getInt(c, IPPROTO_TCP, TCP_USER_TIMEOUT), 300);
    // A bound for the test itself: without the user timeout a send would wait for good.
    timeval guard{10, 0};
    ASSERT_EQ(b->setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &guard, sizeof(guard)), 0);
    const auto data = bytes(64 * 1024, 6);
    const auto t0 = std::chrono::steady_clock::now();
    ssize_t r = 0;
    int err = 0;
    // Blocking sends until one fails: the buffers fill, then the peer takes nothing.
    while (msSince(t0) < 60000) {
        r = b->send(c, data.data(), data.size(), MSG_NOSIGNAL);
        if (r < 0) {
            err = errno;
            break;
        }
    }
    ASSERT_LT(r, 0) << "sends never failed";
    EXPECT_EQ(err, ETIMEDOUT);
    EXPECT_EQ(getInt(c, SOL_SOCKET, SO_ERROR), 0) << "the error was reported by the send";
    RecordProperty("ms_to_etimedout", std::to_string(msSince(t0)));
}

INSTANTIATE_TEST_SUITE_P(Backends, Buffering, ::testing::ValuesIn(kBackends), paramName);

} // namespace
