// SPDX-License-Identifier: MIT
// Address text: one format for every log line, statistic and tool, and its parser.

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <netinet/in.h>

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

TEST(Address, ParsesWhatItFormats)
{
    for (auto ss : {v4("10.1.2.3", 1), v4("0.0.0.0", 65535), v6("::1", 22), v6("fe80::1", 0)}) {
        sockaddr_storage out;
        socklen_t len = 0;
        std::string text = addressText(sa(ss));
        ASSERT_EQ(parseAddress(text.c_str(), 9, &out, &len), 0) << text;
        EXPECT_EQ(addressText(sa(out)), text);
        EXPECT_EQ(len, ss.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    }
}

TEST(Address, BareHostsTakeTheDefaultPort)
{
    sockaddr_storage out;
    socklen_t len;
    ASSERT_EQ(parseAddress("127.0.0.1", 5201, &out, &len), 0);
    EXPECT_EQ(addressText(sa(out)), "127.0.0.1:5201");
    ASSERT_EQ(parseAddress("::1", 5201, &out, &len), 0);
    EXPECT_EQ(addressText(sa(out)), "[::1]:5201");
    ASSERT_EQ(parseAddress("[::1]", 7, &out, &len), 0);
    EXPECT_EQ(addressText(sa(out)), "[::1]:7");
}

TEST(Address, RejectsWhatIsNotAnAddress)
{
    sockaddr_storage out;
    socklen_t len;
    for (const char *bad :
         {"", "localhost", "1.2.3.4:", "1.2.3.4:65536", "1.2.3.4:-1", "1.2.3.4:80x", "[::1",
          "[::1]x", "[::1]:", "[1.2.3.4]:80", "1.2.3.4.5", "[::1]:123456", "::1]:80"})
        EXPECT_EQ(parseAddress(bad, 80, &out, &len), -EINVAL) << bad;
    EXPECT_EQ(parseAddress("1.2.3.4", -1, &out, &len), -EINVAL);
    EXPECT_EQ(parseAddress(nullptr, 80, &out, &len), -EINVAL);
}
