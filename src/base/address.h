// SPDX-License-Identifier: MIT
// Socket addresses as text, the one place that formats them.
#pragma once

#include <cstddef>
#include <string>
#include <sys/socket.h>

namespace rstream {

// "1.2.3.4:80", "[::1]:80" (IPv6 always in brackets), or "-" for a null address or another
// family. Writes at most cap bytes, NUL included, and allocates nothing (usable from the
// crash handler's and the log's paths); returns the length written.
size_t formatAddress(const sockaddr *addr, char *buf, size_t cap);
std::string addressText(const sockaddr *addr);
// The host part alone, without brackets ("1.2.3.4", "::1"), for interfaces that take a node
// name; "" for another family.
std::string hostText(const sockaddr *addr);
// The port in host byte order, 0 for another family.
int addressPort(const sockaddr *addr);
// Sets the port (host byte order) of an AF_INET or AF_INET6 address; others are left alone.
void setAddressPort(sockaddr *addr, int port);

} // namespace rstream
