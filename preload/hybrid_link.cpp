// SPDX-License-Identifier: MIT
// The late switch over a same-host link set up on the kernel TCP connection itself, without
// libfabric: a client whose server is on this host makes a link and sends it, with the token of
// the server's ACCEPT, to the name the server's upgrade listener answers to (upgrade.h); the
// server claims it by token as it would claim the client's fabric connection, and the counts of
// the switch (hybrid_late.cpp) then travel on the link. Where nothing answers to that name (a
// server in another network namespace, or one that does not take links), the fabric carries
// the switch as before, and its own setup may still choose a same-host link.

#include "hybrid.h"

#include <cerrno>
#include <cstring>
#include <netinet/in.h>

#include "clock.h"
#include "hybrid_internal.h"
#include "log.h"
#include "samehost.h"
#include "samehost_setup.h"
#include "upgrade.h"

namespace rstream::shim {

namespace {

// The peer of a connection between local and peer is on this host, as far as the addresses
// tell: a loopback address, or the connection's own. Two addresses of this host (or another
// network namespace's) are left to the fabric's setup, which knows.
bool peerOnThisHost(const sockaddr_storage &local, const sockaddr_storage &peer)
{
    if (local.ss_family != peer.ss_family)
        return false;
    if (peer.ss_family == AF_INET) {
        const auto &l = reinterpret_cast<const sockaddr_in &>(local);
        const auto &p = reinterpret_cast<const sockaddr_in &>(peer);
        return (ntohl(p.sin_addr.s_addr) >> 24) == 127 || l.sin_addr.s_addr == p.sin_addr.s_addr;
    }
    if (peer.ss_family == AF_INET6) {
        const auto &l = reinterpret_cast<const sockaddr_in6 &>(local);
        const auto &p = reinterpret_cast<const sockaddr_in6 &>(peer);
        if (IN6_IS_ADDR_LOOPBACK(&p.sin6_addr) ||
            std::memcmp(&l.sin6_addr, &p.sin6_addr, sizeof(in6_addr)) == 0)
            return true;
        return IN6_IS_ADDR_V4MAPPED(&p.sin6_addr) && p.sin6_addr.s6_addr[12] == 127;
    }
    return false;
}

} // namespace

std::shared_ptr<Socket> HybridSocket::linkSocketLocked(std::unique_ptr<SameHostLink> link,
                                                       const Settings &settings)
{
    auto s = std::make_shared<Socket>(family_, settings);
    std::vector<Option> options;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        options = options_;
    }
    for (auto &o : options)
        s->setsockopt(o.level, o.name, o.value.data(), static_cast<socklen_t>(o.value.size()));
    s->setNonblocking(true);
    const int r =
        s->adoptSameHost(std::move(link), reinterpret_cast<sockaddr *>(&lateLocal_), lateLocalLen_,
                         reinterpret_cast<sockaddr *>(&latePeer_), latePeerLen_);
    if (r < 0) {
        RS_LOG_FD(Warn, fd_, "switch: the same-host link not taken: %s", strerror(-r));
        return nullptr;
    }
    return s;
}

bool HybridSocket::lateLinkLocked()
{
    const Settings settings = upgradeSettings();
    if (!settings.sameHost)
        return false;
    lateNoteAddresses();
    if (!latePeerLen_ || !lateLocalLen_ || !peerOnThisHost(lateLocal_, latePeer_))
        return false;
    const std::string name =
        upgradeLinkName(reinterpret_cast<sockaddr *>(&latePeer_), latePeerLen_, latePort_);
    SameHostOffer offer;
    int r = offer.open(name, sameHostRingSize(settings));
    if (r < 0) {
        // Nothing answers there (ECONNREFUSED): a server that takes no links, or in another
        // network namespace. The fabric, then.
        RS_LOG_FD(Debug, fd_, "switch: no same-host link (%s): over the fabric", strerror(-r));
        return false;
    }
    auto s = linkSocketLocked(offer.takeLink(), settings);
    if (!s)
        return false; // nothing was sent: the fabric
    // LateToken before the link goes, as before the fabric's token (lateStepLocked): once the
    // server has it, the end of the kernel connection may come at any moment.
    upSock_ = std::move(s);
    lateLink_ = true;
    lateBufLen_ = 0;
    upgrade_.store(Upgrade::LateToken, std::memory_order_release);
    if ((r = offer.send(pendingToken_)) < 0) {
        // The server has nothing (its arrival, if any, has no token and is dropped).
        RS_LOG_FD(Info, fd_, "switch: the same-host link could not be sent: %s", strerror(-r));
        lateGiveUpLocked("the same-host link could not be sent");
        return true;
    }
    RS_LOG_FD(Debug, fd_, "switch: same-host link up, token sent");
    return true;
}

void HybridSocket::noteLinkPossible(const UpgradeListener &ul)
{
    const KernelAddresses a = addresses();
    linkPossible_ = ul.takesLinks() && a.localLen && a.peerLen && peerOnThisHost(a.local, a.peer);
    linkLookMs_ = 0;
}

std::shared_ptr<Socket> HybridSocket::claimLinkLocked()
{
    if (!linkPossible_)
        return nullptr;
    // A look takes the inbox's new arrivals (an accept per name it answers to): once a
    // millisecond at most, while the client's switch is due (after its kLoadDelayMs).
    const int64_t now = nowMs();
    if (now < linkLookMs_)
        return nullptr;
    linkLookMs_ = now + 1;
    std::unique_ptr<SameHostLink> link;
    if (collectSameHost(pendingToken_, 0, &link) < 0)
        return nullptr;
    lateNoteAddresses();
    auto s = linkSocketLocked(std::move(link), upgradeSettings());
    if (s)
        RS_LOG_FD(Debug, fd_, "switch: the client's same-host link claimed");
    // Not taken: the link is closed, which the client, waiting for the ack, takes for the
    // server's no (it stays on kernel TCP).
    return s;
}

void HybridSocket::dropLinkLocked()
{
    // A link that comes later finds no arrival of its token taken: dropped with the inbox's
    // stale ones (30 s). One that came already is closed now, for the client to see.
    std::unique_ptr<SameHostLink> link;
    if (linkPossible_)
        (void)collectSameHost(pendingToken_, 0, &link);
    linkPossible_ = false;
}

} // namespace rstream::shim
