// SPDX-License-Identifier: MIT
// Encoding and strict decoding of the deferred upgrade's messages (see upgrade_wire.h).

#include "upgrade_wire.h"

#include <cstring>

#include "wire.h"

namespace rstream::wire {

namespace {

constexpr uint8_t kUpgradeMagic[8] = {0xff, 'R', 'S', 'T', 'U', 'P', 'G', 1};

void putBe(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--) {
        p[i] = static_cast<uint8_t>(v);
        v >>= 8;
    }
}

uint64_t getBe(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v = (v << 8) | p[i];
    return v;
}

bool allZero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

} // namespace

void encodeRefusal(RefusalReason reason, uint8_t out[kRefusalSize])
{
    putBe(out, kMagic, 4);
    putBe(out + 4, kVersion, 2);
    putBe(out + 6, static_cast<uint16_t>(reason), 2);
}

RefusalReason decodeRefusal(const void *data, size_t len)
{
    if (!data || len < kRefusalSize)
        return RefusalReason::None;
    auto *p = static_cast<const uint8_t *>(data);
    if (getBe(p, 4) != kMagic || getBe(p + 4, 2) != kVersion)
        return RefusalReason::None;
    return getBe(p + 6, 2) == static_cast<uint16_t>(RefusalReason::Defer) ? RefusalReason::Defer
                                                                          : RefusalReason::None;
}

size_t encodeUpgrade(const UpgradeMessage &msg, uint8_t out[kUpgradeMaxSize])
{
    std::memset(out, 0, kUpgradeMaxSize);
    std::memcpy(out, kUpgradeMagic, sizeof(kUpgradeMagic));
    out[8] = static_cast<uint8_t>(msg.type);
    if (msg.type != UpgradeType::Accept)
        return kUpgradeHeaderSize;
    putBe(out + 16, msg.port, 2);
    putBe(out + 24, msg.token, 8);
    return kUpgradeAcceptSize;
}

UpgradeMatch matchUpgrade(const void *data, size_t len, UpgradeMessage *msg, size_t *size)
{
    auto *p = static_cast<const uint8_t *>(data);
    const size_t head = len < sizeof(kUpgradeMagic) ? len : sizeof(kUpgradeMagic);
    if (std::memcmp(p, kUpgradeMagic, head) != 0)
        return UpgradeMatch::No;
    if (len <= 8)
        return UpgradeMatch::Partial;
    const uint8_t type = p[8];
    if (type < static_cast<uint8_t>(UpgradeType::Hello) ||
        type > static_cast<uint8_t>(UpgradeType::Cancel))
        return UpgradeMatch::No;
    const size_t need =
        type == static_cast<uint8_t>(UpgradeType::Accept) ? kUpgradeAcceptSize : kUpgradeHeaderSize;
    // Reserved bytes seen so far must be zero.
    const size_t seen = len < need ? len : need;
    if (!allZero(p + 9, (seen < 16 ? seen : 16) - 9))
        return UpgradeMatch::No;
    if (seen > 18 && !allZero(p + 18, (seen < 24 ? seen : 24) - 18))
        return UpgradeMatch::No;
    if (len < need)
        return UpgradeMatch::Partial;
    UpgradeMessage m;
    m.type = static_cast<UpgradeType>(type);
    if (m.type == UpgradeType::Accept) {
        m.port = static_cast<uint16_t>(getBe(p + 16, 2));
        m.token = getBe(p + 24, 8);
        if (m.port == 0)
            return UpgradeMatch::No;
    }
    *msg = m;
    *size = need;
    return UpgradeMatch::Complete;
}

void encodeToken(uint64_t token, uint8_t out[kUpgradeTokenSize])
{
    putBe(out, token, 8);
}

uint64_t decodeToken(const uint8_t in[kUpgradeTokenSize])
{
    return getBe(in, 8);
}

} // namespace rstream::wire
