// SPDX-License-Identifier: MIT
// The library's version string.

#include "config.h"

#include <rstream/version.h>

extern "C" __attribute__((visibility("default"))) const char *rstream_version(void) noexcept
{
    return RSTREAM_VERSION;
}
