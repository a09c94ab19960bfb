// SPDX-License-Identifier: MIT
// The same-host tests' fixture: engine connections over the tcp provider with the same-host
// transport allowed at both ends.
#pragma once

#include "engine_fixture.h"

namespace rstream {

class SameHostTest : public EngineTest
{
protected:
    Settings settings() const
    {
        Settings s;
        s.provider = "tcp";
        s.sameHost = true;
        return s;
    }
    auto pair() { return EngineTest::pair(settings(), settings()); }
    // A pair with "0123456789" sent from the accepted end and "0123" of it read: six bytes in
    // flight, so that a word a test makes the peer write can move back as well as ahead.
    auto pairWithSixInFlight()
    {
        auto p = pair();
        if (p.first && p.second) {
            char buf[4];
            EXPECT_EQ(p.second->send("0123456789", 10), 10);
            EXPECT_EQ(p.first->recv(buf, 4, kWaitAll, 5000), 4);
        }
        return p;
    }
};

} // namespace rstream
