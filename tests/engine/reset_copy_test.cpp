// SPDX-License-Identifier: MIT
// A RESET handled on another thread while recv() copies out of the receive rings: the reader
// gets the bytes the peer sent, or an error, never the zeros of ring pages handed back.

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "engine_fixture.h"

using namespace rstream;

namespace {

std::unique_ptr<Connection> gPeer; // the writer, aborted from inside the reader's recv
std::atomic<int> gHookRuns{0};

// Runs in recv() between choosing the bytes and copying them: the peer resets, and this thread
// (not holding the connection's lock here) makes the reader's connection take the RESET, as the
// progress thread or a poller on another thread would.
void resetDuringCopy(Connection *reader)
{
    if (gHookRuns++ || !gPeer)
        return;
    Connection::abort(std::move(gPeer));
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (reader->peekSend() != -ECONNRESET && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

using ResetCopy = EngineTest;

TEST_P(ResetCopy, RecvReturnsThePeersBytesOrAnErrorNeverZeros)
{
    if (GetParam().strict)
        GTEST_SKIP() << "rings keep their size where registration pins memory: no old ring";
    if (GetParam().sameHost)
        GTEST_SKIP() << "same-host rings keep their size: no old ring";
    auto [c, s] = pair();
    ASSERT_TRUE(c && s);
    // More than the first ring, unread: the ring fills, the reader's side moves the peer to a
    // bigger one, and the first ring (the old one now) holds its bytes until they are read.
    const size_t first = s->info().recvBuf, size = first + first / 2;
    std::vector<uint8_t> data(size);
    for (size_t i = 0; i < size; i++)
        data[i] = static_cast<uint8_t>(1 + i % 251); // never zero
    ASSERT_EQ(c->send(data.data(), size, 0, 10000), ssize_t(size));
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (s->peekRecv() < ssize_t(size) && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_EQ(s->peekRecv(), ssize_t(size));
    ASSERT_GT(s->info().recvGrowths, 0u) << "the test needs the old ring";

    gPeer = std::move(c);
    gHookRuns = 0;
    Connection::testBeforeRecvCopy = resetDuringCopy;
    std::vector<uint8_t> got(size);
    const ssize_t r = s->recv(got.data(), size, 0, 5000);
    Connection::testBeforeRecvCopy = nullptr;
    EXPECT_EQ(gHookRuns.load(), 1);
    EXPECT_EQ(gPeer, nullptr) << "the peer was not reset";
    if (r > 0) {
        for (ssize_t i = 0; i < r; i++)
            ASSERT_EQ(got[i], data[i]) << "byte " << i << " of " << r;
    } else {
        EXPECT_EQ(r, -ECONNRESET);
    }
    // After the RESET: the error, no more data.
    EXPECT_EQ(s->recv(got.data(), size, 0, 1000), -ECONNRESET);
}

INSTANTIATE_TEST_SUITE_P(Modes, ResetCopy, ::testing::ValuesIn(kModes),
                         [](const auto &p) { return std::string(p.param.name); });

} // namespace
