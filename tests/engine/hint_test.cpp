// SPDX-License-Identifier: MIT
// Readiness hints: a poller's look at a quiet connection makes no progress call, and nothing
// that arrives is missed for it (Connection::hintFd, HintPass, hintQuiet).

#include <poll.h>

#include "engine_fixture.h"

namespace rstream {
namespace {

using HintTest = EngineTest;

// One poller pass over c, as the socket layer's poll and epoll make it: the armed wait fd is
// checked first, and the look follows in the same pass.
void pass(Connection &c, ssize_t *recv, ssize_t *send)
{
    Connection::HintPass p;
    if (const int fd = c.hintFd(); fd >= 0) {
        pollfd pf{fd, POLLIN, 0};
        if (poll(&pf, 1, 0) == 0)
            c.hintQuiet();
    }
    c.peek(recv, send);
}

TEST_P(HintTest, QuietLooksMakeNoProgressCall)
{
    auto [c, s] = pair();
    ASSERT_TRUE(c && s);
    ssize_t r, w;
    // The first look makes progress and arms; the next thousand find the fd quiet.
    pass(*s, &r, &w);
    EXPECT_EQ(r, -EAGAIN);
    ASSERT_GE(s->hintFd(), 0) << "an idle connection is armed after a look";
    const uint64_t before = s->progressCalls();
    for (int i = 0; i < 1000; i++) {
        pass(*s, &r, &w);
        ASSERT_EQ(r, -EAGAIN);
        ASSERT_GT(w, 0);
    }
    EXPECT_LE(s->progressCalls() - before, 5u) << "looks at an idle connection made progress";
    // A look outside a pass, or in a pass that did not find the fd quiet, makes progress.
    s->peek(&r, &w);
    {
        Connection::HintPass p;
        s->peek(&r, &w);
    }
    EXPECT_GE(s->progressCalls() - before, 2u);
}

TEST_P(HintTest, WhatArrivesAfterArmingIsSeen)
{
    auto [c, s] = pair();
    ASSERT_TRUE(c && s);
    ssize_t r, w;
    for (int round = 0; round < 50; round++) {
        pass(*s, &r, &w);
        ASSERT_EQ(r, -EAGAIN) << "round " << round;
        ASSERT_GE(s->hintFd(), 0);
        ASSERT_EQ(c->send("x", 1), 1);
        // Bounded: the byte must show within 5 s of passes, as a poller's next look.
        for (int i = 0; i < 5000 && r == -EAGAIN; i++) {
            pass(*s, &r, &w);
            if (r == -EAGAIN) {
                pollfd pf{s->waitFd(), POLLIN, 0};
                poll(&pf, 1, 1);
            }
        }
        ASSERT_EQ(r, 1) << "round " << round;
        char b;
        ASSERT_EQ(s->recv(&b, 1, kNonBlock), 1);
    }
    // The end of the stream too.
    pass(*s, &r, &w);
    ASSERT_EQ(c->shutdown(SHUT_WR), 0);
    for (int i = 0; i < 5000 && r == -EAGAIN; i++) {
        pass(*s, &r, &w);
        if (r == -EAGAIN) {
            pollfd pf{s->waitFd(), POLLIN, 0};
            poll(&pf, 1, 1);
        }
    }
    EXPECT_EQ(r, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, HintTest, ::testing::ValuesIn(kModes),
                         [](const auto &p) { return std::string(p.param.name); });

} // namespace
} // namespace rstream
