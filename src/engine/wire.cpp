// SPDX-License-Identifier: MIT
// Encoding and validation of the message word and the connection hello.

#include "wire.h"

#include <cerrno>
#include <cstring>
#include <endian.h>

namespace rstream::wire {

std::optional<uint32_t> encodeCredit(uint32_t slots, uint32_t ringUnits)
{
    if (slots > kMaxSlots || ringUnits > kMaxRingUnits || (slots == 0 && ringUnits == 0))
        return std::nullopt;
    return (static_cast<uint32_t>(Op::Credit) << kOpShift) | (slots << kSlotShift) | ringUnits;
}

uint32_t encodeCtrl(Ctrl code)
{
    return (static_cast<uint32_t>(Op::Ctrl) << kOpShift) | static_cast<uint32_t>(code);
}

std::optional<uint32_t> encodeGrow(uint32_t log2)
{
    if (log2 < kMinRingLog2 || log2 > kMaxRingLog2)
        return std::nullopt;
    return encodeCtrl(Ctrl::Grow) | (log2 << kCtrlArgShift);
}

std::optional<uint32_t> encodeIoMap(uint32_t window)
{
    if (window >= kMaxIoMaps)
        return std::nullopt;
    return (static_cast<uint32_t>(Op::IoMap) << kOpShift) | window;
}

uint64_t nextRingKey(uint64_t key)
{
    // splitmix64's step: every output bit depends on every input bit.
    uint64_t z = key + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

std::optional<Message> decode(uint32_t word)
{
    uint32_t payload = word & kPayloadMask;
    Message m{};
    switch (word >> kOpShift) {
    case static_cast<uint32_t>(Op::Data):
        if ((payload & kMaxDataLen) == 0)
            return std::nullopt;
        m.op = Op::Data;
        m.len = payload & kMaxDataLen;
        m.rewind = payload & kDataRewind;
        return m;
    case static_cast<uint32_t>(Op::Credit):
        m.op = Op::Credit;
        m.slots = payload >> kSlotShift;
        m.ringUnits = payload & kMaxRingUnits;
        if (m.slots == 0 && m.ringUnits == 0)
            return std::nullopt;
        return m;
    case static_cast<uint32_t>(Op::Ctrl): {
        uint32_t code = payload & kCtrlCodeMask;
        uint32_t arg = payload >> kCtrlArgShift;
        if (code < static_cast<uint32_t>(Ctrl::ShutWr) || code > static_cast<uint32_t>(kLastCtrl))
            return std::nullopt;
        if (code == static_cast<uint32_t>(Ctrl::Grow) ? (arg < kMinRingLog2 || arg > kMaxRingLog2)
                                                      : arg != 0)
            return std::nullopt;
        m.op = Op::Ctrl;
        m.ctrl = static_cast<Ctrl>(code);
        m.arg = arg;
        return m;
    }
    case static_cast<uint32_t>(Op::IoMap):
        if (payload >= kMaxIoMaps)
            return std::nullopt;
        m.op = Op::IoMap;
        m.window = payload;
        return m;
    default:
        return std::nullopt;
    }
}

unsigned creditShift(uint64_t ringSize)
{
    unsigned shift = 0;
    while ((ringSize >> shift) > kMaxRingUnits)
        shift++;
    return shift;
}

namespace {

template <typename T>
void put(uint8_t *&p, T v)
{
    if constexpr (sizeof(T) == 2)
        v = htobe16(v);
    else if constexpr (sizeof(T) == 4)
        v = htobe32(v);
    else
        v = htobe64(v);
    std::memcpy(p, &v, sizeof(v));
    p += sizeof(v);
}

template <typename T>
T get(const uint8_t *&p)
{
    T v;
    std::memcpy(&v, p, sizeof(v));
    p += sizeof(v);
    if constexpr (sizeof(T) == 2)
        return be16toh(v);
    else if constexpr (sizeof(T) == 4)
        return be32toh(v);
    else
        return be64toh(v);
}

} // namespace

size_t encodeHello(const Hello &h, uint8_t *out)
{
    uint8_t *p = out;
    put<uint32_t>(p, h.magic);
    put<uint16_t>(p, h.version);
    put<uint16_t>(p, h.flags);
    put<uint64_t>(p, h.ringAddr);
    put<uint64_t>(p, h.ringKey);
    put<uint32_t>(p, h.ringSize);
    put<uint32_t>(p, h.rxSlots);
    put<uint32_t>(p, h.ioMapSize);
    put<uint32_t>(p, h.process);
    if (!h.token)
        return kHelloSize;
    put<uint32_t>(p, h.hostKey);
    put<uint32_t>(p, h.inbox);
    put<uint64_t>(p, h.token);
    return kHelloSameHostSize;
}

int decodeHello(const void *data, size_t len, Hello *out)
{
    if (!data || len < kHelloSize)
        return -EPROTO;
    const uint8_t *p = static_cast<const uint8_t *>(data);
    Hello h;
    h.magic = get<uint32_t>(p);
    h.version = get<uint16_t>(p);
    h.flags = get<uint16_t>(p);
    h.ringAddr = get<uint64_t>(p);
    h.ringKey = get<uint64_t>(p);
    h.ringSize = get<uint32_t>(p);
    h.rxSlots = get<uint32_t>(p);
    h.ioMapSize = get<uint32_t>(p);
    h.process = get<uint32_t>(p);
    if (len >= kHelloSameHostSize) {
        h.hostKey = get<uint32_t>(p);
        h.inbox = get<uint32_t>(p);
        h.token = get<uint64_t>(p);
        if (!h.token)
            h.hostKey = h.inbox = 0; // no extension: the bytes are padding
    }
    if (h.magic != kMagic || h.version != kVersion)
        return -EPROTO;
    if (h.flags & ~(kFlagIwarp | kFlagVirtAddr | kFlagGrow | kFlagUpgrade | kFlagRewind))
        return -EINVAL;
    if (h.ringSize < 1024 || h.ringSize > (1u << 28) || h.rxSlots < 4 || h.rxSlots > kMaxSlots)
        return -EINVAL;
    if (!(h.flags & kFlagVirtAddr) && h.ringAddr != 0)
        return -EINVAL;
    if (h.ioMapSize > kMaxIoMaps)
        return -EINVAL;
    *out = h;
    return 0;
}

void encodeIoMapRecord(const IoMapRecord &rec, uint8_t out[kIoMapRecordSize])
{
    uint8_t *p = out;
    put<uint64_t>(p, rec.offset);
    put<uint64_t>(p, rec.length);
    put<uint64_t>(p, rec.addr);
    put<uint64_t>(p, rec.key);
}

int decodeIoMapRecord(const void *data, size_t len, IoMapRecord *out)
{
    if (!data || len < kIoMapRecordSize)
        return -EINVAL;
    const uint8_t *p = static_cast<const uint8_t *>(data);
    IoMapRecord r;
    r.offset = get<uint64_t>(p);
    r.length = get<uint64_t>(p);
    r.addr = get<uint64_t>(p);
    r.key = get<uint64_t>(p);
    constexpr uint64_t kMaxOff = uint64_t(INT64_MAX);
    if (r.length == 0) {
        if (r.offset || r.addr || r.key)
            return -EINVAL;
    } else if (r.offset > kMaxOff || r.length > kMaxOff - r.offset || r.addr > ~r.length) {
        return -EINVAL;
    }
    *out = r;
    return 0;
}

} // namespace rstream::wire
