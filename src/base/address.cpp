// SPDX-License-Identifier: MIT
// Socket addresses as text: formatting for logs, statistics and tools, parsing for settings.

#include "address.h"

#include <arpa/inet.h>
#include <cerrno>
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

namespace {

// Digits only, 0..65535.
int parsePort(const char *s)
{
    if (!*s || std::strlen(s) > 5)
        return -1;
    int v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        v = v * 10 + (*s - '0');
    }
    return v <= 65535 ? v : -1;
}

} // namespace

int parseAddress(const char *text, int defaultPort, sockaddr_storage *out, socklen_t *len)
{
    if (!text || !out || !len)
        return -EINVAL;
    char host[INET6_ADDRSTRLEN + 2];
    const char *portText = nullptr;
    if (text[0] == '[') {
        const char *close = std::strchr(text, ']');
        if (!close || size_t(close - text - 1) >= sizeof(host))
            return -EINVAL;
        std::memcpy(host, text + 1, close - text - 1);
        host[close - text - 1] = '\0';
        if (close[1] == ':')
            portText = close + 2;
        else if (close[1] != '\0')
            return -EINVAL;
    } else {
        const char *colon = std::strchr(text, ':');
        // More than one colon without brackets: a bare IPv6 address.
        if (colon && !std::strchr(colon + 1, ':')) {
            if (size_t(colon - text) >= sizeof(host))
                return -EINVAL;
            std::memcpy(host, text, colon - text);
            host[colon - text] = '\0';
            portText = colon + 1;
        } else {
            if (std::strlen(text) >= sizeof(host))
                return -EINVAL;
            std::strcpy(host, text);
        }
    }
    int port = defaultPort;
    if (portText && (port = parsePort(portText)) < 0)
        return -EINVAL;
    if (port < 0 || port > 65535)
        return -EINVAL;
    *out = {};
    auto *in = reinterpret_cast<sockaddr_in *>(out);
    auto *in6 = reinterpret_cast<sockaddr_in6 *>(out);
    if (text[0] != '[' && inet_pton(AF_INET, host, &in->sin_addr) == 1) {
        in->sin_family = AF_INET;
        in->sin_port = htons(uint16_t(port));
        *len = sizeof(sockaddr_in);
        return 0;
    }
    if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons(uint16_t(port));
        *len = sizeof(sockaddr_in6);
        return 0;
    }
    return -EINVAL;
}

} // namespace rstream
