// SPDX-License-Identifier: MIT
// Socket address helpers the shim's configuration and sockets share (IPv4 and IPv6 only).
#pragma once

#include <arpa/inet.h>
#include <cstdint>
#include <cstring>
#include <netinet/in.h>
#include <string>
#include <sys/socket.h>

#include "address.h"

namespace rstream::shim {

inline void setPort(sockaddr_storage *ss, int port)
{
    if (ss->ss_family == AF_INET)
        reinterpret_cast<sockaddr_in *>(ss)->sin_port = htons(static_cast<uint16_t>(port));
    else if (ss->ss_family == AF_INET6)
        reinterpret_cast<sockaddr_in6 *>(ss)->sin6_port = htons(static_cast<uint16_t>(port));
}

// An address that names one host and port (not 0.0.0.0, ::, ::ffff:0.0.0.0 or port 0): what a
// socket bound or connected to it reports as its own or its peer's.
inline bool specificAddress(const sockaddr *addr, socklen_t len)
{
    if (addr->sa_family == AF_INET && len >= sizeof(sockaddr_in)) {
        auto *in = reinterpret_cast<const sockaddr_in *>(addr);
        return in->sin_addr.s_addr != htonl(INADDR_ANY) && in->sin_port != 0;
    }
    if (addr->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
        auto *in6 = reinterpret_cast<const sockaddr_in6 *>(addr);
        static const uint8_t mappedAny[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0};
        return !IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr) &&
               std::memcmp(&in6->sin6_addr, mappedAny, 16) != 0 && in6->sin6_port != 0;
    }
    return false;
}

// The address bytes of an IPv4 or IPv6 address (v4-mapped addresses as IPv4).
inline int addressBytes(const sockaddr *addr, uint8_t out[16])
{
    std::memset(out, 0, 16);
    if (addr->sa_family == AF_INET) {
        std::memcpy(out, &reinterpret_cast<const sockaddr_in *>(addr)->sin_addr, 4);
        return AF_INET;
    }
    auto *in6 = reinterpret_cast<const sockaddr_in6 *>(addr);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
        std::memcpy(out, &in6->sin6_addr.s6_addr[12], 4);
        return AF_INET;
    }
    std::memcpy(out, &in6->sin6_addr, 16);
    return AF_INET6;
}

// The destination as text, v4-mapped addresses as IPv4 (one negative-cache key either way).
inline std::string describe(const sockaddr *addr)
{
    sockaddr_storage ss{};
    uint8_t bytes[16];
    if (addressBytes(addr, bytes) == AF_INET) {
        auto *in = reinterpret_cast<sockaddr_in *>(&ss);
        in->sin_family = AF_INET;
        std::memcpy(&in->sin_addr, bytes, 4);
    } else {
        auto *in6 = reinterpret_cast<sockaddr_in6 *>(&ss);
        in6->sin6_family = AF_INET6;
        std::memcpy(&in6->sin6_addr, bytes, 16);
    }
    setPort(&ss, addressPort(addr));
    return addressText(reinterpret_cast<const sockaddr *>(&ss));
}

} // namespace rstream::shim
