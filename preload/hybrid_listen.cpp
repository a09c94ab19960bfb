// SPDX-License-Identifier: MIT
// The shim's listening sockets: a kernel listener and a fabric one on the same fd, and accept.

#include "hybrid.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <sys/epoll.h>

#include "clock.h"
#include "hybrid_internal.h"
#include "log.h"
#include "shimaddr.h"

namespace rstream::shim {

namespace {

// Picks of the kernel's that bindPortPair() tries before it takes one as it is.
constexpr int kPortPairTries = 16;

} // namespace

int HybridSocket::bindPortPair(const sockaddr *addr, socklen_t len)
{
    // The kernel's pick for port 0 is free, but the fabric listener takes fabricPort() of it,
    // which may not be: in the ephemeral range, another connection's local port. listen() then
    // fell back to a kernel-only listener (port_busy), whose clients all stay on kernel TCP: a
    // clean-clone test run met it beside other tests' connections. So a pick whose fabric port
    // binds too is taken (the fabric listener binds it at listen(), moments later). A pick
    // turned down stays bound by its probe until the end, or the kernel would offer it again
    // (it tries odd ports first, in order); with no pair in kPortPairTries picks, the kernel's
    // own pick as before. Probes bind without SO_REUSEADDR, as strict as the fabric
    // listener's bind can be.
    // A client that defers its port to connect() (IP_BIND_ADDRESS_NO_PORT: proxies sharing
    // ports across destinations) keeps that: no port is taken here.
    // Any other address (a port, another family, a short one) is bound as it is.
    int noPort = 0;
    socklen_t olen = sizeof(noPort);
    if (!addr || addr->sa_family != family_ || (family_ != AF_INET && family_ != AF_INET6) ||
        len < (family_ == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6)) ||
        addressPort(addr) != 0 ||
        (sys::getsockopt(fd_, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &noPort, &olen) == 0 && noPort))
        return sys::bind(fd_, addr, len);
    struct Held
    {
        int fds[kPortPairTries];
        int n = 0;
        ~Held()
        {
            for (int i = 0; i < n; i++)
                sys::close(fds[i]);
        }
    } held;
    sockaddr_storage want{};
    std::memcpy(&want, addr, std::min<size_t>(len, sizeof(want)));
    for (int i = 0; i < kPortPairTries; i++) {
        const int probe = sys::socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (probe < 0)
            break;
        sockaddr_storage got{};
        socklen_t glen = sizeof(got);
        int port = 0;
        if (sys::bind(probe, addr, len) == 0 &&
            sys::getsockname(probe, reinterpret_cast<sockaddr *>(&got), &glen) == 0)
            port = addressPort(reinterpret_cast<sockaddr *>(&got));
        const int fport = port && config_.portAllowed(port) ? config_.fabricPort(port) : 0;
        if (!fport) {
            sys::close(probe);
            break; // no fabric port to pair it with: the kernel's pick
        }
        bool fabricFree = false;
        if (const int fprobe = sys::socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
            fprobe >= 0) {
            sockaddr_storage f = want;
            setPort(&f, fport);
            fabricFree = sys::bind(fprobe, reinterpret_cast<sockaddr *>(&f), len) == 0;
            sys::close(fprobe);
        }
        if (!fabricFree) {
            held.fds[held.n++] = probe;
            continue;
        }
        sys::close(probe);
        sockaddr_storage pick = want;
        setPort(&pick, port);
        const int r = sys::bind(fd_, reinterpret_cast<sockaddr *>(&pick), len);
        if (r != -EADDRINUSE)
            return r; // bound, or an error the program's own bind gets as well
        // Taken between the probe's close and this bind: another pick.
    }
    return sys::bind(fd_, addr, len);
}

int HybridSocket::listen(int backlog)
{
    std::lock_guard<std::mutex> lock(mutex_);
    Mode m = mode_.load();
    if (m == Mode::Fabric)
        return -EINVAL;
    if (m == Mode::Inherited)
        return -EIO;
    if (m == Mode::Listener || m == Mode::Kernel)
        return sys::listen(fd_, backlog); // a new backlog for the kernel; the fabric keeps its own
    // The fabric listener and its beacon are made before the kernel socket listens, so that a
    // client that reaches the port finds them. Made after (libfabric's load takes about 0.3 s),
    // a client started as soon as the port answered (a script that waits for the port) found
    // neither: its fabric attempt was refused, and the negative cache kept all its connections
    // on kernel TCP for RSTREAM_NEGATIVE_CACHE_MS. An unbound socket gets its port from listen()
    // itself: the kernel listens first there (clients learn that port once listen() returns).
    sockaddr_storage local{};
    socklen_t llen = sizeof(local);
    if (int r = sys::getsockname(fd_, reinterpret_cast<sockaddr *>(&local), &llen); r < 0)
        return r;
    bool kernelListens = false;
    if (addressPort(reinterpret_cast<sockaddr *>(&local)) == 0 && !noFabric_ &&
        bindPortPair(reinterpret_cast<sockaddr *>(&local), llen) == 0) {
        // Unbound: bound as listen() would have (the wildcard address), to a paired port.
        llen = sizeof(local);
        if (int r = sys::getsockname(fd_, reinterpret_cast<sockaddr *>(&local), &llen); r < 0)
            return r;
    }
    if (addressPort(reinterpret_cast<sockaddr *>(&local)) == 0) {
        if (int r = sys::listen(fd_, backlog); r < 0)
            return r;
        kernelListens = true;
        llen = sizeof(local);
        if (int r = sys::getsockname(fd_, reinterpret_cast<sockaddr *>(&local), &llen); r < 0)
            return r;
    }
    int port = addressPort(reinterpret_cast<sockaddr *>(&local));
    int fport = config_.fabricPort(port);
    std::shared_ptr<Socket> s;
    Fallback why = Fallback::None;
    int err = 0;
    if (noFabric_) {
        why = Fallback::ForkChild;
    } else if (!fport) {
        why = Fallback::Unsupported;
    } else if (!config_.portAllowed(port)) {
        why = Fallback::Ports;
    } else {
        noteEngineUsed();
        s = std::make_shared<Socket>(family_, upgradeSettings());
        applyOptions(*s);
        s->setNonblocking(true);
        sockaddr_storage faddr = local;
        setPort(&faddr, fport);
        int r = s->bind(reinterpret_cast<sockaddr *>(&faddr), llen);
        if (r == 0)
            r = s->listen(backlog);
        if (r < 0) {
            why = r == -EADDRINUSE ? Fallback::PortBusy : Fallback::ProviderError;
            err = -r;
            s.reset();
        }
    }
    int beacon = -1, beacon4 = -1;
    if (s) {
        beacon = openBeacon(reinterpret_cast<sockaddr *>(&local));
        if (local.ss_family == AF_INET6) {
            // Dual-stack unless IPV6_V6ONLY: IPv4 clients reach it as 0.0.0.0 too.
            int only = 1;
            socklen_t olen = sizeof(only);
            auto *a6 = reinterpret_cast<sockaddr_in6 *>(&local);
            if (IN6_IS_ADDR_UNSPECIFIED(&a6->sin6_addr) &&
                sys::getsockopt(fd_, IPPROTO_IPV6, IPV6_V6ONLY, &only, &olen) == 0 && !only) {
                sockaddr_in v4{};
                v4.sin_family = AF_INET;
                v4.sin_port = a6->sin6_port;
                beacon4 = openBeacon(reinterpret_cast<sockaddr *>(&v4));
            }
        }
    }
    if (!kernelListens) {
        if (int r = sys::listen(fd_, backlog); r < 0) {
            // Nothing of it stays: the program may bind elsewhere and listen again.
            beaconAddr_ = local;
            beaconFd_ = beacon;
            beaconFd4_ = beacon4;
            dropBeaconsLocked();
            return r; // s, the fabric listener, closes as it goes
        }
    }
    if (specificAddress(reinterpret_cast<sockaddr *>(&local), llen)) {
        listenLocal_ = local; // accepted connections have it as theirs
        listenLocalLen_ = llen;
    }
    if (!s) {
        fallback_ = why;
        kernelListener_ = true;
        countListener(false);
        RS_LOG_FD(Info, fd_, "listener on port %d: kernel TCP only: %s (%s)", port,
                  fallbackName(why),
                  fallbackDetail(why, port, "fabric port " + std::to_string(fport), err).c_str());
        mode_.store(Mode::Kernel, std::memory_order_release);
        kernelGen_++;
        return 0;
    }
    // accept() waits on both; the kernel side must never block it.
    int fl = sys::fcntl(fd_, F_GETFL);
    if (fl >= 0)
        sys::fcntl(fd_, F_SETFL, fl | O_NONBLOCK);
    openLookEpoll(*s);
    fixedListen_.store(s.get(), std::memory_order_release);
    sock_ = std::move(s);
    appPort_ = port;
    beaconAddr_ = local;
    beaconFd_ = beacon;
    beaconFd4_ = beacon4;
    countListener(true);
    mode_.store(Mode::Listener, std::memory_order_release);
    RS_LOG_FD(Debug, fd_, "listening on port %d: kernel TCP and fabric port %d", port, fport);
    return 0;
}

void HybridSocket::openLookEpoll(Socket &s)
{
    int waitFd, readyFd;
    if (!s.listenerFds(&waitFd, &readyFd))
        return;
    const int ep = sys::epollCreate1(EPOLL_CLOEXEC);
    if (ep < 0)
        return; // the looks ask the three fds
    int r = 0;
    for (const int fd : {fd_, waitFd, readyFd}) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.fd = fd;
        if (r == 0)
            r = sys::epollCtl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
    if (r < 0) {
        sys::close(ep);
        return;
    }
    lookEp_.store(ep, std::memory_order_release);
}

socklen_t HybridSocket::acceptedLocal(sockaddr_storage *out)
{
    std::lock_guard<std::mutex> lock(mutex_);
    *out = listenLocal_;
    return listenLocalLen_;
}

int HybridSocket::accept(sockaddr *addr, socklen_t *len, int flags,
                         std::shared_ptr<HybridSocket> *newSock, sockaddr_storage *kpeer,
                         socklen_t *kplen)
{
    if (flags & ~(SOCK_NONBLOCK | SOCK_CLOEXEC))
        return -EINVAL;
    std::shared_ptr<Socket> listener;
    int timeout;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (mode_.load() != Mode::Listener)
            return -EINVAL;
        listener = sock_;
        timeout = rcvTimeoutMs_;
    }
    const int64_t deadline = timeout > 0 ? nowMs() + timeout : -1;
    for (;;) {
        // Alternate which side goes first, so neither starves the other.
        bool fabricFirst = acceptFabricFirst_.exchange(!acceptFabricFirst_.load());
        for (int pass = 0; pass < 2; pass++) {
            bool fabric = (pass == 0) == fabricFirst;
            if (fabric && listener) {
                std::shared_ptr<Socket> ns;
                int r = listener->accept(&ns, addr, len);
                if (r == 0) {
                    int nfd = sys::socket(family_, SOCK_STREAM | (flags & SOCK_CLOEXEC), 0);
                    if (nfd < 0)
                        return nfd; // the connection closes with ns
                    auto hs = std::make_shared<HybridSocket>(nfd, family_, flags & SOCK_NONBLOCK,
                                                             config_);
                    ns->setNonblocking(flags & SOCK_NONBLOCK);
                    // The addresses as the application sees them: the peer's, and the port it
                    // listened on.
                    sockaddr_storage local{}, peer{};
                    socklen_t llen = sizeof(local), plen = sizeof(peer);
                    if (ns->localAddress(reinterpret_cast<sockaddr *>(&local), &llen) == 0)
                        setPort(&local, appPort_);
                    else
                        llen = 0;
                    if (ns->peerAddress(reinterpret_cast<sockaddr *>(&peer), &plen) != 0)
                        plen = 0;
                    auto record = std::make_unique<ConnRecord>(
                        nfd, true, Fallback::None, true, reinterpret_cast<sockaddr *>(&local), llen,
                        reinterpret_cast<sockaddr *>(&peer), plen);
                    record->setConnection(ns->connection());
                    hs->bytes_ = &record->bytes();
                    hs->record_ = std::move(record);
                    hs->sock_ = std::move(ns);
                    hs->appPort_ = appPort_;
                    hs->accepted_ = true;
                    hs->mode_.store(Mode::Fabric, std::memory_order_release);
                    if (addr && len) {
                        std::memcpy(addr, &peer, std::min(*len, plen));
                        *len = plen;
                    }
                    countFabricConnection();
                    RS_LOG_FD(Debug, nfd, "fabric connection accepted from %s",
                              plen ? describe(reinterpret_cast<sockaddr *>(&peer)).c_str() : "?");
                    *newSock = std::move(hs);
                    return nfd;
                }
                if (r != -EAGAIN)
                    RS_LOG_FD(Debug, fd_, "fabric accept: %s", strerror(-r));
            } else if (!fabric) {
                // The peer's address is kept (the connection's record needs it, and asking
                // for it at close is a system call): in the caller's buffer when it gives one,
                // else in kpeer.
                sockaddr_storage own;
                socklen_t ownLen = sizeof(own);
                const bool theirs = addr || !kpeer;
                const socklen_t given = addr && len ? *len : 0;
                int r = theirs
                            ? sys::accept4(fd_, addr, len, flags)
                            : sys::accept4(fd_, reinterpret_cast<sockaddr *>(&own), &ownLen, flags);
                if (r >= 0) {
                    if (kpeer && kplen) {
                        *kplen = 0;
                        if (!theirs) {
                            *kpeer = own;
                            *kplen = ownLen;
                        } else if (addr && len && *len <= given && *len <= sizeof(*kpeer)) {
                            std::memcpy(kpeer, addr, *len);
                            *kplen = *len;
                        }
                    }
                    return r; // the caller records it (kernel_peer)
                }
                if (r != -EAGAIN && r != -EWOULDBLOCK)
                    return r;
            }
        }
        if (nonblocking())
            return -EAGAIN;
        int wait = -1;
        if (deadline >= 0) {
            wait = static_cast<int>(deadline - nowMs());
            if (wait <= 0)
                return -EAGAIN;
        }
        std::vector<pollfd> fds{{fd_, POLLIN, 0}};
        if (listener && listener->prepareWait(&fds, POLLIN) == -EAGAIN)
            continue;
        timespec ts{wait / 1000, (wait % 1000) * 1000000L};
        int r = sys::ppoll(fds.data(), fds.size(), wait >= 0 ? &ts : nullptr, nullptr);
        if (r == -EINTR)
            return -EINTR;
    }
}

} // namespace rstream::shim
