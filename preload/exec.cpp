// SPDX-License-Identifier: MIT
// Connections a program finds open when it starts (passed across exec by an inetd-style
// server, socat EXEC:, socket activation): adopted as kernel TCP connections that the client
// may still upgrade in-band, as if this program had accepted them.
//
// A connection moves to the fabric at its first I/O, in the process that does it, so one that
// crossed exec before any I/O upgrades here. One that was upgraded before exec cannot follow
// (its fabric endpoint was the old program's): the upgrade shut its kernel TCP connection
// down, so this program reads EOF and gets EPIPE on it, never a silent hang.
//
// Except on descriptors 0, 1 and 2: an inetd-style program reads its connection through
// stdio, whose reads go to the kernel without passing through the shim. An upgrade offer
// there is answered now, before main, with a DECLINE: the connection stays kernel TCP and the
// program never sees a byte that is not its peer's.

#include <climits>
#include <dirent.h>
#include <map>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/stat.h>
#include <vector>

#include "clock.h"
#include "shim_object.h"
#include "upgrade_wire.h"

namespace rstream::shim {

namespace {

// An established TCP connection (not a listener, not one an upgrade shut down): its family.
int establishedTcp(int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode))
        return 0;
    int v = 0;
    socklen_t len = sizeof(v);
    if (sys::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &len) < 0 || (v != AF_INET && v != AF_INET6))
        return 0;
    const int family = v;
    len = sizeof(v);
    if (sys::getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &len) < 0 || v != SOCK_STREAM)
        return 0;
    tcp_info ti{};
    len = sizeof(ti);
    if (sys::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0 ||
        ti.tcpi_state != TCP_ESTABLISHED)
        return 0;
    return family;
}

// How long a program's start waits for a client's first bytes on a standard descriptor: a
// shimmed client sends its offer at once after it connects.
constexpr int kOfferWaitMs = 20;

// Answers an upgrade offer waiting on fd (or arriving within kOfferWaitMs) with a DECLINE.
void declineOffer(int fd)
{
    uint8_t buf[wire::kUpgradeHeaderSize];
    const int64_t deadline = nowMs() + kOfferWaitMs;
    for (;;) {
        iovec iov{buf, sizeof(buf)};
        msghdr mh{};
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        const ssize_t r = sys::recvmsg(fd, &mh, MSG_PEEK | MSG_DONTWAIT);
        wire::UpgradeMessage msg;
        size_t size = 0;
        const auto match = r > 0 ? wire::matchUpgrade(buf, static_cast<size_t>(r), &msg, &size)
                                 : wire::UpgradeMatch::No;
        if (match == wire::UpgradeMatch::Complete && msg.type == wire::UpgradeType::Hello) {
            sys::recvmsg(fd, &mh, MSG_DONTWAIT);
            uint8_t out[wire::kUpgradeMaxSize];
            wire::UpgradeMessage decline;
            decline.type = wire::UpgradeType::Decline;
            iovec oiov{out, wire::encodeUpgrade(decline, out)};
            msghdr omh{};
            omh.msg_iov = &oiov;
            omh.msg_iovlen = 1;
            sys::sendmsg(fd, &omh, MSG_DONTWAIT | MSG_NOSIGNAL);
            RS_LOG(Debug,
                   "preload: fd %d: an inherited connection's upgrade offer declined (a "
                   "standard descriptor: stdio reads it past the shim)",
                   fd);
            return;
        }
        const int64_t left = deadline - nowMs();
        if ((r != -EAGAIN && match != wire::UpgradeMatch::Partial) || left <= 0)
            return;
        pollfd p{fd, POLLIN, 0};
        const timespec ts{0, left * 1000000L};
        sys::ppoll(&p, 1, &ts, nullptr);
    }
}

} // namespace

void Shim::adoptInheritedSockets()
{
    if (!shimConfig().enabled)
        return;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return; // no /proc: inherited connections stay plain kernel TCP
    const int self = dirfd(d);
    // Every established TCP connection's descriptors, by socket (dups share one).
    std::map<ino_t, std::vector<std::pair<int, int>>> byInode; // fd, family
    while (dirent *e = readdir(d)) {
        char *end;
        const long fd = strtol(e->d_name, &end, 10);
        if (*end || end == e->d_name || fd == self || fd < 0 || fd > INT_MAX)
            continue;
        const int family = establishedTcp(static_cast<int>(fd));
        struct stat st;
        if (family && fstat(static_cast<int>(fd), &st) == 0)
            byInode[st.st_ino].emplace_back(static_cast<int>(fd), family);
    }
    int adopted = 0;
    for (auto &[inode, fds] : byInode) {
        // Ascending: fds.front() is the lowest. A standard descriptor means stdio.
        if (fds.front().first <= 2) {
            declineOffer(fds.front().first);
            continue;
        }
        const int fl = sys::fcntl(fds.front().first, F_GETFL);
        auto s = HybridSocket::acceptedKernel(fds.front().first, fds.front().second,
                                              fl >= 0 && (fl & O_NONBLOCK), shimConfig());
        for (auto &[fd, family] : fds)
            if (installSocket(fd, s))
                adopted++;
    }
    closedir(d);
    if (adopted)
        RS_LOG(Debug,
               "preload: %d inherited TCP connection descriptors, to be upgraded if their "
               "peers offer",
               adopted);
}

} // namespace rstream::shim
