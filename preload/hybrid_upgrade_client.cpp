// SPDX-License-Identifier: MIT
// The client side of the in-band upgrade (see hybrid_upgrade.cpp): after its HELLO the client
// goes on over kernel TCP at once, counting what it writes, and reads the server's answer at
// the head of what the server sends: an ACCEPT starts the switch to the fabric
// (hybrid_late.cpp), a DECLINE or the server's own bytes keep the connection on kernel TCP.
// No call waits for the server.

#include "hybrid.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "fabric.h"
#include "hybrid_internal.h"
#include "upgrade_wire.h"

namespace rstream::shim {

int HybridSocket::clientAnswerLocked(bool leave)
{
    if (upgrade_.load() != Upgrade::Answer)
        return 0;
    wire::UpgradeMessage msg;
    size_t size = 0;
    auto match = wire::UpgradeMatch::No;
    bool after = false; // data follows (dataAfterMsg_)
    const ssize_t r = headMessageLocked(&msg, &size, &match, &after);
    // Nothing yet (EAGAIN), or the read's own error: never a read past an answer not looked at.
    if (r < 0)
        return static_cast<int>(r);
    if (r == 0) {
        upgrade_.store(Upgrade::None, std::memory_order_release);
        stayKernelLocked(Fallback::NotUpgraded, "the connection ended first");
        return 0;
    }
    if (match == wire::UpgradeMatch::No) {
        upgrade_.store(Upgrade::None, std::memory_order_release);
        stayKernelLocked(Fallback::NotUpgraded, "the server wrote first");
        return 0;
    }
    if (match == wire::UpgradeMatch::Partial)
        return -EAGAIN; // the rest of it is on its way
    if (leave && after) {
        leaveHeadLocked(msg, size);
        return 0;
    }
    takeMessageLocked(size);
    dataAfterMsg_ = after;
    if (msg.type != wire::UpgradeType::Accept) {
        upgrade_.store(Upgrade::None, std::memory_order_release);
        stayKernelLocked(Fallback::NotUpgraded, "the server declined");
        return 0;
    }
    // The switch starts: the fabric connect once libfabric is ready (hybrid_late.cpp), and the
    // load once the connection has lasted kLoadDelayMs from its HELLO (a server that only reads
    // holds its ACCEPT back a while, which does not add to that).
    noteEngineUsed();
    latePort_ = msg.port;
    pendingToken_ = msg.token;
    lateRead_ = 0; // the server counts what it writes after its ACCEPT
    upgrade_.store(Upgrade::LateLoad, std::memory_order_release);
    lateStepLocked();
    return 0;
}

} // namespace rstream::shim
