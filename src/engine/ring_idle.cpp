// SPDX-License-Identifier: MIT
// Idle send rings give their pages back: a connection quiet for Settings::ringIdleMs with
// nothing in its send ring lets the kernel reclaim them (MADV_DONTNEED); backed again as used.

#include "connection.h"
#include "connection_detail.h"

#include <sys/mman.h>
#include <unistd.h>

#include "clock.h"
#include "progress.h"

namespace rstream {

namespace {

// The whole pages of [base, base + len): a ring's first and last pages may hold other data.
bool wholePages(uint8_t *base, size_t len, uint8_t **start, size_t *bytes)
{
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const auto b = reinterpret_cast<uintptr_t>(base);
    const uintptr_t s = (b + page - 1) / page * page;
    const uintptr_t e = (b + len) / page * page;
    if (e <= s)
        return false;
    *start = reinterpret_cast<uint8_t *>(s);
    *bytes = e - s;
    return true;
}

void release(uint8_t *base, size_t len)
{
    uint8_t *start;
    size_t bytes;
    if (wholePages(base, len, &start, &bytes))
        madvise(start, bytes, MADV_DONTNEED);
}

size_t resident(uint8_t *base, size_t len)
{
    uint8_t *start;
    size_t bytes;
    if (!base || !wholePages(base, len, &start, &bytes))
        return 0;
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> vec(bytes / page);
    if (mincore(start, bytes, vec.data()) != 0)
        return 0;
    size_t n = 0;
    for (unsigned char v : vec)
        n += v & 1;
    return n * page;
}

} // namespace

uint64_t Connection::bytesMovedLocked() const
{
    return bytesSent_.load(std::memory_order_relaxed) +
           bytesReceived_.load(std::memory_order_relaxed);
}

void Connection::armRingTimerLocked()
{
    // Called on the application's progress: one branch and two loads while nothing changes.
    if (ringTimerArmed_ || !ringRelease_)
        return;
    const uint64_t moved = bytesMovedLocked();
    if (moved == ringStamp_)
        return; // nothing moved since the last release: nothing new to give back
    ringTimerArmed_ = true;
    ringStamp_ = moved;
    ringDueNs_ = ringDueAfter(nowNs(), settings_.ringIdleMs);
    ProgressThread::instance().schedule(this, ringDueNs_);
}

int64_t Connection::ringTickLocked(int64_t now)
{
    if (!ringTimerArmed_)
        return 0;
    if (now < ringDueNs_)
        return ringDueNs_;
    const uint64_t moved = bytesMovedLocked();
    if (moved != ringStamp_) {
        // Bytes moved in the interval: look again one interval after this.
        ringStamp_ = moved;
        ringDueNs_ = ringDueAfter(now, settings_.ringIdleMs);
        return ringDueNs_;
    }
    ringTimerArmed_ = false; // re-armed by the next bytes the application moves
    if (state_ != State::Connected || error_ || !mem_)
        return 0;
    bool released = false;
    // Not the receive ring: empty as it looks, it may hold the first part of a peer's write
    // whose rest has not arrived yet (the tcp provider places a write as its socket delivers
    // it, and announces it at the end), which giving the pages back would zero; an outage in
    // the middle of a transfer did that (e2e_netns_outage). Only the peer knows.
    // The send ring: every byte sent and completed, and no sender copying into it (senders copy
    // under sendMutex_ without this lock).
    if (tx_.tail == tx_.done && !corkHeld_) {
        std::unique_lock<std::mutex> send(sendMutex_, std::try_to_lock);
        if (send.owns_lock()) {
            release(sendBase_, tx_.size);
            released = true;
        }
    }
    if (released)
        ringReleases_.fetch_add(1, std::memory_order_relaxed);
    return 0;
}

size_t Connection::ringResidentLocked()
{
    return resident(sendBase_, tx_.size) + resident(recvBase_, rx_.size);
}

size_t Connection::ownMemoryBytes()
{
    std::lock_guard<std::mutex> lock(mutex_);
    size_t n = sizeof(*this) + windows_.memoryBytes();
    if (shOn_.load(std::memory_order_relaxed))
        return n + sh_->residentBytes();
    return n + resident(mem_, memSize_) + txOps_.cap() * sizeof(TxOp) + rxCount_ * sizeof(RxSlot);
}

size_t Connection::ringResidentBytes()
{
    std::lock_guard<std::mutex> lock(mutex_);
    if (shOn_.load(std::memory_order_relaxed))
        return sh_->residentBytes();
    return ringResidentLocked();
}

} // namespace rstream
