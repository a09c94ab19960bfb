// SPDX-License-Identifier: MIT
// A socket's life: create, bind, listen, accept, connect, shutdown and close, and its state.

#include "socket.h"
#include "clock.h"
#include "kernel.h"
#include "socket_internal.h"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cstdio>
#include <unistd.h>

namespace rstream {

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

int Socket::create(int domain, int type, int protocol, std::shared_ptr<Socket> *out)
{
    // As Linux: flags other than these, or a type past the last one, are invalid; a valid type
    // other than a stream is not supported here.
    constexpr int kTypeMask = 0xf, kTypeMax = 10; // SOCK_TYPE_MASK, SOCK_PACKET
    if ((type & ~kTypeMask & ~(SOCK_NONBLOCK | SOCK_CLOEXEC)) || (type & kTypeMask) > kTypeMax)
        return -EINVAL;
    if (domain != AF_INET && domain != AF_INET6)
        return -EAFNOSUPPORT;
    if ((type & kTypeMask) != SOCK_STREAM)
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
        sys::close(probeFd_);
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
    // The fabric endpoint takes the port over. The probe holds it until the endpoint is bound
    // there: a port nobody held for a moment could become a connection's local one, and a
    // listen fails on such a port (EADDRINUSE) where the program's bind had succeeded. The
    // endpoint binds with SO_REUSEADDR; the probe, which never listens, lets it through once it
    // has the option too.
    if (probeFd_ >= 0) {
        const int one = 1;
        sys::setsockopt(probeFd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    }
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
    releaseProbe();
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
        inheritOptionsLocked(s.get());
        s->sendRing_ = static_cast<uint32_t>(conn->settings().sendBuf);
    }
    s->conn_ = std::shared_ptr<Connection>(conn.release(), ConnectionCloser{});
    s->state_ = State::Connected;
    s->applyKeepaliveLocked();
    s->applyCorkLocked();
    s->applyUserTimeoutLocked();
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
    deferred_ = conn_->refusedWithDefer();
    setStateLocked(State::Fresh);
    conn_.reset();
}

int Socket::connect(const sockaddr *addr, socklen_t len)
{
    // The kernel copies the address in before it looks at the socket.
    if (len > sizeof(sockaddr_storage))
        return -EINVAL;
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
        useConnectionLocked(c, s.sendBuf);
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

int Socket::adoptSameHost(std::unique_ptr<SameHostLink> link, const sockaddr *local, socklen_t llen,
                          const sockaddr *peer, socklen_t plen)
{
    if (llen > sizeof(sockaddr_storage) || plen > sizeof(sockaddr_storage))
        return -EINVAL;
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ != State::Fresh)
        return -EISCONN;
    Settings s;
    applySettings(&s);
    auto c = std::shared_ptr<Connection>(new Connection(s), ConnectionCloser{});
    sockaddr_storage l, p;
    const socklen_t ll = engineAddress(local, llen, &l);
    const socklen_t pl = engineAddress(peer, plen, &p);
    const int ret = c->adoptSameHost(std::move(link), reinterpret_cast<sockaddr *>(&l), ll,
                                     reinterpret_cast<sockaddr *>(&p), pl);
    if (ret < 0)
        return ret;
    useConnectionLocked(std::move(c), s.sendBuf);
    setStateLocked(State::Connected);
    return 0;
}

Settings Socket::connectionSettings()
{
    std::lock_guard<std::mutex> lock(mutex_);
    Settings s;
    applySettings(&s);
    return s;
}

void Socket::useConnectionLocked(std::shared_ptr<Connection> c, size_t sendBuf)
{
    sendRing_ = static_cast<uint32_t>(sendBuf);
    conn_ = std::move(c);
    sameHostConn_.store(false, std::memory_order_relaxed);
    // Options set before the connection existed take effect on it now.
    applyKeepaliveLocked();
    applyCorkLocked();
    applyUserTimeoutLocked();
}

void Socket::allowAfterClose(uint64_t bytes)
{
    if (std::shared_ptr<Connection> conn = connection())
        conn->allowAfterClose(bytes);
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

bool Socket::connectDeferred()
{
    std::lock_guard<std::mutex> lock(mutex_);
    refreshConnectLocked();
    return deferred_;
}

void Socket::confirmConnected()
{
    std::lock_guard<std::mutex> lock(mutex_);
    connectPending_ = false;
}

void Socket::setDeferring(bool on)
{
    std::shared_ptr<Listener> l;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        l = listener_;
    }
    if (l)
        l->setDeferring(on);
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
