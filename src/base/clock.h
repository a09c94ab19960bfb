// SPDX-License-Identifier: MIT
// The monotonic clock, in the units the engine's deadlines use.
#pragma once

#include <cstdint>
#include <ctime>

namespace rstream {

inline int64_t nowNs()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

inline int64_t nowMs()
{
    return nowNs() / 1000000;
}

} // namespace rstream
