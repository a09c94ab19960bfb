// SPDX-License-Identifier: MIT
// librstream_preload.so entry points. The interposers arrive with the shim; until then the
// library loads into any program and changes nothing.

#include <rstream/version.h>

namespace {
[[maybe_unused]] const auto keep_version = &rstream_version;
}
