// SPDX-License-Identifier: MIT
// The engine makes and closes its own fds (progress thread, listener, sleepers) through the seam.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "connection.h"
#include "kernel.h"
#include "listener.h"
#include "net.h"
#include "progress.h"

using namespace rstream;

namespace {

// What the counting table saw. The progress thread calls the seam concurrently.
std::mutex gMutex;
std::multiset<int> gOpened; // fds made through the seam and not yet closed through it
std::set<int> gEverOpened;
std::set<int> gClosed;
std::atomic<int> gEventfds{0};
std::atomic<int> gEpolls{0};
std::atomic<int> gCloses{0};

void opened(int fd)
{
    if (fd < 0)
        return;
    std::lock_guard<std::mutex> lock(gMutex);
    gOpened.insert(fd);
    gEverOpened.insert(fd);
    gClosed.erase(fd);
}

int countingEventfd(unsigned int v, int flags)
{
    const int fd = sys::kLibc.eventfd(v, flags);
    const int saved = errno;
    {
        std::lock_guard<std::mutex> lock(gMutex);
        gEventfds++;
    }
    opened(fd);
    errno = saved;
    return fd;
}

int countingEpollCreate1(int flags)
{
    const int fd = sys::kLibc.epollCreate1(flags);
    const int saved = errno;
    {
        std::lock_guard<std::mutex> lock(gMutex);
        gEpolls++;
    }
    opened(fd);
    errno = saved;
    return fd;
}

int countingClose(int fd)
{
    {
        std::lock_guard<std::mutex> lock(gMutex);
        gCloses++;
        if (auto it = gOpened.find(fd); it != gOpened.end())
            gOpened.erase(it);
        gClosed.insert(fd);
    }
    return sys::kLibc.close(fd);
}

bool openNow(int fd)
{
    std::lock_guard<std::mutex> lock(gMutex);
    return gOpened.count(fd) > 0;
}

bool closedThroughSeam(int fd)
{
    std::lock_guard<std::mutex> lock(gMutex);
    return gEverOpened.count(fd) > 0 && gClosed.count(fd) > 0 && gOpened.count(fd) == 0;
}

// Binds the counting table for the test's length; the progress thread outlives it, so the table
// is static and the libc table is bound back at the end.
struct CountingSeam
{
    CountingSeam()
    {
        static sys::Calls table = [] {
            sys::Calls t = sys::kLibc;
            t.eventfd = countingEventfd;
            t.epollCreate1 = countingEpollCreate1;
            t.close = countingClose;
            return t;
        }();
        sys::bind(&table);
    }
    ~CountingSeam() { sys::bind(&sys::kLibc); }
};

Settings tcpSettings()
{
    Settings s;
    s.provider = "tcp";
    s.pollUs = 0; // sleep at once: the sleeper's eventfd is what is looked at
    return s;
}

} // namespace

// One test, in order: the progress thread exists once per process, and this must be its
// creation.
TEST(KernelSeam, EngineFdsAreMadeAndClosedThroughTheSeam)
{
    CountingSeam seam;

    // The progress thread's epoll set, made when it is first needed.
    ProgressThread::instance();
    EXPECT_EQ(gEpolls, 1);

    int readyFd;
    {
        Listener l(tcpSettings());
        readyFd = l.readyFd();
        ASSERT_GE(readyFd, 0);
        EXPECT_TRUE(openNow(readyFd)) << "the listener's eventfd did not come from sys::eventfd";
        sockaddr_in a = rstest::loopback4(0);
        ASSERT_EQ(l.bind(reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0);
        ASSERT_EQ(l.listen(4), 0); // starts the progress thread: its eventfd
        sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        ASSERT_EQ(l.localAddress(&ss, &len), 0);

        // A connection, and a thread that sleeps on it: a sleeper's eventfd is its thread's,
        // closed when the thread ends, so each sleeps on a thread of its own (the progress
        // thread answers the request meanwhile).
        Connection c(tcpSettings());
        int r = -1;
        std::thread([&] { r = c.connect(reinterpret_cast<sockaddr *>(&ss), len); }).join();
        ASSERT_EQ(r, 0) << strerror(-r);
        std::unique_ptr<Connection> server;
        r = l.accept(&server, false, 5000);
        ASSERT_EQ(r, 0) << strerror(-r);
        const int eventfdsBefore = gEventfds;
        std::thread([&] { EXPECT_EQ(c.wait(kReadable, 20), 0); }).join();
        EXPECT_EQ(gEventfds, eventfdsBefore + 1) << "the sleeper's eventfd bypassed the seam";
    }
    EXPECT_TRUE(closedThroughSeam(readyFd))
        << "the listener's eventfd was not closed by sys::close";

    std::lock_guard<std::mutex> lock(gMutex);
    // The listener's, the progress thread's and the sleepers'.
    EXPECT_GE(gEventfds, 3);
    EXPECT_GE(gCloses, 2);
    // Balanced: what is still open is the progress thread's, which lives for the process.
    EXPECT_EQ(gOpened.size(), 2u);
}
