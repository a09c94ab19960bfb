// SPDX-License-Identifier: MIT
// Data on a socket: send, recv, riomap and riowrite, and readiness for poll, select and epoll.

#include "socket.h"
#include "socket_internal.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>

#include "clock.h"
#include "crash.h"

namespace rstream {

bool signalsRestart()
{
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP)
            continue;
        struct sigaction sa;
        if (sigaction(sig, nullptr, &sa) < 0)
            continue;
        if (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN)
            continue;
        // Faults are delivered to the faulting instruction, never to a sleeping call.
        if (sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE || sig == SIGTRAP ||
            sig == SIGSYS || sig == SIGABRT)
            continue;
        if (sa.sa_flags & SA_RESTART)
            continue;
        // Handlers a fabric library installed for itself are not the program's.
        if (isFabricLibraryHandler(sa))
            continue;
        return false;
    }
    return true;
}

int Socket::reportError(int err)
{
    // Like sk_err: a reset or timeout is reported once; afterwards reads see EOF and writes
    // EPIPE.
    std::lock_guard<std::mutex> lock(mutex_);
    if (errorReported_)
        return 0;
    errorReported_ = true;
    return err;
}

ssize_t Socket::send(const iovec *iov, int iovcnt, int flags)
{
    std::shared_ptr<Connection> conn;
    int timeout;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        refreshConnectLocked();
        if (state_ == State::Fresh || state_ == State::Listening || state_ == State::Closed) {
            if (soError_) {
                int e = soError_;
                soError_ = 0;
                return e;
            }
            return -EPIPE;
        }
        if (flags & MSG_OOB)
            return -EOPNOTSUPP;
        conn = conn_;
        timeout = sndTimeoutMs_;
        if (errorReported_)
            return -EPIPE;
    }
    int f = (nonblocking() || (flags & MSG_DONTWAIT)) ? kNonBlock : 0;
    const int more = (flags & MSG_MORE) ? kMore : 0;
    ssize_t r;
    do {
        r = conn->sendv(iov, iovcnt, f | more, f ? 0 : timeout);
    } while (r == -EINTR && timeout < 0 && signalsRestart());
    if (r == -ENOTCONN)
        r = -EAGAIN; // still connecting, nonblocking
    if (r == -ECONNRESET || r == -ETIMEDOUT) {
        int e = reportError(static_cast<int>(r));
        return e ? e : -EPIPE;
    }
    return r;
}

ssize_t Socket::recv(const iovec *iov, int iovcnt, int flags)
{
    std::shared_ptr<Connection> conn;
    int timeout;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        refreshConnectLocked();
        if (flags & MSG_OOB)
            return -EINVAL;
        if (state_ == State::Listening || state_ == State::Closed)
            return -ENOTCONN;
        if (state_ == State::Fresh) {
            if (soError_) {
                int e = soError_;
                soError_ = 0;
                return e;
            }
            return failedConnect_ ? 0 : -ENOTCONN;
        }
        conn = conn_;
        timeout = rcvTimeoutMs_;
        if (errorReported_)
            return 0;
    }
    int f = (nonblocking() || (flags & MSG_DONTWAIT)) ? kNonBlock : 0;
    if (flags & MSG_PEEK)
        f |= kPeek;
    else if ((flags & MSG_WAITALL) && !f)
        f |= kWaitAll;
    ssize_t r;
    if (flags & MSG_TRUNC) {
        // TCP with MSG_TRUNC: the data is discarded and its length returned.
        size_t total = 0;
        for (int i = 0; i < iovcnt; i++)
            total += iov[i].iov_len;
        static thread_local char scratch[16384];
        size_t done = 0;
        r = 0;
        while (done < total) {
            size_t n = std::min(total - done, sizeof(scratch));
            ssize_t got = conn->recv(scratch, n, done ? (f | kNonBlock) & ~kWaitAll : f,
                                     f & kNonBlock ? 0 : timeout);
            if (got <= 0) {
                r = done ? static_cast<ssize_t>(done) : got;
                break;
            }
            done += static_cast<size_t>(got);
            r = static_cast<ssize_t>(done);
            if (f & kPeek)
                break;
        }
    } else {
        size_t total = 0;
        for (int i = 0; i < iovcnt; i++)
            total += iov[i].iov_len;
        if (total == 0) {
            // Linux waits for data even for an empty read, then returns 0.
            for (;;) {
                ssize_t p = conn->peekRecv();
                if (p != -EAGAIN) {
                    r = p < 0 ? p : 0;
                    break;
                }
                if (f & kNonBlock) {
                    r = -EAGAIN;
                    break;
                }
                int w = conn->wait(kReadable, timeout);
                if (w == 0) {
                    r = -EAGAIN;
                    break;
                }
                if (w == -EINTR && (timeout >= 0 || !signalsRestart())) {
                    r = -EINTR;
                    break;
                }
            }
        } else {
            do {
                r = conn->recvv(iov, iovcnt, f, f & kNonBlock ? 0 : timeout);
            } while (r == -EINTR && timeout < 0 && signalsRestart());
        }
    }
    if (r == -ENOTCONN)
        r = -EAGAIN;
    if (r == -ECONNRESET || r == -ETIMEDOUT) {
        int e = reportError(static_cast<int>(r));
        return e ? e : 0;
    }
    return r;
}

off_t Socket::riomap(void *buf, size_t len, int prot, int flags, off_t offset)
{
    if (flags != 0 || (prot != PROT_WRITE && prot != PROT_NONE))
        return -EINVAL;
    std::shared_ptr<Connection> conn;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        refreshConnectLocked();
        if (state_ != State::Connected)
            return -ENOTCONN;
        conn = conn_;
    }
    off_t chosen = 0;
    int r = conn->mapWindow(buf, len, prot == PROT_WRITE, offset, &chosen);
    return r < 0 ? r : chosen;
}

int Socket::riounmap(void *buf, size_t len)
{
    std::shared_ptr<Connection> conn;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!conn_)
            return -EINVAL; // nothing was ever mapped here
        conn = conn_;
    }
    return conn->unmapWindow(buf, len);
}

ssize_t Socket::riowrite(const void *buf, size_t count, off_t offset, int flags)
{
    std::shared_ptr<Connection> conn;
    int timeout;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        refreshConnectLocked();
        if (state_ != State::Connected) {
            if (soError_) {
                int e = soError_;
                soError_ = 0;
                return e;
            }
            return state_ == State::Connecting ? -EAGAIN : -ENOTCONN;
        }
        conn = conn_;
        timeout = sndTimeoutMs_;
        if (errorReported_)
            return -EPIPE;
    }
    int f = (nonblocking() || (flags & MSG_DONTWAIT)) ? kNonBlock : 0;
    ssize_t r;
    do {
        r = conn->writeWindow(buf, count, offset, f, f ? 0 : timeout);
    } while (r == -EINTR && timeout < 0 && signalsRestart());
    if (r == -ENOTCONN)
        r = -EAGAIN; // still connecting, nonblocking
    if (r == -ECONNRESET || r == -ETIMEDOUT) {
        int e = reportError(static_cast<int>(r));
        return e ? e : -EPIPE;
    }
    return r;
}

int Socket::readable(int *bytes)
{
    std::shared_ptr<Connection> conn;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        refreshConnectLocked();
        if (state_ == State::Listening)
            return -EINVAL;
        conn = conn_;
    }
    ssize_t r = conn ? conn->peekRecv() : 0;
    *bytes = r > 0 ? static_cast<int>(std::min<ssize_t>(r, INT_MAX)) : 0;
    return 0;
}

int Socket::pollEvents(int events)
{
    std::shared_ptr<Connection> conn;
    std::shared_ptr<Listener> listener;
    int rev = 0;
    bool shutWr;
    uint32_t ring;
    bool reported;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        refreshConnectLocked();
        switch (state_) {
        case State::Listening:
            listener = listener_;
            break;
        case State::Closed:
            return POLLHUP & (events | POLLHUP);
        case State::Fresh:
            // A closed TCP socket: writable and hung up; after a failed connect also
            // shut down for reading and, until SO_ERROR is read, in error.
            rev = POLLOUT | POLLHUP;
            if (failedConnect_)
                rev |= POLLIN | POLLRDHUP;
            if (soError_)
                rev |= POLLERR;
            return rev & (events | POLLERR | POLLHUP);
        case State::Connecting:
            return 0;
        case State::Connected:
            conn = conn_;
            break;
        }
        shutWr = shutWr_;
        ring = sendRing_;
        reported = errorReported_;
    }
    if (listener) {
        // In a hint pass that found its fds quiet, nothing is pending; a look of the pass that
        // finds nothing arms the hint for the next.
        const uint64_t pass = Connection::HintPass::current();
        const uint64_t look = listenLook_.load(std::memory_order_relaxed);
        if (!pass || look >> 2 != pass)
            return listener->pending() ? (POLLIN & events) : 0;
        if (look & 1)
            return 0;
        return listener->pendingArm() ? (POLLIN & events) : 0;
    }
    ssize_t r, s;
    uint64_t ringNow = 0;
    conn->peek(&r, &s, &ringNow);
    if (reported || (r < 0 && r != -EAGAIN)) {
        rev |= POLLIN | POLLRDHUP | POLLOUT | POLLHUP;
        if (!reported)
            rev |= POLLERR;
    } else {
        if (r > 0)
            rev |= POLLIN;
        else if (r == 0)
            rev |= POLLIN | POLLRDHUP;
        // Writable once a third of the ring is free, as Linux's sk_stream_is_writeable.
        const bool writable = (s > 0 && static_cast<uint64_t>(s) * 3 >= ring) || s == -EPIPE;
        if (writable)
            rev |= POLLOUT;
        if (events & POLLOUT) {
            if (writable || s < 0)
                roomStalled_.store(false, std::memory_order_relaxed);
            else if (!roomStalled_.exchange(true, std::memory_order_relaxed))
                roomSoon_.store(roomRate_.spin(conn->bytesSent(),
                                               ringNow - std::min<uint64_t>(ringNow, uint64_t(s)),
                                               nowNs()),
                                std::memory_order_relaxed);
        }
        if (s < 0 && s != -EPIPE)
            rev |= POLLOUT | POLLERR | POLLHUP;
        if (r == 0 && shutWr)
            rev |= POLLHUP;
    }
    return rev & (events | POLLERR | POLLHUP);
}

int Socket::prepareWait(std::vector<pollfd> *fds, int)
{
    std::shared_ptr<Connection> conn;
    std::shared_ptr<Listener> listener;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        conn = conn_;
        listener = listener_;
    }
    if (listener) {
        if (listener->arm() == -EAGAIN)
            return -EAGAIN;
        fds->push_back({listener->waitFd(), POLLIN, 0});
        fds->push_back({listener->readyFd(), POLLIN, 0});
    }
    if (conn) {
        if (conn->arm() == -EAGAIN)
            return -EAGAIN;
        fds->push_back({conn->waitFd(), POLLIN, 0});
    }
    return 0;
}

void Socket::addWaiter(int eventFd, std::vector<std::shared_ptr<Connection>> *registered)
{
    std::lock_guard<std::mutex> lock(mutex_);
    if (conn_) {
        conn_->addWaiter(eventFd);
        registered->push_back(conn_);
    }
}

int Socket::lookFds(std::vector<pollfd> *fds)
{
    const uint64_t pass = Connection::HintPass::current();
    std::shared_ptr<Listener> listener;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (state_ == State::Listening)
            listener = listener_;
    }
    if (!pass || !listener)
        return 0;
    if (!listener->hintArmed()) {
        listenLook_.store(pass << 2, std::memory_order_relaxed); // the look arms it
        return 0;
    }
    listenLook_.store(pass << 2 | 2, std::memory_order_relaxed);
    if (fds) {
        fds->push_back({listener->waitFd(), POLLIN, 0});
        fds->push_back({listener->readyFd(), POLLIN, 0});
    }
    return 2;
}

bool Socket::listenerFds(int *waitFd, int *readyFd)
{
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ != State::Listening || !listener_)
        return false;
    *waitFd = listener_->waitFd();
    *readyFd = listener_->readyFd();
    return true;
}

void Socket::lookResults(const pollfd *fds)
{
    // Another thread's pass may have taken the word since: then this look makes progress.
    const uint64_t pass = Connection::HintPass::current();
    uint64_t look = pass << 2 | 2;
    if (!fds[0].revents && !fds[1].revents)
        listenLook_.compare_exchange_strong(look, look | 1, std::memory_order_relaxed);
}

int Socket::parkFds(std::vector<pollfd> *fds)
{
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (state_ != State::Listening || !listener_)
            return -ENOTSUP;
    }
    return prepareWait(fds, POLLIN);
}

std::shared_ptr<Connection> Socket::hintConnection()
{
    std::lock_guard<std::mutex> lock(mutex_);
    return state_ == State::Connected ? conn_ : nullptr;
}

std::shared_ptr<Connection> Socket::passHintConnection()
{
    if (sameHostConn_.load(std::memory_order_relaxed))
        return nullptr;
    std::shared_ptr<Connection> c = hintConnection();
    if (c && c->sameHost()) {
        sameHostConn_.store(true, std::memory_order_relaxed);
        return nullptr;
    }
    return c;
}

uint64_t Socket::generation(int events)
{
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t g = stateChanges_ << 40;
    if (conn_ && (events & POLLIN))
        g += conn_->rxEventCount();
    if (conn_ && (events & POLLOUT))
        g += conn_->txEventCount() << 20;
    return g;
}

} // namespace rstream
