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
};

} // namespace rstream
