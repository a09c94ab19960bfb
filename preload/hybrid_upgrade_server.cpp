// SPDX-License-Identifier: MIT
// The server side of the in-band upgrade (see hybrid_upgrade.cpp): a connection the kernel side
// of a shim listener accepted answers its client's offer in the process that does its first
// I/O, then carries on over kernel TCP until the client's fabric connection arrives and the
// connection switches (hybrid_late.cpp). No call waits for the client.

#include "hybrid.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "clock.h"
#include "hybrid_internal.h"
#include "upgrade.h"
#include "upgrade_wire.h"

namespace rstream::shim {

int HybridSocket::serverUpgradeLocked(bool out)
{
    if (upgrade_.load() != Upgrade::Maybe)
        return 0;
    uint8_t buf[wire::kUpgradeHeaderSize];
    const ssize_t r = peekKernel(buf, sizeof(buf), false);
    if (r < 0) {
        if (out) {
            serverWrote_ = true; // no HELLO yet: we speak first, so we cannot answer one
            return 0;
        }
        return static_cast<int>(r); // nothing yet (EAGAIN), or the read's own error
    }
    wire::UpgradeMessage msg;
    size_t size = 0;
    const auto match = r == 0 ? wire::UpgradeMatch::No
                              : wire::matchUpgrade(buf, static_cast<size_t>(r), &msg, &size);
    if (match == wire::UpgradeMatch::Partial) {
        if (out) {
            serverWrote_ = true;
            return 0;
        }
        return -EAGAIN; // the rest of it is on its way
    }
    if (match != wire::UpgradeMatch::Complete || msg.type != wire::UpgradeType::Hello) {
        upgrade_.store(Upgrade::None, std::memory_order_release);
        stayKernelLocked(Fallback::KernelPeer, "no upgrade offered");
        return 0;
    }
    consumeKernel(size);
    if (serverWrote_) {
        // The client reads our bytes first, which tell it that no answer comes.
        upgrade_.store(Upgrade::None, std::memory_order_release);
        stayKernelLocked(Fallback::NotUpgraded, "the server wrote first");
        return 0;
    }
    serveUpgradeLocked();
    return 0;
}

void HybridSocket::serveUpgradeLocked()
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
        return;
    }
    const uint64_t token = ul->expect();
    if (!sendUpgradeMessage(static_cast<int>(wire::UpgradeType::Accept),
                            static_cast<uint16_t>(ul->port()), token)) {
        // Nothing went out (a fresh connection's send buffer takes 32 bytes, or none): the
        // client reads our data first and stays on kernel TCP too.
        ul->forget(token);
        upgrade_.store(Upgrade::None, std::memory_order_release);
        stayKernelLocked(Fallback::NotUpgraded, "the ACCEPT could not be sent");
        return;
    }
    // From here the connection goes on over kernel TCP, counted, until the client's fabric
    // connection brings the token (hybrid_late.cpp).
    pendingUl_ = std::move(ul);
    pendingToken_ = token;
    // The client loads libfabric first (~0.3 s, seconds on a busy machine), then connects, and
    // each step waits for one of its program's calls on the connection, which an idle
    // connection does not make. Until the token comes, every poll of the socket looks at it.
    upStepDeadlineMs_ = nowMs() + config_.switchWaitMs + config_.connectTimeoutMs;
    lateWritten_ = lateRead_ = 0;
    lateTargetKnown_ = false;
    upgrade_.store(Upgrade::LateServer, std::memory_order_release);
}

void HybridSocket::upgradeAddWaiter(int eventFd,
                                    std::vector<std::shared_ptr<Connection>> *registered)
{
    std::unique_lock<std::mutex> lock(upgradeMutex_, std::try_to_lock);
    if (!lock.owns_lock())
        return;
    if (upgrade_.load() == Upgrade::LateServer && pendingUl_)
        pendingUl_->addWaiter(eventFd, registered);
    else if (late() && upSock_)
        upSock_->addWaiter(eventFd, registered);
}

void HybridSocket::upgradeProgress(int events)
{
    std::unique_lock<std::mutex> lock(upgradeMutex_, std::try_to_lock);
    if (!lock.owns_lock())
        return;
    const Upgrade before = upgrade_.load();
    switch (before) {
    case Upgrade::Maybe:
        // A HELLO alone would make the fd readable with nothing for the read: answer it now
        // (the process that polls a connection for reading is the one that reads it).
        if (events & POLLIN)
            serverUpgradeLocked(false);
        break;
    case Upgrade::Offer:
        sendOfferLocked(); // once connected: the HELLO goes before any byte of ours
        if (upgrade_.load() == Upgrade::Answer)
            clientAnswerLocked();
        break;
    case Upgrade::Answer:
        clientAnswerLocked();
        break;
    default:
        break;
    }
    if (late())
        lateStepLocked();
    // A step (an upgrade message read or sent, a shutdown) changes what the fd shows: the
    // pass's look at it no longer tells.
    if (upgrade_.load() != before)
        kernelLook_.store(0, std::memory_order_relaxed);
}

int HybridSocket::firstBytesPollEvents(Upgrade u, int events)
{
    const int rev = kernelPollNow(events);
    if (!(events & POLLIN) || !(rev & POLLIN))
        return rev;
    // Bytes came in since the look above: the peer's offer or answer, which the read would take
    // and then say EAGAIN if nothing follows. Look again; readable only once they are taken.
    upgradeProgress(events);
    if (upgrade_.load() != u)
        return pollEvents(events);
    // Still not all of it here (or another thread is at it): readable when the rest comes.
    return (rev & (POLLERR | POLLHUP)) ? rev : (rev & ~POLLIN);
}

} // namespace rstream::shim
