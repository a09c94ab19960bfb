// SPDX-License-Identifier: MIT
// The server side of the in-band upgrade (see hybrid_upgrade.cpp): a connection the kernel side
// of a shim listener accepted answers its client's offer, in the process that does its first
// I/O, and waits for the client's fabric connection without ever stalling an event loop.

#include "hybrid.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sys/timerfd.h>

#include "clock.h"
#include "hybrid_internal.h"
#include "upgrade.h"
#include "upgrade_wire.h"

namespace rstream::shim {

namespace {

// How often a poller looks at a server socket waiting for its client (startTickLocked).
constexpr long kTickMs = 20;

} // namespace

int HybridSocket::serverUpgradeLocked(bool out, int flags)
{
    uint8_t buf[wire::kUpgradeHeaderSize];
    for (;;) {
        const Upgrade state = upgrade_.load();
        if (state != Upgrade::Maybe && state != Upgrade::ExpectCancel)
            return 0;
        // A read waits for the client's first bytes as the application's call would; a write
        // only looks.
        const bool wait = !out && upgradeBlocking(flags);
        ssize_t r = peekKernel(buf, sizeof(buf), wait);
        if (r < 0) {
            if (out) {
                if (state == Upgrade::Maybe)
                    serverWrote_ = true; // no HELLO yet: we speak first, so we cannot answer one
                return 0;
            }
            return static_cast<int>(r);
        }
        wire::UpgradeMessage msg;
        size_t size = 0;
        auto match = r == 0 ? wire::UpgradeMatch::No
                            : wire::matchUpgrade(buf, static_cast<size_t>(r), &msg, &size);
        if (match == wire::UpgradeMatch::Partial) {
            if (out) {
                if (state == Upgrade::Maybe)
                    serverWrote_ = true;
                return 0;
            }
            if (!wait)
                return -EAGAIN;
            pollfd p{fd_, POLLIN, 0};
            const timespec ts{0, 10 * 1000000L};
            if (sys::ppoll(&p, 1, &ts, nullptr) == -EINTR)
                return -EINTR;
            continue;
        }
        if (state == Upgrade::ExpectCancel) {
            if (match == wire::UpgradeMatch::Complete && msg.type == wire::UpgradeType::Cancel)
                consumeKernel(size);
            upgrade_.store(Upgrade::None, std::memory_order_release);
            return 0;
        }
        if (match != wire::UpgradeMatch::Complete || msg.type != wire::UpgradeType::Hello) {
            if (out && r > 0) {
                serverWrote_ = true; // the client's data waits; we write first
                return 0;
            }
            upgrade_.store(Upgrade::None, std::memory_order_release);
            stayKernelLocked(helloSeen_ ? Fallback::NotUpgraded : Fallback::KernelPeer,
                             "no upgrade offered");
            return 0;
        }
        consumeKernel(size);
        helloSeen_ = true;
        if (serverWrote_) {
            upgrade_.store(Upgrade::ExpectCancel, std::memory_order_release);
            stayKernelLocked(Fallback::NotUpgraded, "the server wrote first");
            continue;
        }
        return serveUpgradeLocked(!out && upgradeBlocking(flags));
    }
}

int HybridSocket::serveUpgradeLocked(bool blocking)
{
    sockaddr_storage local{};
    socklen_t llen = sizeof(local);
    int err = 0;
    std::shared_ptr<UpgradeListener> ul;
    if (sys::getsockname(fd_, reinterpret_cast<sockaddr *>(&local), &llen) == 0) {
        noteEngineUsed();
        ul = UpgradeListener::forAddress(reinterpret_cast<sockaddr *>(&local), llen, &err);
    }
    if (!ul) {
        sendUpgradeMessage(static_cast<int>(wire::UpgradeType::Decline));
        upgrade_.store(Upgrade::None, std::memory_order_release);
        stayKernelLocked(Fallback::NotUpgraded, err ? strerror(err) : "no local address");
        return 0;
    }
    const uint64_t token = ul->expect();
    if (!sendUpgradeMessage(static_cast<int>(wire::UpgradeType::Accept),
                            static_cast<uint16_t>(ul->port()), token)) {
        ul->forget(token);
        upgrade_.store(Upgrade::ExpectCancel, std::memory_order_release);
        stayKernelLocked(Fallback::NotUpgraded, "the ACCEPT could not be sent");
        return 0;
    }
    pendingUl_ = std::move(ul);
    pendingToken_ = token;
    startTickLocked();
    upgrade_.store(Upgrade::ServerAwait, std::memory_order_release);
    return serverAwaitLocked(blocking);
}

// The client has the ACCEPT: its fabric connection (claimed by token), a CANCEL, or the end
// decides. The client sends one of them at its first I/O, whenever that is, as it would send
// its first bytes: so there is no deadline here, and a blocking call waits as a read waits for
// data (a signal interrupts it: EINTR, the next call goes on). A nonblocking one (an event
// loop, which must never wait for one client while others could be served) gets -EAGAIN, and
// the poller wakes it when the fabric connection or the kernel side has news (prepareWait).
int HybridSocket::serverAwaitLocked(bool blocking)
{
    for (;;) {
        // The kernel side first: a client that gave up (CANCEL) must not be claimed after.
        uint8_t buf[wire::kUpgradeHeaderSize];
        ssize_t r = peekKernel(buf, sizeof(buf), false);
        std::shared_ptr<Socket> claimed;
        if (r < 0)
            claimed = pendingUl_->claim(pendingToken_);
        if (auto s = std::move(claimed)) {
            endServerAwaitLocked();
            const uint8_t ack = wire::kUpgradeAck;
            if (upgradeExchange(*s, &ack, 1, nullptr, 0, nowMs() + config_.upgradeTimeoutMs) == 0) {
                adoptUpgradedLocked(std::move(s), true);
                return 0;
            }
            s->close(); // the client reads EOF instead of the ack and cancels
            upgrade_.store(Upgrade::ExpectCancel, std::memory_order_release);
            stayKernelLocked(Fallback::NotUpgraded, "the ack could not be sent");
            return 0;
        }
        wire::UpgradeMessage msg;
        size_t size = 0;
        const auto match = r > 0 ? wire::matchUpgrade(buf, static_cast<size_t>(r), &msg, &size)
                                 : wire::UpgradeMatch::No;
        const bool cancel =
            match == wire::UpgradeMatch::Complete && msg.type == wire::UpgradeType::Cancel;
        // A CANCEL, the end, or bytes that are no upgrade message (a client off the protocol:
        // they stay the application's).
        if (r == 0 || (r > 0 && match != wire::UpgradeMatch::Partial)) {
            if (cancel)
                consumeKernel(size);
            pendingUl_->forget(pendingToken_);
            endServerAwaitLocked();
            upgrade_.store(Upgrade::None, std::memory_order_release);
            stayKernelLocked(Fallback::NotUpgraded, cancel   ? "the client cancelled"
                                                    : r == 0 ? "closed"
                                                             : "the client wrote data instead");
            return 0;
        }
        if (!blocking)
            return -EAGAIN;
        // The kernel fd only while it has nothing (part of a CANCEL: the tick looks again).
        std::vector<pollfd> fds;
        if (r < 0)
            fds.push_back({fd_, POLLIN, 0});
        if (pendingUl_->prepareWait(&fds) == -EAGAIN)
            continue;
        const timespec tick{0, 10 * 1000000L};
        if (sys::ppoll(fds.data(), fds.size(), &tick, nullptr) == -EINTR)
            return -EINTR;
    }
}

int HybridSocket::upgradeWaitFds(std::vector<pollfd> *fds)
{
    std::unique_lock<std::mutex> lock(upgradeMutex_, std::try_to_lock);
    if (!lock.owns_lock())
        return -EAGAIN; // another thread moves it on: look again
    if (clientWaiting())
        return clientWaitFdsLocked(fds);
    if (upgrade_.load() != Upgrade::ServerAwait || !pendingUl_)
        return 1;
    fds->push_back({fd_, POLLIN, 0});
    if (tickFd_ >= 0)
        fds->push_back({tickFd_, POLLIN, 0});
    return pendingUl_->prepareWait(fds);
}

void HybridSocket::upgradeAddWaiter(int eventFd,
                                    std::vector<std::shared_ptr<Connection>> *registered)
{
    std::unique_lock<std::mutex> lock(upgradeMutex_, std::try_to_lock);
    if (!lock.owns_lock())
        return;
    if (upgrade_.load() == Upgrade::ServerAwait && pendingUl_)
        pendingUl_->addWaiter(eventFd, registered);
    else if (clientWaiting() && upSock_)
        upSock_->addWaiter(eventFd, registered);
}

bool HybridSocket::upgradeProgress()
{
    std::unique_lock<std::mutex> lock(upgradeMutex_, std::try_to_lock);
    if (!lock.owns_lock())
        return false;
    if (clientWaiting()) {
        drainTickLocked();
        clientStepLocked();
        return true;
    }
    if (upgrade_.load() != Upgrade::ServerAwait)
        return false;
    drainTickLocked();
    serverAwaitLocked(false);
    return true;
}

// While the server waits for its client's fabric connection, pollers also wake every
// kTickMs: the connection arrives through the progress thread and the upgrade listener, and
// a wake-up missed there must cost a tick, not the client's whole wait.
void HybridSocket::startTickLocked()
{
    if (tickFd_ >= 0)
        return;
    tickFd_ = sys::timerfdCreate(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (tickFd_ < 0) {
        tickFd_ = -1; // pollers then wake on the listener's fds alone
        return;
    }
    const itimerspec every{{0, kTickMs * 1000000L}, {0, kTickMs * 1000000L}};
    timerfd_settime(tickFd_, 0, &every, nullptr);
}

void HybridSocket::endServerAwaitLocked()
{
    pendingUl_.reset();
    stopTickLocked();
}

void HybridSocket::stopTickLocked()
{
    if (tickFd_ >= 0) {
        sys::close(tickFd_);
        tickFd_ = -1;
    }
}

void HybridSocket::drainTickLocked()
{
    uint64_t ticks;
    if (tickFd_ >= 0 && sys::read(tickFd_, &ticks, sizeof(ticks)) < 0) {
        // Not expired yet.
    }
}

} // namespace rstream::shim
