// SPDX-License-Identifier: MIT
// The deferred upgrade's messages: exact bytes, and a classifier that never takes application
// data for an upgrade message nor lets a truncated or altered one through.

#include <cstring>

#include <gtest/gtest.h>

#include "upgrade_wire.h"

using namespace rstream::wire;

TEST(UpgradeWire, RefusalRoundTrip)
{
    uint8_t buf[kRefusalSize];
    encodeRefusal(RefusalReason::Defer, buf);
    const uint8_t expect[kRefusalSize] = {'R', 'S', 'T', 'M', 0, 2, 0, 1}; // version 2, Defer
    EXPECT_EQ(std::memcmp(buf, expect, sizeof(buf)), 0);
    EXPECT_EQ(decodeRefusal(buf, sizeof(buf)), RefusalReason::Defer);
    EXPECT_EQ(decodeRefusal(buf, sizeof(buf) - 1), RefusalReason::None);
    EXPECT_EQ(decodeRefusal(nullptr, 8), RefusalReason::None);
    for (size_t i = 0; i < sizeof(buf); i++) {
        uint8_t bad[kRefusalSize];
        std::memcpy(bad, buf, sizeof(bad));
        bad[i] ^= 0x40;
        EXPECT_EQ(decodeRefusal(bad, sizeof(bad)), RefusalReason::None) << "byte " << i;
    }
}

TEST(UpgradeWire, AcceptBytes)
{
    uint8_t buf[kUpgradeMaxSize];
    UpgradeMessage m;
    m.type = UpgradeType::Accept;
    m.port = 0x1234;
    m.token = 0x0102030405060708ull;
    ASSERT_EQ(encodeUpgrade(m, buf), kUpgradeAcceptSize);
    const uint8_t expect[kUpgradeAcceptSize] = {0xff, 'R', 'S', 'T', 'U', 'P',  'G',  1, 2, 0, 0,
                                                0,    0,   0,   0,   0,   0x12, 0x34, 0, 0, 0, 0,
                                                0,    0,   1,   2,   3,   4,    5,    6, 7, 8};
    EXPECT_EQ(std::memcmp(buf, expect, sizeof(expect)), 0);
    UpgradeMessage out;
    size_t size = 0;
    ASSERT_EQ(matchUpgrade(buf, sizeof(expect), &out, &size), UpgradeMatch::Complete);
    EXPECT_EQ(size, kUpgradeAcceptSize);
    EXPECT_EQ(out.type, UpgradeType::Accept);
    EXPECT_EQ(out.port, 0x1234);
    EXPECT_EQ(out.token, m.token);
}

TEST(UpgradeWire, EveryPrefixIsPartialAndEveryAlterationIsData)
{
    for (auto type :
         {UpgradeType::Hello, UpgradeType::Accept, UpgradeType::Decline, UpgradeType::Cancel}) {
        uint8_t buf[kUpgradeMaxSize];
        UpgradeMessage m;
        m.type = type;
        m.port = 7;
        m.token = 99;
        const size_t n = encodeUpgrade(m, buf);
        UpgradeMessage out;
        size_t size = 0;
        for (size_t len = 1; len < n; len++)
            EXPECT_EQ(matchUpgrade(buf, len, &out, &size), UpgradeMatch::Partial)
                << int(type) << " " << len;
        EXPECT_EQ(matchUpgrade(buf, n, &out, &size), UpgradeMatch::Complete);
        EXPECT_EQ(size, n);
        // Any change to the header or the reserved bytes makes it application data.
        for (size_t i = 0; i < n; i++) {
            if (type == UpgradeType::Accept && (i == 16 || i == 17 || i >= 24))
                continue; // port and token: any value
            uint8_t bad[kUpgradeMaxSize];
            std::memcpy(bad, buf, n);
            bad[i] ^= 0x10;
            const auto r = matchUpgrade(bad, n, &out, &size);
            if (i == 8 && r == UpgradeMatch::Complete)
                continue; // another valid type
            if (i == 8 && r == UpgradeMatch::Partial)
                continue; // a shorter type turned into Accept, which is longer
            EXPECT_EQ(r, UpgradeMatch::No) << int(type) << " byte " << i;
        }
    }
}

TEST(UpgradeWire, ApplicationDataIsNeverAnUpgrade)
{
    UpgradeMessage out;
    size_t size = 0;
    const char *texts[] = {"GET / HTTP/1.1\r\n", "*1\r\n$4\r\nPING\r\n",
                           "\0\0\0\x08\x04\xd2\x16\x2f", "\xffRSTUPG\x02"};
    for (const char *t : texts)
        EXPECT_EQ(matchUpgrade(t, 8, &out, &size), UpgradeMatch::No) << t;
    // An ACCEPT naming port 0 is not one.
    uint8_t buf[kUpgradeMaxSize];
    UpgradeMessage m;
    m.type = UpgradeType::Accept;
    encodeUpgrade(m, buf);
    EXPECT_EQ(matchUpgrade(buf, kUpgradeAcceptSize, &out, &size), UpgradeMatch::No);
}

TEST(UpgradeWire, TokenRoundTrip)
{
    uint8_t buf[kUpgradeTokenSize];
    encodeToken(0xfedcba9876543210ull, buf);
    EXPECT_EQ(buf[0], 0xfe);
    EXPECT_EQ(decodeToken(buf), 0xfedcba9876543210ull);
}
