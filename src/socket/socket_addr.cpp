// SPDX-License-Identifier: MIT
// Socket addresses: bind's probe, argument checks, family mapping, getsockname and getpeername.

#include "kernel.h"
#include "socket.h"
#include "socket_internal.h"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <unistd.h>

namespace rstream {

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

int probeBind(int family, bool v6Only, bool reuseAddr, const sockaddr *addr, socklen_t len,
              sockaddr_storage *bound, socklen_t *boundLen)
{
    int fd = sys::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return fd;
    int reuse = reuseAddr ? 1 : 0;
    sys::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &reuse, sizeof(reuse));
    if (family == AF_INET6) {
        int v = v6Only ? 1 : 0;
        sys::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v, sizeof(v));
    }
    int ret = sys::bind(fd, addr, len);
    if (ret == 0) {
        *boundLen = sizeof(*bound);
        ret = sys::getsockname(fd, reinterpret_cast<sockaddr *>(bound), boundLen);
    }
    if (ret < 0) {
        sys::close(fd);
        return ret;
    }
    return fd;
}

int checkAddress(int family, const sockaddr *addr, socklen_t len)
{
    if (len > sizeof(sockaddr_storage))
        return -EINVAL;
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

} // namespace rstream
