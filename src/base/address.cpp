// SPDX-License-Identifier: MIT
// Socket addresses as text, for logs, statistics and tools.

#include "address.h"

#include <algorithm>
#include <arpa/inet.h>
#include <cstdint>
#include <cstring>
#include <netinet/in.h>

namespace rstream {

namespace {

// Formatting without stdio: the shim formats a connection's addresses at each connect and
// accept (its beacon's names, its fabric destination), and snprintf with inet_ntop (sprintf
// inside) cost about 1,900 instructions an address, a third of what the shim added to a short
// connection in user space. The text is inet_ntop's (address_test compares them).

char *putDecimal(char *p, unsigned v)
{
    char digits[10];
    int n = 0;
    do {
        digits[n++] = static_cast<char>('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *p++ = digits[--n];
    return p;
}

char *putIpv4(char *p, const uint8_t *b)
{
    for (int i = 0; i < 4; i++) {
        if (i)
            *p++ = '.';
        p = putDecimal(p, b[i]);
    }
    return p;
}

char *putHex(char *p, unsigned v)
{
    static const char kHex[] = "0123456789abcdef";
    bool started = false;
    for (int shift = 12; shift >= 0; shift -= 4) {
        const unsigned d = (v >> shift) & 0xf;
        if (d || started || shift == 0) {
            *p++ = kHex[d];
            started = true;
        }
    }
    return p;
}

// RFC 5952 as glibc's inet_ntop writes it: the first longest run of two or more zero groups
// becomes "::", and an IPv4-compatible or -mapped address ends in dotted decimal.
char *putIpv6(char *p, const uint8_t *b)
{
    unsigned words[8];
    for (int i = 0; i < 8; i++)
        words[i] = unsigned(b[2 * i]) << 8 | b[2 * i + 1];
    int bestBase = -1, bestLen = 0, curBase = -1, curLen = 0;
    for (int i = 0; i <= 8; i++) {
        if (i < 8 && words[i] == 0) {
            if (curBase < 0)
                curBase = i, curLen = 0;
            curLen++;
        } else if (curBase >= 0) {
            if (curLen > bestLen)
                bestBase = curBase, bestLen = curLen;
            curBase = -1;
        }
    }
    if (bestLen < 2)
        bestBase = -1;
    for (int i = 0; i < 8; i++) {
        if (bestBase >= 0 && i >= bestBase && i < bestBase + bestLen) {
            if (i == bestBase)
                *p++ = ':';
            continue;
        }
        if (i)
            *p++ = ':';
        if (i == 6 && bestBase == 0 && (bestLen == 6 || (bestLen == 5 && words[5] == 0xffff)))
            return putIpv4(p, b + 12);
        p = putHex(p, words[i]);
    }
    if (bestBase >= 0 && bestBase + bestLen == 8)
        *p++ = ':';
    return p;
}

// The host part into out (INET6_ADDRSTRLEN bytes, 2 more with brackets): its length, 0 for
// another family.
size_t putHost(const sockaddr *addr, char *out, bool brackets, int *port)
{
    char *p = out;
    if (addr && addr->sa_family == AF_INET) {
        sockaddr_in a;
        std::memcpy(&a, addr, sizeof(a));
        p = putIpv4(p, reinterpret_cast<const uint8_t *>(&a.sin_addr));
        *port = ntohs(a.sin_port);
    } else if (addr && addr->sa_family == AF_INET6) {
        sockaddr_in6 a;
        std::memcpy(&a, addr, sizeof(a));
        if (brackets)
            *p++ = '[';
        p = putIpv6(p, reinterpret_cast<const uint8_t *>(&a.sin6_addr));
        if (brackets)
            *p++ = ']';
        *port = ntohs(a.sin6_port);
    }
    return static_cast<size_t>(p - out);
}

} // namespace

size_t formatAddress(const sockaddr *addr, char *buf, size_t cap)
{
    if (cap == 0)
        return 0;
    char text[INET6_ADDRSTRLEN + 16];
    int port = 0;
    size_t n = putHost(addr, text, true, &port);
    if (n) {
        text[n++] = ':';
        n = static_cast<size_t>(putDecimal(text + n, static_cast<unsigned>(port)) - text);
    } else {
        text[n++] = '-';
    }
    n = std::min(n, cap - 1);
    std::memcpy(buf, text, n);
    buf[n] = 0;
    return n;
}

std::string addressText(const sockaddr *addr)
{
    char buf[INET6_ADDRSTRLEN + 16];
    size_t n = formatAddress(addr, buf, sizeof(buf));
    return std::string(buf, n);
}

std::string hostText(const sockaddr *addr)
{
    char host[INET6_ADDRSTRLEN];
    int port = 0;
    return std::string(host, putHost(addr, host, false, &port));
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

void setAddressPort(sockaddr *addr, int port)
{
    const uint16_t p = htons(static_cast<uint16_t>(port));
    if (addr && addr->sa_family == AF_INET)
        std::memcpy(reinterpret_cast<char *>(addr) + offsetof(sockaddr_in, sin_port), &p, 2);
    else if (addr && addr->sa_family == AF_INET6)
        std::memcpy(reinterpret_cast<char *>(addr) + offsetof(sockaddr_in6, sin6_port), &p, 2);
}

} // namespace rstream
