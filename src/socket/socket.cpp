// SPDX-License-Identifier: MIT
// Linux TCP socket semantics over the engine: states, errors, options and readiness.

#include "socket.h"
#include "clock.h"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include "crash.h"
#include "log.h"

namespace rstream {

namespace {
long readSysctl(const char *path, long fallback)
{
    FILE *f = std::fopen(path, "re");
    if (!f)
        return fallback;
    long v = fallback;
    if (std::fscanf(f, "%ld", &v) != 1)
        v = fallback;
    std::fclose(f);
    return v;
}

// The ring size for a SO_SNDBUF/SO_RCVBUF request: a power of two within the engine's range.
size_t ringFor(int requested)
{
    size_t want =
        std::clamp<size_t>(static_cast<size_t>(std::max(requested, 0)), 4096, Settings::kMaxBuf);
    size_t ring = 4096;
    while (ring < want)
        ring <<= 1;
    return ring;
}

// What Linux stores for SO_SNDBUF/SO_RCVBUF: the value capped by the sysctl, doubled, with a
// floor.
int doubledBuf(int val, bool send)
{
    long max =
        readSysctl(send ? "/proc/sys/net/core/wmem_max" : "/proc/sys/net/core/rmem_max", 212992);
    long v = std::min<long>(std::max(val, 0), max);
    long floor = send ? 4608 : 2304;
    return static_cast<int>(std::max<long>(v * 2, floor));
}

// An IPv4 address as the v4-mapped IPv6 address an AF_INET6 socket reports.
void toFamily(int family, sockaddr_storage *ss, socklen_t *len)
{
    if (family == AF_INET6 && ss->ss_family == AF_INET) {
        sockaddr_in in;
        std::memcpy(&in, ss, sizeof(in));
        sockaddr_in6 in6{};
        in6.sin6_family = AF_INET6;
        in6.sin6_port = in.sin_port;
        in6.sin6_addr.s6_addr[10] = 0xff;
        in6.sin6_addr.s6_addr[11] = 0xff;
        std::memcpy(&in6.sin6_addr.s6_addr[12], &in.sin_addr, 4);
        std::memset(ss, 0, sizeof(*ss));
        std::memcpy(ss, &in6, sizeof(in6));
        *len = sizeof(in6);
    }
}

int copyAddress(const sockaddr_storage &ss, socklen_t ssLen, sockaddr *addr, socklen_t *len)
{
    if (!addr || !len)
        return -EFAULT;
    std::memcpy(addr, &ss, std::min(*len, ssLen));
    *len = ssLen;
    return 0;
}

template <class T>
int getValue(const T &v, void *val, socklen_t *len)
{
    if (!val || !len)
        return -EFAULT;
    socklen_t n = std::min<socklen_t>(*len, sizeof(T));
    std::memcpy(val, &v, n);
    *len = n;
    return 0;
}

int getInt(const void *val, socklen_t len, int *out)
{
    if (!val)
        return -EFAULT;
    if (len < sizeof(int))
        return -EINVAL;
    std::memcpy(out, val, sizeof(int));
    return 0;
}

int timeoutFromTimeval(const void *val, socklen_t len, int *ms)
{
    if (!val)
        return -EFAULT;
    if (len < sizeof(timeval))
        return -EINVAL;
    timeval tv;
    std::memcpy(&tv, val, sizeof(tv));
    if (tv.tv_usec < 0 || tv.tv_usec >= 1000000)
        return -EDOM;
    if (tv.tv_sec < 0) {
        *ms = 0; // Linux: a negative timeout means none... but returns immediately; treat as 0
        return 0;
    }
    if (tv.tv_sec == 0 && tv.tv_usec == 0) {
        *ms = -1;
        return 0;
    }
    long long total = static_cast<long long>(tv.tv_sec) * 1000 + (tv.tv_usec + 999) / 1000;
    *ms = static_cast<int>(std::min<long long>(total, INT_MAX));
    return 0;
}

timeval timevalFromMs(int ms)
{
    timeval tv{};
    if (ms > 0) {
        tv.tv_sec = ms / 1000;
        tv.tv_usec = (ms % 1000) * 1000;
    }
    return tv;
}

// Checks a local address the way bind(2) would and picks the port for port 0, with a probe
// socket the kernel answers for, which keeps holding the port until the fabric endpoint binds
// it (at listen or connect). On the providers that share the kernel's port space this keeps
// bind()'s errors at bind() and the port ours in between. Returns the probe fd.
int probeBind(int family, bool v6Only, bool reuseAddr, const sockaddr *addr, socklen_t len,
              sockaddr_storage *bound, socklen_t *boundLen)
{
    int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int reuse = reuseAddr ? 1 : 0;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &reuse, sizeof(reuse));
    if (family == AF_INET6) {
        int v = v6Only ? 1 : 0;
        ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v, sizeof(v));
    }
    int ret = fd;
    if (::bind(fd, addr, len) < 0) {
        ret = -errno;
    } else {
        *boundLen = sizeof(*bound);
        if (::getsockname(fd, reinterpret_cast<sockaddr *>(bound), boundLen) < 0)
            ret = -errno;
    }
    if (ret < 0)
        ::close(fd);
    return ret;
}

// The options kept for getsockopt only (generic_), without effect.
bool isGenericOption(int level, int name)
{
    switch (level) {
    case SOL_SOCKET:
        return name == SO_RCVLOWAT || name == SO_SNDLOWAT || name == SO_PRIORITY ||
               name == SO_OOBINLINE || name == SO_BROADCAST || name == SO_DONTROUTE ||
               name == SO_MARK || name == SO_BUSY_POLL || name == SO_ZEROCOPY;
    case IPPROTO_TCP:
        return name == TCP_CORK || name == TCP_QUICKACK || name == TCP_USER_TIMEOUT ||
               name == TCP_DEFER_ACCEPT || name == TCP_NOTSENT_LOWAT || name == TCP_FASTOPEN ||
               name == TCP_WINDOW_CLAMP || name == TCP_LINGER2 || name == TCP_SYNCNT;
    case IPPROTO_IP:
        return name == IP_TOS || name == IP_TTL;
    case IPPROTO_IPV6:
        return name == IPV6_TCLASS || name == IPV6_UNICAST_HOPS;
    default:
        return false;
    }
}

// What Linux answers for such an option nobody set (its sysctls included): asked of a fresh
// kernel socket of the family.
int kernelDefault(int family, int level, int name, int *out)
{
    int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    socklen_t l = sizeof(*out);
    int ret = ::getsockopt(fd, level, name, out, &l) < 0 ? -errno : 0;
    ::close(fd);
    return ret;
}

// Whether an interrupted blocking call should restart, as the kernel does under SA_RESTART.
// The signal that interrupted is unknown, so restart only when every signal with a handler
// has SA_RESTART (signals without a handler never interrupt; they kill, stop or are ignored).
bool signalsRestart()
{
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP)
            continue;
        struct sigaction sa;
        if (sigaction(sig, nullptr, &sa) < 0)
            continue;
        if (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN)
            continue;
        // Faults are delivered to the faulting instruction, never to a sleeping call.
        if (sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE || sig == SIGTRAP ||
            sig == SIGSYS || sig == SIGABRT)
            continue;
        if (sa.sa_flags & SA_RESTART)
            continue;
        // Handlers a fabric library installed for itself are not the program's.
        if (isFabricLibraryHandler(sa))
            continue;
        return false;
    }
    return true;
}

// Validates an address argument for a socket of family as Linux TCP does.
int checkAddress(int family, const sockaddr *addr, socklen_t len)
{
    if (!addr)
        return -EFAULT;
    if (family == AF_INET) {
        if (len < sizeof(sockaddr_in))
            return -EINVAL;
        if (addr->sa_family != AF_INET)
            return -EAFNOSUPPORT;
    } else {
        if (len < 24) // SIN6_LEN_RFC2133: without the scope id
            return -EINVAL;
        if (addr->sa_family != AF_INET6)
            return -EAFNOSUPPORT;
    }
    return 0;
}

// An AF_INET6 destination as the engine wants it: v4-mapped addresses become AF_INET.
socklen_t engineAddress(const sockaddr *addr, socklen_t len, sockaddr_storage *out)
{
    std::memset(out, 0, sizeof(*out));
    if (addr->sa_family == AF_INET6) {
        sockaddr_in6 in6{};
        std::memcpy(&in6, addr, std::min<socklen_t>(len, sizeof(in6)));
        if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) {
            sockaddr_in in{};
            in.sin_family = AF_INET;
            in.sin_port = in6.sin6_port;
            std::memcpy(&in.sin_addr, &in6.sin6_addr.s6_addr[12], 4);
            std::memcpy(out, &in, sizeof(in));
            return sizeof(in);
        }
        std::memcpy(out, &in6, sizeof(in6));
        return sizeof(in6);
    }
    std::memcpy(out, addr, std::min<socklen_t>(len, sizeof(sockaddr_in)));
    return sizeof(sockaddr_in);
}

bool isV4Mapped(const sockaddr *addr)
{
    if (addr->sa_family != AF_INET6)
        return false;
    auto *in6 = reinterpret_cast<const sockaddr_in6 *>(addr);
    return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr);
}

} // namespace

int Socket::create(int domain, int type, int protocol, std::shared_ptr<Socket> *out)
{
    if (domain != AF_INET && domain != AF_INET6)
        return -EAFNOSUPPORT;
    if ((type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC)) != SOCK_STREAM)
        return -EPROTONOSUPPORT;
    if (protocol != 0 && protocol != IPPROTO_TCP)
        return -EPROTONOSUPPORT;
    auto s = std::make_shared<Socket>(domain);
    s->setNonblocking(type & SOCK_NONBLOCK);
    *out = std::move(s);
    return 0;
}

Socket::Socket(int family, const Settings &settings) : family_(family), settings_(settings)
{
    if (family == AF_INET6)
        v6Only_ = readSysctl("/proc/sys/net/ipv6/bindv6only", 0) != 0;
}

Socket::~Socket()
{
    close();
    releaseProbe();
}

void Socket::releaseProbe()
{
    if (probeFd_ >= 0) {
        ::close(probeFd_);
        probeFd_ = -1;
    }
}

void Socket::close()
{
    std::shared_ptr<Connection> conn;
    std::shared_ptr<Listener> listener;
    linger l;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        conn = std::move(conn_);
        listener = std::move(listener_);
        l = linger_;
        setStateLocked(State::Closed);
    }
    if (!conn)
        return;
    if (l.l_onoff && l.l_linger == 0) {
        // SO_LINGER with a zero timeout: an abortive close, the peer sees a reset.
        if (auto *d = std::get_deleter<ConnectionCloser>(conn))
            d->abort = true;
    } else if (l.l_onoff && !nonblocking()) {
        // SO_LINGER: wait (bounded) until what was sent is delivered.
        int64_t deadline = nowMs() + int64_t(l.l_linger) * 1000;
        for (;;) {
            Connection::Info info = conn->info();
            if (!info.connected || info.unackedBytes == 0)
                break;
            int64_t left = deadline - nowMs();
            if (left <= 0)
                break;
            if (conn->wait(kWritable, static_cast<int>(std::min<int64_t>(left, 10))) < 0)
                break;
        }
    }
}

void ConnectionCloser::operator()(Connection *c) const
{
    std::unique_ptr<Connection> owned(c);
    if (abort)
        Connection::abort(std::move(owned));
    else
        Connection::close(std::move(owned));
}

int Socket::timeoutFor(int flags, bool send) const
{
    (void)flags;
    return send ? sndTimeoutMs_ : rcvTimeoutMs_;
}

int Socket::applySettings(Settings *s)
{
    *s = settings_;
    // SO_SNDBUF/SO_RCVBUF fix the size, as they stop Linux from autotuning.
    if (sndBufReq_)
        s->sendBuf = s->sendBufMax = ringFor(sndBufReq_);
    if (rcvBufReq_)
        s->recvBuf = s->recvBufMax = ringFor(rcvBufReq_);
    return 0;
}

int Socket::bind(const sockaddr *addr, socklen_t len)
{
    int ret = checkAddress(family_, addr, len);
    if (ret < 0)
        return ret;
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ != State::Fresh || boundLen_)
        return -EINVAL;
    if (family_ == AF_INET6 && v6Only_ && isV4Mapped(addr))
        return -EADDRNOTAVAIL;
    ret = probeBind(family_, v6Only_, reuseAddr_, addr, len, &bound_, &boundLen_);
    if (ret < 0) {
        boundLen_ = 0;
        return ret;
    }
    probeFd_ = ret;
    return 0;
}

int Socket::listen(int backlog)
{
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ == State::Listening)
        return 0; // a new backlog; the fabric listener has none to change
    if (state_ != State::Fresh)
        return -EINVAL;
    Settings s;
    applySettings(&s);
    auto listener = std::make_shared<Listener>(s);
    releaseProbe(); // the fabric endpoint takes the port over
    sockaddr_storage addr{};
    socklen_t len;
    if (boundLen_) {
        addr = bound_;
        len = boundLen_;
    } else if (family_ == AF_INET) {
        auto *in = reinterpret_cast<sockaddr_in *>(&addr);
        in->sin_family = AF_INET;
        in->sin_addr.s_addr = htonl(INADDR_ANY);
        len = sizeof(sockaddr_in);
    } else {
        auto *in6 = reinterpret_cast<sockaddr_in6 *>(&addr);
        in6->sin6_family = AF_INET6;
        in6->sin6_addr = in6addr_any;
        len = sizeof(sockaddr_in6);
    }
    int ret = listener->bind(reinterpret_cast<sockaddr *>(&addr), len);
    if (ret == 0)
        ret = listener->listen(backlog);
    if (ret < 0)
        return ret == -EADDRNOTAVAIL && boundLen_ ? -EADDRINUSE : ret;
    listener_ = std::move(listener);
    setStateLocked(State::Listening);
    return 0;
}

int Socket::accept(std::shared_ptr<Socket> *out, sockaddr *addr, socklen_t *len)
{
    std::shared_ptr<Listener> listener;
    int timeout;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (state_ != State::Listening)
            return -EINVAL;
        listener = listener_;
        timeout = rcvTimeoutMs_;
    }
    std::unique_ptr<Connection> conn;
    int ret;
    do {
        ret = listener->accept(&conn, nonblocking(), nonblocking() ? 0 : timeout);
    } while (ret == -EINTR && timeout < 0 && signalsRestart());
    if (ret == -ETIMEDOUT)
        return -EAGAIN;
    if (ret < 0)
        return ret;
    auto s = std::make_shared<Socket>(family_, settings_);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        // Accepted sockets inherit the listener's options, as on Linux (not O_NONBLOCK).
        s->rcvTimeoutMs_ = rcvTimeoutMs_;
        s->sndTimeoutMs_ = sndTimeoutMs_;
        s->keepalive_ = keepalive_;
        s->keepIdle_ = keepIdle_;
        s->keepIntvl_ = keepIntvl_;
        s->keepCnt_ = keepCnt_;
        s->linger_ = linger_;
        s->noDelay_ = noDelay_;
        s->maxSeg_ = maxSeg_;
        s->v6Only_ = v6Only_;
        s->sndBufReq_ = sndBufReq_;
        s->rcvBufReq_ = rcvBufReq_;
        s->sendRing_ = static_cast<uint32_t>(conn->settings().sendBuf);
        // As Linux clones the listener's socket, but for what it resets.
        s->generic_ = generic_;
        s->generic_.erase({SOL_SOCKET, SO_PRIORITY});
        s->generic_.erase({IPPROTO_TCP, TCP_QUICKACK});
    }
    s->conn_ = std::shared_ptr<Connection>(conn.release(), ConnectionCloser{});
    s->state_ = State::Connected;
    s->applyKeepaliveLocked();
    s->applyCorkLocked();
    if (addr && len) {
        sockaddr_storage peer{};
        socklen_t plen = sizeof(peer);
        if (s->conn_->peerAddress(&peer, &plen) == 0) {
            toFamily(family_, &peer, &plen);
            copyAddress(peer, plen, addr, len);
        } else {
            *len = 0;
        }
    }
    *out = std::move(s);
    return 0;
}

void Socket::refreshConnectLocked()
{
    if (state_ != State::Connecting || !conn_)
        return;
    int r = conn_->connectResult();
    if (r == -EINPROGRESS)
        return;
    if (r == 0) {
        setStateLocked(State::Connected);
        return;
    }
    // A failed connect leaves the socket closed with the error pending, like Linux.
    soError_ = r;
    failedConnect_ = true;
    setStateLocked(State::Fresh);
    conn_.reset();
}

int Socket::connect(const sockaddr *addr, socklen_t len)
{
    std::shared_ptr<Connection> conn;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        refreshConnectLocked();
        switch (state_) {
        case State::Connected:
            // The first connect after a nonblocking connect completed reports success.
            if (connectPending_) {
                connectPending_ = false;
                return 0;
            }
            return -EISCONN;
        case State::Listening:
            return -EISCONN;
        case State::Connecting:
            return -EALREADY;
        case State::Closed:
            return -EBADF;
        case State::Fresh:
            break;
        }
        if (!addr)
            return -EFAULT;
        if (family_ == AF_INET6 && len >= sizeof(sa_family_t) && addr->sa_family == AF_INET)
            return -EAFNOSUPPORT;
        int ret = checkAddress(family_, addr, len);
        if (ret < 0)
            return ret;
        if (family_ == AF_INET6 && v6Only_ && isV4Mapped(addr))
            return -ENETUNREACH;
        Settings s;
        applySettings(&s);
        auto c = std::shared_ptr<Connection>(new Connection(s), ConnectionCloser{});
        if (boundLen_) {
            releaseProbe();
            sockaddr_storage local;
            socklen_t llen =
                engineAddress(reinterpret_cast<sockaddr *>(&bound_), boundLen_, &local);
            ret = c->bind(reinterpret_cast<sockaddr *>(&local), llen);
            if (ret < 0)
                return ret;
        }
        sockaddr_storage dest;
        socklen_t dlen = engineAddress(addr, len, &dest);
        soError_ = 0;
        failedConnect_ = false;
        ret = c->connect(reinterpret_cast<sockaddr *>(&dest), dlen, true);
        if (ret != -EINPROGRESS && ret < 0)
            return ret;
        sendRing_ = static_cast<uint32_t>(s.sendBuf);
        conn_ = c;
        applyKeepaliveLocked();
        applyCorkLocked();
        setStateLocked(ret == 0 ? State::Connected : State::Connecting);
        connectPending_ = ret == -EINPROGRESS && nonblocking();
        if (state_ == State::Connected || nonblocking())
            return ret;
        conn = c;
    }
    // Blocking: wait outside the lock. A signal interrupts the wait, not the connection.
    for (;;) {
        int r = conn->connectResult();
        if (r != -EINPROGRESS) {
            std::lock_guard<std::mutex> lock(mutex_);
            if (conn_ == conn) {
                refreshConnectLocked();
                if (r < 0)
                    soError_ = 0; // reported by connect() itself
            }
            return r;
        }
        r = conn->wait(kWritable, -1);
        if (r == -EINTR)
            return -EINTR;
        if (r < 0 && r != -ENOTCONN)
            return r;
    }
}

void Socket::applyKeepaliveLocked()
{
    if (conn_ && (keepalive_ || keepaliveApplied_)) {
        conn_->setKeepalive(keepalive_, keepIdle_, keepIntvl_, keepCnt_);
        keepaliveApplied_ = keepalive_;
    }
}

int Socket::setGenericLocked(int level, int name, int v)
{
    if (!isGenericOption(level, name))
        return -ENOPROTOOPT;
    generic_[{level, name}] = v;
    return 0;
}

void Socket::applyCorkLocked()
{
    auto it = generic_.find({IPPROTO_TCP, TCP_CORK});
    if (conn_ && it != generic_.end())
        conn_->setCork(it->second != 0);
}

int Socket::reportError(int err)
{
    // Like sk_err: a reset or timeout is reported once; afterwards reads see EOF and writes
    // EPIPE.
    std::lock_guard<std::mutex> lock(mutex_);
    if (errorReported_)
        return 0;
    errorReported_ = true;
    return err;
}

ssize_t Socket::send(const iovec *iov, int iovcnt, int flags)
{
    std::shared_ptr<Connection> conn;
    int timeout;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        refreshConnectLocked();
        if (state_ == State::Fresh || state_ == State::Listening || state_ == State::Closed) {
            if (soError_) {
                int e = soError_;
                soError_ = 0;
                return e;
            }
            return -EPIPE;
        }
        if (flags & MSG_OOB)
            return -EOPNOTSUPP;
        conn = conn_;
        timeout = sndTimeoutMs_;
        if (errorReported_)
            return -EPIPE;
    }
    int f = (nonblocking() || (flags & MSG_DONTWAIT)) ? kNonBlock : 0;
    const int more = (flags & MSG_MORE) ? kMore : 0;
    ssize_t r;
    do {
        r = conn->sendv(iov, iovcnt, f | more, f ? 0 : timeout);
    } while (r == -EINTR && timeout < 0 && signalsRestart());
    if (r == -ENOTCONN)
        r = -EAGAIN; // still connecting, nonblocking
    if (r == -ECONNRESET || r == -ETIMEDOUT) {
        int e = reportError(static_cast<int>(r));
        return e ? e : -EPIPE;
    }
    return r;
}

ssize_t Socket::recv(const iovec *iov, int iovcnt, int flags)
{
    std::shared_ptr<Connection> conn;
    int timeout;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        refreshConnectLocked();
        if (flags & MSG_OOB)
            return -EINVAL;
        if (state_ == State::Listening || state_ == State::Closed)
            return -ENOTCONN;
        if (state_ == State::Fresh) {
            if (soError_) {
                int e = soError_;
                soError_ = 0;
                return e;
            }
            return failedConnect_ ? 0 : -ENOTCONN;
        }
        conn = conn_;
        timeout = rcvTimeoutMs_;
        if (errorReported_)
            return 0;
    }
    int f = (nonblocking() || (flags & MSG_DONTWAIT)) ? kNonBlock : 0;
    if (flags & MSG_PEEK)
        f |= kPeek;
    else if ((flags & MSG_WAITALL) && !f)
        f |= kWaitAll;
    ssize_t r;
    if (flags & MSG_TRUNC) {
        // TCP with MSG_TRUNC: the data is discarded and its length returned.
        size_t total = 0;
        for (int i = 0; i < iovcnt; i++)
            total += iov[i].iov_len;
        static thread_local char scratch[16384];
        size_t done = 0;
        r = 0;
        while (done < total) {
            size_t n = std::min(total - done, sizeof(scratch));
            ssize_t got = conn->recv(scratch, n, done ? (f | kNonBlock) & ~kWaitAll : f,
                                     f & kNonBlock ? 0 : timeout);
            if (got <= 0) {
                r = done ? static_cast<ssize_t>(done) : got;
                break;
            }
            done += static_cast<size_t>(got);
            r = static_cast<ssize_t>(done);
            if (f & kPeek)
                break;
        }
    } else {
        size_t total = 0;
        for (int i = 0; i < iovcnt; i++)
            total += iov[i].iov_len;
        if (total == 0) {
            // Linux waits for data even for an empty read, then returns 0.
            for (;;) {
                ssize_t p = conn->peekRecv();
                if (p != -EAGAIN) {
                    r = p < 0 ? p : 0;
                    break;
                }
                if (f & kNonBlock) {
                    r = -EAGAIN;
                    break;
                }
                int w = conn->wait(kReadable, timeout);
                if (w == 0) {
                    r = -EAGAIN;
                    break;
                }
                if (w == -EINTR && (timeout >= 0 || !signalsRestart())) {
                    r = -EINTR;
                    break;
                }
            }
        } else {
            do {
                r = conn->recvv(iov, iovcnt, f, f & kNonBlock ? 0 : timeout);
            } while (r == -EINTR && timeout < 0 && signalsRestart());
        }
    }
    if (r == -ENOTCONN)
        r = -EAGAIN;
    if (r == -ECONNRESET || r == -ETIMEDOUT) {
        int e = reportError(static_cast<int>(r));
        return e ? e : 0;
    }
    return r;
}

int Socket::shutdown(int how)
{
    if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR)
        return -EINVAL;
    std::shared_ptr<Connection> conn;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        refreshConnectLocked();
        if (state_ == State::Listening) {
            if (how == SHUT_WR)
                return 0;
            // Linux stops listening: pending and future accepts fail.
            listener_.reset();
            setStateLocked(State::Closed);
            return 0;
        }
        if (state_ != State::Connected)
            return -ENOTCONN;
        conn = conn_;
        if (how != SHUT_RD)
            shutWr_ = true;
    }
    int r = conn->shutdown(how);
    return r == -ECONNRESET || r == -ETIMEDOUT ? 0 : r;
}

off_t Socket::riomap(void *buf, size_t len, int prot, int flags, off_t offset)
{
    if (flags != 0 || (prot != PROT_WRITE && prot != PROT_NONE))
        return -EINVAL;
    std::shared_ptr<Connection> conn;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        refreshConnectLocked();
        if (state_ != State::Connected)
            return -ENOTCONN;
        conn = conn_;
    }
    off_t chosen = 0;
    int r = conn->mapWindow(buf, len, prot == PROT_WRITE, offset, &chosen);
    return r < 0 ? r : chosen;
}

int Socket::riounmap(void *buf, size_t len)
{
    std::shared_ptr<Connection> conn;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!conn_)
            return -EINVAL; // nothing was ever mapped here
        conn = conn_;
    }
    return conn->unmapWindow(buf, len);
}

ssize_t Socket::riowrite(const void *buf, size_t count, off_t offset, int flags)
{
    std::shared_ptr<Connection> conn;
    int timeout;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        refreshConnectLocked();
        if (state_ != State::Connected) {
            if (soError_) {
                int e = soError_;
                soError_ = 0;
                return e;
            }
            return state_ == State::Connecting ? -EAGAIN : -ENOTCONN;
        }
        conn = conn_;
        timeout = sndTimeoutMs_;
        if (errorReported_)
            return -EPIPE;
    }
    int f = (nonblocking() || (flags & MSG_DONTWAIT)) ? kNonBlock : 0;
    ssize_t r;
    do {
        r = conn->writeWindow(buf, count, offset, f, f ? 0 : timeout);
    } while (r == -EINTR && timeout < 0 && signalsRestart());
    if (r == -ENOTCONN)
        r = -EAGAIN; // still connecting, nonblocking
    if (r == -ECONNRESET || r == -ETIMEDOUT) {
        int e = reportError(static_cast<int>(r));
        return e ? e : -EPIPE;
    }
    return r;
}

int Socket::setsockopt(int level, int name, const void *val, socklen_t len)
{
    std::lock_guard<std::mutex> lock(mutex_);
    int v = 0;
    int ret;
    bool before = state_ == State::Fresh; // endpoint settings apply to the next endpoint
    switch (level) {
    case SOL_SOCKET:
        switch (name) {
        case SO_RCVTIMEO:
        case SO_SNDTIMEO: {
            int ms;
            if ((ret = timeoutFromTimeval(val, len, &ms)) < 0)
                return ret;
            (name == SO_RCVTIMEO ? rcvTimeoutMs_ : sndTimeoutMs_) = ms;
            return 0;
        }
        case SO_LINGER:
            if (!val)
                return -EFAULT;
            if (len < sizeof(linger))
                return -EINVAL;
            std::memcpy(&linger_, val, sizeof(linger));
            return 0;
        default:
            break;
        }
        if ((ret = getInt(val, len, &v)) < 0)
            return ret;
        switch (name) {
        case SO_KEEPALIVE:
            keepalive_ = v != 0;
            applyKeepaliveLocked();
            return 0;
        case SO_REUSEADDR:
            reuseAddr_ = v != 0;
            return 0;
        case SO_REUSEPORT:
            reusePort_ = v != 0;
            return 0;
        case SO_SNDBUF:
        case SO_SNDBUFFORCE:
            sndBufReq_ = std::max(v, 1);
            return 0;
        case SO_RCVBUF:
        case SO_RCVBUFFORCE:
            rcvBufReq_ = std::max(v, 1);
            return 0;
        default:
            return setGenericLocked(level, name, v);
        }
    case IPPROTO_TCP:
        if ((ret = getInt(val, len, &v)) < 0)
            return ret;
        switch (name) {
        case TCP_NODELAY:
            noDelay_ = v != 0;
            return 0;
        case TCP_MAXSEG:
            if (v < 0 || v > 65535 || (v > 0 && v < 88))
                return -EINVAL;
            maxSeg_ = v;
            return 0;
        case TCP_KEEPIDLE:
            if (v < 1 || v > 32767)
                return -EINVAL;
            keepIdle_ = v;
            applyKeepaliveLocked();
            return 0;
        case TCP_KEEPINTVL:
            if (v < 1 || v > 32767)
                return -EINVAL;
            keepIntvl_ = v;
            applyKeepaliveLocked();
            return 0;
        case TCP_KEEPCNT:
            if (v < 1 || v > 127)
                return -EINVAL;
            keepCnt_ = v;
            applyKeepaliveLocked();
            return 0;
        case TCP_CORK:
            generic_[{level, name}] = v != 0;
            applyCorkLocked();
            return 0;
        default:
            return setGenericLocked(level, name, v);
        }
    case IPPROTO_IPV6:
        if (family_ != AF_INET6)
            return -ENOPROTOOPT;
        if ((ret = getInt(val, len, &v)) < 0)
            return ret;
        if (name == IPV6_V6ONLY) {
            if (!before || boundLen_)
                return -EINVAL;
            v6Only_ = v != 0;
            return 0;
        }
        return setGenericLocked(level, name, v);
    case IPPROTO_IP:
        if ((ret = getInt(val, len, &v)) < 0)
            return ret;
        return setGenericLocked(level, name, v);
    case kSolRdma:
        if ((ret = getInt(val, len, &v)) < 0)
            return ret;
        switch (name) {
        case kRdmaSqSize:
        case kTxSize:
        case kRdmaRqSize:
        case kRxSize:
            if (!before)
                return -EINVAL;
            if (v < static_cast<int>(Settings::kMinQueue) ||
                v > static_cast<int>(Settings::kMaxQueue))
                return -EINVAL;
            (name == kRdmaSqSize || name == kTxSize ? settings_.txSize : settings_.rxSize) =
                static_cast<uint32_t>(v);
            return 0;
        case kSendBuf:
        case kRecvBuf:
            if (!before)
                return -EINVAL;
            if (v < static_cast<int>(Settings::kMinBuf) ||
                static_cast<size_t>(v) > Settings::kMaxBuf)
                return -EINVAL;
            // A size asked for is kept: the ring does not grow.
            if (name == kSendBuf)
                settings_.sendBuf = settings_.sendBufMax = static_cast<size_t>(v);
            else
                settings_.recvBuf = settings_.recvBufMax = static_cast<size_t>(v);
            (name == kSendBuf ? sndBufReq_ : rcvBufReq_) = 0;
            return 0;
        case kRdmaInline:
            if (v < 0)
                return -EINVAL;
            inlineSize_ = v;
            return 0;
        case kRdmaIoMapSize:
            // The table of the peer's windows is sized when the endpoint is made.
            if (!before || v < 0 || static_cast<uint32_t>(v) > wire::kMaxIoMaps)
                return -EINVAL;
            settings_.ioMapSize = static_cast<uint32_t>(v);
            return 0;
        default:
            return -ENOPROTOOPT;
        }
    default:
        return -ENOPROTOOPT;
    }
}

int Socket::getsockopt(int level, int name, void *val, socklen_t *len)
{
    if (!len)
        return -EFAULT;
    std::shared_ptr<Connection> conn;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        refreshConnectLocked();
        conn = conn_;
        switch (level) {
        case SOL_SOCKET:
            switch (name) {
            case SO_RCVTIMEO:
                return getValue(timevalFromMs(rcvTimeoutMs_), val, len);
            case SO_SNDTIMEO:
                return getValue(timevalFromMs(sndTimeoutMs_), val, len);
            case SO_LINGER:
                return getValue(linger_, val, len);
            case SO_ERROR: {
                int e = -soError_;
                soError_ = 0;
                if (!e && conn && state_ == State::Connected && !errorReported_) {
                    int ce = conn->info().error;
                    if (ce == -ECONNRESET || ce == -ETIMEDOUT) {
                        errorReported_ = true;
                        e = -ce;
                    }
                }
                return getValue(e, val, len);
            }
            case SO_TYPE:
                return getValue(int(SOCK_STREAM), val, len);
            case SO_DOMAIN:
                return getValue(family_, val, len);
            case SO_PROTOCOL:
                return getValue(int(IPPROTO_TCP), val, len);
            case SO_ACCEPTCONN:
                return getValue(int(state_ == State::Listening), val, len);
            case SO_KEEPALIVE:
                return getValue(int(keepalive_), val, len);
            case SO_REUSEADDR:
                return getValue(int(reuseAddr_), val, len);
            case SO_REUSEPORT:
                return getValue(int(reusePort_), val, len);
            case SO_SNDBUF:
                return getValue(sndBufReq_ ? doubledBuf(sndBufReq_, true)
                                           : static_cast<int>(settings_.sendBuf * 2),
                                val, len);
            case SO_RCVBUF:
                return getValue(rcvBufReq_ ? doubledBuf(rcvBufReq_, false)
                                           : static_cast<int>(settings_.recvBuf * 2),
                                val, len);
            case SO_RCVLOWAT:
            case SO_SNDLOWAT: {
                auto it = generic_.find({level, name});
                return getValue(it == generic_.end() ? 1 : it->second, val, len);
            }
            default:
                break;
            }
            break;
        case IPPROTO_TCP:
            switch (name) {
            case TCP_NODELAY:
                return getValue(int(noDelay_), val, len);
            case TCP_MAXSEG: {
                // The largest single write the engine makes is a quarter of the ring; report
                // what a loopback TCP connection would, capped by that and by a set value.
                int mss = std::min<int>(65483, std::max<int>(sendRing_ / 4, 536));
                if (maxSeg_)
                    mss = std::min(mss, maxSeg_);
                return getValue(mss, val, len);
            }
            case TCP_KEEPIDLE:
                return getValue(keepIdle_, val, len);
            case TCP_KEEPINTVL:
                return getValue(keepIntvl_, val, len);
            case TCP_KEEPCNT:
                return getValue(keepCnt_, val, len);
            case TCP_INFO:
                break; // below, outside the lock
            default:
                break;
            }
            break;
        case IPPROTO_IPV6:
            if (family_ != AF_INET6)
                return -ENOPROTOOPT;
            if (name == IPV6_V6ONLY)
                return getValue(int(v6Only_), val, len);
            break;
        case IPPROTO_IP:
            break;
        case kSolRdma:
            switch (name) {
            case kRdmaSqSize:
            case kTxSize:
                return getValue(static_cast<int>(settings_.txSize), val, len);
            case kRdmaRqSize:
            case kRxSize:
                return getValue(static_cast<int>(settings_.rxSize), val, len);
            case kSendBuf:
                return getValue(static_cast<int>(settings_.sendBuf), val, len);
            case kRecvBuf:
                return getValue(static_cast<int>(settings_.recvBuf), val, len);
            case kRdmaInline:
                return getValue(inlineSize_, val, len);
            case kRdmaIoMapSize:
                return getValue(static_cast<int>(settings_.ioMapSize), val, len);
            default:
                return -ENOPROTOOPT;
            }
        default:
            return -ENOPROTOOPT;
        }
        if (!(level == IPPROTO_TCP && name == TCP_INFO)) {
            auto it = generic_.find({level, name});
            if (it != generic_.end())
                return getValue(it->second, val, len);
            int v = 0;
            int ret = isGenericOption(level, name) ? kernelDefault(family_, level, name, &v)
                                                   : -ENOPROTOOPT;
            return ret < 0 ? ret : getValue(v, val, len);
        }
    }
    // TCP_INFO.
    TcpInfoFields f;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        switch (state_) {
        case State::Listening:
            f.state = TCP_LISTEN;
            break;
        case State::Connecting:
            f.state = TCP_SYN_SENT;
            break;
        case State::Fresh:
        case State::Closed:
            f.state = TCP_CLOSE;
            break;
        case State::Connected:
            f.state = TCP_ESTABLISHED;
            break;
        }
    }
    if (conn && f.state == TCP_ESTABLISHED) {
        Connection::Info i = conn->info();
        if (i.error)
            f.state = TCP_CLOSE;
        else if (i.peerShutWr && i.shutWr)
            f.state = TCP_LAST_ACK;
        else if (i.peerShutWr)
            f.state = TCP_CLOSE_WAIT;
        else if (i.shutWr)
            f.state = TCP_FIN_WAIT2;
        f.rttUs = i.rttUs;
        f.bytesSent = i.bytesSent;
        f.bytesReceived = i.bytesReceived;
        f.unackedBytes = i.unackedBytes;
        f.sendBuf = i.sendBuf;
        f.recvBuf = i.recvBuf;
    }
    f.mss = static_cast<uint32_t>(std::min<int>(65483, std::max<int>(sendRing_ / 4, 536)));
    return fillTcpInfo(f, val, len);
}

int Socket::localAddress(sockaddr *addr, socklen_t *len)
{
    std::shared_ptr<Connection> conn;
    std::shared_ptr<Listener> listener;
    sockaddr_storage ss{};
    socklen_t slen = 0;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        refreshConnectLocked();
        conn = conn_;
        listener = listener_;
        if (boundLen_) {
            ss = bound_;
            slen = boundLen_;
        }
    }
    if (listener) {
        slen = sizeof(ss);
        listener->localAddress(&ss, &slen);
    } else if (conn) {
        sockaddr_storage l{};
        socklen_t llen = sizeof(l);
        if (conn->localAddress(&l, &llen) == 0) {
            ss = l;
            slen = llen;
        }
    }
    if (!slen) {
        // Unbound: the wildcard address and port 0, as Linux reports.
        ss.ss_family = static_cast<sa_family_t>(family_);
        slen = family_ == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    }
    toFamily(family_, &ss, &slen);
    return copyAddress(ss, slen, addr, len);
}

int Socket::peerAddress(sockaddr *addr, socklen_t *len)
{
    std::shared_ptr<Connection> conn;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        refreshConnectLocked();
        if (state_ != State::Connected)
            return -ENOTCONN;
        conn = conn_;
    }
    sockaddr_storage ss{};
    socklen_t slen = sizeof(ss);
    int ret = conn->peerAddress(&ss, &slen);
    if (ret < 0)
        return -ENOTCONN;
    toFamily(family_, &ss, &slen);
    return copyAddress(ss, slen, addr, len);
}

int Socket::readable(int *bytes)
{
    std::shared_ptr<Connection> conn;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        refreshConnectLocked();
        if (state_ == State::Listening)
            return -EINVAL;
        conn = conn_;
    }
    ssize_t r = conn ? conn->peekRecv() : 0;
    *bytes = r > 0 ? static_cast<int>(std::min<ssize_t>(r, INT_MAX)) : 0;
    return 0;
}

int Socket::pollEvents(int events)
{
    std::shared_ptr<Connection> conn;
    std::shared_ptr<Listener> listener;
    int rev = 0;
    bool shutWr;
    uint32_t ring;
    bool reported;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        refreshConnectLocked();
        switch (state_) {
        case State::Listening:
            listener = listener_;
            break;
        case State::Closed:
            return POLLHUP & (events | POLLHUP);
        case State::Fresh:
            // A closed TCP socket: writable and hung up; after a failed connect also
            // shut down for reading and, until SO_ERROR is read, in error.
            rev = POLLOUT | POLLHUP;
            if (failedConnect_)
                rev |= POLLIN | POLLRDHUP;
            if (soError_)
                rev |= POLLERR;
            return rev & (events | POLLERR | POLLHUP);
        case State::Connecting:
            return 0;
        case State::Connected:
            conn = conn_;
            break;
        }
        shutWr = shutWr_;
        ring = sendRing_;
        reported = errorReported_;
    }
    if (listener)
        return listener->pending() ? (POLLIN & events) : 0;
    ssize_t r, s;
    conn->peek(&r, &s);
    if (reported || (r < 0 && r != -EAGAIN)) {
        rev |= POLLIN | POLLRDHUP | POLLOUT | POLLHUP;
        if (!reported)
            rev |= POLLERR;
    } else {
        if (r > 0)
            rev |= POLLIN;
        else if (r == 0)
            rev |= POLLIN | POLLRDHUP;
        // Writable once a third of the ring is free, as Linux's sk_stream_is_writeable.
        if ((s > 0 && static_cast<uint64_t>(s) * 3 >= ring) || s == -EPIPE)
            rev |= POLLOUT;
        if (s < 0 && s != -EPIPE)
            rev |= POLLOUT | POLLERR | POLLHUP;
        if (r == 0 && shutWr)
            rev |= POLLHUP;
    }
    return rev & (events | POLLERR | POLLHUP);
}

int Socket::prepareWait(std::vector<pollfd> *fds, int)
{
    std::shared_ptr<Connection> conn;
    std::shared_ptr<Listener> listener;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        conn = conn_;
        listener = listener_;
    }
    if (listener) {
        if (listener->arm() == -EAGAIN)
            return -EAGAIN;
        fds->push_back({listener->waitFd(), POLLIN, 0});
        fds->push_back({listener->readyFd(), POLLIN, 0});
    }
    if (conn) {
        if (conn->arm() == -EAGAIN)
            return -EAGAIN;
        fds->push_back({conn->waitFd(), POLLIN, 0});
    }
    return 0;
}

void Socket::addWaiter(int eventFd, std::vector<std::shared_ptr<Connection>> *registered)
{
    std::lock_guard<std::mutex> lock(mutex_);
    if (conn_) {
        conn_->addWaiter(eventFd);
        registered->push_back(conn_);
    }
}

uint64_t Socket::generation(int events)
{
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t g = stateChanges_ << 40;
    if (conn_ && (events & POLLIN))
        g += conn_->rxEventCount();
    if (conn_ && (events & POLLOUT))
        g += conn_->txEventCount() << 20;
    return g;
}

int Socket::connectStatus()
{
    std::lock_guard<std::mutex> lock(mutex_);
    refreshConnectLocked();
    switch (state_) {
    case State::Connected:
        return 0;
    case State::Connecting:
        return -EINPROGRESS;
    default:
        return failedConnect_ && soError_ ? soError_ : -ENOTCONN;
    }
}

void Socket::confirmConnected()
{
    std::lock_guard<std::mutex> lock(mutex_);
    connectPending_ = false;
}

void Socket::setBackgroundAccept(bool on)
{
    std::shared_ptr<Listener> l;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        l = listener_;
    }
    if (l)
        l->setBackgroundAccept(on);
}

std::string Socket::debugState()
{
    std::shared_ptr<Connection> conn;
    int st;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        conn = conn_;
        st = static_cast<int>(state_);
    }
    std::string r = "sock=" + std::to_string(st);
    if (conn)
        r += " " + conn->debugState();
    return r;
}

std::shared_ptr<Connection> Socket::connection()
{
    std::lock_guard<std::mutex> lock(mutex_);
    return conn_;
}

bool Socket::isListening()
{
    std::lock_guard<std::mutex> lock(mutex_);
    return state_ == State::Listening;
}

bool Socket::isConnected()
{
    std::lock_guard<std::mutex> lock(mutex_);
    refreshConnectLocked();
    return state_ == State::Connected;
}

uint64_t Socket::bytesSent()
{
    std::lock_guard<std::mutex> lock(mutex_);
    return conn_ ? conn_->bytesSent() : 0;
}

uint64_t Socket::bytesReceived()
{
    std::lock_guard<std::mutex> lock(mutex_);
    return conn_ ? conn_->bytesReceived() : 0;
}

} // namespace rstream
