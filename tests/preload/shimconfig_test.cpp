// SPDX-License-Identifier: MIT
// ShimConfig's parsing of the environment and its decisions per port and address, and the
// negative cache: what the shim decides before it touches the fabric.

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <chrono>
#include <map>
#include <string>
#include <thread>

#include "shimconfig.h"

using rstream::shim::NegativeCache;
using rstream::shim::ShimConfig;

namespace {

ShimConfig parse(std::map<std::string, std::string> env, int defaultOffset = 20000)
{
    auto lookup = [&env](const char *name) -> const char * {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
    };
    return ShimConfig::parse(lookup, defaultOffset, 1234);
}

sockaddr_storage v4(const char *addr, int port)
{
    sockaddr_storage ss{};
    auto *in = reinterpret_cast<sockaddr_in *>(&ss);
    in->sin_family = AF_INET;
    in->sin_port = htons(static_cast<uint16_t>(port));
    EXPECT_EQ(inet_pton(AF_INET, addr, &in->sin_addr), 1) << addr;
    return ss;
}

sockaddr_storage v6(const char *addr, int port)
{
    sockaddr_storage ss{};
    auto *in6 = reinterpret_cast<sockaddr_in6 *>(&ss);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(port));
    EXPECT_EQ(inet_pton(AF_INET6, addr, &in6->sin6_addr), 1) << addr;
    return ss;
}

bool excluded(const ShimConfig &c, const sockaddr_storage &ss)
{
    return c.excluded(reinterpret_cast<const sockaddr *>(&ss));
}

} // namespace

TEST(ShimConfig, Defaults)
{
    ShimConfig c = parse({});
    EXPECT_TRUE(c.enabled);
    EXPECT_EQ(c.portOffset, 20000);
    EXPECT_EQ(c.connectTimeoutMs, 1234);
    EXPECT_EQ(c.negativeCacheMs, 30000);
    EXPECT_TRUE(c.ports.empty());
    EXPECT_TRUE(c.exclude.empty());
    // The provider's default offset (verbs: 0) applies when RSTREAM_PORT_OFFSET is unset.
    EXPECT_EQ(parse({}, 0).portOffset, 0);
}

TEST(ShimConfig, Numbers)
{
    ShimConfig c = parse({{"RSTREAM_ENABLE", "0"},
                          {"RSTREAM_PORT_OFFSET", "100"},
                          {"RSTREAM_NEGATIVE_CACHE_MS", "0"}});
    EXPECT_FALSE(c.enabled);
    EXPECT_EQ(c.portOffset, 100);
    EXPECT_EQ(c.negativeCacheMs, 0);
    // Out of range or not a number: the default, not a partial parse.
    c = parse({{"RSTREAM_ENABLE", "2"},
               {"RSTREAM_PORT_OFFSET", "65536"},
               {"RSTREAM_NEGATIVE_CACHE_MS", "12abc"}});
    EXPECT_TRUE(c.enabled);
    EXPECT_EQ(c.portOffset, 20000);
    EXPECT_EQ(c.negativeCacheMs, 30000);
    c = parse({{"RSTREAM_PORT_OFFSET", "-1"}, {"RSTREAM_NEGATIVE_CACHE_MS", ""}});
    EXPECT_EQ(c.portOffset, 20000);
    EXPECT_EQ(c.negativeCacheMs, 30000);
}

TEST(ShimConfig, PortsListsAndRanges)
{
    ShimConfig c = parse({{"RSTREAM_PORTS", "5201,6379,7000-7100"}});
    ASSERT_EQ(c.ports.size(), 3u);
    EXPECT_EQ(c.ports[0], std::make_pair(5201, 5201));
    EXPECT_EQ(c.ports[1], std::make_pair(6379, 6379));
    EXPECT_EQ(c.ports[2], std::make_pair(7000, 7100));
    EXPECT_TRUE(c.portAllowed(5201));
    EXPECT_TRUE(c.portAllowed(6379));
    EXPECT_TRUE(c.portAllowed(7000));
    EXPECT_TRUE(c.portAllowed(7050));
    EXPECT_TRUE(c.portAllowed(7100));
    EXPECT_FALSE(c.portAllowed(5200));
    EXPECT_FALSE(c.portAllowed(6999));
    EXPECT_FALSE(c.portAllowed(7101));
    EXPECT_FALSE(c.portAllowed(80));
}

TEST(ShimConfig, PortsGarbageIsIgnored)
{
    // Items that do not start with a number are dropped; the others still count.
    ShimConfig c = parse({{"RSTREAM_PORTS", "abc,,80,x-y"}});
    ASSERT_EQ(c.ports.size(), 1u);
    EXPECT_EQ(c.ports[0], std::make_pair(80, 80));
    EXPECT_TRUE(c.portAllowed(80));
    EXPECT_FALSE(c.portAllowed(81));
    // Nothing usable: an empty list, which allows every port.
    c = parse({{"RSTREAM_PORTS", "nope"}});
    EXPECT_TRUE(c.ports.empty());
    EXPECT_TRUE(c.portAllowed(12345));
}

TEST(ShimConfig, FabricPortOffsetAndWrap)
{
    ShimConfig c = parse({});
    EXPECT_EQ(c.fabricPort(5201), 25201);
    EXPECT_EQ(c.fabricPort(45535), 65535);
    // Above 65535 the port wraps to 1024 and up, past the privileged ports.
    EXPECT_EQ(c.fabricPort(45536), 1024);
    EXPECT_EQ(c.fabricPort(45537), 1025);
    EXPECT_EQ(c.fabricPort(65535), 65535 + 20000 - 65536 + 1024);
    // No port, or none there is.
    EXPECT_EQ(c.fabricPort(0), 0);
    EXPECT_EQ(c.fabricPort(-1), 0);
    EXPECT_EQ(c.fabricPort(65536), 0);
    // Offset 0 (verbs: a port space of its own): the application's port.
    EXPECT_EQ(parse({{"RSTREAM_PORT_OFFSET", "0"}}).fabricPort(5201), 5201);
    // An offset that wraps a port onto itself gives no fabric port rather than a clash.
    ShimConfig w = parse({{"RSTREAM_PORT_OFFSET", "64512"}});
    EXPECT_EQ(w.fabricPort(5000), 0);
    EXPECT_EQ(w.fabricPort(1000), 65512);
}

TEST(ShimConfig, ExcludeV4Cidr)
{
    ShimConfig c = parse({{"RSTREAM_EXCLUDE", "10.0.0.0/8,192.168.1.0/25"}});
    ASSERT_EQ(c.exclude.size(), 2u);
    EXPECT_TRUE(excluded(c, v4("10.1.2.3", 80)));
    EXPECT_TRUE(excluded(c, v4("10.255.255.255", 1)));
    EXPECT_FALSE(excluded(c, v4("11.0.0.1", 80)));
    EXPECT_TRUE(excluded(c, v4("192.168.1.127", 80)));
    EXPECT_FALSE(excluded(c, v4("192.168.1.128", 80))); // a prefix that is not whole bytes
    EXPECT_FALSE(excluded(c, v4("192.168.2.1", 80)));
    // A v4-mapped IPv6 address is the IPv4 one.
    EXPECT_TRUE(excluded(c, v6("::ffff:10.9.9.9", 80)));
    EXPECT_FALSE(excluded(c, v6("::ffff:11.9.9.9", 80)));
}

TEST(ShimConfig, ExcludeV6Cidr)
{
    ShimConfig c = parse({{"RSTREAM_EXCLUDE", "fd00::/8,2001:db8::/33"}});
    ASSERT_EQ(c.exclude.size(), 2u);
    EXPECT_TRUE(excluded(c, v6("fd12:3456::1", 443)));
    EXPECT_FALSE(excluded(c, v6("fe80::1", 443)));
    EXPECT_TRUE(excluded(c, v6("2001:db8:7fff::1", 443)));
    EXPECT_FALSE(excluded(c, v6("2001:db8:8000::1", 443)));
    // Families do not mix.
    EXPECT_FALSE(excluded(c, v4("10.0.0.1", 443)));
}

TEST(ShimConfig, ExcludeBareAddresses)
{
    ShimConfig c = parse({{"RSTREAM_EXCLUDE", "192.168.1.5,::1"}});
    ASSERT_EQ(c.exclude.size(), 2u);
    EXPECT_EQ(c.exclude[0].prefix, 32);
    EXPECT_EQ(c.exclude[1].prefix, 128);
    EXPECT_TRUE(excluded(c, v4("192.168.1.5", 1)));
    EXPECT_FALSE(excluded(c, v4("192.168.1.6", 1)));
    EXPECT_TRUE(excluded(c, v6("::1", 2)));
    EXPECT_FALSE(excluded(c, v6("::2", 2)));
}

TEST(ShimConfig, ExcludePorts)
{
    ShimConfig c = parse(
        {{"RSTREAM_EXCLUDE", ":22,127.0.0.1:6379,[::1]:8080,[fd00::/8]:53,172.16.0.0/12:443"}});
    ASSERT_EQ(c.exclude.size(), 5u);
    // ":port": any address on that port.
    EXPECT_TRUE(excluded(c, v4("8.8.8.8", 22)));
    EXPECT_TRUE(excluded(c, v6("2001:db8::1", 22)));
    EXPECT_FALSE(excluded(c, v4("8.8.8.8", 23)));
    EXPECT_TRUE(excluded(c, v4("127.0.0.1", 6379)));
    EXPECT_FALSE(excluded(c, v4("127.0.0.1", 6380)));
    EXPECT_FALSE(excluded(c, v4("127.0.0.2", 6379)));
    EXPECT_TRUE(excluded(c, v6("::1", 8080)));
    EXPECT_FALSE(excluded(c, v6("::1", 8081)));
    EXPECT_TRUE(excluded(c, v6("fd99::1", 53)));
    EXPECT_FALSE(excluded(c, v6("fd99::1", 54)));
    EXPECT_TRUE(excluded(c, v4("172.31.0.1", 443)));
    EXPECT_FALSE(excluded(c, v4("172.32.0.1", 443)));
    EXPECT_FALSE(excluded(c, v4("172.16.0.1", 80)));
}

TEST(ShimConfig, ExcludeGarbageIsIgnored)
{
    // Each bad item goes alone: a bad port never becomes "any port", a bad prefix never "the
    // whole family"; the good item at the end still counts.
    ShimConfig c =
        parse({{"RSTREAM_EXCLUDE", "10.0.0.0/33,10.0.0.0/x,::/129,1.2.3.4:0,"
                                   "1.2.3.4:65536,1.2.3.4:http,[::1,[::1]x,[fd00::]/8:53,::1/,"
                                   "host.example,/8,:,1.2.3.4/,5.6.7.8"}});
    ASSERT_EQ(c.exclude.size(), 1u);
    EXPECT_TRUE(excluded(c, v4("5.6.7.8", 1)));
    EXPECT_FALSE(excluded(c, v4("10.0.0.1", 1)));
    EXPECT_FALSE(excluded(c, v4("1.2.3.4", 80)));
    EXPECT_FALSE(excluded(c, v6("::1", 80)));
}

TEST(ShimConfig, ExcludeEmpty)
{
    ShimConfig c = parse({{"RSTREAM_EXCLUDE", ",,"}});
    EXPECT_TRUE(c.exclude.empty());
    EXPECT_FALSE(excluded(c, v4("127.0.0.1", 80)));
}

TEST(NegativeCache, SkipsForTheTtlThenTriesAgain)
{
    NegativeCache cache;
    EXPECT_FALSE(cache.has("10.0.0.1:25201"));
    cache.add("10.0.0.1:25201", 200);
    EXPECT_TRUE(cache.has("10.0.0.1:25201"));
    EXPECT_FALSE(cache.has("10.0.0.2:25201")); // per destination
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    EXPECT_FALSE(cache.has("10.0.0.1:25201"));
    EXPECT_EQ(cache.size(), 0u); // the expired entry went when looked up
    // A new failure caches it again.
    cache.add("10.0.0.1:25201", 10000);
    EXPECT_TRUE(cache.has("10.0.0.1:25201"));
}

TEST(NegativeCache, ZeroNeverCaches)
{
    NegativeCache cache;
    cache.add("10.0.0.1:25201", 0);
    EXPECT_FALSE(cache.has("10.0.0.1:25201"));
    cache.add("10.0.0.1:25201", -5);
    EXPECT_FALSE(cache.has("10.0.0.1:25201"));
    EXPECT_EQ(cache.size(), 0u);
}

TEST(NegativeCache, ExpiredEntriesAreSwept)
{
    NegativeCache cache;
    for (int i = 0; i < 63; i++)
        cache.add("short" + std::to_string(i), 1);
    EXPECT_EQ(cache.size(), 63u);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    // The 64th entry reaches the sweep threshold: the 63 expired ones go without a look-up.
    cache.add("long", 10000);
    EXPECT_EQ(cache.size(), 1u);
    EXPECT_TRUE(cache.has("long"));
}
