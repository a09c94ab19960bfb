// SPDX-License-Identifier: MIT
// What the files implementing HybridSocket share and the interposers need not see.
#pragma once

#include <string>
#include <sys/socket.h>

#include "settings.h"
#include "socket.h"
#include "statexport.h"

namespace rstream::shim {

// The fabric is about to be used by this process (see engineUsed()).
void noteEngineUsed();

// How long a client's connection runs before it switches (loads libfabric, or tries a same-host
// link: see LateLoad in hybrid_late.cpp).
constexpr int64_t kLoadDelayMs = 50;

// How long a server that has not written holds its ACCEPT back (hybrid_upgrade_server.cpp):
// well within the time a client lets a connection run before it switches (kLoadDelayMs).
constexpr int64_t kAcceptDelayMs = 20;

// The engine's settings for the shim's fabric sockets: their connects can take a Defer
// refusal, their listeners defer other processes' connects (Settings::upgrade).
Settings upgradeSettings();

// What the log says about a fallback (formatted only when the line is written). where: the
// fabric address (connects) or port (listeners) concerned; err: the fabric's errno.
std::string fallbackDetail(Fallback why, int port, const std::string &where, int err,
                           int timeoutMs = 0);

} // namespace rstream::shim
