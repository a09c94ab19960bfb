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

// The receive ring: the peer's writes land at written, the application reads at consumed. A
// write that rewound to the ring's start (wire.h, kDataRewind) left the rest of the ring after
// the bytes before it as padding: [padAt, padAt + padLen), up to the ring's end, holds no
// data, and the bytes after it start at offset 0. One at a time: the peer's credit covers the
// padding until the reader passes it (padLen is 0 again then).
struct RecvRing : Ring
{
    uint64_t written = 0;
    uint64_t consumed = 0;
    uint64_t padAt = 0;
    uint64_t padLen = 0;

    uint64_t readable() const { return written - consumed - padLen; }
    // The readable bytes from consumed on that come before the padding (all without one).
    uint64_t readableToPad() const { return padLen ? padAt - consumed : readable(); }
    uint64_t readSpan() const { return std::min(readableToPad(), toEnd(consumed)); }
    // The bytes after the padding (0 without one): they start at offset 0.
    uint64_t readableAfterPad() const { return readable() - readableToPad(); }

    // A rewind at written: skip bytes of padding, passed at once when nothing before them is
    // unread. Returns the positions consumed by it (skip or 0), owed back to the peer.
    uint64_t pad(uint64_t skip)
    {
        const bool passed = consumed == written;
        if (!passed && skip) {
            padAt = written;
            padLen = skip;
        }
        written += skip;
        if (passed)
            consumed = written;
        return passed ? skip : 0;
    }
    // Consumes n readable bytes, passing the padding when they reach it. Returns the positions
    // moved (n, plus the padding passed), which are owed back to the peer.
    uint64_t consume(uint64_t n)
    {
        uint64_t moved = n;
        if (padLen && consumed + n >= padAt) {
            moved += padLen;
            padLen = 0;
        }
        consumed += moved;
        return moved;
    }
    // Everything written counts as read. Returns the positions moved.
    uint64_t discardAll()
    {
        const uint64_t moved = written - consumed;
        consumed = written;
        padLen = 0;
        return moved;
    }
};

} // namespace rstream
