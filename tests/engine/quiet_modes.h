// SPDX-License-Identifier: MIT
// Which modes and libfabric versions the tests of the tcp provider's quiet wait fd apply to.
#pragma once

#include "fabric.h"

namespace rstream::test {

// libfabric 1.16 and 1.17's tcp provider takes its completion signal out of the wait fd once a
// pass has read the CQ (quiet_signal.cpp).
inline bool quietProvider()
{
    const uint32_t v = fabricLibraryVersion();
    return v && FI_MAJOR(v) == 1 && FI_MINOR(v) >= 16 && FI_MINOR(v) <= 17;
}

// Why a test of injected answers on a quiet wait fd does not apply to a mode, or null.
template <typename Mode>
const char *notInjectedQuiet(const Mode &m)
{
    if (m.sameHost || m.strict || m.iwarp)
        return "the default mode covers it (strict: no wait set; iwarp: no inject)";
    return quietProvider() ? nullptr : "the signal stays in the wait fd on this libfabric";
}

} // namespace rstream::test
