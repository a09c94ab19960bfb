// SPDX-License-Identifier: MIT
// The in-band upgrade of a kernel TCP connection to the fabric (upgrade_wire.h): the client
// towards a shim listener (its beacon, or its Defer refusal), the server on connections its
// listener accepted over kernel TCP. It starts in the process that does the connection's first
// I/O, so a fork or exec between accept and the first I/O moves it with the connection.

#include "hybrid.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <linux/tcp.h>
#include <poll.h>
#include <vector>

#include "address.h"
#include "clock.h"
#include "hybrid_internal.h"
#include "log.h"
#include "shimaddr.h"
#include "upgrade.h"
#include "upgrade_wire.h"

namespace rstream::shim {

std::shared_ptr<HybridSocket> HybridSocket::acceptedKernel(int fd, int family, bool nonblocking,
                                                           const ShimConfig &config)
{
    auto s = std::make_shared<HybridSocket>(fd, family, nonblocking, config);
    s->accepted_ = true;
    s->mode_.store(Mode::Kernel, std::memory_order_relaxed);
    s->upgrade_.store(Upgrade::Maybe, std::memory_order_release);
    return s;
}

void HybridSocket::knowAddresses(const sockaddr_storage &local, socklen_t llen,
                                 const sockaddr_storage &peer, socklen_t plen)
{
    std::lock_guard<std::mutex> lock(mutex_);
    knownLocal_ = local;
    knownLocalLen_ = llen;
    knownPeer_ = peer;
    knownPeerLen_ = plen;
}

KernelAddresses HybridSocket::addresses()
{
    KernelAddresses a;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        a.local = knownLocal_;
        a.localLen = knownLocalLen_;
        a.peer = knownPeer_;
        a.peerLen = knownPeerLen_;
    }
    // A connection's addresses do not change: one fetched now is known from then on (a
    // record at close asked the kernel for both, two system calls a short connection).
    bool fetched = false;
    if (!a.localLen) {
        a.localLen = sizeof(a.local);
        if (sys::getsockname(fd_, reinterpret_cast<sockaddr *>(&a.local), &a.localLen) != 0)
            a.localLen = 0;
        fetched = a.localLen != 0;
    }
    if (!a.peerLen) {
        a.peerLen = sizeof(a.peer);
        if (sys::getpeername(fd_, reinterpret_cast<sockaddr *>(&a.peer), &a.peerLen) != 0)
            a.peerLen = 0;
        fetched = fetched || a.peerLen != 0;
    }
    if (fetched) {
        std::lock_guard<std::mutex> lock(mutex_);
        knownLocal_ = a.local;
        knownLocalLen_ = a.localLen;
        knownPeer_ = a.peer;
        knownPeerLen_ = a.peerLen;
    }
    return a;
}

char HybridSocket::inheritableUpgrade()
{
    std::lock_guard<std::mutex> lock(upgradeMutex_);
    switch (upgrade_.load()) {
    case Upgrade::Maybe:
        return serverWrote_ ? 0 : 's';
    case Upgrade::Offer:
        return 'c';
    default:
        return 0;
    }
}

void HybridSocket::adoptInherited(char state)
{
    std::lock_guard<std::mutex> lock(upgradeMutex_);
    mode_.store(Mode::Kernel, std::memory_order_release);
    if (state == 's') {
        accepted_ = true;
        upgrade_.store(Upgrade::Maybe, std::memory_order_release);
    } else if (state == 'c') {
        std::lock_guard<std::mutex> l(mutex_);
        peerLen_ = sizeof(peer_);
        if (sys::getpeername(fd_, reinterpret_cast<sockaddr *>(&peer_), &peerLen_) < 0)
            peerLen_ = 0;
        else
            upgrade_.store(Upgrade::Offer, std::memory_order_release);
    }
}

int HybridSocket::upgradeStep(bool out, int flags, const iovec *iov, int iovcnt, ssize_t *got)
{
    // Only a plain nonblocking read takes the program's bytes with a message: not a peek, nor
    // one that waits (for all of them, or for SO_RCVLOWAT's, which an accepted socket may have
    // from its listener): what a nonblocking read returns is whatever is there.
    const bool fuse = got && !out && !upgradeBlocking(flags) && iovcnt > 0 &&
                      iovcnt <= kFuseMaxIov && (flags & ~(MSG_DONTWAIT | MSG_NOSIGNAL)) == 0 &&
                      std::any_of(iov, iov + iovcnt, [](const iovec &v) { return v.iov_len > 0; });
    for (;;) {
        std::unique_lock<std::mutex> lock(upgradeMutex_);
        int r = 0;
        if (fuse)
            fuse_ = FusedRead{iov, iovcnt, 0};
        switch (upgrade_.load()) {
        case Upgrade::Offer:
            sendOfferLocked(); // the HELLO goes before the first byte of ours
            break;
        case Upgrade::Maybe:
            r = serverUpgradeLocked(out);
            break;
        default:
            break;
        }
        if (upgrade_.load() == Upgrade::Answer) {
            // The server's answer comes before its first byte: a read takes it first; a write
            // looks for it too (a client that only writes must switch as well).
            const int a = clientAnswerLocked();
            if (!out)
                r = a;
        }
        ssize_t n = 0;
        if (fuse) {
            n = std::exchange(fuse_, FusedRead{}).got;
            // Read after the message, as the late reads count them (from the message on).
            if (n > 0 && isLate(upgrade_.load()))
                lateRead_ += static_cast<uint64_t>(n);
        }
        if (late())
            lateStepLocked();
        if (n > 0) {
            *got = n;
            return 0;
        }
        if (r != -EAGAIN || !upgradeBlocking(flags))
            return r;
        // A blocking read waits for the peer's first bytes as the kernel would (SO_RCVTIMEO,
        // signals), without the upgrade's lock: a writer on another thread goes on.
        lock.unlock();
        uint8_t byte;
        const ssize_t w = peekKernel(&byte, 1, true);
        if (w < 0)
            return static_cast<int>(w);
    }
}

ssize_t HybridSocket::peekKernel(void *buf, size_t len, bool wait)
{
    iovec iov{buf, len};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    // A blocking peek sleeps in the kernel as the application's recv would (SO_RCVTIMEO,
    // signals): the fd is blocking exactly when the application's socket is.
    return sys::recvmsg(fd_, &mh, MSG_PEEK | (wait ? 0 : MSG_DONTWAIT));
}

ssize_t HybridSocket::headMessageLocked(wire::UpgradeMessage *msg, size_t *size,
                                        wire::UpgradeMatch *match, bool *after)
{
    const HeadMessage head = std::exchange(head_, HeadMessage{});
    if (head.size && head.epoch == forkEpoch_.load(std::memory_order_relaxed)) {
        *msg = head.msg;
        *size = head.size;
        *match = wire::UpgradeMatch::Complete;
        *after = true;
        return static_cast<ssize_t>(head.size) + 1;
    }
    // Room for any upgrade message and a byte past it: whether data follows it is known.
    uint8_t buf[wire::kUpgradeMaxSize + 1];
    const ssize_t r = peekKernel(buf, sizeof(buf), false);
    *match = r <= 0 ? wire::UpgradeMatch::No
                    : wire::matchUpgrade(buf, static_cast<size_t>(r), msg, size);
    *after = *match == wire::UpgradeMatch::Complete && static_cast<size_t>(r) > *size;
    return r;
}

void HybridSocket::leaveHeadLocked(const wire::UpgradeMessage &msg, size_t size)
{
    head_ = HeadMessage{msg, size, forkEpoch_.load(std::memory_order_relaxed)};
}

void HybridSocket::takeMessageLocked(size_t size)
{
    if (!fuse_.iov || size > wire::kUpgradeMaxSize) {
        consumeKernel(size);
        return;
    }
    kernelLook_.store(0, std::memory_order_relaxed); // the pass's look saw these bytes
    uint8_t msg[wire::kUpgradeMaxSize];
    iovec v[kFuseMaxIov + 1];
    v[0] = {msg, size};
    std::copy(fuse_.iov, fuse_.iov + fuse_.iovcnt, v + 1);
    msghdr mh{};
    mh.msg_iov = v;
    mh.msg_iovlen = static_cast<size_t>(fuse_.iovcnt) + 1;
    // A peek showed the message whole, and no other read runs in this step: it comes whole.
    const ssize_t n = sys::recvmsg(fd_, &mh, MSG_DONTWAIT);
    if (n < static_cast<ssize_t>(size)) {
        if (n >= 0)
            consumeKernel(size - static_cast<size_t>(n));
        return;
    }
    fuse_.got = n - static_cast<ssize_t>(size);
}

void HybridSocket::consumeKernel(size_t len)
{
    kernelLook_.store(0, std::memory_order_relaxed); // the pass's look saw these bytes
    uint8_t buf[wire::kUpgradeMaxSize];
    iovec iov{buf, std::min(len, sizeof(buf))};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    sys::recvmsg(fd_, &mh, MSG_DONTWAIT); // a peek showed them: they are there
}

bool HybridSocket::sendUpgradeMessage(int type, uint16_t port, uint64_t token)
{
    wire::UpgradeMessage msg;
    msg.type = static_cast<wire::UpgradeType>(type);
    msg.port = port;
    msg.token = token;
    uint8_t buf[wire::kUpgradeMaxSize];
    const size_t n = wire::encodeUpgrade(msg, buf);
    iovec iov{buf, n};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    // Nothing of the application's is queued before it (these are the first bytes, or follow
    // only other upgrade messages), so the send buffer has room for these few bytes.
    return sys::sendmsg(fd_, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(n);
}

void HybridSocket::lateNoteAddresses()
{
    const KernelAddresses a = addresses();
    lateLocal_ = a.local;
    lateLocalLen_ = a.localLen;
    latePeer_ = a.peer;
    latePeerLen_ = a.peerLen;
}

void HybridSocket::stayKernelLocked(Fallback why, const char *detail)
{
    const KernelAddresses a = addresses();
    const socklen_t plen = a.peerLen;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!fallbackCounted_) {
            fallback_ = why;
            fallbackCounted_ = true;
            countFallback(why);
            if (!record_ && plen)
                record_ = std::make_unique<ConnRecord>(fd_, false, why, accepted_, a.localAddr(),
                                                       a.localLen, a.peerAddr(), plen);
            if (record_)
                record_->markEstablished();
        }
    }
    if (why == Fallback::KernelPeer)
        RS_LOG_FD(Info, fd_, "kernel TCP from %s: %s (the peer connected over kernel TCP)",
                  plen ? addressText(a.peerAddr()).c_str() : "?", fallbackName(why));
    else if (why == Fallback::NotUpgraded)
        RS_LOG_FD(Info, fd_, "kernel TCP %s %s: not upgraded: %s", accepted_ ? "from" : "to",
                  plen ? describe(a.peerAddr()).c_str() : "?", detail);
    kernelGen_++;
}

void HybridSocket::adoptUpgradedLocked(std::shared_ptr<Socket> s, bool accepted)
{
    s->setNonblocking(nonblocking());
    KernelAddresses a = addresses();
    if (latePeerLen_) {
        a.local = lateLocal_;
        a.localLen = lateLocalLen_;
        a.peer = latePeer_;
        a.peerLen = latePeerLen_;
    }
    const sockaddr_storage &local = a.local, &peer = a.peer;
    const socklen_t llen = a.localLen, plen = a.peerLen;
    auto record = std::make_unique<ConnRecord>(fd_, true, Fallback::None, accepted, a.localAddr(),
                                               llen, a.peerAddr(), plen);
    record->setConnection(s->connection());
    const bool sameHost = s->connection() && s->connection()->sameHost();
    {
        std::lock_guard<std::mutex> lock(mutex_);
        bytes_ = &record->bytes();
        record_ = std::move(record);
        sock_ = std::move(s);
        accepted_ = accepted;
        upgraded_ = true;
        std::memcpy(&upLocal_, &local, sizeof(local));
        upLocalLen_ = llen;
        std::memcpy(&peer_, &peer, sizeof(peer));
        peerLen_ = plen;
        fallbackCounted_ = true;
        upgrade_.store(Upgrade::None, std::memory_order_release);
        mode_.store(Mode::Fabric, std::memory_order_release);
    }
    // The kernel TCP connection has done its part. Shut down, a program that inherits the fd
    // across exec (where the fabric endpoint cannot follow) reads EOF instead of waiting for
    // bytes that now travel on the fabric; the peer's shim no longer reads it.
    sys::shutdown(fd_, SHUT_RDWR);
    countFabricConnection();
    RS_LOG_FD(Debug, fd_, "upgraded to the %s (%s %s)", sameHost ? "same-host transport" : "fabric",
              accepted ? "from" : "to", plen ? describe(a.peerAddr()).c_str() : "?");
}

void HybridSocket::sendOfferLocked()
{
    // Not connected yet (a nonblocking connect in progress, or failed): the kernel answers
    // this call, the HELLO goes out with a later one. Nor after a byte of ours went some way
    // the shim does not see (splice, io_uring): the HELLO would land inside the stream.
    if (!kernelUntouched())
        return;
    if (!sendUpgradeMessage(static_cast<int>(wire::UpgradeType::Hello))) {
        upgrade_.store(Upgrade::None, std::memory_order_release);
        stayKernelLocked(Fallback::NotUpgraded, "the HELLO could not be sent");
        return;
    }
    // Our bytes follow, counted for the switch (hybrid_late.cpp); the connection's age, for
    // when it switches, counts from here.
    lateWritten_ = 0;
    lateSinceMs_ = nowMs();
    upgrade_.store(Upgrade::Answer, std::memory_order_release);
}

bool HybridSocket::kernelUntouched()
{
    struct tcp_info ti;
    std::memset(&ti, 0, sizeof(ti));
    socklen_t len = sizeof(ti);
    if (sys::getsockopt(fd_, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
        return false;
    constexpr uint8_t kEstablished = 1, kCloseWait = 8; // the kernel's TCP states
    if (ti.tcpi_state != kEstablished && ti.tcpi_state != kCloseWait)
        return false;
    // Kernels before 4.19 do not say what was sent: then only what is queued or unacked.
    if (len >= offsetof(struct tcp_info, tcpi_bytes_sent) + sizeof(ti.tcpi_bytes_sent))
        return ti.tcpi_bytes_sent == 0 && ti.tcpi_notsent_bytes == 0;
    return ti.tcpi_unacked == 0 && ti.tcpi_bytes_acked <= 1; // the SYN counts as one
}

ssize_t HybridSocket::sendPrefixed(const uint8_t *msg, size_t n, const iovec *iov, int iovcnt,
                                   int flags)
{
    iovec stack[8];
    std::vector<iovec> heap;
    iovec *all = stack;
    if (iovcnt + 1 > static_cast<int>(std::size(stack))) {
        heap.resize(static_cast<size_t>(iovcnt) + 1);
        all = heap.data();
    }
    all[0] = {const_cast<uint8_t *>(msg), n};
    for (int i = 0; i < iovcnt; i++)
        all[i + 1] = iov[i];
    msghdr mh{};
    mh.msg_iov = all;
    mh.msg_iovlen = static_cast<size_t>(iovcnt) + 1;
    const ssize_t r = sys::sendmsg(fd_, &mh, flags | MSG_NOSIGNAL); // SIGPIPE is the caller's
    if (r < 0)
        return r;
    if (static_cast<size_t>(r) < n) {
        RS_LOG_FD(Warn, fd_,
                  "upgrade: only %zd of the %zu bytes of an upgrade message went: "
                  "the connection is shut down",
                  r, n);
        sys::shutdown(fd_, SHUT_RDWR);
        return -ECONNRESET;
    }
    kernelLook_.store(0, std::memory_order_relaxed);
    return r - static_cast<ssize_t>(n);
}

bool HybridSocket::offerWithWrite(const iovec *iov, int iovcnt, int flags, ssize_t *result)
{
    // MSG_OOB marks the call's last byte urgent, which must stay the program's: the HELLO goes
    // first on its own then (as it does for more buffers than one sendmsg takes).
    const bool merge = !(flags & MSG_OOB) && iovcnt < IOV_MAX;
    size_t total = 0;
    for (int i = 0; i < iovcnt; i++)
        total += iov[i].iov_len;
    for (;;) {
        bool sendRest = false;
        {
            std::lock_guard<std::mutex> lock(upgradeMutex_);
            if (upgrade_.load() != Upgrade::Offer)
                return false;
            wire::UpgradeMessage msg;
            msg.type = wire::UpgradeType::Hello;
            uint8_t hello[wire::kUpgradeMaxSize];
            const size_t n = wire::encodeUpgrade(msg, hello);
            // Never blocking under the lock (a reader on another thread needs it): a blocking
            // write's remainder goes on below, as any write in Answer.
            const ssize_t r =
                sendPrefixed(hello, n, iov, merge ? iovcnt : 0, (merge ? flags : 0) | MSG_DONTWAIT);
            if (r >= 0) {
                lateWritten_ = static_cast<uint64_t>(r);
                lateSinceMs_ = nowMs();
                upgrade_.store(Upgrade::Answer, std::memory_order_release);
                if (!merge)
                    return false;
                *result = r;
                if (static_cast<size_t>(r) == total || !upgradeBlocking(flags))
                    return true;
                sendRest = true;
            } else if (r != -EAGAIN || !upgradeBlocking(flags)) {
                // Nothing went (not connected yet: EAGAIN as the kernel says; or its error).
                *result = r;
                return true;
            }
        }
        if (sendRest) {
            // A blocking write sends the rest as the kernel would, counted.
            std::vector<iovec> rest;
            size_t skip = static_cast<size_t>(*result);
            for (int i = 0; i < iovcnt; i++) {
                if (skip >= iov[i].iov_len) {
                    skip -= iov[i].iov_len;
                    continue;
                }
                rest.push_back(
                    {static_cast<uint8_t *>(iov[i].iov_base) + skip, iov[i].iov_len - skip});
                skip = 0;
            }
            const ssize_t more =
                io(true, rest.data(), static_cast<int>(rest.size()), flags & ~MSG_DONTWAIT);
            if (more > 0)
                *result += more;
            return true;
        }
        // A blocking write on a connection not established yet: the kernel waits for it (its
        // SO_SNDTIMEO, signals) in an empty send, outside the lock.
        msghdr empty{};
        if (const ssize_t w = sys::sendmsg(fd_, &empty, MSG_NOSIGNAL); w < 0) {
            *result = w;
            return true;
        }
        pollfd p{fd_, POLLOUT, 0};
        sys::ppoll(&p, 1, nullptr, nullptr); // established (or failed): the send says which
    }
}

} // namespace rstream::shim
