// SPDX-License-Identifier: MIT
// Address text: one format for every log line, statistic and tool.

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <netinet/in.h>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "address.h"

using namespace rstream;

namespace {

sockaddr_storage v4(const char *host, int port)
{
    sockaddr_storage ss{};
    auto *a = reinterpret_cast<sockaddr_in *>(&ss);
    a->sin_family = AF_INET;
    a->sin_port = htons(uint16_t(port));
    inet_pton(AF_INET, host, &a->sin_addr);
    return ss;
}

sockaddr_storage v6(const char *host, int port)
{
    sockaddr_storage ss{};
    auto *a = reinterpret_cast<sockaddr_in6 *>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(uint16_t(port));
    inet_pton(AF_INET6, host, &a->sin6_addr);
    return ss;
}

const sockaddr *sa(const sockaddr_storage &ss)
{
    return reinterpret_cast<const sockaddr *>(&ss);
}

} // namespace

TEST(Address, FormatsIpv4WithPort)
{
    auto a = v4("192.0.2.5", 6379);
    EXPECT_EQ(addressText(sa(a)), "192.0.2.5:6379");
    EXPECT_EQ(hostText(sa(a)), "192.0.2.5");
    EXPECT_EQ(addressPort(sa(a)), 6379);
}

TEST(Address, BracketsIpv6Always)
{
    auto a = v6("::1", 80);
    EXPECT_EQ(addressText(sa(a)), "[::1]:80");
    EXPECT_EQ(hostText(sa(a)), "::1");
    auto m = v6("::ffff:127.0.0.1", 5201);
    EXPECT_EQ(addressText(sa(m)), "[::ffff:127.0.0.1]:5201");
}

TEST(Address, UnknownIsADash)
{
    EXPECT_EQ(addressText(nullptr), "-");
    sockaddr_storage un{};
    un.ss_family = AF_UNIX;
    EXPECT_EQ(addressText(sa(un)), "-");
    EXPECT_EQ(hostText(sa(un)), "");
    EXPECT_EQ(addressPort(sa(un)), 0);
}

TEST(Address, SetsThePortOfEitherFamilyAndNothingElse)
{
    auto a = v4("192.0.2.5", 0);
    setAddressPort(reinterpret_cast<sockaddr *>(&a), 40001);
    EXPECT_EQ(addressText(sa(a)), "192.0.2.5:40001");
    auto b = v6("2001:db8::7", 80);
    setAddressPort(reinterpret_cast<sockaddr *>(&b), 0);
    EXPECT_EQ(addressText(sa(b)), "[2001:db8::7]:0");
    sockaddr_storage un{};
    un.ss_family = AF_UNIX;
    const sockaddr_storage before = un;
    setAddressPort(reinterpret_cast<sockaddr *>(&un), 80);
    EXPECT_EQ(std::memcmp(&un, &before, sizeof(un)), 0);
    setAddressPort(nullptr, 80);
}

TEST(Address, FormatCutsToTheBufferWithoutOverrun)
{
    auto a = v6("2001:db8:1234:5678:9abc:def0:1234:5678", 65535);
    char buf[12];
    std::memset(buf, 'x', sizeof(buf));
    size_t n = formatAddress(sa(a), buf, 8);
    EXPECT_EQ(n, 7u);
    EXPECT_EQ(std::string(buf), "[2001:d");
    EXPECT_EQ(buf[8], 'x');
    EXPECT_EQ(formatAddress(sa(a), buf, 0), 0u);
}

// The text is inet_ntop's, for every pattern of zero groups (where "::" and the IPv4 forms
// apply) and for random addresses, with the port after it.
TEST(Address, HostTextIsInetNtops)
{
    std::mt19937 rng(7);
    auto check = [&](int family, const uint8_t *bytes, uint16_t port) {
        char want[INET6_ADDRSTRLEN];
        ASSERT_NE(inet_ntop(family, bytes, want, sizeof(want)), nullptr);
        sockaddr_storage ss{};
        if (family == AF_INET) {
            auto *a = reinterpret_cast<sockaddr_in *>(&ss);
            a->sin_family = AF_INET;
            a->sin_port = htons(port);
            std::memcpy(&a->sin_addr, bytes, 4);
            EXPECT_EQ(addressText(sa(ss)), std::string(want) + ":" + std::to_string(port));
        } else {
            auto *a = reinterpret_cast<sockaddr_in6 *>(&ss);
            a->sin6_family = AF_INET6;
            a->sin6_port = htons(port);
            std::memcpy(&a->sin6_addr, bytes, 16);
            EXPECT_EQ(addressText(sa(ss)), "[" + std::string(want) + "]:" + std::to_string(port));
        }
        EXPECT_EQ(hostText(sa(ss)), want);
    };
    const uint16_t special[] = {1, 2, 0xffff, 0xfffe, 0x10, 0x100, 0x1000, 0xabcd};
    uint8_t b[16];
    for (unsigned zeros = 0; zeros < 256; zeros++) {
        for (const uint16_t w : special) {
            for (int i = 0; i < 8; i++) {
                const uint16_t v = (zeros >> i & 1) ? 0 : (i % 2 ? w : uint16_t(rng()));
                b[2 * i] = uint8_t(v >> 8);
                b[2 * i + 1] = uint8_t(v);
            }
            check(AF_INET6, b, uint16_t(rng()));
        }
    }
    for (int k = 0; k < 20000; k++) {
        for (auto &x : b)
            x = uint8_t(rng() % 4 ? rng() : 0);
        check(AF_INET6, b, uint16_t(rng()));
        check(AF_INET, b, uint16_t(rng()));
    }
    const uint8_t edges[][4] = {
        {0, 0, 0, 0}, {255, 255, 255, 255}, {127, 0, 0, 1}, {10, 0, 9, 100}};
    for (const auto &e : edges) {
        check(AF_INET, e, 0);
        check(AF_INET, e, 65535);
    }
}
