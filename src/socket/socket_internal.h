// SPDX-License-Identifier: MIT
// What the socket's source files share besides the Socket class: sysctls, restarts, addresses.
#pragma once

#include <sys/socket.h>

namespace rstream {

long readSysctl(const char *path, long fallback);

// Whether an interrupted blocking call should restart, as the kernel does under SA_RESTART.
// The signal that interrupted is unknown, so restart only when every signal with a handler
// has SA_RESTART (signals without a handler never interrupt; they kill, stop or are ignored).
bool signalsRestart();

// An IPv4 address as the v4-mapped IPv6 address an AF_INET6 socket reports.
void toFamily(int family, sockaddr_storage *ss, socklen_t *len);
int copyAddress(const sockaddr_storage &ss, socklen_t ssLen, sockaddr *addr, socklen_t *len);

// Checks a local address the way bind(2) would and picks the port for port 0, with a probe
// socket the kernel answers for, which keeps holding the port until the fabric endpoint binds
// it (at listen or connect). On the providers that share the kernel's port space this keeps
// bind()'s errors at bind() and the port ours in between. Returns the probe fd.
int probeBind(int family, bool v6Only, bool reuseAddr, const sockaddr *addr, socklen_t len,
              sockaddr_storage *bound, socklen_t *boundLen);

// Validates an address argument for a socket of family as Linux TCP does.
int checkAddress(int family, const sockaddr *addr, socklen_t len);

// An AF_INET6 destination as the engine wants it: v4-mapped addresses become AF_INET.
socklen_t engineAddress(const sockaddr *addr, socklen_t len, sockaddr_storage *out);

bool isV4Mapped(const sockaddr *addr);

} // namespace rstream
