// SPDX-License-Identifier: MIT
// libFuzzer target for every decoder of bytes a peer controls: data-path words, IOMAP records,
// the CM hello and refusal, and the in-band upgrade messages. Beyond not crashing (under
// AddressSanitizer and UndefinedBehaviorSanitizer), whatever a decoder accepts must satisfy the
// bounds its header promises and encode back to the same bytes.

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "upgrade_wire.h"
#include "wire.h"

using namespace rstream::wire;

namespace {

void check(bool ok)
{
    if (!ok)
        std::abort(); // the fuzzer reports it with the input
}

void words(const uint8_t *data, size_t size)
{
    for (size_t i = 0; i + 4 <= size; i += 4) {
        uint32_t w;
        std::memcpy(&w, data + i, 4);
        auto m = decode(w);
        if (!m)
            continue;
        switch (m->op) {
        case Op::Data:
            check(encodeData(m->len, m->rewind) == w);
            break;
        case Op::Credit:
            check(encodeCredit(m->slots, m->ringUnits) == w);
            break;
        case Op::IoMap:
            check(m->window < kMaxIoMaps && encodeIoMap(m->window) == w);
            break;
        default:
            break;
        }
    }
}

void ioMapRecord(const uint8_t *data, size_t size)
{
    IoMapRecord r;
    if (decodeIoMapRecord(data, size, &r) != 0)
        return;
    check(size >= kIoMapRecordSize);
    check(r.offset + r.length <= uint64_t(INT64_MAX) && r.offset <= uint64_t(INT64_MAX));
    check(r.addr + r.length >= r.addr);
    if (r.length == 0)
        check(r.offset == 0 && r.addr == 0 && r.key == 0);
    uint8_t out[kIoMapRecordSize];
    encodeIoMapRecord(r, out);
    check(std::memcmp(out, data, kIoMapRecordSize) == 0);
}

void hello(const uint8_t *data, size_t size)
{
    Hello h;
    if (decodeHello(data, size, &h) != 0)
        return;
    check(size >= kHelloSize && h.magic == kMagic && h.version == kVersion);
    check(h.ioMapSize <= kMaxIoMaps);
    // With the same-host extension (a token) the hello is longer.
    uint8_t out[kHelloSameHostSize];
    const size_t n = encodeHello(h, out);
    check(n == (h.token ? kHelloSameHostSize : kHelloSize));
    Hello again;
    check(decodeHello(out, n, &again) == 0 && again == h);
}

void upgrade(const uint8_t *data, size_t size)
{
    UpgradeMessage m;
    size_t n = 0;
    const UpgradeMatch r = matchUpgrade(data, size, &m, &n);
    if (r == UpgradeMatch::Complete) {
        check(n <= size && n >= kUpgradeHeaderSize && n <= kUpgradeMaxSize);
        check(m.type != UpgradeType::Accept || m.port != 0);
        uint8_t out[kUpgradeMaxSize];
        check(encodeUpgrade(m, out) == n && std::memcmp(out, data, n) == 0);
    } else if (r == UpgradeMatch::Partial) {
        check(size < kUpgradeMaxSize);
    }
    decodeRefusal(data, size);
    if (size >= kUpgradeTokenSize) {
        uint8_t out[kUpgradeTokenSize];
        encodeToken(decodeToken(data), out);
        check(std::memcmp(out, data, kUpgradeTokenSize) == 0);
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    words(data, size);
    ioMapRecord(data, size);
    hello(data, size);
    upgrade(data, size);
    return 0;
}
