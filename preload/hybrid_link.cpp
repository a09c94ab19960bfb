// SPDX-License-Identifier: MIT
// The late switch over a same-host link set up on the kernel TCP connection itself, without
// libfabric: a client whose server is on this host makes a link and sends it, with the token of
// the server's ACCEPT, to the name the server's upgrade listener answers to (upgrade.h); the
// server claims it by token as it would claim the client's fabric connection, and the counts of
// the switch (hybrid_late.cpp) then travel on the link. Where nothing answers to that name (a
// server in another network namespace, or one that does not take links), the fabric carries
// the switch as before, and its own setup may still choose a same-host link.

#include "hybrid.h"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include "clock.h"
#include "hybrid_internal.h"
#include "log.h"
#include "samehost.h"
#include "samehost_setup.h"
#include "shimaddr.h"
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

// The owner (uid) of the TCP socket listening at addr (its port set), from the kernel's socket
// diagnostics: 0 and *uid, or -errno.
int listenerUid(const sockaddr_storage &addr, uid_t *uid)
{
    struct
    {
        nlmsghdr nlh;
        inet_diag_req_v2 req;
    } q{};
    q.nlh.nlmsg_len = sizeof(q);
    q.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    q.nlh.nlmsg_flags = NLM_F_REQUEST; // one socket, looked up: no dump
    q.req.sdiag_family = static_cast<uint8_t>(addr.ss_family);
    q.req.sdiag_protocol = IPPROTO_TCP;
    q.req.idiag_states = 1u << TCP_LISTEN;
    q.req.id.idiag_cookie[0] = q.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
    if (addr.ss_family == AF_INET) {
        const auto &a = reinterpret_cast<const sockaddr_in &>(addr);
        q.req.id.idiag_sport = a.sin_port;
        std::memcpy(q.req.id.idiag_src, &a.sin_addr, sizeof(a.sin_addr));
    } else if (addr.ss_family == AF_INET6) {
        const auto &a = reinterpret_cast<const sockaddr_in6 &>(addr);
        q.req.id.idiag_sport = a.sin6_port;
        if (IN6_IS_ADDR_V4MAPPED(&a.sin6_addr)) {
            // The upgrade listener of a dual-stack server's IPv4 client is an IPv4 one.
            q.req.sdiag_family = AF_INET;
            std::memcpy(q.req.id.idiag_src, &a.sin6_addr.s6_addr[12], 4);
        } else {
            std::memcpy(q.req.id.idiag_src, &a.sin6_addr, sizeof(a.sin6_addr));
        }
    } else {
        return -EAFNOSUPPORT;
    }
    const int fd = sys::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (fd < 0)
        return fd;
    iovec iov{&q, sizeof(q)};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    alignas(nlmsghdr) uint8_t buf[1024];
    ssize_t r = sys::sendmsg(fd, &m, MSG_NOSIGNAL);
    if (r >= 0) {
        iov = {buf, sizeof(buf)};
        r = sys::recvmsg(fd, &m, 0);
    }
    sys::close(fd);
    if (r < 0)
        return static_cast<int>(r);
    const auto *h = reinterpret_cast<const nlmsghdr *>(buf);
    if (!NLMSG_OK(h, static_cast<size_t>(r)))
        return -EPROTO;
    if (h->nlmsg_type == NLMSG_ERROR) {
        const auto *e = static_cast<const nlmsgerr *>(NLMSG_DATA(h));
        return e->error < 0 ? e->error : -EPROTO;
    }
    if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY || h->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg)))
        return -EPROTO;
    *uid = static_cast<const inet_diag_msg *>(NLMSG_DATA(h))->idiag_uid;
    return 0;
}

// Whether the process listening at the link name we connected to may have the link: it must be
// the server's. Abstract names are anybody's to bind in the network namespace, so a process that
// took the name first would otherwise get the link and could act as the server. The name's owner
// must be the user that owns the upgrade port's fabric listener (the server's process made both),
// or, where the kernel does not say who owns that, this process's own user.
bool linkOwnerTrusted(const SameHostOffer &offer, const sockaddr_storage &upgradePort, int fd)
{
    ucred owner{};
    if (offer.peerCredentials(&owner) < 0)
        return false;
    uid_t listener = 0;
    const int r = listenerUid(upgradePort, &listener);
    const uid_t want = r == 0 ? listener : geteuid();
    if (owner.uid == want)
        return true;
    // A warning once per process (whoever squats the names would otherwise fill the log), then
    // at debug level.
    static std::atomic<bool> warned{false};
    const LogLevel level = warned.exchange(true) ? LogLevel::Debug : LogLevel::Warn;
    if (logEnabled(level))
        logWriteFd(level, fd,
                   "switch: the same-host link's socket belongs to uid %u, not %u%s: no link",
                   static_cast<unsigned>(owner.uid), static_cast<unsigned>(want),
                   r == 0 ? " (the upgrade port's)" : "");
    return false;
}

} // namespace

std::shared_ptr<Socket> HybridSocket::linkSocketLocked(std::shared_ptr<Socket> s,
                                                       std::unique_ptr<SameHostLink> link)
{
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
    // The engine socket that will carry the link comes first: the program's options on it
    // (SO_SNDBUF, SO_RCVBUF) size the link's rings, as they size a connection's over the
    // fabric; this end makes the region, so the sizes are its to choose.
    auto sock = newEngineSocket(settings);
    SameHostOffer offer;
    int r = offer.open(name, sameHostRings(sock->connectionSettings()));
    if (r < 0) {
        // Nothing answers there (ECONNREFUSED): a server that takes no links, or in another
        // network namespace. The fabric, then.
        RS_LOG_FD(Debug, fd_, "switch: no same-host link (%s): over the fabric", strerror(-r));
        return false;
    }
    sockaddr_storage port = latePeer_;
    setPort(&port, latePort_);
    if (!linkOwnerTrusted(offer, port, fd_))
        return false; // closed unsent: the fabric, whose setup has the server's own word
    auto s = linkSocketLocked(std::move(sock), offer.takeLink());
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
    auto s = linkSocketLocked(newEngineSocket(upgradeSettings()), std::move(link));
    if (s)
        RS_LOG_FD(Debug, fd_, "switch: the client's same-host link claimed");
    // Not taken: the link is closed, which the client, waiting for the ack, takes for the
    // server's no (it stays on kernel TCP).
    return s;
}

int HybridSocket::linkWaitFdsLocked(std::vector<pollfd> *fds)
{
    // The link's arrival wakes a server asleep on the connection (its client, waiting for the
    // switch's count, may write nothing until then): the inbox's names' fds. Arrived: the
    // next look claims it, the once-a-millisecond pace aside.
    if (!linkPossible_)
        return 0;
    const int r = sameHostWaitFds(pendingToken_, Connection::HintPass::current(), fds);
    if (r == -EAGAIN) {
        linkLookMs_ = 0;
        return r;
    }
    return 0;
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
