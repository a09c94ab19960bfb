// SPDX-License-Identifier: MIT
// The late switch (upgrade_wire.h): a client whose libfabric is still loading when the server
// accepts its upgrade does not wait for it. Both ends carry on over kernel TCP at once, counting
// the application bytes each writes and reads there, and move to the fabric mid-stream once the
// client's fabric is ready (or a same-host link is up: hybrid_link.cpp): each side declares how
// much it wrote over kernel TCP, writes only on the fabric from then on, and reads the kernel
// connection up to the other's count before reading the fabric. Nothing is framed or held
// back, and no call waits for the switch. Readiness while it runs: hybrid_poll.cpp.

#include "hybrid.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "clock.h"
#include "fabric.h"
#include "hybrid_internal.h"
#include "log.h"
#include "shimaddr.h"
#include "upgrade.h"
#include "upgrade_wire.h"

namespace rstream::shim {

namespace {

constexpr size_t kServerCountSize = 1 + 8; // the ack and M
constexpr size_t kClientCountSize = 8;     // N

} // namespace

void HybridSocket::lateGiveUpLocked(const char *why)
{
    // Before the switch: the kernel connection carries on alone, which the peer does too (the
    // client's fabric connection is closed before any count, or never made).
    if (upSock_) {
        upSock_->close();
        upSock_.reset();
    }
    upgrade_.store(Upgrade::None, std::memory_order_release);
    stayKernelLocked(Fallback::NotUpgraded, why);
}

void HybridSocket::serverGiveUpLocked(const char *why)
{
    if (pendingUl_) {
        pendingUl_->forget(pendingToken_);
        pendingUl_.reset();
    }
    dropLinkLocked();
    lateGiveUpLocked(why);
}

bool HybridSocket::lateReadCount(size_t need, bool *closed)
{
    while (lateBufLen_ < need) {
        iovec iov{lateBuf_ + lateBufLen_, need - lateBufLen_};
        const ssize_t r = upSock_->recv(&iov, 1, MSG_DONTWAIT);
        if (r > 0) {
            lateBufLen_ += static_cast<size_t>(r);
            continue;
        }
        // The end, or a reset: the fabric connection is gone. Anything else (EAGAIN, EINTR):
        // look again later.
        if (r == 0 || r == -ECONNRESET || r == -EPIPE || r == -ENOTCONN)
            *closed = true;
        return false;
    }
    return true;
}

bool HybridSocket::lateFinishLocked()
{
    if (upgrade_.load() != Upgrade::LateSwitch || !lateTargetKnown_)
        return false;
    std::unique_lock<std::mutex> r(lateReadMutex_, std::try_to_lock);
    std::unique_lock<std::mutex> w(lateWriteMutex_, std::try_to_lock);
    if (!r.owns_lock() || !w.owns_lock() || lateRead_ < lateTarget_)
        return false;
    // Both directions are on the fabric now.
    adoptUpgradedLocked(upSock_, accepted_);
    switchedUnseen_.store(true, std::memory_order_release);
    if (bytes_) {
        bytes_->sent.fetch_add(lateFabricSent_.load(), std::memory_order_relaxed);
        bytes_->received.fetch_add(lateFabricReceived_.load(), std::memory_order_relaxed);
    }
    return true;
}

void HybridSocket::lateStepLocked()
{
    switch (upgrade_.load()) {
    case Upgrade::LateLoad: {
        // This process may not have loaded libfabric yet (about 0.3 s of a thread's time). A
        // connection that is over within kLoadDelayMs would not switch anyway, and a
        // short-lived program would then only wait for the load at its exit: so only one that
        // lasts starts the load, or first tries a same-host link, which needs none.
        const bool ready = fabricReady();
        if (!ready && nowMs() - lateSinceMs_ < kLoadDelayMs)
            return;
        if (!lateLinkTried_) {
            lateLinkTried_ = true;
            if (lateLinkLocked())
                return;
        }
        if (!ready) {
            loadFabricInBackground(Settings::fromEnv());
            return;
        }
        // The switch begins: the kernel connection's addresses for its record, while it is
        // whole (noted now, not at the ACCEPT, so that short connections never pay for them).
        lateNoteAddresses();
        sockaddr_storage dest;
        socklen_t dlen;
        {
            std::lock_guard<std::mutex> l(mutex_);
            dest = peer_;
            dlen = peerLen_;
        }
        setPort(&dest, latePort_);
        std::shared_ptr<Socket> s;
        const int e = startFabric(reinterpret_cast<sockaddr *>(&dest), dlen, &s);
        if (e != 0 && e != -EINPROGRESS) {
            lateGiveUpLocked(strerror(-e));
            return;
        }
        upSock_ = std::move(s);
        upStepDeadlineMs_ = nowMs() + config_.connectTimeoutMs;
        upgrade_.store(Upgrade::LateConnect, std::memory_order_release);
        [[fallthrough]];
    }
    case Upgrade::LateConnect: {
        upSock_->pollEvents(POLLOUT); // moves the connect on
        int st = upSock_->connectStatus();
        if (st == -EINPROGRESS) {
            if (nowMs() < upStepDeadlineMs_)
                return;
            st = -ETIMEDOUT;
        }
        if (st != 0) {
            lateGiveUpLocked(strerror(-st));
            return;
        }
        // LateToken before the token goes out: once the server has it, the end of the kernel
        // connection may come at any moment, and a reader (another thread, in a kernel read
        // since before) must take it for a possible switch, not for the end of the stream.
        lateBufLen_ = 0;
        upgrade_.store(Upgrade::LateToken, std::memory_order_release);
        uint8_t token[wire::kUpgradeTokenSize];
        wire::encodeToken(pendingToken_, token);
        iovec iov{token, sizeof(token)};
        if (upSock_->send(&iov, 1, MSG_DONTWAIT | MSG_NOSIGNAL) !=
            static_cast<ssize_t>(sizeof(token))) {
            lateGiveUpLocked("the token could not be sent");
            return;
        }
        RS_LOG_FD(Debug, fd_, "switch: fabric connection up, token sent");
        [[fallthrough]];
    }
    case Upgrade::LateToken: {
        // Whenever the server gets to it (its next call or poll): its ack and count. A server
        // that claims a link writes them there before it shuts the kernel connection down, so
        // an end met before an empty link is the server's real end (hybrid_link.cpp).
        const bool ended = lateLink_ && lateKernelEnd_.load(std::memory_order_acquire);
        bool closed = false;
        if (!lateReadCount(kServerCountSize, &closed)) {
            if (closed || (ended && lateBufLen_ == 0)) {
                // The server's socket closed before it claimed the token (the connection is
                // ending there), or it no longer expected it: kernel TCP to the end.
                upSock_->close();
                upSock_.reset();
                upgrade_.store(Upgrade::None, std::memory_order_release);
                RS_LOG_FD(Info, fd_, "switch: the server closed the fabric connection first");
                stayKernelLocked(Fallback::BeforeSwitch, "the server did not take it");
            }
            return;
        }
        if (lateBuf_[0] != wire::kUpgradeAck) {
            lateGiveUpLocked("the server's answer was not the ack");
            return;
        }
        std::unique_lock<std::mutex> w(lateWriteMutex_, std::try_to_lock);
        if (!w.owns_lock())
            return; // a write is under way: the next look switches
        uint8_t n[kClientCountSize];
        wire::encodeToken(lateWritten_, n);
        iovec iov{n, sizeof(n)};
        const ssize_t sent = upSock_->send(&iov, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (sent == -EPIPE) {
            // The server closed its socket right after its ack (a reply and a close): it reads
            // nothing more, and what it wrote after the ack is in the fabric connection, ahead
            // of its end. The switch goes on without the count, so that those bytes are read.
            RS_LOG_FD(Debug, fd_, "switch: the server closed after its ack");
        } else if (sent != static_cast<ssize_t>(sizeof(n))) {
            // The server writes on the fabric already: without our count it cannot read on.
            upSock_->close();
            sys::shutdown(fd_, SHUT_RDWR);
            upgrade_.store(Upgrade::None, std::memory_order_release);
            stayKernelLocked(Fallback::NotUpgraded, "the count could not be sent: shut down");
            return;
        }
        // The server reads the kernel connection up to N, then its end.
        sys::shutdown(fd_, SHUT_WR);
        if (lateShutWr_)
            upSock_->shutdown(SHUT_WR);
        lateTarget_ = wire::decodeToken(lateBuf_ + 1);
        lateTargetKnown_ = true;
        RS_LOG_FD(Debug, fd_, "switch: wrote %llu bytes over kernel TCP, reads %llu of %llu",
                  static_cast<unsigned long long>(lateWritten_),
                  static_cast<unsigned long long>(lateRead_),
                  static_cast<unsigned long long>(lateTarget_));
        upSock_->setNonblocking(nonblocking()); // the application's calls use it now
        upgrade_.store(Upgrade::LateSwitch, std::memory_order_release);
        w.unlock();
        lateFinishLocked();
        return;
    }
    case Upgrade::LateServer: {
        if (acceptDropped_.load(std::memory_order_acquire)) {
            serverGiveUpLocked("the ACCEPT could not be sent");
            return;
        }
        if (acceptOwed_.load(std::memory_order_acquire)) {
            // A server that has not written by now sends its ACCEPT on its own; until then no
            // token can come, and nothing is pumped.
            if (nowMs() < acceptDueMs_)
                return;
            std::unique_lock<std::mutex> w(lateWriteMutex_, std::try_to_lock);
            if (!w.owns_lock() || !acceptOwed_.load())
                return; // a write is under way: it carries the ACCEPT
            if (!sendOwedAcceptLocked()) {
                acceptOwed_.store(false, std::memory_order_release);
                w.unlock();
                serverGiveUpLocked("the ACCEPT could not be sent");
            }
            return;
        }
        if (!upStepDeadlineMs_) {
            // The client loads libfabric first (~0.3 s, seconds on a busy machine), then
            // connects, and each step waits for one of its program's calls on the connection,
            // which an idle connection does not make. Until the token comes, every poll of the
            // socket looks at it.
            upStepDeadlineMs_ = nowMs() + config_.switchWaitMs + config_.connectTimeoutMs;
        }
        if (!upSock_) {
            if (!pendingUl_)
                return;
            upSock_ = pendingUl_->claim(pendingToken_);
            if (!upSock_ && (upSock_ = claimLinkLocked()))
                pendingUl_->forget(pendingToken_); // a fabric connection with it is closed
            if (!upSock_) {
                // A client that gave up (its fabric connect failed or timed out) sends no
                // token: the connection stays on kernel TCP, and stops costing every poll a
                // look. A token that comes later finds nobody and its connection is closed,
                // which the client takes for the server's no.
                if (nowMs() >= upStepDeadlineMs_)
                    serverGiveUpLocked("the client's fabric connection did not come in time");
                return;
            }
            pendingUl_.reset();  // claimed: no longer expected
            lateNoteAddresses(); // the switch begins (see LateLoad)
        }
        std::unique_lock<std::mutex> w(lateWriteMutex_, std::try_to_lock);
        if (!w.owns_lock())
            return;
        // LateSwitch before the ack goes out: once the client has it, the end of the kernel
        // connection may come at any moment, and a reader must take it for the switch.
        lateTargetKnown_ = false;
        lateBufLen_ = 0;
        upSock_->setNonblocking(nonblocking());
        upgrade_.store(Upgrade::LateSwitch, std::memory_order_release);
        uint8_t msg[kServerCountSize];
        msg[0] = wire::kUpgradeAck;
        wire::encodeToken(lateWritten_, msg + 1);
        iovec iov{msg, sizeof(msg)};
        const ssize_t sent = upSock_->send(&iov, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (sent == -EPIPE) {
            // The client closed its socket after its token: it wrote all it will write over
            // kernel TCP, which is read to its end here (the client counts it as ended before
            // its switch too).
            upSock_->close();
            upSock_.reset();
            upgrade_.store(Upgrade::None, std::memory_order_release);
            stayKernelLocked(Fallback::BeforeSwitch, "the client closed before its switch");
            return;
        }
        if (sent != static_cast<ssize_t>(sizeof(msg))) {
            lateGiveUpLocked("the ack could not be sent"); // the client reads EOF: gives up
            return;
        }
        sys::shutdown(fd_, SHUT_WR); // the client reads the kernel connection up to M
        RS_LOG_FD(Debug, fd_, "switch: claimed, wrote %llu bytes over kernel TCP",
                  static_cast<unsigned long long>(lateWritten_));
        if (lateShutWr_)
            upSock_->shutdown(SHUT_WR);
        w.unlock();
        [[fallthrough]];
    }
    case Upgrade::LateSwitch: {
        if (!lateTargetKnown_) {
            bool closed = false;
            if (!lateReadCount(kClientCountSize, &closed)) {
                if (closed) {
                    lateFabricEnd_ = true; // the client went away: the kernel end is the end
                    RS_LOG_FD(Info, fd_, "switch: the client closed the fabric connection first");
                }
                return;
            }
            lateTarget_ = wire::decodeToken(lateBuf_);
            lateTargetKnown_ = true;
            RS_LOG_FD(Debug, fd_, "switch: reads %llu of %llu over kernel TCP",
                      static_cast<unsigned long long>(lateRead_),
                      static_cast<unsigned long long>(lateTarget_));
        }
        lateFinishLocked();
        return;
    }
    default:
        return;
    }
}

ssize_t HybridSocket::lateIo(bool out, const iovec *iov, int iovcnt, int flags)
{
    if (out) {
        std::unique_lock<std::mutex> w(lateWriteMutex_);
        const Upgrade u = upgrade_.load();
        if (!isLate(u)) {
            w.unlock();
            return io(out, iov, iovcnt, flags);
        }
        if (u == Upgrade::LateSwitch) {
            const ssize_t r = upSock_->send(iov, iovcnt, flags);
            if (r > 0)
                lateFabricSent_ += static_cast<uint64_t>(r);
            return r;
        }
        if (u == Upgrade::LateServer && acceptOwed_.load(std::memory_order_acquire))
            return writeOwedAcceptLocked(iov, iovcnt, flags);
        const ssize_t r = kernelIo(true, iov, iovcnt, flags);
        if (r > 0)
            lateWritten_ += static_cast<uint64_t>(r);
        return r;
    }
    // A reader that meets the end of the kernel connection waits for the count its peer sent on
    // the fabric just before (within a round trip, unless the peer died):
    // RSTREAM_UPGRADE_TIMEOUT_MS.
    const int64_t deadline = nowMs() + config_.upgradeTimeoutMs;
    for (;;) {
        std::unique_lock<std::mutex> rd(lateReadMutex_);
        const Upgrade u = upgrade_.load();
        if (!isLate(u)) {
            rd.unlock();
            return io(out, iov, iovcnt, flags);
        }
        const bool known = u == Upgrade::LateSwitch && lateTargetKnown_;
        if (known && lateRead_ >= lateTarget_) {
            // The kernel part is read: the fabric from here on.
            rd.unlock();
            {
                std::unique_lock<std::mutex> ul(upgradeMutex_, std::try_to_lock);
                if (ul.owns_lock())
                    lateFinishLocked();
            }
            if (!late())
                return io(out, iov, iovcnt, flags);
            const ssize_t f = upSock_->recv(iov, iovcnt, flags);
            if (f > 0 && !(flags & MSG_PEEK))
                lateFabricReceived_ += static_cast<uint64_t>(f);
            return f;
        }
        // The kernel connection, never past the peer's count.
        std::vector<iovec> part;
        const iovec *use = iov;
        int usecnt = iovcnt;
        if (known) {
            uint64_t left = lateTarget_ - lateRead_;
            for (int i = 0; i < iovcnt && left; i++) {
                const size_t n = static_cast<size_t>(std::min<uint64_t>(iov[i].iov_len, left));
                part.push_back({iov[i].iov_base, n});
                left -= n;
            }
            use = part.data();
            usecnt = static_cast<int>(part.size());
        }
        const ssize_t r = kernelIo(false, use, usecnt, flags);
        if (r > 0) {
            if (!(flags & MSG_PEEK))
                lateRead_ += static_cast<uint64_t>(r);
            return r;
        }
        if (r != 0)
            return r;
        lateKernelEnd_.store(true, std::memory_order_release);
        // The end of the kernel connection: the real end, or the peer switched (it sent its
        // count on the fabric before shutting the kernel connection down). The state as it is
        // now: another thread may have moved the switch on while this read waited.
        const Upgrade cur = upgrade_.load();
        if (!isLate(cur))
            continue; // switched meanwhile (our own shutdown ended the read): the fabric
        if (cur == Upgrade::LateSwitch && lateTargetKnown_) {
            if (lateRead_ < lateTarget_) {
                RS_LOG_FD(Info, fd_, "switch: kernel TCP ended after %llu of %llu bytes: reset",
                          static_cast<unsigned long long>(lateRead_),
                          static_cast<unsigned long long>(lateTarget_));
                return -ECONNRESET; // fewer bytes than the peer declared
            }
            continue; // all of them read: the fabric
        }
        if (cur != Upgrade::LateToken && cur != Upgrade::LateSwitch)
            return 0; // before any token: the server cannot have switched, the real end
        if (cur == Upgrade::LateSwitch && lateFabricEnd_)
            return 0;
        rd.unlock();
        // The count decides: step until it is here (or the fabric connection ended).
        {
            std::lock_guard<std::mutex> ul(upgradeMutex_);
            lateStepLocked();
        }
        const Upgrade now = upgrade_.load();
        if (!isLate(now) || (now == Upgrade::LateSwitch && (lateTargetKnown_ || lateFabricEnd_)))
            continue;
        if (!upgradeBlocking(flags))
            return -EAGAIN;
        if (nowMs() >= deadline) {
            RS_LOG_FD(Info, fd_, "switch: no count from the peer within %d ms: reset",
                      config_.upgradeTimeoutMs);
            return -ECONNRESET;
        }
        std::vector<pollfd> fds;
        if (upSock_->prepareWait(&fds, POLLIN) == -EAGAIN)
            continue;
        const timespec tick{0, 100 * 1000000L};
        if (sys::ppoll(fds.data(), fds.size(), &tick, nullptr) == -EINTR)
            return -EINTR;
    }
}

bool HybridSocket::lateEndMayBeSwitch(Upgrade u) const
{
    // The client's token went out, or the server claimed it: the peer may have switched, and
    // only its count (on the fabric) tells the switch from the end of the stream.
    return u == Upgrade::LateToken ||
           (u == Upgrade::LateSwitch && !lateTargetKnown_ && !lateFabricEnd_);
}

bool HybridSocket::lateKernelAtEnd()
{
    if (lateKernelEnd_.load(std::memory_order_acquire))
        return true;
    uint8_t byte;
    if (peekKernel(&byte, 1, false) != 0)
        return false; // data (or nothing yet, or an error the read reports)
    lateKernelEnd_.store(true, std::memory_order_release);
    return true;
}

int HybridSocket::lateFionread(int *bytes)
{
    // Without the read lock, as a poll looks: a blocking read may hold it.
    const Upgrade u = upgrade_.load();
    const bool known = u == Upgrade::LateSwitch && lateTargetKnown_;
    int kernel = 0;
    if ((!known || lateRead_ < lateTarget_) && ::syscall(SYS_ioctl, fd_, FIONREAD, &kernel) < 0)
        return -errno;
    if (!known) {
        *bytes = kernel;
        return 0;
    }
    // What is left of the peer's kernel bytes, then (once they are read) the fabric's.
    const uint64_t left = lateTarget_ - std::min(lateRead_, lateTarget_);
    if (left) {
        *bytes = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(kernel), left));
        return 0;
    }
    return upSock_->readable(bytes);
}

void HybridSocket::lateAccount()
{
    std::lock_guard<std::mutex> lock(upgradeMutex_);
    const Upgrade u = upgrade_.load();
    if (!isLate(u))
        return;
    // A server that closes before its client's count came: the client sent it over the fabric
    // before it saw the end, and what a closed connection gets is answered with a reset, which
    // costs the client what it has not read yet (this end's last bytes). The count is dropped.
    if (u == Upgrade::LateSwitch && accepted_ && !lateTargetKnown_ && upSock_)
        upSock_->allowAfterClose(kClientCountSize);
    // A server whose client closed before sending its count never read a byte of it over the
    // fabric: that connection ended before its switch as well, as the client counts it.
    if (u != Upgrade::LateSwitch || (!lateTargetKnown_ && lateFabricEnd_)) {
        stayKernelLocked(Fallback::BeforeSwitch, "it ended before its switch to the fabric");
        return;
    }
    std::lock_guard<std::mutex> l(mutex_);
    if (!fallbackCounted_) {
        fallbackCounted_ = true;
        countFabricConnection(); // it ended on the fabric, its first bytes over kernel TCP
    }
}

int HybridSocket::lateShutdown(int how)
{
    std::lock_guard<std::mutex> w(lateWriteMutex_);
    if (upgrade_.load() == Upgrade::LateSwitch) {
        int r = 0;
        if (how != SHUT_RD)
            r = upSock_->shutdown(SHUT_WR); // the kernel side is shut down already
        if (how != SHUT_WR)
            sys::shutdown(fd_, SHUT_RD);
        return r;
    }
    if (how != SHUT_RD) {
        lateShutWr_ = true; // the fabric's sending side goes too, at the switch
        // Still owed: it goes before the end, or the client takes the end for no answer (and
        // the next step here gives up, the connection no longer established).
        if (acceptOwed_.load(std::memory_order_acquire))
            sendOwedAcceptLocked();
    }
    return sys::shutdown(fd_, how);
}

} // namespace rstream::shim
