// SPDX-License-Identifier: MIT
// Unit tests of the wire format: the 32-bit message word, the credit unit, the hello and the
// riomap window record.

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "credits.h"
#include "settings.h"
#include "wire.h"

using namespace rstream;
using namespace rstream::wire;

namespace {

// (GROW needs its argument: WireCtrl.GrowCarries...)
constexpr Ctrl kAllCtrls[] = {Ctrl::ShutWr,       Ctrl::Disconnect, Ctrl::Reset,   Ctrl::Keepalive,
                              Ctrl::KeepaliveAck, Ctrl::Switch,     Ctrl::Unmapped};

uint32_t makeWord(uint32_t op, uint32_t payload)
{
    return (op << kOpShift) | (payload & kPayloadMask);
}

// Payloads worth trying for any op: the edges of every field, and random ones.
std::vector<uint32_t> samplePayloads()
{
    std::vector<uint32_t> v = {0,
                               1,
                               2,
                               3,
                               4,
                               5,
                               6,
                               0xff,
                               0xffff,
                               0x10000,
                               0x10001,
                               kMaxSlots << kSlotShift,
                               (kMaxSlots << kSlotShift) | kMaxRingUnits,
                               1u << 28,
                               kPayloadMask - 1,
                               kPayloadMask};
    std::mt19937 rng(1234);
    for (int i = 0; i < 5000; i++)
        v.push_back(rng() & kPayloadMask);
    return v;
}

} // namespace

TEST(WireLayout, ConstantsMatchTheDocumentedLayout)
{
    EXPECT_EQ(kOpShift, 29u);
    // DATA: 28 bits of length, and the rewind bit above them.
    EXPECT_EQ(kMaxDataLen, (1u << 28) - 1);
    EXPECT_EQ(kDataRewind, 1u << 28);
    EXPECT_EQ(kDataRewind | kMaxDataLen, kPayloadMask);
    EXPECT_EQ(kMaxSlots, 8191u);
    EXPECT_EQ(kMaxRingUnits, 0xffffu);
    // Slots and ring units share the payload without overlapping.
    EXPECT_EQ(((kMaxSlots << kSlotShift) | kMaxRingUnits), kPayloadMask);
    EXPECT_EQ((kMaxSlots << kSlotShift) & kMaxRingUnits, 0u);
    // Window ids fit the payload.
    EXPECT_EQ(kMaxIoMaps, 4096u);
    EXPECT_LE(kMaxIoMaps - 1, kPayloadMask);
    EXPECT_EQ(kIoMapRecordSize, 32u);
}

TEST(WireData, RoundTripsAtTheEdgesAndAcrossTheRange)
{
    std::vector<uint32_t> lens = {1, 2, 3, 4095, 4096, 65535, 65536, kMaxDataLen - 1, kMaxDataLen};
    for (uint32_t len = 1; len < kMaxDataLen; len = len * 3 + 1)
        lens.push_back(len);
    for (uint32_t len : lens) {
        auto word = encodeData(len);
        ASSERT_TRUE(word) << "len " << len;
        EXPECT_EQ(*word >> kOpShift, static_cast<uint32_t>(Op::Data));
        auto m = decode(*word);
        ASSERT_TRUE(m) << "len " << len;
        EXPECT_EQ(m->op, Op::Data);
        EXPECT_EQ(m->len, len);
        EXPECT_EQ(m->slots, 0u);
        EXPECT_EQ(m->ringUnits, 0u);
    }
}

TEST(WireData, RewindIsABitBesideTheLength)
{
    for (uint32_t len : {1u, 64u, 4096u, kMaxDataLen}) {
        auto word = encodeData(len, true);
        ASSERT_TRUE(word) << "len " << len;
        EXPECT_EQ(*word, (static_cast<uint32_t>(Op::Data) << kOpShift) | kDataRewind | len);
        auto m = decode(*word);
        ASSERT_TRUE(m) << "len " << len;
        EXPECT_EQ(m->op, Op::Data);
        EXPECT_EQ(m->len, len);
        EXPECT_TRUE(m->rewind);
        auto plain = decode(*encodeData(len));
        ASSERT_TRUE(plain);
        EXPECT_FALSE(plain->rewind);
    }
    // A rewind still says how many bytes landed: none is malformed.
    EXPECT_FALSE(encodeData(0, true));
    EXPECT_FALSE(decode(kDataRewind));
}

TEST(WireData, EncoderRejectsOutOfRangeLengths)
{
    EXPECT_FALSE(encodeData(0));
    EXPECT_FALSE(encodeData(kMaxDataLen + 1));
    EXPECT_FALSE(encodeData(kMaxDataLen + 1, true));
    EXPECT_FALSE(encodeData(1u << 30));
    EXPECT_FALSE(encodeData(0xffffffffu));
}

TEST(WireCredit, RoundTripsEverySlotCount)
{
    for (uint32_t slots = 0; slots <= kMaxSlots; slots++) {
        for (uint32_t units : {0u, 1u, 0x7fffu, kMaxRingUnits}) {
            if (slots == 0 && units == 0)
                continue;
            auto word = encodeCredit(slots, units);
            ASSERT_TRUE(word) << slots << "/" << units;
            EXPECT_EQ(*word >> kOpShift, static_cast<uint32_t>(Op::Credit));
            auto m = decode(*word);
            ASSERT_TRUE(m) << slots << "/" << units;
            EXPECT_EQ(m->op, Op::Credit);
            EXPECT_EQ(m->slots, slots);
            EXPECT_EQ(m->ringUnits, units);
            EXPECT_EQ(m->len, 0u);
        }
    }
}

TEST(WireCredit, RoundTripsEveryRingUnitCount)
{
    for (uint32_t units = 0; units <= kMaxRingUnits; units++) {
        for (uint32_t slots : {0u, 1u, 4096u, kMaxSlots}) {
            if (slots == 0 && units == 0)
                continue;
            auto word = encodeCredit(slots, units);
            ASSERT_TRUE(word) << slots << "/" << units;
            auto m = decode(*word);
            ASSERT_TRUE(m) << slots << "/" << units;
            ASSERT_EQ(m->op, Op::Credit);
            ASSERT_EQ(m->slots, slots);
            ASSERT_EQ(m->ringUnits, units);
        }
    }
}

TEST(WireCredit, EncoderRejectsOutOfRangeFields)
{
    EXPECT_FALSE(encodeCredit(0, 0));
    EXPECT_FALSE(encodeCredit(kMaxSlots + 1, 1));
    EXPECT_FALSE(encodeCredit(kMaxSlots + 1, 0));
    EXPECT_FALSE(encodeCredit(0xffffffffu, 1));
    EXPECT_FALSE(encodeCredit(1, kMaxRingUnits + 1));
    EXPECT_FALSE(encodeCredit(0, kMaxRingUnits + 1));
    EXPECT_FALSE(encodeCredit(1, 0xffffffffu));
    // In range on both edges.
    EXPECT_TRUE(encodeCredit(kMaxSlots, kMaxRingUnits));
    EXPECT_TRUE(encodeCredit(1, 0));
    EXPECT_TRUE(encodeCredit(0, 1));
}

TEST(WireRingKey, NextRingKeyMixesEveryBitAndDoesNotRepeat)
{
    // The peer's next ring key is derived from the current one: it must not be the next
    // integer (sequential keys are what a guesser tries) and must change with every bit.
    uint64_t key = 0x0123456789abcdefull;
    std::set<uint64_t> seen{key};
    for (int i = 0; i < 1000; i++) {
        const uint64_t next = nextRingKey(key);
        EXPECT_TRUE(seen.insert(next).second) << i;
        EXPECT_GE(__builtin_popcountll(next ^ key), 12) << i;
        key = next;
    }
    for (unsigned bit = 0; bit < 64; bit++) {
        const uint64_t a = nextRingKey(0), b = nextRingKey(uint64_t(1) << bit);
        EXPECT_GE(__builtin_popcountll(a ^ b), 16) << bit;
    }
}

TEST(WireCtrl, RoundTripsEveryCode)
{
    for (Ctrl code : kAllCtrls) {
        uint32_t word = encodeCtrl(code);
        EXPECT_EQ(word >> kOpShift, static_cast<uint32_t>(Op::Ctrl));
        EXPECT_EQ(word & kPayloadMask, static_cast<uint32_t>(code));
        auto m = decode(word);
        ASSERT_TRUE(m);
        EXPECT_EQ(m->op, Op::Ctrl);
        EXPECT_EQ(m->ctrl, code);
    }
}

// GROW carries log2 of the new ring size in bits 12..8; every other code carries nothing there.
TEST(WireCtrl, GrowCarriesTheRingSizeAndNothingElseCarriesAnArgument)
{
    for (uint32_t log2 = kMinRingLog2; log2 <= kMaxRingLog2; log2++) {
        auto word = encodeGrow(log2);
        ASSERT_TRUE(word) << log2;
        EXPECT_EQ(*word, (2u << kOpShift) | (log2 << 8) | 6u);
        auto m = decode(*word);
        ASSERT_TRUE(m);
        EXPECT_EQ(m->ctrl, Ctrl::Grow);
        EXPECT_EQ(m->arg, log2);
    }
    for (uint32_t log2 : {0u, 1u, kMinRingLog2 - 1, kMaxRingLog2 + 1, 31u}) {
        EXPECT_FALSE(encodeGrow(log2)) << log2;
        EXPECT_FALSE(decode((2u << kOpShift) | (log2 << 8) | 6u)) << log2;
    }
    EXPECT_FALSE(decode((2u << kOpShift) | (16u << 8) | 7u)) << "SWITCH with an argument";
    EXPECT_FALSE(decode((2u << kOpShift) | (16u << 8) | 1u)) << "SHUT_WR with an argument";
    EXPECT_FALSE(decode((2u << kOpShift) | (1u << 13) | 6u)) << "bits above the argument";
}

// The keepalive codes are fixed by the wire format: probe 4, answer 5.
TEST(WireCtrl, KeepaliveProbeAndAnswerAreDistinct)
{
    EXPECT_EQ(encodeCtrl(Ctrl::Keepalive), (2u << kOpShift) | 4u);
    EXPECT_EQ(encodeCtrl(Ctrl::KeepaliveAck), (2u << kOpShift) | 5u);
    EXPECT_EQ(decode((2u << kOpShift) | 5u)->ctrl, Ctrl::KeepaliveAck);
    EXPECT_FALSE(decode((2u << kOpShift) | 6u));
}

TEST(WireIoMap, RoundTripsEveryWindowId)
{
    for (uint32_t id = 0; id < kMaxIoMaps; id++) {
        auto w = encodeIoMap(id);
        ASSERT_TRUE(w);
        EXPECT_EQ(*w, (3u << kOpShift) | id);
        auto m = decode(*w);
        ASSERT_TRUE(m);
        EXPECT_EQ(m->op, Op::IoMap);
        EXPECT_EQ(m->window, id);
    }
    EXPECT_FALSE(encodeIoMap(kMaxIoMaps));
    EXPECT_FALSE(encodeIoMap(0xffffffffu));
    EXPECT_FALSE(decode(makeWord(3, kMaxIoMaps)));
    EXPECT_FALSE(decode(makeWord(3, kPayloadMask)));
}

TEST(WireDecode, RejectsMalformedWords)
{
    for (uint32_t payload : {kMaxIoMaps, kMaxIoMaps + 1, 0x10001u, kPayloadMask})
        EXPECT_FALSE(decode(makeWord(3, payload))) << "IOMAP window " << payload;
    for (uint32_t op = 4; op <= 7; op++) {
        for (uint32_t payload : {0u, 1u, 2u, 4u, 0x10001u, kPayloadMask})
            EXPECT_FALSE(decode(makeWord(op, payload))) << "op " << op << " payload " << payload;
    }
    EXPECT_FALSE(decode(makeWord(0, 0))) << "DATA of length 0";
    EXPECT_FALSE(decode(makeWord(1, 0))) << "CREDIT returning nothing";
    EXPECT_FALSE(decode(makeWord(2, 0))) << "CTRL code 0";
    EXPECT_FALSE(decode(makeWord(2, static_cast<uint32_t>(kLastCtrl) + 1)));
    EXPECT_FALSE(decode(makeWord(2, 0x100)));
    EXPECT_FALSE(decode(makeWord(2, kPayloadMask)));
    EXPECT_FALSE(decode(0xffffffffu));
}

// For every op value and many payloads: a word decodes exactly when an encoder produces it, and
// encoding the decoded message gives the same word back.
TEST(WireDecode, AgreesWithTheEncodersForEveryOp)
{
    const std::vector<uint32_t> payloads = samplePayloads();
    for (uint32_t op = 0; op <= 7; op++) {
        for (uint32_t payload : payloads) {
            uint32_t word = makeWord(op, payload);
            auto m = decode(word);
            std::optional<uint32_t> reencoded;
            switch (op) {
            case 0:
                reencoded = encodeData(payload & kMaxDataLen, payload & kDataRewind);
                break;
            case 1:
                reencoded = encodeCredit(payload >> kSlotShift, payload & kMaxRingUnits);
                break;
            case 2: {
                uint32_t code = payload & kCtrlCodeMask, arg = payload >> kCtrlArgShift;
                if (code == static_cast<uint32_t>(Ctrl::Grow))
                    reencoded = encodeGrow(arg);
                else if (arg == 0 && code >= static_cast<uint32_t>(Ctrl::ShutWr) &&
                         code <= static_cast<uint32_t>(kLastCtrl))
                    reencoded = encodeCtrl(static_cast<Ctrl>(code));
                break;
            }
            case 3:
                reencoded = encodeIoMap(payload);
                break;
            default:
                break;
            }
            ASSERT_EQ(m.has_value(), reencoded.has_value())
                << "op " << op << " payload 0x" << std::hex << payload;
            if (!m)
                continue;
            ASSERT_EQ(*reencoded, word) << "op " << op << " payload 0x" << std::hex << payload;
            ASSERT_EQ(static_cast<uint32_t>(m->op), op);
            switch (m->op) {
            case Op::Data:
                ASSERT_EQ(m->len | (m->rewind ? kDataRewind : 0), payload);
                break;
            case Op::Credit:
                ASSERT_EQ((m->slots << kSlotShift) | m->ringUnits, payload);
                break;
            case Op::Ctrl:
                ASSERT_EQ(static_cast<uint32_t>(m->ctrl) | (m->arg << kCtrlArgShift), payload);
                break;
            case Op::IoMap:
                ASSERT_EQ(m->window, payload);
                break;
            }
        }
    }
}

// The documented rule: ring space travels in units of 1 << shift bytes "so that a whole ring
// fits in the 16-bit field". A whole ring of R bytes is floor(R / unit) units (ring bytes are
// returned as ringDue >> shift), so the expectation is the smallest shift with
// R >> shift <= 0xffff.
TEST(WireCreditShift, WholeRingFitsAndShiftIsMinimal)
{
    for (uint64_t ringSize :
         {uint64_t(1024), uint64_t(4096), uint64_t(32768), uint64_t(65535), uint64_t(65536),
          uint64_t(65537), uint64_t(131071), uint64_t(131072), uint64_t(1) << 20,
          (uint64_t(1) << 20) + 1, uint64_t(3) << 20, uint64_t(1) << 28}) {
        unsigned shift = creditShift(ringSize);
        EXPECT_LE(ringSize >> shift, kMaxRingUnits)
            << "ring " << ringSize << ": shift " << shift << " gives " << (ringSize >> shift)
            << " units for a whole ring";
        if (shift > 0) {
            EXPECT_GT(ringSize >> (shift - 1), kMaxRingUnits)
                << "ring " << ringSize << ": shift " << shift << " is not minimal";
        }
    }
}

TEST(WireCreditShift, SmallRingsUseByteUnits)
{
    for (uint64_t ringSize = 1; ringSize <= 65535; ringSize += 997)
        EXPECT_EQ(creditShift(ringSize), 0u) << "ring " << ringSize;
    EXPECT_EQ(creditShift(65535), 0u);
}

TEST(WireCreditShift, IsMonotonic)
{
    unsigned last = 0;
    for (uint64_t ringSize = 1024; ringSize <= (uint64_t(1) << 28); ringSize += ringSize / 7 + 1) {
        unsigned shift = creditShift(ringSize);
        EXPECT_GE(shift, last) << "ring " << ringSize;
        last = shift;
    }
}

namespace {

Hello sampleHello()
{
    Hello h;
    h.flags = kFlagVirtAddr | kFlagIwarp;
    h.ringAddr = 0x0102030405060708ull;
    h.ringKey = 0x1112131415161718ull;
    h.ringSize = 1u << 20;
    h.rxSlots = 384;
    h.ioMapSize = 64;
    h.process = 0;
    return h;
}

struct EncodedHello
{
    uint8_t bytes[kHelloSize];
};

EncodedHello encode(const Hello &h)
{
    EncodedHello e;
    std::memset(e.bytes, 0xa5, sizeof(e.bytes));
    encodeHello(h, e.bytes);
    return e;
}

int decodeModified(void (*modify)(Hello &))
{
    Hello h = sampleHello();
    modify(h);
    EncodedHello e = encode(h);
    Hello out{};
    return decodeHello(e.bytes, sizeof(e.bytes), &out);
}

} // namespace

TEST(WireHello, RoundTrips)
{
    Hello h = sampleHello();
    EncodedHello e = encode(h);
    Hello out{};
    out.magic = 0;
    ASSERT_EQ(decodeHello(e.bytes, sizeof(e.bytes), &out), 0);
    EXPECT_EQ(out, h);

    Hello plain;
    plain.ringSize = 32 * 1024;
    plain.rxSlots = 8;
    e = encode(plain);
    ASSERT_EQ(decodeHello(e.bytes, sizeof(e.bytes), &out), 0);
    EXPECT_EQ(out, plain);
}

TEST(WireHello, IsFortyBytesInNetworkOrder)
{
    EXPECT_EQ(kHelloSize, 40u);
    Hello h = sampleHello();
    h.ioMapSize = 0x00000fff;
    h.process = 0x25262728u;
    EncodedHello e = encode(h);
    const uint8_t *b = e.bytes;
    // magic "RSTM"
    EXPECT_EQ(b[0], 'R');
    EXPECT_EQ(b[1], 'S');
    EXPECT_EQ(b[2], 'T');
    EXPECT_EQ(b[3], 'M');
    // version 2, big endian
    EXPECT_EQ(b[4], 0x00);
    EXPECT_EQ(b[5], 0x02);
    // flags
    EXPECT_EQ(b[6], 0x00);
    EXPECT_EQ(b[7], kFlagVirtAddr | kFlagIwarp);
    // ringAddr, ringKey: most significant byte first
    for (int i = 0; i < 8; i++) {
        EXPECT_EQ(b[8 + i], 0x01 + i);
        EXPECT_EQ(b[16 + i], 0x11 + i);
    }
    // ringSize 1 MiB = 00 10 00 00, rxSlots 384 = 00 00 01 80
    const uint8_t size[] = {0x00, 0x10, 0x00, 0x00};
    const uint8_t slots[] = {0x00, 0x00, 0x01, 0x80};
    EXPECT_EQ(std::memcmp(b + 24, size, 4), 0);
    EXPECT_EQ(std::memcmp(b + 28, slots, 4), 0);
    // ioMapSize 4095 = 00 00 0f ff, then the reserved word
    const uint8_t maps[] = {0x00, 0x00, 0x0f, 0xff};
    EXPECT_EQ(std::memcmp(b + 32, maps, 4), 0);
    for (int i = 0; i < 4; i++)
        EXPECT_EQ(b[36 + i], 0x25 + i);
}

TEST(WireHello, RejectsIoMapSizesOutOfRange)
{
    EXPECT_EQ(decodeModified([](Hello &h) { h.ioMapSize = 0; }), 0);
    EXPECT_EQ(decodeModified([](Hello &h) { h.ioMapSize = kMaxIoMaps; }), 0);
    EXPECT_EQ(decodeModified([](Hello &h) { h.ioMapSize = kMaxIoMaps + 1; }), -EINVAL);
    EXPECT_EQ(decodeModified([](Hello &h) { h.ioMapSize = 0xffffffffu; }), -EINVAL);
}

TEST(WireHello, AcceptsLongerPrivateData)
{
    // Providers may pad CM private data (rdma_cm with zeros); the trailing bytes are not ours.
    Hello h = sampleHello();
    uint8_t buf[64];
    std::memset(buf, 0, sizeof(buf));
    EXPECT_EQ(encodeHello(h, buf), kHelloSize);
    Hello out{};
    ASSERT_EQ(decodeHello(buf, sizeof(buf), &out), 0);
    EXPECT_EQ(out, h);
    // Other padding reads as a same-host offer or answer that matches nothing: an offer names
    // another machine (hostKey) or an inbox that does not exist, an answer's token is not the
    // one offered; either way the fabric carries the connection.
    std::memset(buf, 0xee, sizeof(buf));
    encodeHello(h, buf);
    ASSERT_EQ(decodeHello(buf, sizeof(buf), &out), 0);
    out.hostKey = out.inbox = 0;
    out.token = 0;
    EXPECT_EQ(out, h);
}

TEST(WireHello, SameHostExtensionRoundTrips)
{
    Hello h = sampleHello();
    h.hostKey = 0x01020304;
    h.inbox = 0xa0b0c0d0;
    h.token = 0x1122334455667788ull;
    uint8_t buf[kHelloSameHostSize];
    ASSERT_EQ(encodeHello(h, buf), kHelloSameHostSize);
    Hello out{};
    ASSERT_EQ(decodeHello(buf, sizeof(buf), &out), 0);
    EXPECT_EQ(out, h);
    // An end that knows only the first 40 bytes reads the same hello without the offer.
    ASSERT_EQ(decodeHello(buf, kHelloSize, &out), 0);
    EXPECT_EQ(out.token, 0u);
    EXPECT_EQ(out.ringSize, h.ringSize);
}

TEST(WireHello, RejectsBadMagicVersionOrLength)
{
    EXPECT_EQ(decodeModified([](Hello &h) { h.magic = 0x4d545352; }), -EPROTO);
    EXPECT_EQ(decodeModified([](Hello &h) { h.magic = 0; }), -EPROTO);
    EXPECT_EQ(decodeModified([](Hello &h) { h.version = 0; }), -EPROTO);
    EXPECT_EQ(decodeModified([](Hello &h) { h.version = kVersion + 1; }), -EPROTO);
    EXPECT_EQ(decodeModified([](Hello &h) { h.version = 0x0100; }), -EPROTO);

    EncodedHello e = encode(sampleHello());
    Hello out{};
    for (size_t len : {size_t(0), size_t(1), size_t(4), size_t(32), kHelloSize - 1})
        EXPECT_EQ(decodeHello(e.bytes, len, &out), -EPROTO) << "length " << len;
    EXPECT_EQ(decodeHello(nullptr, kHelloSize, &out), -EPROTO);

    // A corrupted byte of the magic on the wire.
    e.bytes[3] ^= 0x20;
    EXPECT_EQ(decodeHello(e.bytes, kHelloSize, &out), -EPROTO);
}

TEST(WireHello, RejectsUnknownFlags)
{
    EXPECT_EQ(decodeModified([](Hello &h) { h.flags |= 1 << 5; }), -EINVAL);
    EXPECT_EQ(decodeModified([](Hello &h) { h.flags |= kFlagGrow; }), 0);
    EXPECT_EQ(decodeModified([](Hello &h) { h.flags |= kFlagUpgrade; }), 0);
    EXPECT_EQ(decodeModified([](Hello &h) { h.flags |= kFlagRewind; }), 0);
    EXPECT_EQ(decodeModified([](Hello &h) { h.flags |= 1 << 15; }), -EINVAL);
    EXPECT_EQ(decodeModified([](Hello &h) { h.flags = 0xffff; }), -EINVAL);
    EXPECT_EQ(decodeModified([](Hello &h) {
                  h.flags = kFlagIwarp;
                  h.ringAddr = 0;
              }),
              0);
}

TEST(WireHello, RejectsRingSizesOutOfRange)
{
    EXPECT_EQ(decodeModified([](Hello &h) { h.ringSize = 0; }), -EINVAL);
    EXPECT_EQ(decodeModified([](Hello &h) { h.ringSize = Settings::kMinBuf - 1; }), -EINVAL);
    EXPECT_EQ(decodeModified([](Hello &h) { h.ringSize = Settings::kMaxBuf + 1; }), -EINVAL);
    EXPECT_EQ(decodeModified([](Hello &h) { h.ringSize = 0xffffffffu; }), -EINVAL);
    EXPECT_EQ(decodeModified([](Hello &h) { h.ringSize = Settings::kMinBuf; }), 0);
    EXPECT_EQ(decodeModified([](Hello &h) { h.ringSize = Settings::kMaxBuf; }), 0);
    EXPECT_EQ(decodeModified([](Hello &h) { h.ringSize = 65537; }), 0);
}

TEST(WireHello, RejectsReceiveSlotsOutOfRange)
{
    // A peer must give enough slots to carry data past the reserved ones, and no more than a
    // CREDIT word can return.
    EXPECT_EQ(decodeModified([](Hello &h) { h.rxSlots = 0; }), -EINVAL);
    EXPECT_EQ(decodeModified([](Hello &h) { h.rxSlots = kReservedSlots; }), -EINVAL);
    EXPECT_EQ(decodeModified([](Hello &h) { h.rxSlots = kMaxSlots + 1; }), -EINVAL);
    EXPECT_EQ(decodeModified([](Hello &h) { h.rxSlots = 0xffffffffu; }), -EINVAL);
    EXPECT_EQ(decodeModified([](Hello &h) { h.rxSlots = Settings::kMinQueue; }), 0);
    EXPECT_EQ(decodeModified([](Hello &h) { h.rxSlots = Settings::kMaxQueue; }), 0);
    EXPECT_EQ(decodeModified([](Hello &h) { h.rxSlots = kMaxSlots; }), 0);
}

TEST(WireHello, RejectsAnAddressWithoutVirtAddr)
{
    EXPECT_EQ(decodeModified([](Hello &h) {
                  h.flags = 0;
                  h.ringAddr = 4096;
              }),
              -EINVAL);
    EXPECT_EQ(decodeModified([](Hello &h) {
                  h.flags = kFlagIwarp;
                  h.ringAddr = 1;
              }),
              -EINVAL);
    EXPECT_EQ(decodeModified([](Hello &h) {
                  h.flags = 0;
                  h.ringAddr = 0;
              }),
              0);
    EXPECT_EQ(decodeModified([](Hello &h) {
                  h.flags = kFlagVirtAddr;
                  h.ringAddr = 0xffff800000001000ull;
              }),
              0);
}

TEST(WireHello, LeavesTheOutputAloneOnError)
{
    Hello h = sampleHello();
    h.flags = 1 << 3;
    EncodedHello e = encode(h);
    Hello out{};
    out.ringSize = 12345;
    EXPECT_EQ(decodeHello(e.bytes, kHelloSize, &out), -EINVAL);
    EXPECT_EQ(out.ringSize, 12345u);
}

namespace {

IoMapRecord sampleRecord()
{
    IoMapRecord r;
    r.offset = 0x0102030405060708ull;
    r.length = 0x1112131415161718ull;
    r.addr = 0x2122232425262728ull;
    r.key = 0x3132333435363738ull;
    return r;
}

int decodeRecord(const IoMapRecord &r)
{
    uint8_t buf[kIoMapRecordSize];
    encodeIoMapRecord(r, buf);
    IoMapRecord out;
    return decodeIoMapRecord(buf, sizeof(buf), &out);
}

} // namespace

TEST(WireIoMapRecord, IsThirtyTwoBytesInNetworkOrderAndRoundTrips)
{
    IoMapRecord r = sampleRecord();
    uint8_t buf[kIoMapRecordSize + 8];
    std::memset(buf, 0xee, sizeof(buf));
    encodeIoMapRecord(r, buf);
    for (int field = 0; field < 4; field++)
        for (int i = 0; i < 8; i++)
            EXPECT_EQ(buf[field * 8 + i], 0x01 + 0x10 * field + i) << field << " " << i;
    EXPECT_EQ(buf[kIoMapRecordSize], 0xee); // nothing written past the record
    IoMapRecord out;
    ASSERT_EQ(decodeIoMapRecord(buf, sizeof(buf), &out), 0);
    EXPECT_EQ(out, r);
}

TEST(WireIoMapRecord, WithdrawalHasOnlyZeros)
{
    EXPECT_EQ(decodeRecord(IoMapRecord{}), 0);
    IoMapRecord r{};
    r.key = 1;
    EXPECT_EQ(decodeRecord(r), -EINVAL);
    r = {};
    r.offset = 4096;
    EXPECT_EQ(decodeRecord(r), -EINVAL);
    r = {};
    r.addr = 4096;
    EXPECT_EQ(decodeRecord(r), -EINVAL);
}

TEST(WireIoMapRecord, RejectsWindowsPastOffTOrWrappingAddresses)
{
    constexpr uint64_t kMax = uint64_t(INT64_MAX);
    auto rec = [](uint64_t offset, uint64_t length, uint64_t addr) {
        IoMapRecord r;
        r.offset = offset;
        r.length = length;
        r.addr = addr;
        r.key = 7;
        return r;
    };
    EXPECT_EQ(decodeRecord(rec(0, 1, 0)), 0);
    EXPECT_EQ(decodeRecord(rec(0, kMax, 0)), 0);
    EXPECT_EQ(decodeRecord(rec(kMax - 1, 1, 0)), 0);
    EXPECT_EQ(decodeRecord(rec(kMax, 1, 0)), -EINVAL);
    EXPECT_EQ(decodeRecord(rec(1, kMax, 0)), -EINVAL);
    EXPECT_EQ(decodeRecord(rec(kMax + 1, 1, 0)), -EINVAL);
    EXPECT_EQ(decodeRecord(rec(0, UINT64_MAX, 0)), -EINVAL);
    EXPECT_EQ(decodeRecord(rec(0, 4096, UINT64_MAX - 4096)), 0);
    EXPECT_EQ(decodeRecord(rec(0, 4096, UINT64_MAX - 4095)), -EINVAL);
    EXPECT_EQ(decodeRecord(rec(0, 1, UINT64_MAX)), -EINVAL);
}

TEST(WireIoMapRecord, RejectsShortInputAndLeavesTheOutputAlone)
{
    uint8_t buf[kIoMapRecordSize];
    encodeIoMapRecord(sampleRecord(), buf);
    IoMapRecord out;
    out.key = 99;
    EXPECT_EQ(decodeIoMapRecord(buf, kIoMapRecordSize - 1, &out), -EINVAL);
    EXPECT_EQ(decodeIoMapRecord(nullptr, kIoMapRecordSize, &out), -EINVAL);
    IoMapRecord bad{};
    bad.key = 1;
    encodeIoMapRecord(bad, buf);
    EXPECT_EQ(decodeIoMapRecord(buf, sizeof(buf), &out), -EINVAL);
    EXPECT_EQ(out.key, 99u);
}
