// SPDX-License-Identifier: MIT
// Unit tests of settings: size parsing, setter validation and the RSTREAM_* environment.

#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include <gtest/gtest.h>

#include "settings.h"

using namespace rstream;

namespace {

constexpr uint64_t kUnset = 0xdeadbeefcafef00dull;

// Parses text, returning the error and leaving *value untouched on failure.
int parse(const char *text, uint64_t *value)
{
    *value = kUnset;
    return parseSize(text, value);
}

} // namespace

TEST(ParseSize, PlainDecimal)
{
    uint64_t v;
    EXPECT_EQ(parse("0", &v), 0);
    EXPECT_EQ(v, 0u);
    EXPECT_EQ(parse("1", &v), 0);
    EXPECT_EQ(v, 1u);
    EXPECT_EQ(parse("65536", &v), 0);
    EXPECT_EQ(v, 65536u);
    EXPECT_EQ(parse("18446744073709551615", &v), 0);
    EXPECT_EQ(v, UINT64_MAX);
}

TEST(ParseSize, Hex)
{
    uint64_t v;
    EXPECT_EQ(parse("0x10", &v), 0);
    EXPECT_EQ(v, 16u);
    EXPECT_EQ(parse("0X1000", &v), 0);
    EXPECT_EQ(v, 4096u);
    EXPECT_EQ(parse("0xffffffffffffffff", &v), 0);
    EXPECT_EQ(v, UINT64_MAX);
    EXPECT_EQ(parse("0x10k", &v), 0);
    EXPECT_EQ(v, 16u * 1024);
}

TEST(ParseSize, Suffixes)
{
    uint64_t v;
    EXPECT_EQ(parse("1k", &v), 0);
    EXPECT_EQ(v, 1024u);
    EXPECT_EQ(parse("64K", &v), 0);
    EXPECT_EQ(v, 64u * 1024);
    EXPECT_EQ(parse("1m", &v), 0);
    EXPECT_EQ(v, 1u << 20);
    EXPECT_EQ(parse("256M", &v), 0);
    EXPECT_EQ(v, 256u << 20);
    EXPECT_EQ(parse("1g", &v), 0);
    EXPECT_EQ(v, uint64_t(1) << 30);
    EXPECT_EQ(parse("3G", &v), 0);
    EXPECT_EQ(v, uint64_t(3) << 30);
    EXPECT_EQ(parse("0k", &v), 0);
    EXPECT_EQ(v, 0u);
}

TEST(ParseSize, RejectsGarbage)
{
    uint64_t v;
    for (const char *text : {"", "k", "abc", "x", "0x", "1kb", "1kk", "1 k", "1.5k", "1t", "12abc",
                             "1e3", "--1", "k1", "1\n", "0xg"}) {
        EXPECT_EQ(parse(text, &v), -EINVAL) << "\"" << text << "\"";
        EXPECT_EQ(v, kUnset) << "\"" << text << "\"";
    }
    EXPECT_EQ(parseSize(nullptr, &v), -EINVAL);
}

TEST(ParseSize, RejectsNegative)
{
    uint64_t v;
    for (const char *text : {"-1", "-0", "-1k", "-18446744073709551615", "-0x10"}) {
        EXPECT_EQ(parse(text, &v), -EINVAL) << "\"" << text << "\"";
        EXPECT_EQ(v, kUnset) << "\"" << text << "\"";
    }
}

TEST(ParseSize, RejectsNegativeAfterWhitespace)
{
    // strtoull skips leading blanks and then negates: " -1" must not become 2^64 - 1.
    uint64_t v;
    for (const char *text : {" -1", "\t-4096", " -1k"}) {
        EXPECT_EQ(parse(text, &v), -EINVAL) << "\"" << text << "\" parsed as " << v;
    }
}

TEST(ParseSize, RejectsOverflow)
{
    uint64_t v;
    EXPECT_EQ(parse("18446744073709551616", &v), -EINVAL);
    EXPECT_EQ(parse("99999999999999999999999", &v), -EINVAL);
    EXPECT_EQ(parse("0x10000000000000000", &v), -EINVAL);
    // The suffix overflows: 2^54 k, 2^44 m, 2^34 g are all 2^64.
    EXPECT_EQ(parse("18014398509481984k", &v), -EINVAL);
    EXPECT_EQ(parse("17592186044416m", &v), -EINVAL);
    EXPECT_EQ(parse("17179869184g", &v), -EINVAL);
    EXPECT_EQ(parse("18446744073709551615k", &v), -EINVAL);
    EXPECT_EQ(v, kUnset);
    // One less still fits.
    EXPECT_EQ(parse("18014398509481983k", &v), 0);
    EXPECT_EQ(v, UINT64_MAX - 1023);
    EXPECT_EQ(parse("17179869183g", &v), 0);
    EXPECT_EQ(v, (uint64_t(17179869183) << 30));
}

TEST(Settings, Defaults)
{
    Settings s;
    EXPECT_GE(s.sendBuf, Settings::kMinBuf);
    EXPECT_LE(s.sendBuf, Settings::kMaxBuf);
    EXPECT_GE(s.recvBuf, Settings::kMinBuf);
    EXPECT_LE(s.recvBuf, Settings::kMaxBuf);
    EXPECT_GE(s.txSize, Settings::kMinQueue);
    EXPECT_LE(s.txSize, Settings::kMaxQueue);
    EXPECT_GE(s.rxSize, Settings::kMinQueue);
    EXPECT_LE(s.rxSize, Settings::kMaxQueue);
    EXPECT_GT(s.connectTimeoutMs, 0);
}

// fromEnv keeps a Settings field's own default for a variable unset or invalid: the registry's
// table (README, man page) must say the same.
TEST(Settings, DefaultsAreTheRegistrys)
{
    const Settings s;
    auto def = [](const char *name) {
        const config::ConfigVar *v = config::find(name);
        EXPECT_NE(v, nullptr) << name;
        return v ? config::defaultValue(*v) : -1;
    };
    EXPECT_EQ(def("RSTREAM_SEND_BUF"), int64_t(s.sendBuf));
    EXPECT_EQ(def("RSTREAM_RECV_BUF"), int64_t(s.recvBuf));
    EXPECT_EQ(def("RSTREAM_SEND_BUF_MAX"), int64_t(s.sendBufMax));
    EXPECT_EQ(def("RSTREAM_RECV_BUF_MAX"), int64_t(s.recvBufMax));
    EXPECT_EQ(def("RSTREAM_TX_SIZE"), int64_t(s.txSize));
    EXPECT_EQ(def("RSTREAM_RX_SIZE"), int64_t(s.rxSize));
    EXPECT_EQ(def("RSTREAM_POLL_US"), int64_t(s.pollUs));
    EXPECT_EQ(def("RSTREAM_CONNECT_TIMEOUT_MS"), int64_t(s.connectTimeoutMs));
    EXPECT_EQ(def("RSTREAM_IWARP"), int64_t(s.iwarp));
    EXPECT_EQ(def("RSTREAM_STRICT"), int64_t(s.strict));
    EXPECT_TRUE(s.provider.empty());
    EXPECT_EQ(*config::find("RSTREAM_PROVIDER")->defaultText, '\0');
}

TEST(Settings, BufferSettersCheckTheRange)
{
    using Setter = int (Settings::*)(size_t);
    struct Case
    {
        Setter set;
        size_t Settings::*field;
    };
    for (Case c : {Case{&Settings::setSendBuf, &Settings::sendBuf},
                   Case{&Settings::setRecvBuf, &Settings::recvBuf}}) {
        Settings s;
        const size_t initial = s.*c.field;
        for (size_t bad : {size_t(0), size_t(1), Settings::kMinBuf - 1, Settings::kMaxBuf + 1,
                           size_t(1) << 40, SIZE_MAX}) {
            EXPECT_EQ((s.*c.set)(bad), -EINVAL) << bad;
            EXPECT_EQ(s.*c.field, initial) << bad;
        }
        for (size_t good : {Settings::kMinBuf, Settings::kMinBuf + 1, size_t(65537),
                            Settings::kMaxBuf - 1, Settings::kMaxBuf}) {
            EXPECT_EQ((s.*c.set)(good), 0) << good;
            EXPECT_EQ(s.*c.field, good);
        }
        // A rejected value keeps the last accepted one, not the default.
        EXPECT_EQ((s.*c.set)(Settings::kMaxBuf * 2), -EINVAL);
        EXPECT_EQ(s.*c.field, Settings::kMaxBuf);
    }
}

TEST(Settings, QueueSettersCheckTheRange)
{
    using Setter = int (Settings::*)(uint64_t);
    struct Case
    {
        Setter set;
        uint32_t Settings::*field;
    };
    for (Case c : {Case{&Settings::setTxSize, &Settings::txSize},
                   Case{&Settings::setRxSize, &Settings::rxSize}}) {
        Settings s;
        const uint32_t initial = s.*c.field;
        for (uint64_t bad :
             {uint64_t(0), uint64_t(Settings::kMinQueue) - 1, uint64_t(Settings::kMaxQueue) + 1,
              uint64_t(1) << 32, (uint64_t(1) << 32) + Settings::kMinQueue, UINT64_MAX}) {
            EXPECT_EQ((s.*c.set)(bad), -EINVAL) << bad;
            EXPECT_EQ(s.*c.field, initial) << bad;
        }
        for (uint64_t good :
             {uint64_t(Settings::kMinQueue), uint64_t(100), uint64_t(Settings::kMaxQueue)}) {
            EXPECT_EQ((s.*c.set)(good), 0) << good;
            EXPECT_EQ(s.*c.field, good);
        }
        EXPECT_EQ((s.*c.set)(0), -EINVAL);
        EXPECT_EQ(s.*c.field, Settings::kMaxQueue);
    }
}

// fromEnv() reads the environment once per process; this is the only test that calls it.
TEST(Settings, FromEnvAppliesValidValuesAndIgnoresTheRest)
{
    ASSERT_EQ(setenv("RSTREAM_SEND_BUF", "64k", 1), 0);
    ASSERT_EQ(setenv("RSTREAM_RECV_BUF", "1g", 1), 0); // out of range: ignored
    ASSERT_EQ(setenv("RSTREAM_TX_SIZE", "0x100", 1), 0);
    ASSERT_EQ(setenv("RSTREAM_RX_SIZE", "lots", 1), 0); // malformed: ignored
    ASSERT_EQ(setenv("RSTREAM_POLL_US", "7", 1), 0);
    ASSERT_EQ(setenv("RSTREAM_CONNECT_TIMEOUT_MS", "0", 1), 0); // out of range: ignored
    ASSERT_EQ(setenv("RSTREAM_IWARP", "1", 1), 0);
    ASSERT_EQ(setenv("RSTREAM_PROVIDER", "tcp", 1), 0);
    unsetenv("RSTREAM_STRICT");

    const Settings defaults;
    const Settings &s = Settings::fromEnv();
    EXPECT_EQ(s.sendBuf, 64u * 1024);
    EXPECT_EQ(s.recvBuf, defaults.recvBuf);
    EXPECT_EQ(s.txSize, 256u);
    EXPECT_EQ(s.rxSize, defaults.rxSize);
    EXPECT_EQ(s.pollUs, 7u);
    EXPECT_EQ(s.connectTimeoutMs, defaults.connectTimeoutMs);
    EXPECT_TRUE(s.iwarp);
    EXPECT_EQ(s.strict, defaults.strict);
    EXPECT_EQ(s.provider, "tcp");
    EXPECT_EQ(&Settings::fromEnv(), &s) << "read once";
}
