// SPDX-License-Identifier: MIT
// Adaptive spin-then-block: how long a wait spins before it sleeps, learnt from earlier waits.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace rstream {

// A wait that spins catches what comes within its window without a sleep and a wake-up (on
// these machines a cross-CPU wake-up alone takes tens of microseconds), but every wait that
// outlasts the window burns the whole window for nothing. So the window follows the waits:
// one that ended within the cap (RSTREAM_POLL_US) sets it to twice its length, so a ping-pong
// spins through its round trips; one that outlasted the cap by more than a wake-up's worth
// (kWakeSlackNs: a wait that slept is measured with its wake-up, which a spin would have saved),
// or that spun the whole cap and still slept, halves it, so a server that sees a request every
// millisecond, or every 100 us, or an idle one, soon sleeps at once. Every kProbeEvery-th wait
// spins the whole cap, so a falling window can learn that waits got short again even where
// its sleeps' wake-ups alone push every measured wait past the cap. Once the window is 0, a
// probe that missed makes them come half as often, down to one wait in kProbeMax; one that
// caught its event brings them back to every kProbeEvery-th: a server with a request every
// millisecond spun a sixteenth of the cap a request (3 us of its 21 us a request here), and
// now spins a 256th of it once its probes have missed four times.
//
// Relaxed atomics: the pollers of one epoll set may share one; a lost update only makes one
// window a little off.
class AdaptiveSpin
{
public:
    static constexpr uint32_t kProbeEvery = 16;
    static constexpr uint32_t kProbeMax = 256; // a power of two, as kProbeEvery
    static constexpr int64_t kFloorNs = 1000;  // below this a window is no window
    // A cross-CPU wake-up takes tens of microseconds on a shared machine: a wait that slept
    // this much past the cap may have ended within it.
    static constexpr int64_t kWakeSlackNs = 100000;

    // The spin for the wait starting now, in ns, with the cap in ns (0: never spin).
    int64_t windowNs(int64_t capNs)
    {
        if (capNs <= 0)
            return 0;
        const uint32_t n = waits_.fetch_add(1, std::memory_order_relaxed);
        const uint32_t every = probeEvery_.load(std::memory_order_relaxed);
        if (n % every == every - 1)
            return capNs;
        const int64_t w = window_.load(std::memory_order_relaxed);
        return w < 0 ? capNs : std::min(w, capNs); // < 0: nothing learnt yet, spin as before
    }

    // A wait whose first look found nothing ended after waitedNs: ready, or timed out. spunNs:
    // the window it spun before sleeping. One that spun the whole cap and still slept saw
    // nothing come within the cap (its looks would have caught it), however soon its wake-up
    // came: a client that connects every 100 us kept a server spinning 50 us for each
    // connection in vain, its waits never past the cap by a wake-up's worth.
    void record(int64_t waitedNs, int64_t capNs, int64_t spunNs = 0)
    {
        if (capNs <= 0)
            return;
        int64_t w = window_.load(std::memory_order_relaxed);
        if (w < 0)
            w = capNs;
        if (waitedNs <= capNs)
            w = std::min(capNs, std::max(w, 2 * waitedNs));
        else if (waitedNs > capNs + kWakeSlackNs || spunNs >= capNs)
            w = w / 2 < kFloorNs ? 0 : w / 2;
        window_.store(w, std::memory_order_relaxed);
        if (spunNs >= capNs) {
            // Only where the probes are all that still spins: while the window is not 0, they
            // are also what shrinks it (a wait past the cap that spun less is no evidence).
            const uint32_t every = probeEvery_.load(std::memory_order_relaxed);
            probeEvery_.store(waitedNs <= capNs || w > 0 ? kProbeEvery
                                                         : std::min(2 * every, kProbeMax),
                              std::memory_order_relaxed);
        }
    }

    // One wait in this many spins the whole cap (tests).
    uint32_t probeEvery() const { return probeEvery_.load(std::memory_order_relaxed); }

    int64_t currentNs() const { return window_.load(std::memory_order_relaxed); }

private:
    std::atomic<int64_t> window_{-1};
    std::atomic<uint32_t> waits_{0};
    std::atomic<uint32_t> probeEvery_{kProbeEvery};
};

// Whether a writer that ran out of room should spin for more, asked once as each wait for room
// begins. Room comes as the peer reads. A small-write stream (iperf3 -l 64) is read slowly:
// what is queued keeps the reader busy for milliseconds, and a spin that caught each piece of
// room burnt a CPU (88 % of one, against 25 % sleeping) for writes no bigger. A fast stream
// (1 MiB writes) is read in microseconds: a sleep's wake-up outlasts the queue and the reader
// runs dry (same-host 1 MiB: 15-30 % slower sleeping). So: spin when the peer, at the rate it
// read since the previous wait for room, reads what is queued within a wake-up's time.
// Relaxed atomics: concurrent writers on one connection only make the estimate rougher.
class RoomRate
{
public:
    // sent: the bytes sent so far; queued: those the peer has not read yet.
    bool spin(uint64_t sent, uint64_t queued, int64_t nowNs)
    {
        const int64_t dt = nowNs - lastNs_.exchange(nowNs, std::memory_order_relaxed);
        const uint64_t ds = sent - lastSent_.exchange(sent, std::memory_order_relaxed);
        // queued / (ds / dt) < kWakeSlackNs, in doubles: bytes times ns overflow 64 bits.
        return dt > 0 && double(queued) * double(dt) < double(AdaptiveSpin::kWakeSlackNs) * ds;
    }

private:
    std::atomic<int64_t> lastNs_{0};
    std::atomic<uint64_t> lastSent_{0};
};

} // namespace rstream
