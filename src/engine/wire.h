// SPDX-License-Identifier: MIT
// The rstream wire format: the 32-bit message word and the connection hello (CM private data).
//
// Every message between two rstream endpoints is one 32-bit word. It travels as the immediate
// (CQ data) of an RMA write or of a zero-length send, or, in iWarp mode where there is no
// immediate data, as the 4-byte payload of a small send that follows the write. 32 bits are all
// verbs offers, so nothing else may be needed by the receiver:
//
//   31   29 28                                                 0
//   +------+----------------------------------------------------+
//   |  op  |                      payload                       |
//   +------+----------------------------------------------------+
//
//   op 0 DATA    payload bits 27..0 = length in bytes (1 .. 2^28-1) of the write that landed
//                                      at the receiver's current ring position (offsets are
//                                      implicit: in order, never wrap)
//                payload bit 28     = REWIND: the write landed at the start of the ring, not at
//                                      the current position. Only towards a receiver whose hello
//                                      has kFlagRewind, with no earlier padding unread. The rest
//                                      of the ring, from the current position to its end, is
//                                      padding (ring.h): both ends count it as written, it takes
//                                      the sender's credit, and the receiver returns that credit
//                                      once its reader has passed it, so the padding and the
//                                      write together must fit the credit the sender holds. A
//                                      connection that moves small messages keeps to the first
//                                      pages of its ring instead of cycling through all of it:
//                                      fewer pages resident, and the same cache lines reused
//                                      (see tx.cpp).
//   op 1 CREDIT  payload bits 28..16 = receive slots returned (0 .. 8191)
//                payload bits 15..0  = ring space returned, in units of 2^shift bytes, the
//                                      smallest shift for which the whole receive ring fits
//                                      in 16 bits (ringSize >> shift <= 65535)
//   op 2 CTRL    payload bits 7..0  = control code (SHUT_WR, DISCONNECT, RESET, KEEPALIVE,
//                                      KEEPALIVE_ACK, GROW, SWITCH, UNMAPPED)
//                payload bits 12..8 = GROW: log2 of the new ring size (10 .. 28); else 0
//                payload bits 28..13 = 0
//   op 3 IOMAP   payload = window id (0 .. the receiver's ioMapSize - 1). The only word that
//                carries a payload of its own: a 32-byte IoMapRecord that announces (length > 0)
//                or withdraws (length 0) the sender's riomap() window with that id (answered
//                with UNMAPPED once no write into it can land any more). It travels
//                as a send into a posted receive: as the 32-byte payload of a send with
//                immediate, or in iWarp mode as bytes 4..35 of the 36-byte send that starts
//                with the word. Any other word arriving with a payload, or an IOMAP without
//                one, resets the connection.
//   op 4..7      invalid: the connection is reset
//
// riowrite() data travels as a plain RMA write (no immediate, no receive consumed) into the
// window the record named, posted after the stream data that precedes it on the same
// endpoint; stream data posted after it tells the receiver it has landed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace rstream::wire {

enum class Op : uint32_t
{
    Data = 0,
    Credit = 1,
    Ctrl = 2,
    IoMap = 3,
};

enum class Ctrl : uint32_t
{
    ShutWr = 1,     // no more data from the sender: EOF after what was sent
    Disconnect = 2, // graceful close: EOF after what was sent, the sender is gone
    Reset = 3,      // abortive close: the receiver reports ECONNRESET at once
    // Keepalive: a probe the receiver's engine answers with KeepaliveAck, without the
    // application, as a kernel answers TCP keepalive probes. The prober counts any word from
    // the peer as proof of life, the ack only guarantees there is one. An ack is never answered,
    // so two probing ends cannot ping-pong.
    Keepalive = 4,
    KeepaliveAck = 5,
    // Receive ring growth (the receiver's ring only grows, and only towards a sender whose hello
    // has kFlagGrow). GROW tells the sender the receiver has a ring of 2^arg bytes ready right
    // after its current one in memory, registered on its own (see nextRingKey()); from then on
    // the receiver returns no more ring credit for the current ring. The sender answers SWITCH,
    // ordered after its last write into the current ring and before its first write into the
    // new one, which starts with all of it free. The receiver closes the current ring's
    // registration when SWITCH arrives: only the ring in use is ever writable.
    Grow = 6,
    Switch = 7,
    // The answer to an IOMAP withdrawal, one for each, in order: the sender of UNMAPPED has
    // forgotten the window and posted every write into it before this word, so once it arrives
    // (ordered behind those writes) nothing can land in the window's memory any more, and
    // riounmap() may hand the memory back to the application.
    Unmapped = 8,
};
constexpr Ctrl kLastCtrl = Ctrl::Unmapped;

constexpr unsigned kOpShift = 29;
constexpr uint32_t kPayloadMask = (1u << kOpShift) - 1;
constexpr uint32_t kDataRewind = 1u << 28;
constexpr uint32_t kMaxDataLen = kDataRewind - 1;
constexpr unsigned kSlotShift = 16;
constexpr uint32_t kMaxSlots = (1u << 13) - 1;
constexpr uint32_t kMaxRingUnits = 0xffff;
constexpr unsigned kCtrlArgShift = 8;
constexpr uint32_t kCtrlCodeMask = 0xff;
constexpr uint32_t kMinRingLog2 = 10;
constexpr uint32_t kMaxRingLog2 = 28;
// Bound on the windows one end accepts from its peer (RDMA_IOMAPSIZE), so on IOMAP ids.
constexpr uint32_t kMaxIoMaps = 4096;

struct Message
{
    Op op;
    uint32_t len = 0;       // Data
    bool rewind = false;    // Data: landed at the start of the ring (kDataRewind)
    uint32_t slots = 0;     // Credit
    uint32_t ringUnits = 0; // Credit
    Ctrl ctrl{};            // Ctrl
    uint32_t arg = 0;       // Ctrl GROW: log2 of the new ring size
    uint32_t window = 0;    // IoMap

    bool operator==(const Message &) const = default;
};

// The key of the receive ring that follows a ring registered under key (GROW): a mix of all its
// bits, so that only the two ends, who know the first ring's key from the hello, can name it
// (the ring of a domain shared with other connections is guarded by its key alone). Its address
// is the current ring's address plus its size with kFlagVirtAddr, else 0 (offsets into the new
// ring's own registration). Growth needs keys this end chooses: where the provider chooses
// them, rings keep their size.
uint64_t nextRingKey(uint64_t key);

// Encoders return nullopt for a field out of range.
// Inline: every write encodes one, and an optional returned from another unit went through
// memory, a store-forwarding stall (two stores, one wider load) that cost a server answering
// 64 B requests 1 % of its time (perf annotate).
inline std::optional<uint32_t> encodeData(uint32_t len, bool rewind = false)
{
    if (len == 0 || len > kMaxDataLen)
        return std::nullopt;
    return (static_cast<uint32_t>(Op::Data) << kOpShift) | (rewind ? kDataRewind : 0) | len;
}
std::optional<uint32_t> encodeCredit(uint32_t slots, uint32_t ringUnits);
uint32_t encodeCtrl(Ctrl code);
// GROW to a ring of 2^log2 bytes; nullopt out of kMinRingLog2 .. kMaxRingLog2.
std::optional<uint32_t> encodeGrow(uint32_t log2);
std::optional<uint32_t> encodeIoMap(uint32_t window);

// Decodes a word from the wire; nullopt when it is malformed.
std::optional<Message> decode(uint32_t word);

// The credit unit shift of a ring: ring space is returned in units of 1 << shift bytes, so that
// a whole ring fits in the 16-bit field.
unsigned creditShift(uint64_t ringSize);

// The record an IOMAP word carries: 32 bytes, four 64-bit fields in network byte order.
//   offset  where the window starts in the riowrite() offset space of the connection
//   length  bytes in the window; 0 withdraws the window (all other fields 0 then)
//   addr    RMA target address of the window's first byte: a virtual address with
//           FI_MR_VIRT_ADDR (the hello's kFlagVirtAddr), else 0 (offsets into the region)
//   key     the remote key of the window's memory region
// offset + length never exceeds 2^63 - 1 (off_t), and addr + length never wraps.
constexpr size_t kIoMapRecordSize = 32;

struct IoMapRecord
{
    uint64_t offset = 0;
    uint64_t length = 0;
    uint64_t addr = 0;
    uint64_t key = 0;

    bool operator==(const IoMapRecord &) const = default;
};

void encodeIoMapRecord(const IoMapRecord &rec, uint8_t out[kIoMapRecordSize]);
// Decodes and validates (see above): -EINVAL when out of range, and *out is left alone.
int decodeIoMapRecord(const void *data, size_t len, IoMapRecord *out);

// CM private data: sent by the connecting side with fi_connect and answered with fi_accept.
// All fields in network byte order on the wire; 40 bytes, or 56 with the same-host extension
// (bytes 40..55: hostKey, inbox, token), which an end that does not know it ignores:
//   connect  the connecting end offers the same-host transport (samehost.h): hostKey names its
//            kernel and network namespace, inbox its process's inbox socket, token (never 0)
//            the connection
//   accept   the accepting end took the offer: token echoes the connect's, and the region has
//            been sent to the inbox; an answer without the extension keeps the fabric
// 56 bytes is all a verbs connection request carries.
constexpr uint32_t kMagic = 0x5253544d; // "RSTM"
// Version 2: each receive ring registered on its own (GROW, nextRingKey()), UNMAPPED.
constexpr uint16_t kVersion = 2;
constexpr size_t kHelloSize = 40;
constexpr size_t kHelloSameHostSize = 56;

enum HelloFlags : uint16_t
{
    kFlagIwarp = 1 << 0,    // use RMA write + small send instead of write with immediate
    kFlagVirtAddr = 1 << 1, // ringAddr is a virtual address (FI_MR_VIRT_ADDR), else an offset
    kFlagGrow = 1 << 2,     // the sender of this hello understands GROW and answers SWITCH
    // (connect) the sender can take a Defer refusal: it then connects over kernel TCP and
    // upgrades in-band (upgrade_wire.h); process identifies its process.
    kFlagUpgrade = 1 << 3,
    // The sender of this hello takes DATA words with kDataRewind into its receive ring.
    kFlagRewind = 1 << 4,
};

struct Hello
{
    uint32_t magic = kMagic;
    uint16_t version = kVersion;
    uint16_t flags = 0;
    uint64_t ringAddr = 0;  // target address of the receive ring
    uint64_t ringKey = 0;   // remote key of the receive ring
    uint32_t ringSize = 0;  // bytes
    uint32_t rxSlots = 0;   // receive slots posted: the peer's initial message credits
    uint32_t ioMapSize = 0; // riomap() windows the sender accepts from its peer (0 .. kMaxIoMaps)
    uint32_t process = 0;   // kFlagUpgrade: a random id of the connecting process, else 0
    // The same-host extension, sent when token != 0.
    uint32_t hostKey = 0;
    uint32_t inbox = 0;
    uint64_t token = 0;

    bool operator==(const Hello &) const = default;
};

// Returns the bytes written into out: kHelloSize, or kHelloSameHostSize with the extension
// (hello.token != 0).
size_t encodeHello(const Hello &hello, uint8_t *out);

// Decodes and validates: -EPROTO for a bad magic or version, -EINVAL for out-of-range fields.
int decodeHello(const void *data, size_t len, Hello *out);

} // namespace rstream::wire
