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
#include <poll.h>
#include <string>
#include <sys/socket.h>
#include <sys/un.h>
#include <vector>

#include "samehost.h"
#include "settings.h"
#include "wire.h"

namespace rstream {

// This machine's kernel and network namespace, hashed (0 when they cannot be named).
uint32_t sameHostKey();

// The connecting end: fills the hello's extension (*token set) or leaves it empty (no offer).
void offerSameHost(wire::Hello *hello);

// The accepting end, for a peer's hello with an offer: the region and socket, sent to the peer's
// inbox. -errno: the offer is declined (the connection stays on the fabric).
// The rings of a link made for a connection with these settings: the size both start at, and
// the most its maker's send ring and receive ring may grow to (the region reserves that much).
struct SameHostRings
{
    uint64_t ring = 0;
    uint64_t sendCap = 0;
    uint64_t recvCap = 0;
};
SameHostRings sameHostRings(const Settings &settings);

int acceptSameHost(const wire::Hello &peer, const SameHostRings &rings,
                   std::unique_ptr<SameHostLink> *out);

// The in-band setup of the preload shim (upgrade_wire.h), where the server's process is not
// the one that offered: the server's process makes its inbox answer to name too (an abstract
// socket name, without its leading NUL; -errno when it is taken), and the client sends a link it
// made there (SameHostOffer) with the token of the server's ACCEPT; the server collects it with
// collectSameHost(token).
int addSameHostName(const std::string &name);

// A link made for a peer that does not have it yet, in two steps, so that its maker can be ready
// for the peer's use of it before the peer has it: open() connects to the inbox socket (or a
// name it answers to) and makes the link, send() hands the peer's part over with a token.
class SameHostOffer
{
public:
    SameHostOffer() = default;
    ~SameHostOffer();
    SameHostOffer(const SameHostOffer &) = delete;
    SameHostOffer &operator=(const SameHostOffer &) = delete;

    // -errno: nothing listens at name (ECONNREFUSED), or no memory, pipes or descriptors.
    int open(const std::string &name, const SameHostRings &rings);
    int open(const sockaddr_un &addr, socklen_t len, const SameHostRings &rings);
    // This end of the link, once open() succeeded.
    std::unique_ptr<SameHostLink> takeLink() { return std::move(link_); }
    // Who listens where open() connected (the process that bound the name, as it was then), for
    // a caller that must know before it sends; -errno when not open.
    int peerCredentials(ucred *out) const;
    // Sends the peer's part with token (never 0); the offer's fds are closed either way.
    int send(uint64_t token);

private:
    void closeSent();
    int sock_ = -1;
    int fds_[3] = {-1, -1, -1}; // the region, the peer's sleep end, the write end of ours
    std::unique_ptr<SameHostLink> link_;
};

// For a poller that waits for the link sent with token to a name added by addSameHostName():
// -EAGAIN when it is there (collectSameHost() takes it), -ENOTCONN when no name was added, else
// 0 with the fds that turn readable when a link comes (appended once per HintPass pass: the
// same for every socket that waits for one; pass 0: always).
int sameHostWaitFds(uint64_t token, uint64_t pass, std::vector<pollfd> *fds);

// The connecting end, once the peer's answer echoed token: the link the peer sent, waiting up
// to timeoutMs for it to arrive. -errno when it did not come or is not acceptable.
int collectSameHost(uint64_t token, int timeoutMs, std::unique_ptr<SameHostLink> *out);

// Tests: the abstract socket name of this process's inbox (without the leading NUL), or empty.
std::string sameHostInboxName();

} // namespace rstream
