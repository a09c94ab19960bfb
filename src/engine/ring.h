// SPDX-License-Identifier: MIT
// Ring arithmetic. Positions are 64-bit byte counts of the stream that never wrap; a ring of
// `size` bytes maps position p to offset p % size. Chunks never straddle the end of a ring.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace rstream {

struct Ring
{
    uint64_t size = 0;

    uint64_t offset(uint64_t pos) const { return pos % size; }
    // Bytes from pos to the end of the ring.
    uint64_t toEnd(uint64_t pos) const { return size - offset(pos); }
};

// The send ring: the application appends at tail, chunks are posted from posted, and space is
// released at done when their writes complete. done <= posted <= tail <= done + size.
struct SendRing : Ring
{
    uint64_t tail = 0;
    uint64_t posted = 0;
    uint64_t done = 0;

    uint64_t freeSpace() const { return size - (tail - done); }
    uint64_t unsent() const { return tail - posted; }
    uint64_t inFlight() const { return posted - done; }
    // Less than a third free: a poller asked for POLLOUT waits (socket_io.cpp's criterion).
    bool shortOfRoom() const { return freeSpace() * 3 < size; }
    // Contiguous free bytes at tail (the first of at most two spans).
    uint64_t appendSpan() const { return std::min(freeSpace(), toEnd(tail)); }
};

// The receive ring: the peer's writes land at written, the application reads at consumed.
struct RecvRing : Ring
{
    uint64_t written = 0;
    uint64_t consumed = 0;

    uint64_t readable() const { return written - consumed; }
    uint64_t readSpan() const { return std::min(readable(), toEnd(consumed)); }
};

} // namespace rstream
