// SPDX-License-Identifier: MIT
// The server side of the in-band upgrade (see hybrid_upgrade.cpp): a connection the kernel side
// of a shim listener accepted answers its client's offer in the process that does its first
// I/O, then carries on over kernel TCP until the client's fabric connection arrives and the
// connection switches (hybrid_late.cpp). No call waits for the client.

#include "hybrid.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "clock.h"
#include "hybrid_internal.h"
#include "upgrade.h"
#include "upgrade_wire.h"

namespace rstream::shim {

int HybridSocket::serverUpgradeLocked(bool out, bool leave)
{
    if (upgrade_.load() != Upgrade::Maybe)
        return 0;
    // Another message than a HELLO is the program's bytes (never waited for as partial).
    wire::UpgradeMessage msg;
    size_t size = 0;
    auto match = wire::UpgradeMatch::No;
    bool after = false;
    const ssize_t r = headMessageLocked(&msg, &size, &match, &after);
    if (r < 0) {
        if (out) {
            serverWrote_ = true; // no HELLO yet: we speak first, so we cannot answer one
            return 0;
        }
        return static_cast<int>(r); // nothing yet (EAGAIN), or the read's own error
    }
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
    if (leave && after && !serverWrote_) {
        leaveHeadLocked(msg, size);
        return 0;
    }
    takeMessageLocked(size);
    dataAfterMsg_ = after;
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
    const KernelAddresses a = addresses();
    int err = 0;
    std::shared_ptr<UpgradeListener> ul;
    if (a.localLen) {
        noteEngineUsed();
        const UpgradeLimits limits{static_cast<size_t>(config_.upgradePendingMax),
                                   config_.tokenWaitMs, upgradeSettings().sameHost};
        ul = UpgradeListener::forAddress(a.localAddr(), a.localLen, limits, &err);
    }
    if (!ul) {
        sendUpgradeMessage(static_cast<int>(wire::UpgradeType::Decline));
        upgrade_.store(Upgrade::None, std::memory_order_release);
        stayKernelLocked(Fallback::NotUpgraded, err ? strerror(err) : "no local address");
        return;
    }
    // The ACCEPT goes with the program's first write, in one segment (a request answered at
    // once costs no segment more than over plain TCP), or on its own after kAcceptDelayMs for a
    // server that only reads (lateStepLocked). Until it has gone no token can come.
    noteLinkPossible(*ul);
    pendingUl_ = std::move(ul);
    pendingToken_ = pendingUl_->expect();
    acceptDueMs_ = nowMs() + kAcceptDelayMs;
    upStepDeadlineMs_ = 0; // set once the ACCEPT is out
    lateWritten_ = lateRead_ = 0;
    lateTargetKnown_ = false;
    acceptOwed_.store(true, std::memory_order_release);
    upgrade_.store(Upgrade::LateServer, std::memory_order_release);
}

void HybridSocket::dropOwedAcceptLocked()
{
    acceptOwed_.store(false, std::memory_order_release);
    acceptDropped_.store(true, std::memory_order_release);
}

bool HybridSocket::sendOwedAcceptLocked()
{
    // Not after a byte of ours went some way the shim does not see (splice, io_uring): the
    // ACCEPT would land inside the stream, where the client takes our bytes for no answer.
    if (!pendingUl_ || !kernelUntouched() ||
        !sendUpgradeMessage(static_cast<int>(wire::UpgradeType::Accept),
                            static_cast<uint16_t>(pendingUl_->port()), pendingToken_))
        return false;
    acceptOwed_.store(false, std::memory_order_release);
    return true;
}

ssize_t HybridSocket::writeOwedAcceptLocked(const iovec *iov, int iovcnt, int flags)
{
    // The server's first write: its ACCEPT and its bytes in one segment (MSG_OOB's urgent byte
    // must stay the program's last: the ACCEPT goes alone first then).
    ssize_t r;
    if (flags & MSG_OOB || iovcnt >= IOV_MAX) {
        if (!sendOwedAcceptLocked())
            dropOwedAcceptLocked(); // our bytes go first: the client takes them for no answer
        r = kernelIo(true, iov, iovcnt, flags);
    } else {
        wire::UpgradeMessage msg;
        msg.type = wire::UpgradeType::Accept;
        msg.port = static_cast<uint16_t>(pendingUl_->port());
        msg.token = pendingToken_;
        uint8_t buf[wire::kUpgradeMaxSize];
        const size_t n = wire::encodeUpgrade(msg, buf);
        r = sendPrefixed(buf, n, iov, iovcnt, flags);
        if (r >= 0)
            acceptOwed_.store(false, std::memory_order_release);
    }
    if (r > 0)
        lateWritten_ += static_cast<uint64_t>(r);
    return r;
}

void HybridSocket::upgradeAddWaiter(int eventFd,
                                    std::vector<std::shared_ptr<Connection>> *registered)
{
    std::unique_lock<std::mutex> lock(upgradeMutex_, std::try_to_lock);
    if (!lock.owns_lock())
        return;
    if (upgrade_.load() == Upgrade::LateServer && pendingUl_) {
        if (!acceptOwed_.load(std::memory_order_acquire)) // before the ACCEPT no token comes
            pendingUl_->addWaiter(eventFd, registered);
        return;
    }
    if (late() && upSock_)
        upSock_->addWaiter(eventFd, registered);
}

bool HybridSocket::upgradeProgress(int events, bool leave)
{
    std::unique_lock<std::mutex> lock(upgradeMutex_, std::try_to_lock);
    if (!lock.owns_lock())
        return false;
    const Upgrade before = upgrade_.load();
    switch (before) {
    case Upgrade::Maybe:
        // A HELLO alone would make the fd readable with nothing for the read: answer it now
        // (the process that polls a connection for reading is the one that reads it).
        if (events & POLLIN)
            serverUpgradeLocked(false, leave);
        break;
    case Upgrade::Offer:
        // A program that waits to read gets the HELLO out now (the server may speak first);
        // one that waits to write sends it with its first bytes (offerWithWrite). No answer
        // can be here yet.
        if (events & POLLIN)
            sendOfferLocked();
        break;
    case Upgrade::Answer:
        clientAnswerLocked(leave);
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
    return head_.size != 0 && upgrade_.load() == before;
}

int HybridSocket::firstBytesPollEvents(Upgrade u, int events)
{
    // The look first: only bytes that came in can be the peer's offer or answer, which the read
    // would take and then say EAGAIN if nothing follows. A client takes its answer whatever it
    // waits for (one that only writes must switch too); a server's offer is taken by the
    // process that polls it for reading (the one that reads it).
    const int full = kernelPollNow(kKernelLookEvents);
    const int rev = full & (events | POLLIN | POLLERR | POLLHUP);
    if (!(rev & POLLIN) || (u == Upgrade::Maybe && !(events & POLLIN)))
        return rev & (events | POLLERR | POLLHUP);
    dataAfterMsg_ = false;
    // A look for reading leaves a message with bytes after it for the read, which takes both in
    // one recvmsg (upgradeStep()): the fd is readable for the program's bytes.
    if (upgradeProgress(events | (u == Upgrade::Answer ? POLLIN : 0), (events & POLLIN) != 0))
        return rev & (events | POLLERR | POLLHUP);
    if (upgrade_.load() != u) {
        // The message was taken and the peek saw bytes after it: the look still tells (one
        // system call less per connection).
        if (const uint64_t pass = Connection::HintPass::current(); pass && dataAfterMsg_)
            kernelLook_.store(pass << 20 | kLookDone | uint16_t(full), std::memory_order_relaxed);
        return pollEvents(events);
    }
    // Still not all of it here (or another thread is at it): readable when the rest comes.
    return (rev & (POLLERR | POLLHUP)) ? rev & (events | POLLERR | POLLHUP)
                                       : rev & events & ~POLLIN;
}

} // namespace rstream::shim
