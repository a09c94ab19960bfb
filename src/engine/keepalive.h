// SPDX-License-Identifier: MIT
// The keepalive state machine: settings, probes unanswered, and the next deadline as a function
// of time and words received. Pure logic; the connection sends the probes and fails.
#pragma once

#include <cstdint>

namespace rstream {

class KeepaliveTimer
{
public:
    static constexpr int64_t kSec = 1000000000;

    // What tick() asks the connection to do now.
    enum class Action
    {
        None,
        Probe, // send a KEEPALIVE (counted as sent and unanswered already)
        Fail,  // count probes went unanswered: the connection fails with ETIMEDOUT
    };

    // Linux's bounds for TCP_KEEPIDLE, TCP_KEEPINTVL and TCP_KEEPCNT (0: keep the current one).
    static bool valid(int idleSec, int intervalSec, int count)
    {
        return idleSec >= 0 && idleSec <= 32767 && intervalSec >= 0 && intervalSec <= 32767 &&
               count >= 0 && count <= 127;
    }

    // Takes valid() values; now is only read when on.
    void configure(bool on, int idleSec, int intervalSec, int count, int64_t now)
    {
        if (idleSec)
            idle_ = idleSec;
        if (intervalSec)
            interval_ = intervalSec;
        if (count)
            count_ = count;
        bool was = on_;
        on_ = on;
        if (on && !was) {
            // As on Linux, the idle time counts from when keepalive is switched on.
            lastRxNs_ = now;
            unanswered_ = 0;
        }
    }

    bool on() const { return on_; }
    int idleSec() const { return idle_; }
    int intervalSec() const { return interval_; }
    int count() const { return count_; }
    uint32_t unanswered() const { return unanswered_; }
    uint64_t sent() const { return sent_; }

    // A word arrived. Noted without reading the clock: only keepalive needs the time, and
    // takeWord() tells the caller whether to read it.
    void noteWord() { wordSeen_ = true; }
    bool takeWord()
    {
        bool seen = wordSeen_;
        wordSeen_ = false;
        return seen;
    }
    // Any word from the peer is an answer.
    void onRx(int64_t now)
    {
        lastRxNs_ = now;
        unanswered_ = 0;
    }
    // The connection is established: the idle time counts from now. The deadline.
    int64_t start(int64_t now)
    {
        lastRxNs_ = now;
        return lastRxNs_;
    }

    // On a connected connection with keepalive on: what to do at now, and the next deadline
    // (0: none, after Fail).
    int64_t tick(int64_t now, Action *action)
    {
        *action = Action::None;
        if (unanswered_ == 0) {
            int64_t due = lastRxNs_ + int64_t(idle_) * kSec;
            if (now < due)
                return due;
        } else {
            int64_t due = lastProbeNs_ + int64_t(interval_) * kSec;
            if (now < due)
                return due;
            if (unanswered_ >= uint32_t(count_)) {
                *action = Action::Fail;
                return 0;
            }
        }
        // A probe that cannot be queued (no credit, no queue entry: the peer returns none) counts
        // as unanswered all the same, as TCP counts probes into a zero window.
        *action = Action::Probe;
        unanswered_++;
        sent_++;
        lastProbeNs_ = now;
        return now + int64_t(interval_) * kSec;
    }

private:
    // TCP's defaults.
    bool on_ = false;
    int idle_ = 7200;
    int interval_ = 75;
    int count_ = 9;
    bool wordSeen_ = false;   // a word arrived since lastRxNs_ was taken
    int64_t lastRxNs_ = 0;    // when a word last arrived (with keepalive on)
    int64_t lastProbeNs_ = 0; // when the last probe went
    uint32_t unanswered_ = 0;
    uint64_t sent_ = 0;
};

} // namespace rstream
