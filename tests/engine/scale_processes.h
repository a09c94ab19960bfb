// SPDX-License-Identifier: MIT
// The scale tests' processes: this binary run again as a client or a server process, what each
// reports back of what its connections held and gave back, and the waits between them.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <poll.h>
#include <signal.h>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

#include "connection.h"
#include "proc.h"
#include "respawn.h"
#include "sanitizers.h"

namespace rstream::scaletest {

using Clock = std::chrono::steady_clock;
using rstest::countFds;
using rstest::rssKiB;

inline double secondsSince(Clock::time_point t0)
{
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// What one process's connections held and gave back: a client process sends its own to its
// server process, a server process both to the coordinator (IdleConnectionsInSeveralProcesses).
struct EndsReport
{
    int pid = 0;
    int n = 0;                        // connections held
    int fds0 = 0, fds1 = 0, fds2 = 0; // descriptors before, while held, after closing
    long rss0 = 0, rss1 = 0;          // KiB before (trimmed) and while held
    long rssKept = 0, rss2 = 0;       // KiB after closing, before and after malloc_trim
    long live0 = 0, live2 = 0;        // Connection::liveCount() before and after
    double openSec = 0, closeSec = 0;
    double idleCpuMs = -1; // per second while held
};

// The environment variables that give a process run again its role: "ppid port n" for a
// client, "ppid n" for a server; ppid lets it check that its parent is still the one that
// started it once it has asked to die with it.
inline constexpr char kClientEnv[] = "RSTREAM_SCALE_CLIENT";
inline constexpr char kServerEnv[] = "RSTREAM_SCALE_SERVER";

// This binary run again as the test named, with env=value (one role's variable) added and the
// other roles' variables left out, sock as its fd 3 (see rstest::spawnSelf).
inline pid_t spawnSelf(const char *test, const char *env, const char *value, int sock)
{
    return rstest::spawnSelf(test, std::string(env) + "=" + value, sock, {kClientEnv, kServerEnv});
}

// A process started by spawnSelf: killed and reaped unless it exited, so that a failed assert
// leaves none behind; its socket closed.
struct Child
{
    pid_t pid = -1;
    int fd = -1;
    ~Child()
    {
        if (pid > 0) {
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
        }
        if (fd >= 0)
            close(fd);
    }
    // Its exit status once it exits, within timeoutMs; killed (and -1) if it does not.
    int reap(int timeoutMs)
    {
        int status = -1;
        for (int waited = 0; pid > 0; waited += 10) {
            if (waitpid(pid, &status, WNOHANG) == pid) {
                pid = -1;
                return status;
            }
            if (waited >= timeoutMs) {
                kill(pid, SIGKILL);
                waitpid(pid, nullptr, 0);
                pid = -1;
                return -1;
            }
            usleep(10 * 1000);
        }
        return status;
    }
};

// Reads len bytes from fd by the deadline; false on EOF, an error or the deadline.
inline bool readBy(int fd, void *buf, size_t len, Clock::time_point deadline)
{
    auto *p = static_cast<char *>(buf);
    while (len > 0) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        pollfd pfd{fd, POLLIN, 0};
        if (left.count() <= 0 || poll(&pfd, 1, int(left.count())) != 1)
            return false;
        const ssize_t r = read(fd, p, len);
        if (r <= 0)
            return false;
        p += r;
        len -= size_t(r);
    }
    return true;
}

// Says c and waits for the other side's answer by the deadline: want, or false.
inline bool handshake(int fd, char c, char want, Clock::time_point deadline)
{
    char got = 0;
    return write(fd, &c, 1) == 1 && readBy(fd, &got, 1, deadline) && got == want;
}

inline Clock::time_point after(int seconds)
{
    return Clock::now() + std::chrono::seconds(seconds);
}

// Closes every connection (ends) and waits (up to 5 s) for their descriptors and live
// connections to come back to r->fds0 and r->live0: a close delivers in the background and the
// progress thread lets an endpoint go just after its owner did. Records the time, and RSS
// before and after malloc_trim (see serveEnds()); names any descriptors left (and those of
// before) on stderr.
inline void closeAll(std::vector<std::unique_ptr<Connection>> &ends, EndsReport *r,
                     const std::string &fdsBefore)
{
    const auto t0 = Clock::now();
    ends.clear();
    r->fds2 = countFds();
    for (int i = 0; i < 250 && (r->fds2 > r->fds0 || Connection::liveCount() > r->live0); i++) {
        usleep(20 * 1000);
        r->fds2 = countFds();
    }
    r->closeSec = secondsSince(t0);
    if (r->fds2 != r->fds0)
        fprintf(stderr, "scale: pid %d: fds after closing: %s; before: %s\n", r->pid,
                rstest::describeFds().c_str(), fdsBefore.c_str());
    r->live2 = Connection::liveCount();
    r->rssKept = rssKiB();
    r->rss2 = rstest::trimmedRssKiB();
}

// That a process's connections gave back what they held: every descriptor and connection, and
// (after malloc_trim) all but a tenth of the memory, or 8 MiB.
inline void expectBack(const EndsReport &r, const char *who)
{
    EXPECT_EQ(r.fds2, r.fds0) << who << ": descriptors left after closing every connection";
    EXPECT_EQ(r.live2, r.live0) << who << ": connections left alive after closing every one";
#ifndef RSTREAM_TEST_ASAN // ASan's allocator keeps freed memory in quarantine
    EXPECT_LE(r.rss2 - r.rss0, std::max(8192L, (r.rss1 - r.rss0) / 10))
        << who << ": RSS " << r.rss0 << " KiB before, " << r.rss1 << " held, " << r.rss2
        << " after closing";
#endif
}

inline void printReport(const char *who, const EndsReport &r)
{
    printf("scale: %s (pid %d): %d connections opened in %.2f s, closed in %.2f s; fds %d -> %d "
           "-> %d (%.2f per connection); RSS %ld -> %ld KiB (%.1f per connection), %ld after "
           "the close, %ld trimmed; live connections %ld -> %ld; idle CPU %.1f ms/s\n",
           who, r.pid, r.n, r.openSec, r.closeSec, r.fds0, r.fds1, r.fds2,
           double(r.fds1 - r.fds0) / r.n, r.rss0, r.rss1, double(r.rss1 - r.rss0) / r.n, r.rssKept,
           r.rss2, r.live0, r.live2, r.idleCpuMs);
}

} // namespace rstream::scaletest
