// SPDX-License-Identifier: MIT
// The progress thread.

#include "progress.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <thread>
#include <unistd.h>

#include "connection.h"
#include "log.h"

namespace rstream {

ProgressThread &ProgressThread::instance()
{
    // Never destroyed: connections may be closed from other static destructors.
    static ProgressThread *thread = new ProgressThread();
    return *thread;
}

ProgressThread::ProgressThread() = default;

void ProgressThread::start()
{
    if (started_)
        return;
    eventFd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (eventFd_ < 0) {
        RS_LOG(Error, "progress thread: eventfd failed");
        return;
    }
    // The thread must not take the application's signals.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    try {
        std::thread([this] { run(); }).detach();
        started_ = true;
    } catch (...) {
        RS_LOG(Error, "progress thread: cannot start");
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    std::atexit([] { ProgressThread::instance().drain(2000); });
}

void ProgressThread::watch(Connection *conn)
{
    std::lock_guard<std::mutex> lock(mutex_);
    start();
    if (std::find(watched_.begin(), watched_.end(), conn) == watched_.end())
        watched_.push_back(conn);
    // A thread that is not asleep looks at the list within a millisecond anyway; not waking it
    // saves a system call and a context switch per send in a ping-pong.
    uint64_t one = 1;
    if (asleep_ && eventFd_ >= 0) {
        asleep_ = false;
        if (::write(eventFd_, &one, sizeof(one)) < 0) {
            // Already signalled.
        }
    }
}

void ProgressThread::unwatch(Connection *conn)
{
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase(watched_, conn);
}

void ProgressThread::adopt(std::unique_ptr<Connection> conn)
{
    Connection *raw = conn.get();
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
            std::lock_guard<std::mutex> lock(mutex_);
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
    std::vector<pollfd> fds;
    std::vector<std::unique_ptr<Connection>> finished;
    for (;;) {
        fds.clear();
        fds.push_back({eventFd_, POLLIN, 0});
        bool busy = false;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            for (size_t i = 0; i < watched_.size();) {
                Connection *c = watched_[i];
                bool closedDone = false;
                int more = c->backgroundProgress(&closedDone);
                if (closedDone) {
                    for (auto &a : adopted_) {
                        if (a.get() == c) {
                            finished.push_back(std::move(a));
                            break;
                        }
                    }
                    std::erase(adopted_, nullptr);
                    more = Connection::kProgressDone;
                }
                if (!more) {
                    watched_[i] = watched_.back();
                    watched_.pop_back();
                    continue;
                }
                // A connection the application is working on is left to it for now.
                if (more == Connection::kProgressMore)
                    fds.push_back({c->waitFd(), POLLIN, 0});
                busy = true;
                i++;
            }
            asleep_ = !busy;
        }
        // Destroyed outside the lock: ~Connection calls unwatch().
        finished.clear();
        // While work is pending, look at least every millisecond: the provider may need
        // progress to push data into a socket without any fd becoming readable.
        int n = ::poll(fds.data(), fds.size(), busy ? 1 : -1);
        if (n > 0 && (fds[0].revents & POLLIN)) {
            uint64_t v;
            ssize_t r = ::read(eventFd_, &v, sizeof(v));
            (void)r;
        }
    }
}

} // namespace rstream
