// SPDX-License-Identifier: MIT
// The client side of the in-band upgrade (see hybrid_upgrade.cpp): after its HELLO, the
// server's answer, the fabric connect to the port it names, the token and the server's ack,
// one step at a time, so that a nonblocking socket never makes its caller wait (an event loop
// with many connections upgrading goes on serving the others; pollers wake on each step's fds
// and a tick) and a blocking one sleeps in ppoll between steps.

#include "hybrid.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "clock.h"
#include "hybrid_internal.h"
#include "shimaddr.h"
#include "upgrade_wire.h"

namespace rstream::shim {

namespace {

// How long a client waits for the server's answer to its token. Once the token is out the
// server may take the connection at any moment: only its answer (the ack, or closing a token
// it does not expect) decides, so this is a bound for a server that stopped, not a timeout to
// fall back on.
constexpr int64_t kAckWaitMs = 30000;

} // namespace

void HybridSocket::clientCancelLocked(const char *why)
{
    if (upSock_) {
        upSock_->close(); // the server reads EOF instead of a token (or before its ack)
        upSock_.reset();
    }
    stopTickLocked();
    sendUpgradeMessage(static_cast<int>(wire::UpgradeType::Cancel));
    upgrade_.store(Upgrade::None, std::memory_order_release);
    stayKernelLocked(Fallback::NotUpgraded, why);
}

int HybridSocket::clientStepLocked()
{
    uint8_t buf[wire::kUpgradeMaxSize];
    switch (upgrade_.load()) {
    case Upgrade::AwaitReply: {
        // The server's first bytes decide.
        ssize_t r = peekKernel(buf, sizeof(buf), false);
        if (r == 0 || (r < 0 && r != -EAGAIN)) {
            stopTickLocked();
            upgrade_.store(Upgrade::None, std::memory_order_release);
            stayKernelLocked(Fallback::NotUpgraded, "the connection ended first");
            return 0;
        }
        if (r > 0) {
            wire::UpgradeMessage msg;
            size_t size = 0;
            auto match = wire::matchUpgrade(buf, static_cast<size_t>(r), &msg, &size);
            if (match == wire::UpgradeMatch::No) {
                stopTickLocked();
                upgrade_.store(Upgrade::None, std::memory_order_release);
                stayKernelLocked(Fallback::NotUpgraded, "the server wrote first");
                return 0;
            }
            if (match == wire::UpgradeMatch::Complete) {
                consumeKernel(size);
                if (msg.type != wire::UpgradeType::Accept) {
                    stopTickLocked();
                    upgrade_.store(Upgrade::None, std::memory_order_release);
                    stayKernelLocked(Fallback::NotUpgraded, "the server declined");
                    return 0;
                }
                sockaddr_storage dest;
                socklen_t dlen;
                {
                    std::lock_guard<std::mutex> l(mutex_);
                    dest = peer_;
                    dlen = peerLen_;
                }
                setPort(&dest, msg.port);
                std::shared_ptr<Socket> s;
                int e = startFabric(reinterpret_cast<sockaddr *>(&dest), dlen, &s);
                if (e != 0 && e != -EINPROGRESS) {
                    clientCancelLocked(strerror(-e));
                    return 0;
                }
                upSock_ = std::move(s);
                pendingToken_ = msg.token;
                upStepDeadlineMs_ = nowMs() + config_.connectTimeoutMs;
                upgrade_.store(Upgrade::ClientConnect, std::memory_order_release);
                return clientStepLocked();
            }
        }
        // Nothing yet, or part of the answer: the wait starts with the first I/O (a client may
        // idle first), bounded.
        if (!upgradeDeadlineMs_)
            upgradeDeadlineMs_ = nowMs() + config_.upgradeTimeoutMs;
        if (nowMs() >= upgradeDeadlineMs_) {
            stopTickLocked();
            sendUpgradeMessage(static_cast<int>(wire::UpgradeType::Cancel));
            upgrade_.store(Upgrade::StripReply, std::memory_order_release);
            stayKernelLocked(Fallback::NotUpgraded, "no answer from the server in time");
            return 0;
        }
        startTickLocked();
        return -EAGAIN;
    }
    case Upgrade::ClientConnect: {
        upSock_->pollEvents(POLLOUT); // moves the connect on
        int st = upSock_->connectStatus();
        if (st == -EINPROGRESS) {
            if (nowMs() < upStepDeadlineMs_) {
                startTickLocked();
                return -EAGAIN;
            }
            st = -ETIMEDOUT;
        }
        if (st != 0) {
            clientCancelLocked(strerror(-st));
            return 0;
        }
        uint8_t token[wire::kUpgradeTokenSize];
        wire::encodeToken(pendingToken_, token);
        iovec iov{token, sizeof(token)};
        // A fresh connection's send ring has room for 8 bytes: anything else is an error.
        const ssize_t r = upSock_->send(&iov, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (r != static_cast<ssize_t>(sizeof(token))) {
            clientCancelLocked(r < 0 ? strerror(static_cast<int>(-r)) : "the token did not fit");
            return 0;
        }
        upStepDeadlineMs_ = nowMs() + kAckWaitMs;
        upgrade_.store(Upgrade::ClientAwaitAck, std::memory_order_release);
        return clientStepLocked();
    }
    case Upgrade::ClientAwaitAck: {
        uint8_t ack = 0;
        iovec iov{&ack, 1};
        const ssize_t r = upSock_->recv(&iov, 1, MSG_DONTWAIT);
        if (r == 1 && ack == wire::kUpgradeAck) {
            stopTickLocked();
            adoptUpgradedLocked(std::move(upSock_), false);
            upSock_.reset();
            return 0;
        }
        if (r == 1 || r == 0 || r == -ECONNRESET || r == -EPIPE) {
            // The server did not take it (closed, or answered otherwise): kernel TCP.
            clientCancelLocked(r == 1 ? "the server's answer was not the ack"
                                      : "the server closed the fabric connection");
            return 0;
        }
        if (r == -EAGAIN && nowMs() < upStepDeadlineMs_) {
            startTickLocked();
            return -EAGAIN;
        }
        // No answer: whether the server took it is unknown, so neither path is safe. The
        // connection fails, as a reset one would.
        upSock_->close();
        upSock_.reset();
        stopTickLocked();
        sys::shutdown(fd_, SHUT_RDWR);
        upgrade_.store(Upgrade::None, std::memory_order_release);
        stayKernelLocked(Fallback::NotUpgraded,
                         "the server did not answer the token: connection shut down");
        return 0;
    }
    default:
        return 0;
    }
}

int HybridSocket::clientWaitFdsLocked(std::vector<pollfd> *fds)
{
    int r = 0;
    switch (upgrade_.load()) {
    case Upgrade::AwaitReply:
        fds->push_back({fd_, POLLIN, 0});
        break;
    case Upgrade::ClientConnect:
        r = upSock_->prepareWait(fds, POLLOUT);
        break;
    case Upgrade::ClientAwaitAck:
        r = upSock_->prepareWait(fds, POLLIN);
        break;
    default:
        return -EAGAIN; // decided: look again
    }
    if (tickFd_ >= 0)
        fds->push_back({tickFd_, POLLIN, 0});
    return r;
}

int HybridSocket::clientUpgradeLocked(bool out, int flags)
{
    if (upgrade_.load() == Upgrade::Offer)
        sendOfferLocked();
    const bool blocking = upgradeBlocking(flags);
    // The application's call waits for the outcome (a blocking one, bounded): its data must go
    // where the server will read it.
    while (clientStepLocked() == -EAGAIN) {
        if (!blocking)
            return -EAGAIN;
        std::vector<pollfd> fds;
        if (clientWaitFdsLocked(&fds) == -EAGAIN)
            continue;
        const timespec ts{0, 100 * 1000000L}; // deadlines are looked at between sleeps
        const int r = sys::ppoll(fds.data(), fds.size(), &ts, nullptr);
        drainTickLocked();
        if (r == -EINTR)
            return -EINTR; // the HELLO is out: the next call goes on
    }
    if (upgrade_.load() != Upgrade::StripReply || out)
        return 0;
    // The server may still answer the HELLO we gave up on: drop that answer, never deliver it.
    uint8_t buf[wire::kUpgradeMaxSize];
    for (;;) {
        ssize_t r = peekKernel(buf, sizeof(buf), upgradeBlocking(flags));
        if (r < 0)
            return static_cast<int>(r);
        wire::UpgradeMessage msg;
        size_t size = 0;
        auto match = r == 0 ? wire::UpgradeMatch::No
                            : wire::matchUpgrade(buf, static_cast<size_t>(r), &msg, &size);
        if (match == wire::UpgradeMatch::Complete &&
            (msg.type == wire::UpgradeType::Accept || msg.type == wire::UpgradeType::Decline)) {
            consumeKernel(size);
            upgrade_.store(Upgrade::None, std::memory_order_release);
            return 0;
        }
        if (match != wire::UpgradeMatch::Partial) {
            upgrade_.store(Upgrade::None, std::memory_order_release);
            return 0;
        }
        if (!upgradeBlocking(flags))
            return -EAGAIN;
        pollfd p{fd_, POLLIN, 0};
        const timespec ts{0, 10 * 1000000L};
        if (sys::ppoll(&p, 1, &ts, nullptr) == -EINTR)
            return -EINTR;
    }
}

} // namespace rstream::shim
