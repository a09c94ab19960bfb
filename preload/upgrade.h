// SPDX-License-Identifier: MIT
// The process's fabric listeners for in-band upgrades, and the tokens they wait for.
//
// A process that serves an upgraded connection (upgrade_wire.h) listens on an ephemeral fabric
// port of the connection's local address, created the first time it needs one. Clients connect
// there and send the token from the server's ACCEPT; the server's socket claims its connection
// by token. Tokens are 64 random bits, expected only while their socket waits; a connection
// with another token is closed, so a stray or hostile client never reaches a socket.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <poll.h>
#include <set>
#include <string>
#include <sys/socket.h>
#include <vector>

#include "socket.h"

namespace rstream::shim {

// What a listener holds for peers that connect and send no token: ShimConfig's
// upgradePendingMax and tokenWaitMs (RSTREAM_UPGRADE_PENDING_MAX, RSTREAM_TOKEN_WAIT_MS).
struct UpgradeLimits
{
    size_t pendingMax;   // connections whose token is not read yet; the oldest goes beyond
    int64_t tokenWaitMs; // how long each may take to send its token
    bool sameHost =
        false; // clients on this host may send a same-host link instead (RSTREAM_SAME_HOST)
};

// The abstract socket name at which the upgrade listener of addr (its port replaced by port)
// takes same-host links (samehost_setup.h), without the leading NUL: "rstream-up/1.2.3.4:5".
std::string upgradeLinkName(const sockaddr *addr, socklen_t len, int port);

class UpgradeListener
{
public:
    // The listener for local (its port ignored), created on first use with limits; null when
    // the fabric cannot be had (*err: why).
    static std::shared_ptr<UpgradeListener> forAddress(const sockaddr *local, socklen_t len,
                                                       const UpgradeLimits &limits, int *err);
    // In a fork child: the parent's listeners are not the child's (kept, never closed).
    static void forgetAfterFork();

    int port() const { return port_; }
    // Clients on this host may send a same-host link to upgradeLinkName(its address, port()).
    bool takesLinks() const { return takesLinks_; }
    // A fresh token this listener expects from now on.
    uint64_t expect();
    // No longer expected; a connection that brought it is closed.
    void forget(uint64_t token);
    // The connection that brought token, once it has (then no longer expected); null before.
    std::shared_ptr<Socket> claim(uint64_t token);
    // The fds to sleep on for the next arrival (the listener's and unread connections'), or
    // -EAGAIN when something arrived already (look again instead of sleeping).
    int prepareWait(std::vector<pollfd> *fds);
    // Registers a poller's eventfd with the connections whose token is awaited: the progress
    // thread may take their events (and so their wait fds' readiness) and then signals it.
    void addWaiter(int eventFd, std::vector<std::shared_ptr<Connection>> *registered);

private:
    struct Unread
    {
        std::shared_ptr<Socket> sock;
        int64_t deadlineMs;
    };
    void pumpLocked();
    uint64_t nextTokenLocked(); // 64 random bits

    uint64_t tokens_[32] = {}; // drawn ahead: tokens_[0, tokensLeft_) unused yet
    size_t tokensLeft_ = 0;

    std::shared_ptr<Socket> listen_;
    int port_ = 0;
    bool takesLinks_ = false;
    UpgradeLimits limits_{};
    std::mutex mutex_;
    std::set<uint64_t> expected_;
    std::map<uint64_t, std::shared_ptr<Socket>> arrived_;
    std::vector<Unread> unread_; // accepted, token not read yet
    uint64_t acceptGen_ = 0;     // connections accepted so far
    uint64_t waitedGen_ = 0;     // acceptGen_ when a poller last registered its wake-up
    uint64_t pumpedPass_ = 0;    // the poller's pass (Connection::HintPass) that last pumped
    uint64_t waitPass_ = 0;      // the poller's pass whose list holds this listener's fds
    uint64_t addPass_ = 0;       // the poller's pass that registered its wake-up (addWaiter)
};

} // namespace rstream::shim
