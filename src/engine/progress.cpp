// SPDX-License-Identifier: MIT
// The progress thread.

#include "progress.h"
#include "clock.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <thread>
#include <unistd.h>

#include "kernel.h"
#include "log.h"

namespace rstream {

ProgressThread &ProgressThread::instance()
{
    // Never destroyed: connections may be closed from other static destructors.
    static ProgressThread *thread = new ProgressThread();
    return *thread;
}

ProgressThread::ProgressThread()
{
    epollFd_ = sys::epollCreate1(EPOLL_CLOEXEC);
    if (epollFd_ < 0) {
        RS_LOG(Error, "progress thread: epoll_create1 failed (%s)", strerror(-epollFd_));
        epollFd_ = -1;
    }
    // A fork child has no progress thread, and shares the parent's epoll set: it must neither
    // add its connections to that set nor believe a thread serves them.
    pthread_atfork(
        [] {
            ProgressThread &t = ProgressThread::instance();
            t.listenersMutex_.lock();
            t.mutex_.lock();
            t.pendingMutex_.lock();
        },
        [] {
            ProgressThread &t = ProgressThread::instance();
            t.pendingMutex_.unlock();
            t.mutex_.unlock();
            t.listenersMutex_.unlock();
        },
        [] { ProgressThread::instance().afterFork(); });
}

void ProgressThread::afterFork()
{
    // The parent's connections and listeners are not ours to progress or destroy here.
    watched_.clear();
    listeners_.clear();
    for (auto &c : adopted_)
        (void)c.release();
    adopted_.clear();
    timers_.clear();
    byDeadline_.clear();
    pending_.clear();
    pendingMinNs_ = INT64_MAX;
    nextTimerNs_ = INT64_MAX;
    passiveNextNs_ = 0;
    if (epollFd_ >= 0)
        sys::close(epollFd_);
    epollFd_ = std::max(sys::epollCreate1(EPOLL_CLOEXEC), -1); // -1, not -errno: "none"
    if (eventFd_ >= 0)
        sys::close(eventFd_);
    eventFd_ = -1;
    started_.store(false, std::memory_order_release);
    pendingMutex_.unlock();
    mutex_.unlock();
    listenersMutex_.unlock();
}

namespace {
std::atomic<void (*)()> gBeforeExitDrain{nullptr};
} // namespace

void ProgressThread::setBeforeExitDrain(void (*fn)())
{
    gBeforeExitDrain.store(fn, std::memory_order_release);
}

void ProgressThread::start()
{
    if (started_.load(std::memory_order_relaxed))
        return;
    eventFd_ = sys::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (eventFd_ < 0) {
        RS_LOG(Error, "progress thread: eventfd failed (%s)", strerror(-eventFd_));
        eventFd_ = -1;
        return;
    }
    // The thread must not take the application's signals.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    try {
        std::thread([this] { run(); }).detach();
        started_.store(true, std::memory_order_release);
    } catch (...) {
        RS_LOG(Error, "progress thread: cannot start");
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    std::atexit([] {
        if (auto *fn = gBeforeExitDrain.load(std::memory_order_acquire))
            fn();
        ProgressThread::instance().drain(2000);
    });
}

void ProgressThread::watch(ProgressClient *conn, int64_t noneBeforeNs)
{
    std::lock_guard<std::mutex> lock(mutex_);
    start();
    if (std::find(watched_.begin(), watched_.end(), conn) == watched_.end())
        watched_.push_back(conn);
    // A thread that is not asleep looks at the list within a millisecond anyway; not waking it
    // saves a system call and a context switch per send in a ping-pong. Nor one whose timer
    // ends before it would have anything to do here: nginx with 200 clients re-watched each
    // connection at each answer (the thread had let it go after the last one's completion was
    // reaped), and woke the thread for it, only for the thread to set a timer.
    if (noneBeforeNs && asleep_ && sleepUntilNs_ <= noneBeforeNs)
        return;
    uint64_t one = 1;
    if (asleep_ && eventFd_ >= 0) {
        asleep_ = false;
        if (sys::write(eventFd_, &one, sizeof(one)) < 0) {
            // Already signalled.
        }
    }
}

void ProgressThread::watchListener(AcceptClient *listener)
{
    {
        std::lock_guard<std::mutex> lock(mutex_);
        start();
    }
    std::lock_guard<std::mutex> lock(listenersMutex_);
    if (std::find_if(listeners_.begin(), listeners_.end(), [listener](const auto &w) {
            return w.client == listener;
        }) == listeners_.end())
        listeners_.push_back({listener});
    uint64_t one = 1;
    if (eventFd_ >= 0 && sys::write(eventFd_, &one, sizeof(one)) < 0) {
        // Already signalled.
    }
}

void ProgressThread::unwatchListener(AcceptClient *listener)
{
    std::lock_guard<std::mutex> lock(listenersMutex_);
    std::erase_if(listeners_, [listener](const auto &w) { return w.client == listener; });
}

void ProgressThread::unwatch(ProgressClient *conn)
{
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase(watched_, conn);
}

void ProgressThread::addPassive(ProgressClient *conn, int fd)
{
    if (!started_.load(std::memory_order_acquire)) {
        std::lock_guard<std::mutex> lock(mutex_);
        start();
    }
    // Level-triggered: a connection whose words could not all be processed is seen again.
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = conn;
    if (epollFd_ < 0)
        return;
    const int r = sys::epollCtl(epollFd_, EPOLL_CTL_ADD, fd, &ev);
    if (r < 0 && r != -EEXIST)
        RS_LOG(Warn, "progress thread: cannot watch a connection (%s)", strerror(-r));
}

void ProgressThread::schedule(ProgressClient *conn, int64_t deadlineNs)
{
    queueTimer(conn, deadlineNs, false);
}

void ProgressThread::reschedule(ProgressClient *conn, int64_t deadlineNs)
{
    queueTimer(conn, deadlineNs, true);
}

void ProgressThread::queueTimer(ProgressClient *conn, int64_t deadlineNs, bool exact)
{
    if (!started_.load(std::memory_order_acquire)) {
        std::lock_guard<std::mutex> lock(mutex_);
        start();
    }
    // Queued under a leaf lock and merged by the thread, so that this may be called from
    // anywhere, the thread's own calls into connections included.
    std::lock_guard<std::mutex> lock(pendingMutex_);
    pending_.push_back({conn, deadlineNs, exact});
    // A deadline wakes the thread if it may be the earliest; a timer dropped (0) waits for
    // its next loop, which merges that before it looks at the timers.
    if (deadlineNs && deadlineNs < pendingMinNs_) {
        pendingMinNs_ = deadlineNs;
        uint64_t one = 1;
        if (eventFd_ >= 0 && sys::write(eventFd_, &one, sizeof(one)) < 0) {
            // Already signalled.
        }
    }
}

void ProgressThread::mergePendingLocked()
{
    std::lock_guard<std::mutex> lock(pendingMutex_);
    bool dropped = false;
    for (auto [conn, deadlineNs, exact] : pending_) {
        if (exact) {
            if (auto it = timers_.find(conn); it != timers_.end()) {
                byDeadline_.erase({it->second, conn});
                timers_.erase(it);
                dropped = true;
            }
            if (!deadlineNs)
                continue;
        }
        auto [it, added] = timers_.emplace(conn, deadlineNs);
        if (!added) {
            if (deadlineNs >= it->second)
                continue;
            byDeadline_.erase({it->second, conn});
            it->second = deadlineNs;
        }
        byDeadline_.emplace(deadlineNs, conn);
        nextTimerNs_ = std::min(nextTimerNs_, deadlineNs);
    }
    // A deadline dropped or moved later may have been the next one.
    if (dropped)
        nextTimerNs_ = byDeadline_.empty() ? INT64_MAX : byDeadline_.begin()->first;
    pending_.clear();
    pendingMinNs_ = INT64_MAX;
}

void ProgressThread::forget(ProgressClient *conn, int fd)
{
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase(watched_, conn);
    if (auto it = timers_.find(conn); it != timers_.end()) {
        byDeadline_.erase({it->second, conn});
        timers_.erase(it);
    }
    {
        std::lock_guard<std::mutex> pendingLock(pendingMutex_);
        std::erase_if(pending_, [conn](const auto &p) { return p.conn == conn; });
    }
    // Events are read and dispatched with mutex_ held, so none can name conn after this.
    if (fd >= 0 && epollFd_ >= 0)
        sys::epollCtl(epollFd_, EPOLL_CTL_DEL, fd, nullptr);
}

void ProgressThread::runTimersLocked(int64_t now)
{
    // Only the timers due; those that go on are put back after the walk (a deadline of now or
    // earlier would be taken again).
    std::vector<std::pair<int64_t, ProgressClient *>> again;
    while (!byDeadline_.empty() && byDeadline_.begin()->first <= now) {
        ProgressClient *c = byDeadline_.begin()->second;
        byDeadline_.erase(byDeadline_.begin());
        bool watch = false;
        const int64_t due = c->timerTick(now, &watch);
        if (watch && std::find(watched_.begin(), watched_.end(), c) == watched_.end())
            watched_.push_back(c);
        if (due == 0) {
            timers_.erase(c);
            continue;
        }
        timers_[c] = due;
        again.emplace_back(due, c);
    }
    byDeadline_.insert(again.begin(), again.end());
    nextTimerNs_ =
        byDeadline_.empty() ? INT64_MAX : std::max(byDeadline_.begin()->first, now + kTimerSlackNs);
}

void ProgressThread::runPassiveLocked()
{
    // Everything ready now, in batches: a round is rare, a backlog should not span several.
    epoll_event events[256];
    for (int batch = 0; batch < 16; batch++) {
        // An error (n < 0) ends the round as no events would.
        int n = sys::epollWait(epollFd_, events, 256, 0);
        for (int i = 0; i < n; i++) {
            auto *c = static_cast<ProgressClient *>(events[i].data.ptr);
            bool watch = false;
            if (!c->passiveProgress(&watch))
                sys::epollCtl(epollFd_, EPOLL_CTL_DEL, c->waitFd(), nullptr);
            if (watch && std::find(watched_.begin(), watched_.end(), c) == watched_.end())
                watched_.push_back(c);
        }
        if (n < 256)
            break;
    }
}

void ProgressThread::adopt(std::unique_ptr<ProgressClient> conn)
{
    ProgressClient *raw = conn.get();
    {
        std::lock_guard<std::mutex> lock(mutex_);
        adopted_.push_back(std::move(conn));
    }
    watch(raw);
}

void ProgressThread::drain(int timeoutMs)
{
    // Wait for closed connections to deliver their data, then briefly for their peers to
    // acknowledge, so exiting does not reset a peer that is still reading.
    using Clock = std::chrono::steady_clock;
    auto deadline = Clock::now() + std::chrono::milliseconds(timeoutMs);
    std::optional<Clock::time_point> ackDeadline;
    for (;;) {
        auto now = Clock::now();
        if (now >= deadline || (ackDeadline && now >= *ackDeadline))
            return;
        {
            // exit() may run from a signal handler that interrupted a holder of mutex_.
            std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
            if (!lock.owns_lock()) {
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
                continue;
            }
            if (adopted_.empty())
                return;
            if (!ackDeadline && std::all_of(adopted_.begin(), adopted_.end(),
                                            [](auto &c) { return c->closeDelivered(); }))
                ackDeadline = now + std::chrono::milliseconds(250);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
}

void ProgressThread::run()
{
    // Named for top -H, gdb and the tests (at most 15 characters).
    pthread_setname_np(pthread_self(), "rstream-prog");
    std::vector<pollfd> fds;
    std::vector<std::pair<AcceptClient *, size_t>> polledListeners; // and their fds' index
    std::vector<std::unique_ptr<ProgressClient>> finished;
    for (;;) {
        fds.clear();
        fds.push_back({eventFd_, POLLIN, 0});
        bool busy = false;
        int64_t wakeAt;
        int64_t listenersWakeAt = INT64_MAX;
        bool passiveOpen;
        polledListeners.clear();
        {
            // Not under mutex_: answering a request creates a connection, which watch()es.
            // A listener whose fd stayed quiet in the last poll is polled again as it is: its
            // EQ was read and armed after the last request, and a new one makes the fd readable
            // (a look was an EQ read and an fi_trywait, two system calls of the provider, for
            // each listener at every round: each millisecond while a connection had work).
            std::lock_guard<std::mutex> lock(listenersMutex_);
            for (WatchedListener &w : listeners_) {
                if (w.look)
                    w.fd = w.client->backgroundAccept(&listenersWakeAt);
                w.look = w.fd < 0; // not polled: looked at again at the next round
                if (w.fd >= 0) {
                    polledListeners.emplace_back(w.client, fds.size());
                    fds.push_back({w.fd, POLLIN, 0});
                }
            }
        }
        {
            std::lock_guard<std::mutex> lock(mutex_);
            // One timer check per loop; the list is walked only when a deadline has passed.
            mergePendingLocked();
            int64_t now = nowNs();
            if (now >= nextTimerNs_)
                runTimersLocked(now);
            wakeAt = std::min(nextTimerNs_, listenersWakeAt);
            passiveOpen = now >= passiveNextNs_ && epollFd_ >= 0;
            if (!passiveOpen)
                wakeAt = std::min(wakeAt, passiveNextNs_);
            for (size_t i = 0; i < watched_.size();) {
                ProgressClient *c = watched_[i];
                bool closedDone = false;
                int64_t recheckNs = INT64_MAX;
                int more = c->backgroundProgress(&closedDone, &recheckNs);
                if (closedDone) {
                    for (auto &a : adopted_) {
                        if (a.get() == c) {
                            finished.push_back(std::move(a));
                            break;
                        }
                    }
                    std::erase(adopted_, nullptr);
                    more = ProgressClient::kProgressDone;
                }
                if (!more) {
                    watched_[i] = watched_.back();
                    watched_.pop_back();
                    continue;
                }
                // A connection the application is working on is left to it for now; one that
                // waits for its peer wakes the thread through its wait fd alone.
                if (more == ProgressClient::kProgressMore || more == ProgressClient::kProgressIdle)
                    fds.push_back({c->waitFd(), POLLIN, 0});
                if (more == ProgressClient::kProgressLater)
                    wakeAt = std::min(wakeAt, recheckNs);
                else if (more != ProgressClient::kProgressIdle)
                    busy = true;
                i++;
            }
            if (passiveOpen)
                fds.push_back({epollFd_, POLLIN, 0});
            asleep_ = !busy;
            sleepUntilNs_ = wakeAt;
        }
        // Destroyed outside the lock: ~Connection calls forget().
        finished.clear();
        // While work is pending, look at least every millisecond: the provider may need
        // progress to push data into a socket without any fd becoming readable. Otherwise
        // sleep until the nearest deadline.
        int timeout = busy ? 1 : -1;
        if (wakeAt != INT64_MAX) {
            int64_t ms = std::clamp<int64_t>((wakeAt - nowNs() + 999999) / 1000000, 0, INT_MAX);
            if (timeout < 0 || ms < timeout)
                timeout = static_cast<int>(ms);
        }
        int n = sys::poll(fds.data(), fds.size(), timeout);
        if (n > 0 && !polledListeners.empty()) {
            std::lock_guard<std::mutex> lock(listenersMutex_);
            for (auto [client, at] : polledListeners) {
                if (!fds[at].revents)
                    continue;
                for (WatchedListener &w : listeners_)
                    if (w.client == client)
                        w.look = true;
            }
        }
        if (n > 0 && (fds[0].revents & POLLIN)) {
            uint64_t v;
            ssize_t r = sys::read(eventFd_, &v, sizeof(v));
            (void)r;
        }
        if (n > 0 && passiveOpen && (fds.back().revents & POLLIN)) {
            std::lock_guard<std::mutex> lock(mutex_);
            runPassiveLocked();
            passiveNextNs_ = nowNs() + kPassiveIntervalNs;
        }
    }
}

} // namespace rstream
