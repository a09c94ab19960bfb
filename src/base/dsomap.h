// SPDX-License-Identifier: MIT
// Where a code address lies (which loaded object, at which offset), from a signal handler.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rstream::dsomap {

// Records the objects loaded now. Takes the loader's lock (dl_iterate_phdr): call it when the
// crash handler is installed, never from the handler.
void snapshot();
// The object holding addr, copied into name, and addr's offset in it (what addr2line takes):
// from the snapshot, else from /proc/self/maps. Async-signal-safe: no malloc, no locks, plain
// system calls. false when no mapping holds addr.
bool lookup(uintptr_t addr, char *name, size_t cap, uintptr_t *rel);

} // namespace rstream::dsomap
