// SPDX-License-Identifier: MIT
// libfabric, loaded on first use (see fiload.cpp): fi_getinfo, fi_freeinfo, fi_dupinfo,
// fi_fabric and fi_strerror are defined by the engine and load it.
#pragma once

namespace rstream {

// Loads libfabric if that has not been tried yet; false when it cannot be loaded (the fabric
// calls then fail with FI_ENOSYS, and the shim keeps every socket on kernel TCP).
bool fabricLoaded();

} // namespace rstream
