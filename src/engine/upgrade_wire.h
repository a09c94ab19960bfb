// SPDX-License-Identifier: MIT
// The deferred upgrade's wire format: the refusal that defers a fabric connect, and the
// messages two shims exchange in-band on a kernel TCP connection to move it to the fabric.
//
// A listener whose process has forked cannot tell which process will serve a connection, so it
// refuses fabric connection requests with a Refusal whose reason is Defer (CM reject data).
// The client then connects over kernel TCP and knows, from that refusal alone, that the
// process listening runs the shim. Only then does it send an upgrade message, so a peer without
// the shim never sees one. On the TCP stream (both directions start with them, before any byte
// of the application):
//
//   client -> server  HELLO                       (first bytes the client sends)
//   server -> client  ACCEPT port token | DECLINE (first bytes the server sends)
//   client -> server  CANCEL                      (only when it gives up: then kernel TCP)
//
// Each message is a 16-byte header, ACCEPT adds 16 bytes:
//   0..7   magic: ff 'R' 'S' 'T' 'U' 'P' 'G' version(1)
//   8      type: 1 HELLO, 2 ACCEPT, 3 DECLINE, 4 CANCEL
//   9..15  zero
//   ACCEPT 16..17 the server's fabric port for this upgrade (network order), 18..23 zero,
//          24..31 a random token (network order)
// The client then connects to that fabric port and sends the token as the first 8 bytes of
// the fabric stream; the server answers one byte (kUpgradeAck) when the token was one it waits
// for, and closes the connection otherwise. A server that has written application bytes before
// it reads the HELLO answers nothing: its first bytes tell the client to stay on kernel TCP.
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
    Cancel = 4,
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
