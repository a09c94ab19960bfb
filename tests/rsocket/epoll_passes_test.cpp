// SPDX-License-Identifier: MIT
// The provider passes an emulated epoll wait costs a fabric server between requests: none for
// the look after an answer the kernel took whole, and a request that came meanwhile still seen.

#include <cstdint>
#include <sys/epoll.h>

#include <gtest/gtest.h>

#include "connection.h"
#include "epoll_fixture.h"
#include "provider_sends_hook.h"
#include "socket.h"

namespace rstream {
namespace {

using rstest_epoll::EpollReady;
using rstest_epoll::kModes;

// A server's round: the wait reports the request, the server reads it dry (its recv arms the
// member's connection without a pass) and answers with a byte, which the provider injects and
// the kernel takes whole (the executable's send reports it, as the preload shim's does). The
// look at the member in the next wait then needs no pass: nothing reached its wait fd since
// the last one (each request was a pass and a look before). In every other round the client's
// next request is already there at that look, which must report it. Unreported, the answer's
// send leaves the connection disarmed and the look makes a pass, as before.
TEST_P(EpollReady, ALookAfterAnAnswerMakesNoPass)
{
    if (GetParam().sameHost)
        GTEST_SKIP() << "a same-host link's look makes no provider pass";
    connectPairs(1);
    ASSERT_TRUE(parked(1));
    auto [c, s] = pairs_[0];
    std::shared_ptr<Connection> conn = s->connection();
    ASSERT_TRUE(conn);
    const int n = 40;
    int quiet[2] = {0, 0};
    for (const bool report : {true, false}) {
        test::gReportSends = report;
        bool pending = false; // the next request is there already
        for (int i = 0; i < n; i++) {
            SCOPED_TRACE(i);
            epoll_event out[4];
            if (!pending)
                sendByte(*c);
            ASSERT_EQ(set_->wait(out, 4, 5000, nullptr, 0), 1);
            char b = 0;
            iovec v{&b, 1};
            ASSERT_EQ(s->recv(&v, 1, 0), 1);
            ASSERT_EQ(s->send(&v, 1, 0), 1);
            pending = i % 2 == 1;
            if (pending)
                sendByte(*c); // on loopback, in the server's socket when send returns
            const uint64_t before = conn->progressCalls();
            const int got = set_->wait(out, 4, 0, nullptr, 0);
            if (pending) {
                EXPECT_EQ(got, 1) << "a request that came after the answer was not reported";
            } else {
                EXPECT_EQ(got, 0);
                quiet[report] += conn->progressCalls() == before;
            }
            ASSERT_EQ(c->recv(&v, 1, 0), 1); // the answer
            if (pending && got == 1) {
                // Reported already: read now, answered in the next round's wait-less start.
                ASSERT_EQ(s->recv(&v, 1, 0), 1);
                ASSERT_EQ(s->send(&v, 1, 0), 1);
                ASSERT_EQ(c->recv(&v, 1, 0), 1);
                pending = false;
            }
        }
    }
    test::gReportSends = true;
    RecordProperty("looks_without_pass_reported", quiet[1]);
    RecordProperty("looks_without_pass_unreported", quiet[0]);
    EXPECT_GE(quiet[1], n / 2 * 9 / 10) << "looks after answers the kernel took whole made passes";
    EXPECT_EQ(quiet[0], 0) << "a look after an unverified answer made no pass";
}

INSTANTIATE_TEST_SUITE_P(Modes, EpollReady, ::testing::ValuesIn(kModes),
                         [](const auto &p) { return std::string(p.param.name); });

} // namespace
} // namespace rstream
