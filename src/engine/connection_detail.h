// SPDX-License-Identifier: MIT
// Constants and helpers shared by the source files of Connection (not part of its interface).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <sys/uio.h>

#include "clock.h"
#include "connection.h"
#include "wire.h"

namespace rstream {

// waitFor(): the send ring is empty (it may grow).
constexpr int kSendDrained = 1 << 8;
// waitFor(): every window withdrawal queued so far is answered, or the connection is down.
constexpr int kWithdrawn = 1 << 10;

// The spin cap of a blocking wait for events. A wait only for room (a blocking send, a drain,
// a connect) spins only when the peer reads what is queued within a wake-up's time (RoomRate:
// sent, and queued, the bytes it has not read yet); else it sleeps at once.
inline int64_t spinCapNs(int events, uint32_t pollUs, RoomRate *room, uint64_t sent,
                         uint64_t queued)
{
    const int64_t capNs = int64_t(pollUs) * 1000;
    if (events & ~(kWritable | kSendDrained))
        return capNs;
    return room->spin(sent, queued, nowNs()) ? capNs : 0;
}

inline int64_t deadlineFor(int timeoutMs)
{
    return timeoutMs < 0 ? 0 : nowNs() + int64_t(timeoutMs) * 1000000;
}

inline size_t alignUp(size_t v, size_t a)
{
    return (v + a - 1) & ~(a - 1);
}

inline size_t iovTotal(const iovec *iov, int iovcnt)
{
    size_t total = 0;
    for (int i = 0; i < iovcnt; i++)
        total += iov[i].iov_len;
    return total;
}

// Copies len bytes between a ring region starting at ring offset off and the iovec array,
// starting iovSkip bytes into it. toRing: from the iovecs into the ring.
inline void copyRing(uint8_t *ring, uint64_t ringSize, uint64_t off, const iovec *iov, int iovcnt,
                     size_t iovSkip, size_t len, bool toRing)
{
    int i = 0;
    while (i < iovcnt && iovSkip >= iov[i].iov_len)
        iovSkip -= iov[i++].iov_len;
    while (len > 0 && i < iovcnt) {
        size_t n = std::min<size_t>({len, iov[i].iov_len - iovSkip, ringSize - off});
        uint8_t *user = static_cast<uint8_t *>(iov[i].iov_base) + iovSkip;
        if (toRing)
            std::memcpy(ring + off, user, n);
        else
            std::memcpy(user, ring + off, n);
        len -= n;
        off = (off + n) % ringSize;
        iovSkip += n;
        if (iovSkip == iov[i].iov_len) {
            iovSkip = 0;
            i++;
        }
    }
}

constexpr uint32_t kTxReserve = 2; // queue entries kept for control sends
constexpr uint64_t kCoalesceMax = 16 * 1024;
// The most a write may carry whole, past the ring's chunk size, when all of it fits the peer's
// ring and nothing is in flight (flushLocked).
constexpr uint64_t kWholeWriteMax = 64 * 1024;
// The largest write that rewinds to the start of the peer's ring whenever it fits there
// (flushLocked): a larger one only where it would otherwise be cut at the ring's end.
constexpr uint64_t kRewindMax = 16 * 1024;
// A receive slot that can take an IOMAP message: in iWarp mode the word and then the record.
constexpr size_t kRecordMsgBytes = sizeof(uint32_t) + wire::kIoMapRecordSize;
constexpr size_t kRecordSlotBytes = (kRecordMsgBytes + 7) & ~size_t(7);

// When an idle ring's timer is due: idleMs from now, rounded up onto a grid of an eighth of it
// (250 ms at the default). The timers of thousands of connections that went quiet at different
// moments then fall due together, a few wake-ups of the progress thread a second instead of one
// every ProgressThread::kTimerSlackNs.
inline int64_t ringDueAfter(int64_t now, int64_t idleMs)
{
    const int64_t grain = std::clamp<int64_t>(idleMs * 1000000 / 8, 1000000, 250 * 1000000);
    const int64_t due = now + idleMs * 1000000;
    return (due + grain - 1) / grain * grain;
}

constexpr int kMaxBatches = 8;
// progressLocked() calls per passive-set wake-up at most (passiveProgress()).
constexpr int kPassiveRounds = 32;
constexpr uint32_t kEqInterval = 16;
// The progress thread leaves a connection to the application for this long after the
// application last made progress on it: racing it for the lock and the CQ only costs both
// wake-ups, and on few cores the CPU the application or its peer needs.
constexpr int64_t kAppIdleNs = 1000000;
// A look at a connection already readable and writable makes progress at most this often.
constexpr int64_t kLookProgressNs = 50000;
// When all that is left is to learn that injected writes left the provider (they did, unless its
// socket was full), the thread waits longer: its KEEPALIVE costs both ends a message and the peer
// a wake-up, and a client whose requests are injected went quiet after every one of them for
// longer than kAppIdleNs whenever its server took that long to answer.
constexpr int64_t kInjectIdleNs = 20000000;
// A nonblocking read this soon after the one that read the ring dry answers EAGAIN without a
// pass (rx.cpp): a client's send and its read right after it, not a reader that comes back later.
constexpr int64_t kDryReadNs = 500000;
// The progress thread's passive round leaves alone a connection whose application made
// progress on it this recently (keepalive.cpp).
constexpr int64_t kPassiveAppNs = 10000000;

} // namespace rstream
