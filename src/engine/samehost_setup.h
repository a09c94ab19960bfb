// SPDX-License-Identifier: MIT
// Setting up a same-host link inside the normal connection setup: the offer, the region handed
// to the connecting end's inbox, and its collection there.
//
// The connecting end offers in its hello: hostKey (its kernel's boot id and its network
// namespace), inbox (the process's inbox: an abstract UNIX socket, so only reachable from the
// same network namespace) and a random 64-bit token. An accepting end with the same hostKey
// creates the region, connects to the inbox, sends the token with the memfd (SCM_RIGHTS), and
// answers with the token echoed; anything that fails on the way leaves the connection on the
// fabric. The connecting end takes the socket whose token is its own: only the two ends know
// it, since it travelled inside their connection.
#pragma once

#include <cstdint>
#include <memory>

#include "samehost.h"
#include "wire.h"

namespace rstream {

// This machine's kernel and network namespace, hashed (0 when they cannot be named).
uint32_t sameHostKey();

// The connecting end: fills the hello's extension (*token set) or leaves it empty (no offer).
void offerSameHost(wire::Hello *hello);

// The accepting end, for a peer's hello with an offer: the region and socket, sent to the peer's
// inbox. -errno: the offer is declined (the connection stays on the fabric).
int acceptSameHost(const wire::Hello &peer, uint64_t ringSize, std::unique_ptr<SameHostLink> *out);

// The connecting end, once the peer's answer echoed token: the link the peer sent, waiting up
// to timeoutMs for it to arrive. -errno when it did not come or is not acceptable.
int collectSameHost(uint64_t token, int timeoutMs, std::unique_ptr<SameHostLink> *out);

// Tests: the abstract socket name of this process's inbox (without the leading NUL), or empty.
std::string sameHostInboxName();

} // namespace rstream
