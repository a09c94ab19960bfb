// SPDX-License-Identifier: MIT
// The shim's sockets: their life, modes and the syscalls once the path is decided.

#include "hybrid.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <new>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fabric.h"
#include "hybrid_internal.h"
#include "log.h"
#include "shimaddr.h"
#include "upgrade.h"

namespace rstream::shim {

namespace {
std::atomic<bool> gEngineUsed{false};

// Sockets inherited across fork keep their engine objects alive, untouched, for good: the
// parent owns the connections, and destroying them here would disconnect the parent.
std::vector<std::shared_ptr<Socket>> &inheritedSockets()
{
    static auto *v = new std::vector<std::shared_ptr<Socket>>();
    return *v;
}

} // namespace

bool engineUsed()
{
    return gEngineUsed.load(std::memory_order_relaxed);
}

Settings upgradeSettings()
{
    Settings s = Settings::fromEnv();
    s.upgrade = true;
    return s;
}

void noteEngineUsed()
{
    gEngineUsed.store(true, std::memory_order_relaxed);
}

std::string fallbackDetail(Fallback why, int port, const std::string &where, int err, int timeoutMs)
{
    switch (why) {
    case Fallback::Refused:
        return "nothing listens on " + where;
    case Fallback::Timeout:
        return "no answer from " + where + " within " + std::to_string(timeoutMs) + " ms";
    case Fallback::Excluded:
        return "RSTREAM_EXCLUDE";
    case Fallback::Ports:
        return "port " + std::to_string(port) + " is not in RSTREAM_PORTS";
    case Fallback::NegativeCache:
        return "the fabric at " + where + " failed less than RSTREAM_NEGATIVE_CACHE_MS ago";
    case Fallback::ProviderError:
    case Fallback::PortBusy:
        return where + ": " + strerror(err);
    case Fallback::Unsupported:
        return port ? "no fabric port for port " + std::to_string(port) : "address family";
    case Fallback::ForkChild:
        return "a socket inherited in a fork child";
    default:
        return "";
    }
}

HybridSocket::HybridSocket(int fd, int family, bool nonblocking, const ShimConfig &config)
    : fd_(fd), family_(family), config_(config)
{
    nonblock_.store(nonblocking, std::memory_order_relaxed);
}

std::pair<std::shared_ptr<Socket>, HybridSocket::Mode> HybridSocket::snapshot()
{
    std::lock_guard<std::mutex> lock(mutex_);
    return {sock_, mode_.load()};
}

Socket *HybridSocket::fixSocket()
{
    // Cheap refusals first: a look at a socket that is not a settled connection (a kernel one,
    // a listener) must not take the lock either.
    if (mode() != Mode::Fabric || tentative_.load(std::memory_order_acquire) || upgradePending())
        return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    // Once settled, nothing replaces sock_ (connect, settleSlow and the upgrade set it only
    // before; a fork child clears fixed_ before it moves sock_ away).
    if (mode_.load() != Mode::Fabric || !sock_ || tentative_.load() || upgradePending())
        return nullptr;
    fixed_.store(sock_.get(), std::memory_order_release);
    return sock_.get();
}

std::shared_ptr<Socket> HybridSocket::socket()
{
    std::lock_guard<std::mutex> lock(mutex_);
    return sock_;
}

// The connection's record (and what it moved) goes with record_.
HybridSocket::~HybridSocket()
{
    dropBeaconsLocked();
    if (const int ep = lookEp_.load(std::memory_order_relaxed); ep >= 0)
        sys::close(ep);
    if (pendingUl_) {
        pendingUl_->forget(pendingToken_); // a token nobody will claim
        dropLinkLocked();
    }
}

void HybridSocket::dropBeaconsLocked()
{
    closeBeacon(beaconFd_, reinterpret_cast<sockaddr *>(&beaconAddr_));
    beaconFd_ = -1;
    if (beaconFd4_ >= 0) {
        sockaddr_in v4{};
        v4.sin_family = AF_INET;
        v4.sin_port = reinterpret_cast<sockaddr_in6 *>(&beaconAddr_)->sin6_port;
        closeBeacon(beaconFd4_, reinterpret_cast<sockaddr *>(&v4));
        beaconFd4_ = -1;
    }
}

void HybridSocket::setNonblocking(bool on)
{
    setNonblockingEngine(on);
    if (mode() != Mode::Listener) {
        // The kernel fd follows, so forwarding to it (after a fallback) behaves the same.
        int fl = sys::fcntl(fd_, F_GETFL);
        if (fl >= 0)
            sys::fcntl(fd_, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
    }
}

void HybridSocket::setNonblockingEngine(bool on)
{
    nonblock_.store(on, std::memory_order_relaxed);
    if (late()) {
        std::lock_guard<std::mutex> lock(upgradeMutex_);
        if (upgrade_.load() == Upgrade::LateSwitch && upSock_)
            upSock_->setNonblocking(on);
    }
    auto [s, m] = snapshot();
    if (m == Mode::Fabric && s)
        s->setNonblocking(on);
}

int HybridSocket::getFlags()
{
    int fl = sys::fcntl(fd_, F_GETFL);
    if (fl < 0)
        return fl;
    return nonblocking() ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
}

int HybridSocket::setFlags(int flags)
{
    // The kernel fd gets the program's flags below, in one F_SETFL.
    setNonblockingEngine(flags & O_NONBLOCK);
    int fl = flags;
    if (mode() == Mode::Listener)
        fl |= O_NONBLOCK; // the listener's kernel fd stays nonblocking; accept() emulates
    else
        fl = nonblocking() ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
    return sys::fcntl(fd_, F_SETFL, fl);
}

int HybridSocket::applyOptions(Socket &s)
{
    for (auto &o : options_)
        s.setsockopt(o.level, o.name, o.value.data(), static_cast<socklen_t>(o.value.size()));
    return 0;
}

int HybridSocket::bind(const sockaddr *addr, socklen_t len)
{
    Mode m = mode();
    if (m == Mode::Fabric || m == Mode::Listener)
        return -EINVAL;
    // Port 0: the kernel's pick, with a free fabric port beside it (a server on an ephemeral
    // port, as tests and some services use, would otherwise get a kernel-only listener
    // whenever its fabric port was another connection's ephemeral port).
    bool noFabric;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        noFabric = noFabric_;
    }
    const bool pair = !noFabric && m == Mode::Undecided;
    if (int r = pair ? bindPortPair(addr, len) : sys::bind(fd_, addr, len); r < 0)
        return r;
    std::lock_guard<std::mutex> lock(mutex_);
    boundLen_ = std::min<socklen_t>(len, sizeof(bound_));
    std::memcpy(&bound_, addr, boundLen_);
    return 0;
}

HybridSocket::Wait HybridSocket::wait(int flags)
{
    // Connecting: EAGAIN as TCP says, or a blocking call waits for the connection (or the
    // fallback to kernel TCP, which it then uses).
    return nonblocking() || (flags & MSG_DONTWAIT) ? Wait::No : Wait::Settle;
}

ssize_t HybridSocket::send(const iovec *iov, int iovcnt, int flags)
{
    return io(true, iov, iovcnt, flags);
}

ssize_t HybridSocket::recv(const iovec *iov, int iovcnt, int flags)
{
    return io(false, iov, iovcnt, flags);
}

ssize_t HybridSocket::io(bool out, const iovec *iov, int iovcnt, int flags)
{
    if (Socket *f = fixedSocket()) {
        const ssize_t r = out ? f->send(iov, iovcnt, flags) : f->recv(iov, iovcnt, flags);
        countIo(out, r, flags);
        return r;
    }
    std::shared_ptr<Socket> s;
    Mode m;
    if (int r = settledSnapshot(wait(flags), &s, &m); r < 0)
        return r;
    if (m == Mode::Inherited)
        return -EIO;
    if (m == Mode::Kernel && upgradePending()) {
        // A client's first write carries its HELLO, in one segment.
        if (ssize_t r;
            out && upgrade_.load() == Upgrade::Offer && offerWithWrite(iov, iovcnt, flags, &r))
            return r;
        ssize_t got = 0;
        if (int r = upgradeStep(out, flags, iov, iovcnt, &got); r < 0)
            return r;
        if (got > 0)
            return got; // the program's bytes, read with an upgrade message before them
        if (late())
            return lateIo(out, iov, iovcnt, flags);
        std::tie(s, m) = snapshot();
    }
    if (m == Mode::Kernel)
        return kernelIo(out, iov, iovcnt, flags); // fell back while this waited
    if (m != Mode::Fabric)
        return -ENOTSOCK; // the shim forwards other modes to the kernel
    ssize_t r = out ? s->send(iov, iovcnt, flags) : s->recv(iov, iovcnt, flags);
    countIo(out, r, flags);
    return r;
}

void HybridSocket::countIo(bool out, ssize_t r, int flags)
{
    if (r > 0 && out)
        bytes_->sent.fetch_add(static_cast<uint64_t>(r), std::memory_order_relaxed);
    else if (r > 0 && !(flags & MSG_PEEK))
        bytes_->received.fetch_add(static_cast<uint64_t>(r), std::memory_order_relaxed);
}

int HybridSocket::shutdown(int how)
{
    std::shared_ptr<Socket> s;
    Mode m;
    if (int r = settledSnapshot(Wait::Load, &s, &m); r < 0)
        return r;
    if (late())
        return lateShutdown(how);
    switch (m) {
    case Mode::Fabric:
        return s->shutdown(how);
    case Mode::Inherited:
        return -EIO;
    case Mode::Listener:
        if (s)
            s->shutdown(how);
        [[fallthrough]];
    default:
        return sys::shutdown(fd_, how);
    }
}

int HybridSocket::setsockopt(int level, int name, const void *val, socklen_t len)
{
    settle();
    std::lock_guard<std::mutex> lock(mutex_);
    Mode m = mode_.load();
    // While a fabric attempt is in progress the kernel fd keeps the option too: a fallback
    // connects it.
    const bool tentative = tentative_.load(std::memory_order_acquire);
    if (m == Mode::Fabric && !tentative)
        return sock_->setsockopt(level, name, val, len);
    if (m == Mode::Inherited)
        return -EIO;
    // The kernel validates and keeps it (a fallback needs it); the engine gets it too.
    if (int r = sys::setsockopt(fd_, level, name, val, len); r < 0)
        return r;
    if (level == SOL_SOCKET && name == SO_RCVTIMEO && val && len >= sizeof(timeval)) {
        timeval tv;
        std::memcpy(&tv, val, sizeof(tv));
        rcvTimeoutMs_ = static_cast<int>(tv.tv_sec * 1000 + tv.tv_usec / 1000);
    }
    if ((m == Mode::Listener || m == Mode::Fabric) && sock_) {
        sock_->setsockopt(level, name, val, len);
        return 0;
    }
    auto it = std::find_if(options_.begin(), options_.end(),
                           [&](const Option &o) { return o.level == level && o.name == name; });
    Option o{level, name,
             std::vector<uint8_t>(static_cast<const uint8_t *>(val),
                                  static_cast<const uint8_t *>(val) + len)};
    if (it != options_.end())
        *it = std::move(o);
    else
        options_.push_back(std::move(o));
    return 0;
}

int HybridSocket::getsockopt(int level, int name, void *val, socklen_t *len)
{
    settle();
    auto [s, m] = snapshot();
    if (m == Mode::Kernel && level == SOL_SOCKET && name == SO_ERROR && val && len &&
        *len >= sizeof(int)) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (deferredError_) {
            std::memcpy(val, &deferredError_, sizeof(int));
            *len = sizeof(int);
            deferredError_ = 0;
            return 0;
        }
    }
    // Waiting for libfabric to load, the kernel fd answers: it holds the options set, and
    // SO_ERROR 0 (in progress).
    if (m == Mode::Fabric && s)
        return s->getsockopt(level, name, val, len);
    if (m == Mode::Inherited)
        return -EIO;
    return sys::getsockopt(fd_, level, name, val, len);
}

namespace {

// getsockname's contract: the address truncated to *len, *len set to its real length.
int copyAddress(const sockaddr_storage &from, socklen_t fromLen, sockaddr *addr, socklen_t *len)
{
    if (!addr || !len)
        return -EFAULT;
    std::memcpy(addr, &from, std::min(*len, fromLen));
    *len = fromLen;
    return 0;
}

} // namespace

int HybridSocket::getsockname(sockaddr *addr, socklen_t *len)
{
    auto [s, m] = snapshot();
    if (m == Mode::Fabric && upgraded_) {
        // What the kernel said before the upgrade shut its connection down.
        std::lock_guard<std::mutex> lock(mutex_);
        return copyAddress(upLocal_, upLocalLen_, addr, len);
    }
    if (m != Mode::Fabric || !s)
        return sys::getsockname(fd_, addr, len); // also while waiting for libfabric to load
    int r = s->localAddress(addr, len);
    if (r == 0 && accepted_ && appPort_ && addr)
        setPort(reinterpret_cast<sockaddr_storage *>(addr), appPort_); // the port it listened on
    return r;
}

int HybridSocket::getpeername(sockaddr *addr, socklen_t *len)
{
    std::shared_ptr<Socket> s;
    Mode m;
    sockaddr_storage peer;
    socklen_t plen;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        s = sock_;
        m = mode_.load();
        peer = peer_;
        plen = peerLen_;
    }
    if (m == Mode::Fabric && s && upgraded_)
        return copyAddress(peer, plen, addr, len);
    if (m != Mode::Fabric)
        return sys::getpeername(fd_, addr, len);
    if (!s)
        return -ENOTCONN; // connecting: waiting for libfabric to load
    if (!accepted_) {
        // The address the application connected to, not the fabric listener's port.
        int r = s->peerAddress(addr, len);
        if (r < 0)
            return r;
        if (!addr || !len)
            return -EFAULT;
        std::memcpy(addr, &peer, std::min(*len, plen));
        *len = plen;
        return 0;
    }
    return s->peerAddress(addr, len);
}

int HybridSocket::fionread(int *bytes)
{
    // The peer's upgrade message at the head of the stream is not the program's: taken first
    // (a look waiting to read leaves one for the read), so that a program that reads what the
    // count says with MSG_WAITALL does not wait for bytes that never come.
    if (const Upgrade u = upgrade_.load(); u == Upgrade::Maybe || u == Upgrade::Answer)
        upgradeProgress(POLLIN);
    if (late())
        return lateFionread(bytes);
    auto [s, m] = snapshot();
    if (m == Mode::Kernel) {
        // Still to be upgraded: the kernel's count (an upgrade message not read yet counts).
        return ::syscall(SYS_ioctl, fd_, FIONREAD, bytes) < 0 ? -errno : 0;
    }
    if (m != Mode::Fabric)
        return -ENOTTY;
    if (!s) {
        *bytes = 0; // connecting: waiting for libfabric to load
        return 0;
    }
    return s->readable(bytes);
}

void HybridSocket::onFdClosed(int fd)
{
    if (late() && fd == fd_) {
        lateAccount();
        return;
    }
    // Still to be upgraded: this process never used it (a fork-per-connection parent closing
    // its copy); the process that does counts it.
    if (mode() != Mode::Kernel || upgradePending())
        return;
    if (fd == fd_) {
        countFallbackIfEstablished();
        forgetRefusal();
    }
    // What the kernel moved, while a descriptor of it is still open.
    std::lock_guard<std::mutex> lock(mutex_);
    if (record_)
        record_->readKernelBytes(fd);
}

void HybridSocket::noteExit()
{
    if (late()) {
        lateAccount();
        return;
    }
    if (mode() == Mode::Kernel)
        countFallbackIfEstablished();
}

bool HybridSocket::kernelListener(Fallback *why)
{
    std::lock_guard<std::mutex> lock(mutex_);
    *why = fallback_;
    return kernelListener_;
}

void HybridSocket::countFallbackIfEstablished()
{
    if (upgradePending())
        return; // counted when the upgrade is decided
    std::lock_guard<std::mutex> lock(mutex_);
    if (fallbackCounted_ || kernelListener_)
        return;
    sockaddr_storage peer;
    socklen_t plen = sizeof(peer);
    if (sys::getpeername(fd_, reinterpret_cast<sockaddr *>(&peer), &plen) == 0) {
        fallbackCounted_ = true;
        countFallback(fallback_);
        if (record_)
            record_->markEstablished();
    }
}

void HybridSocket::markInherited()
{
    // Runs in a fork child, where only the forking thread exists: a lock another parent thread
    // held at the fork would never be released, so the mutex starts over.
    new (&mutex_) std::mutex();
    new (&upgradeMutex_) std::mutex();
    new (&lateWriteMutex_) std::mutex();
    new (&lateReadMutex_) std::mutex();
    if (isLate(upgrade_.load())) {
        // The switch is the parent's (its fabric connection, its upgrade listener and its
        // counts): the child's copy of the connection is plain kernel TCP.
        upgrade_.store(Upgrade::None, std::memory_order_relaxed);
        pendingUl_.reset(); // the parent's table keeps the listener itself
        if (upSock_)
            inheritedSockets().push_back(std::move(upSock_));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    noFabric_ = true;
    fixed_.store(nullptr, std::memory_order_relaxed);
    fixedListen_.store(nullptr, std::memory_order_relaxed);
    // The look epoll is shared with the parent, and holds its fabric listener's fds.
    if (const int ep = lookEp_.exchange(-1, std::memory_order_relaxed); ep >= 0)
        sys::close(ep);
    // A fabric attempt in progress stays the parent's: the child's copy is inherited.
    tentative_.store(false, std::memory_order_relaxed);
    pending_.reset();
    if (sock_)
        inheritedSockets().push_back(std::move(sock_));
    Mode m = mode_.load();
    if (m == Mode::Fabric)
        mode_.store(Mode::Inherited, std::memory_order_release);
    // A listener keeps accepting over kernel TCP (its fabric side stays with the parent).
}

void HybridSocket::beforeFork()
{
    // An ACCEPT still owed goes now, before the child can write on the connection (after
    // that it could land inside the stream): as it would have gone at the offer.
    if (!acceptOwed_.load(std::memory_order_acquire))
        return;
    std::unique_lock<std::mutex> w(lateWriteMutex_, std::try_to_lock);
    if (w.owns_lock() && acceptOwed_.load() && !sendOwedAcceptLocked())
        dropOwedAcceptLocked();
}

void HybridSocket::onForkParent()
{
    if (acceptOwed_.load(std::memory_order_acquire)) {
        // Still owed (a write was under way at beforeFork()): the child may write on the
        // connection now, as plain kernel TCP, and an ACCEPT sent after that would land inside
        // the stream, so none goes. The next step gives up (not here: fork's handlers run while
        // other handlers hold the statistics' locks); the client reads whoever's bytes come
        // first and stays on kernel TCP.
        std::unique_lock<std::mutex> w(lateWriteMutex_, std::try_to_lock);
        if (w.owns_lock() && acceptOwed_.load())
            dropOwedAcceptLocked();
    }
    std::shared_ptr<Socket> s;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (mode_.load() != Mode::Listener)
            return;
        s = sock_;
    }
    if (s)
        s->setDeferring(true);
}

std::string HybridSocket::debugState()
{
    std::shared_ptr<Socket> s = socket();
    std::string r = "fd=" + std::to_string(fd_) + " mode=" + std::to_string(int(mode()));
    if (upgradePending())
        r += " upgrade=" + std::to_string(int(upgrade_.load()));
    if (mode() == Mode::Kernel) {
        std::lock_guard<std::mutex> lock(mutex_);
        r += std::string(" fallback=") + fallbackName(fallback_);
    }
    if (s)
        r += " " + s->debugState();
    else if (mode() == Mode::Fabric)
        r += " waiting for libfabric to load";
    return r;
}

} // namespace rstream::shim
