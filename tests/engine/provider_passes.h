// SPDX-License-Identifier: MIT
// Counting the tcp provider's progress passes and tries from a test: include in one source file
// of an executable linked with export_dynamic.
#pragma once

#include <atomic>
#include <chrono>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>

#include "connection.h"

namespace rstream::test {
// The executable's epoll_wait (below) is the one libfabric binds to: its calls are counted for
// the thread that sets tCounting.
inline thread_local bool tCounting = false;
inline std::atomic<int> gEpollWaits{0};

// Waits up to 5 s for c to have n bytes readable, looking as a poller would.
inline bool readable(Connection &c, ssize_t n)
{
    for (int i = 0; i < 5000; i++) {
        if (c.peekRecv() >= n)
            return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
}
} // namespace rstream::test

extern "C" int epoll_wait(int epfd, epoll_event *events, int maxevents, int timeout)
{
    if (rstream::test::tCounting)
        rstream::test::gEpollWaits.fetch_add(1);
    return static_cast<int>(
        syscall(SYS_epoll_pwait, epfd, events, maxevents, timeout, nullptr, _NSIG / 8));
}
