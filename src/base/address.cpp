// SPDX-License-Identifier: MIT
// Socket addresses as text, for logs, statistics and tools.

#include "address.h"

#include <arpa/inet.h>
#include <cstdio>
#include <cstring>
#include <netinet/in.h>

namespace rstream {

size_t formatAddress(const sockaddr *addr, char *buf, size_t cap)
{
    if (cap == 0)
        return 0;
    char host[INET6_ADDRSTRLEN] = "?";
    int n;
    if (addr && addr->sa_family == AF_INET) {
        sockaddr_in a;
        std::memcpy(&a, addr, sizeof(a));
        inet_ntop(AF_INET, &a.sin_addr, host, sizeof(host));
        n = std::snprintf(buf, cap, "%s:%u", host, unsigned(ntohs(a.sin_port)));
    } else if (addr && addr->sa_family == AF_INET6) {
        sockaddr_in6 a;
        std::memcpy(&a, addr, sizeof(a));
        inet_ntop(AF_INET6, &a.sin6_addr, host, sizeof(host));
        n = std::snprintf(buf, cap, "[%s]:%u", host, unsigned(ntohs(a.sin6_port)));
    } else {
        n = std::snprintf(buf, cap, "-");
    }
    if (n < 0)
        return 0;
    return size_t(n) < cap ? size_t(n) : cap - 1;
}

std::string addressText(const sockaddr *addr)
{
    char buf[INET6_ADDRSTRLEN + 16];
    size_t n = formatAddress(addr, buf, sizeof(buf));
    return std::string(buf, n);
}

std::string hostText(const sockaddr *addr)
{
    char host[INET6_ADDRSTRLEN] = "";
    if (addr && addr->sa_family == AF_INET) {
        sockaddr_in a;
        std::memcpy(&a, addr, sizeof(a));
        inet_ntop(AF_INET, &a.sin_addr, host, sizeof(host));
    } else if (addr && addr->sa_family == AF_INET6) {
        sockaddr_in6 a;
        std::memcpy(&a, addr, sizeof(a));
        inet_ntop(AF_INET6, &a.sin6_addr, host, sizeof(host));
    }
    return host;
}

int addressPort(const sockaddr *addr)
{
    if (addr && addr->sa_family == AF_INET) {
        sockaddr_in a;
        std::memcpy(&a, addr, sizeof(a));
        return ntohs(a.sin_port);
    }
    if (addr && addr->sa_family == AF_INET6) {
        sockaddr_in6 a;
        std::memcpy(&a, addr, sizeof(a));
        return ntohs(a.sin6_port);
    }
    return 0;
}

} // namespace rstream
