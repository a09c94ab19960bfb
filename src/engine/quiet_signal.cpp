// SPDX-License-Identifier: MIT
// The tcp provider's completion signal, taken out of a connected endpoint's wait fd.
//
// On tcp up to libfabric 1.17 a connection's wait fd is the wait set's epoll: the endpoint's
// socket and a signal (a socketpair) that the provider sets after each completion it queues and
// each send it could not finish. Every completion is queued inside one of our own calls, which
// reads the CQ; the signal only made the fd readable afterwards, and the next look paid a
// progress pass (epoll_wait) and a read to reset it, and the next completion a write to set it
// again: three system calls a request for a server (redis GET over the fabric: 6.3 a request,
// against 2.9 on kernel TCP). Once connected, the signal is taken out of the epoll, where the
// provider's passes no longer reset it (so it is written no more either), and what it stood for
// is kept here:
// - data, credits and the peer going away arrive on the socket, which stays in the epoll;
// - a completion queued by a read's progress pass is taken by that read (with 1.16 and 1.17
//   every CQ read is a pass, so a read that returns fewer entries than it asked for emptied
//   the CQ after one: cqTaken_);
// - a send posted since the last pass may have queued a completion, or, if the provider could
//   not finish it, needs its POLLOUT registered, which only a pass (or fi_trywait) does: each
//   send disarms the fd (unverified_), and the next arm makes that pass before anything sleeps
//   on the fd (armLocked()); a thread asleep on it is woken to do so.
#include "connection.h"
#include "connection_detail.h"

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/epoll.h>

#include "kernel.h"
#include "log.h"

namespace rstream {

namespace {

// The descriptor registered in epoll fd ep with data.ptr == ptr, from the kernel's list of the
// epoll's members (/proc/self/fdinfo); -ENOENT when none, or the list cannot be read.
int epollMemberWithData(int ep, const void *ptr)
{
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", ep);
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    // A wait set holds the signal and the endpoint's socket: two short lines, and a few of the
    // file's own. A member list cut short by the buffer only misses what it did not hold.
    char buf[4096];
    size_t len = 0;
    for (;;) {
        const ssize_t n = sys::read(fd, buf + len, sizeof(buf) - 1 - len);
        if (n <= 0)
            break;
        len += static_cast<size_t>(n);
        if (len == sizeof(buf) - 1)
            break;
    }
    sys::close(fd);
    buf[len] = '\0';
    const uint64_t want = reinterpret_cast<uintptr_t>(ptr);
    for (char *line = buf; line && *line;) {
        char *next = std::strchr(line, '\n');
        if (next)
            *next++ = '\0';
        int tfd;
        unsigned events;
        uint64_t data;
        if (std::sscanf(line, "tfd: %d events: %x data: %" SCNx64, &tfd, &events, &data) == 3 &&
            data == want)
            return tfd;
        line = next;
    }
    return -ENOENT;
}

} // namespace

void Connection::quietSignalLocked()
{
    if (quietSignal_ || !settings_.quietSignal || !domain_->caps().quietSignal || !waitSet_ ||
        waitFd_ < 0 || shOn_.load(std::memory_order_relaxed))
        return;
    // The signal's read end is the member whose data is the wait set's own fid (util_wait_fd
    // registers it so); a layout not found here keeps the signal where it is.
    const int sig = epollMemberWithData(waitFd_, &waitSet_->fid);
    if (sig < 0) {
        RS_LOG(Debug, "wait set signal not found (%s): it stays in the wait fd", strerror(-sig));
        return;
    }
    const int r = sys::epollCtl(waitFd_, EPOLL_CTL_DEL, sig, nullptr);
    if (r < 0) {
        RS_LOG(Debug, "wait set signal not removed (%s)", strerror(-r));
        return;
    }
    quietSignal_ = true;
    // Whatever the signal stood for until now is looked at once more before the next sleep.
    cqDrained_ = cqTaken_ = false;
    unverified_ = true;
    disarmLocked();
}

void Connection::noteTxPostedLocked(bool sentWhole)
{
    // An op whose sends were not all seen taken by the kernel may need a pass to complete:
    // until it is released the progress thread looks at the connection soon (wait.cpp).
    if (!sentWhole)
        untakenNext_ = txOps_.next();
    if (!quietSignal_)
        return;
    // A write the kernel took whole has its completion queued, which the next pass takes:
    // nothing for a reader, and the fd can stay armed (a client that sends, reads EAGAIN and
    // polls made a pass for it in the read or the poll). Only a writer short of room waits for
    // it: while a third of the ring is free (POLLOUT) none is; sendv() and waitFor() see to
    // the rest.
    if (sentWhole && !tx_.shortOfRoom())
        return;
    // Until the next progress pass the fd may miss this send's end: a completion queued now, or
    // the POLLOUT of a send the provider could not finish. Disarmed, it is no hint to pollers,
    // and a parked one is marked: each arms again, with that pass, before it sleeps.
    unverified_ = true;
    disarmLocked();
    // A thread asleep on the fd relied on the signal for the same: it looks again.
    if (!sleepers_.empty()) {
        changed_ = true;
        wakeSleepersLocked();
    }
}

void Connection::lightArmLocked()
{
    if (quietSignal_ && cqTaken_ && !unverified_ && !eqDue_ && !error_ && !closed_ &&
        state_ == State::Connected && rxCount_ > 0 && quietLocked())
        armed_.store(true, std::memory_order_release);
}

} // namespace rstream
