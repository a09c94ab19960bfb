// SPDX-License-Identifier: MIT
// The in-band upgrade's wire format: the refusal that defers a fabric connect, and the messages
// two shims exchange on a kernel TCP connection to move it to the fabric mid-stream.
//
// Only a client that knows the listener runs the shim offers the upgrade, so a peer without the
// shim never sees a byte of it: it knows from the listener's beacon (an abstract UNIX socket
// named after the listening address, for a destination on this host) or from a Refusal whose
// reason is Defer (CM reject data), the answer of a shim listener to another process's fabric
// connect. The offer and the answer ride at the head of each direction, and nobody waits for
// them: the application's bytes follow at once over kernel TCP.
//
//   client -> server  HELLO                       (the first bytes the client sends)
//   server -> client  ACCEPT port token | DECLINE (the first bytes the server sends, unless it
//                                                  wrote before it read the HELLO: then none,
//                                                  and its bytes tell the client)
//
// Each message is a 16-byte header, ACCEPT adds 16 bytes:
//   0..7   magic: ff 'R' 'S' 'T' 'U' 'P' 'G' version(1)
//   8      type: 1 HELLO, 2 ACCEPT, 3 DECLINE (4: reserved, an earlier CANCEL)
//   9..15  zero
//   ACCEPT 16..17 the server's fabric port for this upgrade (network order), 18..23 zero,
//          24..31 a random token (network order)
//
// The switch: both ends count the application bytes each writes over kernel TCP after the
// HELLO (client) or the ACCEPT (server). Once its libfabric is ready the client connects to the
// port and sends the token (8 bytes) first. The server, when it next looks, claims the
// connection that brought its token (closing any other), answers kUpgradeAck and M (8 bytes,
// network order: what it wrote over kernel TCP), writes only on the fabric from then on and
// shuts down its sending side of the kernel connection. The client answers N (8 bytes: what it
// wrote over kernel TCP) and does the same. Each side reads the kernel connection up to the
// count the other declared, then the fabric. Nothing is framed or held back; a count the peer
// does not reach is a broken connection (ECONNRESET).
#pragma once

#include <cstddef>
#include <cstdint>

namespace rstream::wire {

// CM reject data.
constexpr size_t kRefusalSize = 8;
enum class RefusalReason : uint16_t
{
    None = 0,
    Defer = 1, // connect over kernel TCP and upgrade there (the listener's process has forked)
};
void encodeRefusal(RefusalReason reason, uint8_t out[kRefusalSize]);
// The reason a reject's data gives; None for data that is not an rstream refusal.
RefusalReason decodeRefusal(const void *data, size_t len);

enum class UpgradeType : uint8_t
{
    Hello = 1,
    Accept = 2,
    Decline = 3,
    Cancel = 4, // reserved: an earlier protocol's, never sent
};
constexpr size_t kUpgradeHeaderSize = 16;
constexpr size_t kUpgradeAcceptSize = 32;
constexpr size_t kUpgradeMaxSize = kUpgradeAcceptSize;
constexpr size_t kUpgradeTokenSize = 8;
constexpr uint8_t kUpgradeAck = 0x06;

struct UpgradeMessage
{
    UpgradeType type = UpgradeType::Hello;
    uint16_t port = 0;  // Accept
    uint64_t token = 0; // Accept
};

// Writes msg at out (room for kUpgradeMaxSize); returns its size.
size_t encodeUpgrade(const UpgradeMessage &msg, uint8_t out[kUpgradeMaxSize]);

enum class UpgradeMatch
{
    No,       // these bytes do not start an upgrade message: application data
    Partial,  // a prefix of one: more bytes decide
    Complete, // *msg and *size are set
};
// Classifies the first len bytes of a stream.
UpgradeMatch matchUpgrade(const void *data, size_t len, UpgradeMessage *msg, size_t *size);

void encodeToken(uint64_t token, uint8_t out[kUpgradeTokenSize]);
uint64_t decodeToken(const uint8_t in[kUpgradeTokenSize]);

} // namespace rstream::wire
