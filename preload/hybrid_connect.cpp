// SPDX-License-Identifier: MIT
// The shim's connect: the fabric attempt, its settling when nonblocking, and the fallback to
// kernel TCP on the application's own fd.

#include "hybrid.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <tuple>

#include "clock.h"
#include "fabric.h"
#include "hybrid_internal.h"
#include "log.h"
#include "shimaddr.h"

namespace rstream::shim {

namespace {

NegativeCache &negativeCache()
{
    static auto *cache = new NegativeCache();
    return *cache;
}

// Fabric destinations whose listener deferred (another process's, see upgrade_wire.h) less than
// RSTREAM_NEGATIVE_CACHE_MS ago. It defers again, so the next connect skips the fabric attempt
// (an endpoint made and torn down for a refusal) and offers the in-band upgrade at once, after
// a light probe has seen a fabric listener still there: a server that went away or no longer
// runs the shim has none, and its port gets no offer.
NegativeCache &deferCache()
{
    static auto *cache = new NegativeCache();
    return *cache;
}

} // namespace

int HybridSocket::connectFabric(const sockaddr *addr, socklen_t len, std::shared_ptr<Socket> *out)
{
    std::shared_ptr<Socket> s;
    int r = startFabric(addr, len, &s);
    if (r != 0 && r != -EINPROGRESS)
        return r;
    // Bounded: a peer without a fabric listener refuses at once; one that does not answer
    // costs connectTimeoutMs, once per destination thanks to the negative cache.
    const int64_t deadline = nowMs() + config_.connectTimeoutMs;
    for (;;) {
        if (s->pollEvents(POLLOUT))
            break;
        int64_t left = deadline - nowMs();
        if (left <= 0)
            return -ETIMEDOUT;
        std::vector<pollfd> fds;
        if (s->prepareWait(&fds, POLLOUT) == -EAGAIN)
            continue;
        int wait = static_cast<int>(std::min<int64_t>(left, 10));
        timespec ts{0, wait * 1000000L};
        sys::ppoll(fds.data(), fds.size(), &ts, nullptr);
    }
    int err = 0;
    socklen_t elen = sizeof(err);
    s->getsockopt(SOL_SOCKET, SO_ERROR, &err, &elen);
    *out = std::move(s); // also when it failed: the caller may ask why (connectDeferred)
    return -err;
}

int HybridSocket::connect(const sockaddr *addr, socklen_t len)
{
    std::shared_ptr<Socket> fs;
    Mode m;
    if (int r = settledSnapshot(nonblocking() ? Wait::No : Wait::Load, &fs, &m); r < 0)
        return r == -EAGAIN ? -EALREADY : r; // still waiting for libfabric
    if (m == Mode::Fabric)
        return fs->connect(addr, len);
    if (m == Mode::Listener)
        return -EISCONN;
    if (m == Mode::Inherited)
        return -EIO;
    if (m == Mode::Kernel) {
        {
            // A fabric attempt that fell back to a kernel connect which failed at once.
            std::lock_guard<std::mutex> lock(mutex_);
            if (deferredError_) {
                int e = deferredError_;
                deferredError_ = 0;
                return -e;
            }
        }
        // Again, after a kernel connect that failed or is in progress.
        if (int r = sys::connect(fd_, addr, len); r < 0) {
            const int err = -r;
            if (err == EINPROGRESS && addr) {
                std::lock_guard<std::mutex> lock(mutex_);
                recordKernelLocked(addr, len);
            }
            return -err;
        }
        if (addr) {
            std::lock_guard<std::mutex> lock(mutex_);
            recordKernelLocked(addr, len);
        }
        countFallbackIfEstablished();
        return 0;
    }
    if (!addr)
        return -EFAULT;
    if (len < sizeof(sa_family_t))
        return -EINVAL;

    // Undecided: the fabric when the destination may have a fabric listener.
    const bool inet = addr->sa_family == AF_INET || addr->sa_family == AF_INET6;
    const bool usable =
        addr->sa_family == family_ && len >= (family_ == AF_INET ? sizeof(sockaddr_in) : 24);
    const int port = usable ? addressPort(addr) : 0;
    const int fport = config_.fabricPort(port);
    Fallback why = Fallback::None;
    std::string key; // the fabric destination
    int fabricErr = 0;
    bool offer = false; // the listener deferred: offer the in-band upgrade
    if (noFabric_) {
        why = Fallback::ForkChild;
    } else if (!usable || !fport) {
        why = Fallback::Unsupported;
    } else if (!config_.portAllowed(port)) {
        why = Fallback::Ports;
    } else if (config_.excluded(addr)) {
        why = Fallback::Excluded;
    } else {
        sockaddr_storage dest{};
        std::memcpy(&dest, addr, std::min<socklen_t>(len, sizeof(dest)));
        setPort(&dest, fport);
        key = describe(reinterpret_cast<sockaddr *>(&dest));
        if (negativeCache().has(key)) {
            why = Fallback::NegativeCache;
        } else if (shimListenerHere(addr)) {
            // A shim listener on this host serves that address (its beacon says so): the
            // upgrade is offered in-band at once, without a fabric attempt or libfabric.
            noteEngineUsed();
            return connectKernel(addr, len, inet, Fallback::NotUpgraded, port, key, 0, true);
        } else {
            std::shared_ptr<Socket> s;
            int r;
            std::unique_ptr<LightProbe> probe;
            const bool deferred = lightProbePossible() && deferCache().has(key);
            if (nonblocking()) {
                // A nonblocking connect returns at once; the attempt settles later (settle()),
                // and starts later too while the light probe runs or libfabric loads in the
                // background.
                if (deferred || lightProbeApplies()) {
                    probe = std::make_unique<LightProbe>();
                    r = probe->start(reinterpret_cast<sockaddr *>(&dest), len,
                                     config_.connectTimeoutMs);
                    if (r == 0)
                        r = -EINPROGRESS;
                } else if (loadFabricInBackground(Settings::fromEnv())) {
                    noteEngineUsed();
                    r = -EINPROGRESS;
                } else {
                    r = startFabric(reinterpret_cast<sockaddr *>(&dest), len, &s);
                }
                if (r == -EINPROGRESS) {
                    std::lock_guard<std::mutex> lock(mutex_);
                    pending_ = std::make_unique<Pending>();
                    std::memcpy(&pending_->addr, addr, std::min<socklen_t>(len, sizeof(dest)));
                    pending_->dest = dest;
                    pending_->len = len;
                    pending_->key = key;
                    pending_->port = port;
                    pending_->fport = fport;
                    pending_->probe = std::move(probe);
                    pending_->offerAfterProbe = deferred;
                    sock_ = std::move(s); // none yet while probing or loading
                    mode_.store(Mode::Fabric, std::memory_order_release);
                    tentative_.store(true, std::memory_order_release);
                    return -EINPROGRESS;
                }
            } else {
                // A refusal of the light probe: nothing listens there, libfabric not needed.
                r = deferred || lightProbeApplies()
                        ? LightProbe::run(reinterpret_cast<sockaddr *>(&dest), len,
                                          config_.connectTimeoutMs)
                        : 0;
                // A beacon there now: a shim listener made its fabric side since the look above
                // (its beacon comes next, then its kernel port listens).
                if (r == 0 && (deferred || shimListenerHere(addr))) {
                    noteEngineUsed();
                    return connectKernel(addr, len, inet, Fallback::NotUpgraded, port, key, 0,
                                         true);
                }
                // Something listens there, and only a fabric attempt can tell what. On this
                // host every shim listener has a beacon, so it is none of ours: with libfabric
                // still to load (about 0.3 s), this connection does not wait for it (kernel
                // TCP, no offer). Towards another host it may well be a shim listener, whose
                // fabric is worth the wait.
                if (r == 0 && !fabricReady() && hostAddress(addr) &&
                    loadFabricInBackground(Settings::fromEnv())) {
                    noteEngineUsed();
                    return connectKernel(addr, len, inet, Fallback::Loading, port, key, 0);
                }
                if (r == 0)
                    r = connectFabric(reinterpret_cast<sockaddr *>(&dest), len, &s);
            }
            if (r == 0) {
                std::lock_guard<std::mutex> lock(mutex_);
                s->setNonblocking(nonblocking());
                if (!nonblocking())
                    s->confirmConnected();
                sock_ = std::move(s);
                adoptFabricLocked(addr, len, fport);
                // A nonblocking connect reports progress the way TCP does; POLLOUT is ready.
                return nonblocking() ? -EINPROGRESS : 0;
            }
            if (r == -ECONNREFUSED && s && s->connectDeferred()) {
                why = Fallback::NotUpgraded; // until the upgrade succeeds
                offer = true;
                deferCache().add(key, config_.negativeCacheMs);
            } else {
                deferCache().remove(key);
                negativeCache().add(key, config_.negativeCacheMs);
                why = r == -ECONNREFUSED ? Fallback::Refused
                      : r == -ETIMEDOUT  ? Fallback::Timeout
                                         : Fallback::ProviderError;
            }
            fabricErr = -r;
        }
    }
    return connectKernel(addr, len, inet, why, port, key, fabricErr, offer);
}

void HybridSocket::adoptFabricLocked(const sockaddr *addr, socklen_t len, int fport)
{
    sockaddr_storage local{};
    socklen_t llen = sizeof(local);
    if (sock_->localAddress(reinterpret_cast<sockaddr *>(&local), &llen) != 0)
        llen = 0;
    auto record = std::make_unique<ConnRecord>(
        fd_, true, Fallback::None, false, reinterpret_cast<sockaddr *>(&local), llen, addr, len);
    record->setConnection(sock_->connection());
    bytes_ = &record->bytes();
    record_ = std::move(record);
    peerLen_ = std::min<socklen_t>(len, sizeof(peer_));
    std::memcpy(&peer_, addr, peerLen_);
    mode_.store(Mode::Fabric, std::memory_order_release);
    countFabricConnection();
    RS_LOG_FD(Debug, fd_, "fabric connection to %s (fabric port %d)", describe(addr).c_str(),
              fport);
}

int HybridSocket::connectKernel(const sockaddr *addr, socklen_t len, bool inet, Fallback why,
                                int port, const std::string &key, int fabricErr, bool offer)
{
    // Kernel TCP on the application's own fd, with the options it set already applied.
    {
        std::lock_guard<std::mutex> lock(mutex_);
        fallback_ = why;
        if (why == Fallback::Refused)
            refusedKey_ = key;
        if (offer) {
            // The listener's process runs the shim and deferred: the upgrade is offered in-band
            // at the first I/O, to the address the application connected to.
            peerLen_ = std::min<socklen_t>(len, sizeof(peer_));
            std::memcpy(&peer_, addr, peerLen_);
            if (specificAddress(addr, len)) { // the kernel's peer, for the record at close
                knownPeer_ = peer_;
                knownPeerLen_ = peerLen_;
            }
            upgrade_.store(Upgrade::Offer, std::memory_order_release);
        }
    }
    if (offer)
        RS_LOG_FD(Debug, fd_, "kernel TCP to %s, to be upgraded in-band (the listener deferred)",
                  describe(addr).c_str());
    else if (inet)
        RS_LOG_FD(Info, fd_, "kernel TCP to %s: %s (%s)", describe(addr).c_str(), fallbackName(why),
                  fallbackDetail(why, port, key, fabricErr, config_.connectTimeoutMs).c_str());
    mode_.store(Mode::Kernel, std::memory_order_release);
    kernelGen_++;
    if (int r = sys::connect(fd_, addr, len); r < 0) {
        const int err = -r;
        if (err == EINPROGRESS) {
            std::lock_guard<std::mutex> lock(mutex_);
            recordKernelLocked(addr, len);
        } else if (err == ECONNREFUSED) {
            forgetRefusal();
        }
        return -err;
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        recordKernelLocked(addr, len);
    }
    if (offer) {
        // A blocking connect's program may read first (a server that speaks first must find the
        // HELLO before it writes): the HELLO goes now. After a nonblocking one it waits for the
        // first write, or a look for reading (hybrid_upgrade.cpp).
        std::lock_guard<std::mutex> lock(upgradeMutex_);
        if (upgrade_.load() == Upgrade::Offer)
            sendOfferLocked();
    }
    countFallbackIfEstablished();
    return 0;
}

// A destination that refused both the fabric and kernel TCP had nothing listening at all: a
// server still starting, and a client that retries until it is up. That refusal says nothing
// of the server to come, so it is not remembered: cached, it kept the client's connections to
// the server on kernel TCP for RSTREAM_NEGATIVE_CACHE_MS once it was up. (A nonblocking
// connect's refusal shows at its close, as one that never connected.)
void HybridSocket::forgetRefusal()
{
    std::string key;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        key.swap(refusedKey_);
        if (fallbackCounted_)
            return; // it connected after all: something listens on kernel TCP there
    }
    if (!key.empty())
        negativeCache().remove(key);
}

std::shared_ptr<Socket> HybridSocket::newEngineSocket(const Settings &settings)
{
    auto s = std::make_shared<Socket>(family_, settings);
    std::vector<Option> options;
    {
        // Another thread may be setting one (settle() can start an attempt).
        std::lock_guard<std::mutex> lock(mutex_);
        options = options_;
    }
    for (auto &o : options)
        s->setsockopt(o.level, o.name, o.value.data(), static_cast<socklen_t>(o.value.size()));
    s->setNonblocking(true);
    return s;
}

int HybridSocket::startFabric(const sockaddr *addr, socklen_t len, std::shared_ptr<Socket> *out)
{
    noteEngineUsed();
    auto s = newEngineSocket(upgradeSettings());
    int r = s->connect(addr, len);
    if (r != 0 && r != -EINPROGRESS)
        return r;
    *out = std::move(s);
    return r;
}

int HybridSocket::settledSnapshot(Wait wait, std::shared_ptr<Socket> *s, Mode *m)
{
    for (;;) {
        settle();
        std::tie(*s, *m) = snapshot();
        const bool tentative = tentative_.load(std::memory_order_acquire);
        if (*m != Mode::Fabric || (*s && !(tentative && wait == Wait::Settle)))
            return 0;
        if (!*s) {
            if (wait == Wait::No)
                return -EAGAIN;
            if (tentative && waitProbe())
                continue;
            if (!tentative || fabricLoadFd() < 0)
                return -ENOTCONN; // not waiting for the load after all
            waitFabricLoad();
            continue;
        }
        // The attempt is under way: until it connects or fails (then settle() falls back),
        // bounded by the engine's connect deadline.
        if ((*s)->pollEvents(POLLOUT))
            continue;
        std::vector<pollfd> fds;
        if ((*s)->prepareWait(&fds, POLLOUT) == -EAGAIN)
            continue;
        const timespec tick{0, 100 * 1000000L};
        sys::ppoll(fds.data(), fds.size(), &tick, nullptr);
    }
}

ssize_t HybridSocket::kernelIo(bool out, const iovec *iov, int iovcnt, int flags)
{
    // SIGPIPE is the caller's to raise.
    msghdr mh{};
    mh.msg_iov = const_cast<iovec *>(iov);
    mh.msg_iovlen = static_cast<size_t>(iovcnt);
    return out ? sys::sendmsg(fd_, &mh, flags | MSG_NOSIGNAL) : sys::recvmsg(fd_, &mh, flags);
}

void HybridSocket::settleSlow()
{
    // One thread settles; the others see the outcome.
    std::lock_guard<std::mutex> settleLock(settleMutex_);
    if (!tentative_.load(std::memory_order_acquire))
        return;
    std::shared_ptr<Socket> s;
    sockaddr_storage dest{}, addr{};
    socklen_t destLen = 0;
    int probed = 1; // no light probe
    bool cachedOffer = false;
    bool loading = false;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        s = sock_;
        if (!s && pending_) {
            dest = pending_->dest;
            addr = pending_->addr;
            destLen = pending_->len;
            if (pending_->probe) {
                probed = pending_->probe->status();
                if (probed == -EINPROGRESS)
                    return;
                pending_->probe.reset();
                cachedOffer = probed == 0 && pending_->offerAfterProbe;
            }
        }
    }
    // Something listens there, and a beacon there now (a shim listener made its fabric side
    // since the connect looked: its beacon comes next, then its kernel port listens): the
    // upgrade is offered in-band, as at a connect that sees the beacon.
    if (probed == 0 && !cachedOffer && shimListenerHere(reinterpret_cast<sockaddr *>(&addr)))
        cachedOffer = true;
    int st;
    if (probed < 0) {
        st = probed; // nothing listens on the fabric port: kernel TCP, libfabric never loaded
    } else if (cachedOffer) {
        st = -ECONNREFUSED; // as the deferring listener would answer
        noteEngineUsed();
    } else if (probed == 0 && !fabricReady() && hostAddress(reinterpret_cast<sockaddr *>(&dest)) &&
               loadFabricInBackground(Settings::fromEnv())) {
        // As a blocking connect does: no waiting for libfabric on this host (see connect()).
        noteEngineUsed();
        loading = true;
        st = -EAGAIN;
    } else if (!s && destLen) {
        // Something listens: libfabric loads (in the background), then the attempt starts.
        if (probed == 0) {
            noteEngineUsed();
            if (loadFabricInBackground(Settings::fromEnv()))
                return;
        } else if (!fabricLoadReady()) {
            return; // the attempt waited for libfabric to load: it starts once that is over
        }
        st = startFabric(reinterpret_cast<sockaddr *>(&dest), destLen, &s);
        if (s) {
            s->setNonblocking(nonblocking());
            std::lock_guard<std::mutex> lock(mutex_);
            sock_ = s;
        }
        if (st == 0 || st == -EINPROGRESS)
            st = s->connectStatus();
    } else {
        st = s ? s->connectStatus() : -ENOTCONN;
    }
    if (st == -EINPROGRESS)
        return; // the engine's connect deadline bounds it
    std::unique_ptr<Pending> p;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        p = std::move(pending_);
        if (!p) {
            tentative_.store(false, std::memory_order_release);
            return;
        }
        if (st == 0) {
            adoptFabricLocked(reinterpret_cast<sockaddr *>(&p->addr), p->len, p->fport);
            tentative_.store(false, std::memory_order_release);
            return;
        }
        // The fabric attempt failed: kernel TCP on the same fd, as a blocking connect would
        // have done at once.
        sock_.reset();
    }
    const bool offer = cachedOffer || (st == -ECONNREFUSED && s && s->connectDeferred());
    if (offer) {
        if (!cachedOffer)
            deferCache().add(p->key, config_.negativeCacheMs);
    } else if (!loading) {
        deferCache().remove(p->key);
        negativeCache().add(p->key, config_.negativeCacheMs);
    }
    const Fallback why = loading               ? Fallback::Loading
                         : offer               ? Fallback::NotUpgraded
                         : st == -ECONNREFUSED ? Fallback::Refused
                         : st == -ETIMEDOUT    ? Fallback::Timeout
                                               : Fallback::ProviderError;
    int r = connectKernel(reinterpret_cast<sockaddr *>(&p->addr), p->len, true, why, p->port,
                          p->key, -st, offer);
    if (r < 0 && r != -EINPROGRESS) {
        // Failed at once (nothing listens on kernel TCP either): reported by SO_ERROR and
        // connect() as the kernel would have after a nonblocking connect.
        std::lock_guard<std::mutex> lock(mutex_);
        deferredError_ = -r;
    }
    tentative_.store(false, std::memory_order_release);
}

void HybridSocket::recordKernelLocked(const sockaddr *peer, socklen_t peerLen)
{
    if (record_ || (peer->sa_family != AF_INET && peer->sa_family != AF_INET6) || upgradePending())
        return; // an upgrade makes its record when it is decided
    sockaddr_storage local{};
    socklen_t llen = sizeof(local);
    if (sys::getsockname(fd_, reinterpret_cast<sockaddr *>(&local), &llen) != 0)
        llen = 0;
    record_ = std::make_unique<ConnRecord>(
        fd_, false, fallback_, false, reinterpret_cast<sockaddr *>(&local), llen, peer, peerLen);
}

} // namespace rstream::shim
