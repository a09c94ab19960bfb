// SPDX-License-Identifier: MIT
// setsockopt and getsockopt: one table of the options, how each is passed, kept and applied.

#include "kernel.h"
#include "socket.h"
#include "socket_internal.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <netinet/tcp.h>
#include <type_traits>
#include <unistd.h>

namespace rstream {

namespace {
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

// What Linux answers for such an option nobody set (its sysctls included): asked of a fresh
// kernel socket of the family.
int kernelDefault(int family, int level, int name, int *out)
{
    int fd = sys::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return fd;
    socklen_t l = sizeof(*out);
    int ret = sys::getsockopt(fd, level, name, out, &l);
    sys::close(fd);
    return ret;
}

// How the caller passes an option's value.
enum class Kind
{
    Int,     // an int; flags are on when nonzero
    Timeval, // a struct timeval, kept as milliseconds (-1: none)
    Linger,  // a struct linger
    Kept,    // an int kept without effect for getsockopt (generic_)
    TcpInfo, // struct tcp_info, read only, as much of it as asked for
};

// A value between the caller's buffer and the socket: i for Int, Timeval and Kept.
struct Value
{
    int i = 0;
    linger l{0, 0};
};

// An option that is one field of the socket, set within [Min, Max], then After run.
template <auto Field, int Min = INT_MIN, int Max = INT_MAX, auto After = nullptr>
int setField(Socket &s, const Value &v)
{
    if (v.i < Min || v.i > Max)
        return -EINVAL;
    s.*Field = static_cast<std::remove_reference_t<decltype(s.*Field)>>(v.i);
    if constexpr (After != nullptr)
        (s.*After)();
    return 0;
}

template <auto Field>
Value getField(Socket &s)
{
    return Value{static_cast<int>(s.*Field)};
}
} // namespace

// One row per option setsockopt or getsockopt knows; what no row names is -ENOPROTOOPT.
// set and get run with the mutex held. A null set is a read-only option, a null get a
// write-only one; for kept options set, if any, stores the value itself and applies it, and
// get gives the value while unset (null: what the kernel gives).
struct Socket::Option
{
    int level;
    int name;
    Kind kind;
    int (*set)(Socket &s, const Value &v);
    Value (*get)(Socket &s);
};

const Socket::Option *Socket::findOption(int level, int name)
{
    // Endpoint settings apply to the next endpoint: -EINVAL once there is one.
    static constexpr auto before = [](const Socket &s) { return s.state_ == State::Fresh; };
    // Before the connection: the ring's size (applySettings); on a connection: its ring keeps
    // the size it has.
    static constexpr auto setSndBuf = [](Socket &s, const Value &v) {
        s.sndBufReq_ = std::max(v.i, 1);
        if (s.conn_)
            s.conn_->fixBufferSizes(true, false);
        return 0;
    };
    static constexpr auto setRcvBuf = [](Socket &s, const Value &v) {
        s.rcvBufReq_ = std::max(v.i, 1);
        if (s.conn_)
            s.conn_->fixBufferSizes(false, true);
        return 0;
    };
    static constexpr auto setQueue = [](Socket &s, uint32_t Settings::*queue, int v) {
        if (!before(s))
            return -EINVAL;
        if (v < static_cast<int>(Settings::kMinQueue) || v > static_cast<int>(Settings::kMaxQueue))
            return -EINVAL;
        s.settings_.*queue = static_cast<uint32_t>(v);
        return 0;
    };
    static constexpr auto setTxSize = [](Socket &s, const Value &v) {
        return setQueue(s, &Settings::txSize, v.i);
    };
    static constexpr auto setRxSize = [](Socket &s, const Value &v) {
        return setQueue(s, &Settings::rxSize, v.i);
    };
    static constexpr auto getTxSize = [](Socket &s) {
        return Value{static_cast<int>(s.settings_.txSize)};
    };
    static constexpr auto getRxSize = [](Socket &s) {
        return Value{static_cast<int>(s.settings_.rxSize)};
    };
    static constexpr auto setRing = [](Socket &s, bool send, int v) {
        if (!before(s))
            return -EINVAL;
        if (v < static_cast<int>(Settings::kMinBuf) || static_cast<size_t>(v) > Settings::kMaxBuf)
            return -EINVAL;
        // A size asked for is kept: the ring does not grow.
        if (send)
            s.settings_.sendBuf = s.settings_.sendBufMax = static_cast<size_t>(v);
        else
            s.settings_.recvBuf = s.settings_.recvBufMax = static_cast<size_t>(v);
        (send ? s.sndBufReq_ : s.rcvBufReq_) = 0;
        return 0;
    };
    static constexpr Option kOptions[] = {
        {SOL_SOCKET, SO_RCVTIMEO, Kind::Timeval, setField<&Socket::rcvTimeoutMs_>,
         getField<&Socket::rcvTimeoutMs_>},
        {SOL_SOCKET, SO_SNDTIMEO, Kind::Timeval, setField<&Socket::sndTimeoutMs_>,
         getField<&Socket::sndTimeoutMs_>},
        {SOL_SOCKET, SO_LINGER, Kind::Linger,
         [](Socket &s, const Value &v) {
             s.linger_ = v.l;
             return 0;
         },
         [](Socket &s) { return Value{.l = s.linger_}; }},
        {SOL_SOCKET, SO_KEEPALIVE, Kind::Int,
         setField<&Socket::keepalive_, INT_MIN, INT_MAX, &Socket::applyKeepaliveLocked>,
         getField<&Socket::keepalive_>},
        {SOL_SOCKET, SO_REUSEADDR, Kind::Int, setField<&Socket::reuseAddr_>,
         getField<&Socket::reuseAddr_>},
        {SOL_SOCKET, SO_REUSEPORT, Kind::Int, setField<&Socket::reusePort_>,
         getField<&Socket::reusePort_>},
        {SOL_SOCKET, SO_SNDBUF, Kind::Int, setSndBuf,
         [](Socket &s) {
             return Value{s.sndBufReq_ ? doubledBuf(s.sndBufReq_, true)
                                       : static_cast<int>(s.settings_.sendBuf * 2)};
         }},
        {SOL_SOCKET, SO_SNDBUFFORCE, Kind::Int, setSndBuf, nullptr},
        {SOL_SOCKET, SO_RCVBUF, Kind::Int, setRcvBuf,
         [](Socket &s) {
             return Value{s.rcvBufReq_ ? doubledBuf(s.rcvBufReq_, false)
                                       : static_cast<int>(s.settings_.recvBuf * 2)};
         }},
        {SOL_SOCKET, SO_RCVBUFFORCE, Kind::Int, setRcvBuf, nullptr},
        {SOL_SOCKET, SO_ERROR, Kind::Int, nullptr,
         [](Socket &s) {
             int e = -s.soError_;
             s.soError_ = 0;
             if (!e && s.conn_ && s.state_ == State::Connected && !s.errorReported_) {
                 int ce = s.conn_->info().error;
                 if (ce == -ECONNRESET || ce == -ETIMEDOUT) {
                     s.errorReported_ = true;
                     e = -ce;
                 }
             }
             return Value{e};
         }},
        {SOL_SOCKET, SO_TYPE, Kind::Int, nullptr, [](Socket &) { return Value{SOCK_STREAM}; }},
        {SOL_SOCKET, SO_DOMAIN, Kind::Int, nullptr, [](Socket &s) { return Value{s.family_}; }},
        {SOL_SOCKET, SO_PROTOCOL, Kind::Int, nullptr, [](Socket &) { return Value{IPPROTO_TCP}; }},
        {SOL_SOCKET, SO_ACCEPTCONN, Kind::Int, nullptr,
         [](Socket &s) { return Value{s.state_ == State::Listening}; }},
        {SOL_SOCKET, SO_RCVLOWAT, Kind::Kept, nullptr, [](Socket &) { return Value{1}; }},
        {SOL_SOCKET, SO_SNDLOWAT, Kind::Kept, nullptr, [](Socket &) { return Value{1}; }},
        {SOL_SOCKET, SO_PRIORITY, Kind::Kept},
        {SOL_SOCKET, SO_OOBINLINE, Kind::Kept},
        {SOL_SOCKET, SO_BROADCAST, Kind::Kept},
        {SOL_SOCKET, SO_DONTROUTE, Kind::Kept},
        {SOL_SOCKET, SO_MARK, Kind::Kept},
        {SOL_SOCKET, SO_BUSY_POLL, Kind::Kept},
        {SOL_SOCKET, SO_ZEROCOPY, Kind::Kept},

        {IPPROTO_TCP, TCP_NODELAY, Kind::Int, setField<&Socket::noDelay_>,
         getField<&Socket::noDelay_>},
        {IPPROTO_TCP, TCP_MAXSEG, Kind::Int,
         [](Socket &s, const Value &v) {
             if (v.i < 0 || v.i > 65535 || (v.i > 0 && v.i < 88))
                 return -EINVAL;
             s.maxSeg_ = v.i;
             return 0;
         },
         [](Socket &s) {
             // Capped by a set value, as Linux does.
             int mss = s.ringMss();
             return Value{s.maxSeg_ ? std::min(mss, s.maxSeg_) : mss};
         }},
        {IPPROTO_TCP, TCP_KEEPIDLE, Kind::Int,
         setField<&Socket::keepIdle_, 1, 32767, &Socket::applyKeepaliveLocked>,
         getField<&Socket::keepIdle_>},
        {IPPROTO_TCP, TCP_KEEPINTVL, Kind::Int,
         setField<&Socket::keepIntvl_, 1, 32767, &Socket::applyKeepaliveLocked>,
         getField<&Socket::keepIntvl_>},
        {IPPROTO_TCP, TCP_KEEPCNT, Kind::Int,
         setField<&Socket::keepCnt_, 1, 127, &Socket::applyKeepaliveLocked>,
         getField<&Socket::keepCnt_>},
        {IPPROTO_TCP, TCP_INFO, Kind::TcpInfo},
        {IPPROTO_TCP, TCP_CORK, Kind::Kept,
         [](Socket &s, const Value &v) {
             s.generic_[{IPPROTO_TCP, TCP_CORK}] = v.i != 0;
             s.applyCorkLocked();
             return 0;
         }},
        {IPPROTO_TCP, TCP_QUICKACK, Kind::Kept},
        {IPPROTO_TCP, TCP_USER_TIMEOUT, Kind::Kept,
         [](Socket &s, const Value &v) {
             if (v.i < 0)
                 return -EINVAL; // as Linux
             s.generic_[{IPPROTO_TCP, TCP_USER_TIMEOUT}] = v.i;
             s.applyUserTimeoutLocked();
             return 0;
         }},
        {IPPROTO_TCP, TCP_DEFER_ACCEPT, Kind::Kept},
        {IPPROTO_TCP, TCP_NOTSENT_LOWAT, Kind::Kept},
        {IPPROTO_TCP, TCP_FASTOPEN, Kind::Kept},
        {IPPROTO_TCP, TCP_WINDOW_CLAMP, Kind::Kept},
        {IPPROTO_TCP, TCP_LINGER2, Kind::Kept},
        {IPPROTO_TCP, TCP_SYNCNT, Kind::Kept},

        {IPPROTO_IP, IP_TOS, Kind::Kept},
        {IPPROTO_IP, IP_TTL, Kind::Kept},

        {IPPROTO_IPV6, IPV6_V6ONLY, Kind::Int,
         [](Socket &s, const Value &v) {
             if (!before(s) || s.boundLen_)
                 return -EINVAL;
             s.v6Only_ = v.i != 0;
             return 0;
         },
         getField<&Socket::v6Only_>},
        {IPPROTO_IPV6, IPV6_TCLASS, Kind::Kept},
        {IPPROTO_IPV6, IPV6_UNICAST_HOPS, Kind::Kept},

        {kSolRdma, kRdmaSqSize, Kind::Int, setTxSize, getTxSize},
        {kSolRdma, kTxSize, Kind::Int, setTxSize, getTxSize},
        {kSolRdma, kRdmaRqSize, Kind::Int, setRxSize, getRxSize},
        {kSolRdma, kRxSize, Kind::Int, setRxSize, getRxSize},
        {kSolRdma, kSendBuf, Kind::Int,
         [](Socket &s, const Value &v) { return setRing(s, true, v.i); },
         [](Socket &s) { return Value{static_cast<int>(s.settings_.sendBuf)}; }},
        {kSolRdma, kRecvBuf, Kind::Int,
         [](Socket &s, const Value &v) { return setRing(s, false, v.i); },
         [](Socket &s) { return Value{static_cast<int>(s.settings_.recvBuf)}; }},
        {kSolRdma, kRdmaInline, Kind::Int, setField<&Socket::inlineSize_, 0>,
         getField<&Socket::inlineSize_>},
        {kSolRdma, kRdmaIoMapSize, Kind::Int,
         [](Socket &s, const Value &v) {
             // The table of the peer's windows is sized when the endpoint is made.
             if (!before(s) || v.i < 0 || static_cast<uint32_t>(v.i) > wire::kMaxIoMaps)
                 return -EINVAL;
             s.settings_.ioMapSize = static_cast<uint32_t>(v.i);
             return 0;
         },
         [](Socket &s) { return Value{static_cast<int>(s.settings_.ioMapSize)}; }},
    };
    for (const Option &o : kOptions)
        if (o.level == level && o.name == name)
            return &o;
    return nullptr;
}

int Socket::setsockopt(int level, int name, const void *val, socklen_t len)
{
    std::lock_guard<std::mutex> lock(mutex_);
    int ret = checkLevel(level, false);
    if (ret < 0)
        return ret;
    const Option *o = findOption(level, name);
    Value v;
    switch (o ? o->kind : Kind::Int) {
    case Kind::Timeval:
        ret = timeoutFromTimeval(val, len, &v.i);
        break;
    case Kind::Linger:
        if (!val)
            return -EFAULT;
        if (len < sizeof(linger))
            return -EINVAL;
        std::memcpy(&v.l, val, sizeof(linger));
        break;
    default:
        // Unknown options too: Linux checks the int before the name.
        ret = getInt(val, len, &v.i);
        break;
    }
    if (ret < 0)
        return ret;
    if (o && o->kind == Kind::Kept && !o->set) {
        generic_[{level, name}] = v.i;
        return 0;
    }
    if (!o || !o->set)
        return -ENOPROTOOPT;
    return o->set(*this, v);
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
        int ret = checkLevel(level, true);
        if (ret < 0)
            return ret;
        const Option *o = findOption(level, name);
        if (!o)
            return -ENOPROTOOPT;
        switch (o->kind) {
        case Kind::TcpInfo:
            break; // below, outside the lock
        case Kind::Kept: {
            auto it = generic_.find({level, name});
            if (it != generic_.end())
                return getValue(it->second, val, len);
            if (o->get)
                return getValue(o->get(*this).i, val, len);
            int v = 0;
            ret = kernelDefault(family_, level, name, &v);
            return ret < 0 ? ret : getValue(v, val, len);
        }
        case Kind::Timeval:
        case Kind::Linger:
        case Kind::Int:
            if (!o->get)
                return -ENOPROTOOPT;
            Value v = o->get(*this);
            if (o->kind == Kind::Timeval)
                return getValue(timevalFromMs(v.i), val, len);
            if (o->kind == Kind::Linger)
                return getValue(v.l, val, len);
            return getValue(v.i, val, len);
        }
    }
    return tcpInfo(conn, val, len);
}

int Socket::tcpInfo(const std::shared_ptr<Connection> &conn, void *val, socklen_t *len)
{
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
    f.mss = static_cast<uint32_t>(ringMss());
    return fillTcpInfo(f, val, len);
}

int Socket::checkLevel(int level, bool get) const
{
    // Linux's TCP hands a level it does not know to IP, which refuses a set with ENOPROTOOPT and
    // a get with EOPNOTSUPP.
    const int unknown = get ? -EOPNOTSUPP : -ENOPROTOOPT;
    switch (level) {
    case SOL_SOCKET:
    case IPPROTO_TCP:
    case IPPROTO_IP:
    case kSolRdma:
        return 0;
    case IPPROTO_IPV6:
        return family_ == AF_INET6 ? 0 : unknown;
    default:
        return unknown;
    }
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

void Socket::applyKeepaliveLocked()
{
    if (conn_ && (keepalive_ || keepaliveApplied_)) {
        conn_->setKeepalive(keepalive_, keepIdle_, keepIntvl_, keepCnt_);
        keepaliveApplied_ = keepalive_;
    }
}

void Socket::applyCorkLocked()
{
    auto it = generic_.find({IPPROTO_TCP, TCP_CORK});
    if (conn_ && it != generic_.end())
        conn_->setCork(it->second != 0);
}

void Socket::applyUserTimeoutLocked()
{
    auto it = generic_.find({IPPROTO_TCP, TCP_USER_TIMEOUT});
    if (conn_ && it != generic_.end())
        conn_->setUserTimeout(static_cast<unsigned>(it->second));
}

void Socket::inheritOptionsLocked(Socket *s) const
{
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
    // As Linux clones the listener's socket, but for what it resets.
    s->generic_ = generic_;
    s->generic_.erase({SOL_SOCKET, SO_PRIORITY});
    s->generic_.erase({IPPROTO_TCP, TCP_QUICKACK});
}

} // namespace rstream
