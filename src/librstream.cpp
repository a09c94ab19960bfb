// SPDX-License-Identifier: MIT
// librstream.so: the exported C API. Every entry point converts the engine's -errno once.
// The exported set is defined by librstream.map; the engine archive is linked whole.
