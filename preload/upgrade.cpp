// SPDX-License-Identifier: MIT
// The process's fabric listeners for in-band upgrades (see upgrade.h).

#include "upgrade.h"

#include <cerrno>
#include <cstring>
#include <iterator>
#include <netinet/in.h>
#include <new>
#include <pthread.h>
#include <string>
#include <sys/random.h>

#include "address.h"
#include "clock.h"
#include "fabric.h"
#include "log.h"
#include "samehost_setup.h"
#include "upgrade_wire.h"

namespace rstream::shim {

namespace {

std::mutex gListenersMutex;
std::map<std::string, std::shared_ptr<UpgradeListener>> *gListeners =
    new std::map<std::string, std::shared_ptr<UpgradeListener>>();

// A v4-mapped IPv6 address (a dual-stack listener's connection from an IPv4 peer) becomes the
// IPv4 address its peer connected to.
socklen_t plainAddress(const sockaddr *in, socklen_t len, sockaddr_storage *out)
{
    std::memset(out, 0, sizeof(*out));
    if (in->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
        auto *a6 = reinterpret_cast<const sockaddr_in6 *>(in);
        if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) {
            auto *a4 = reinterpret_cast<sockaddr_in *>(out);
            a4->sin_family = AF_INET;
            std::memcpy(&a4->sin_addr, &a6->sin6_addr.s6_addr[12], 4);
            return sizeof(sockaddr_in);
        }
    }
    std::memcpy(out, in, std::min<size_t>(len, sizeof(*out)));
    return len;
}

// Closes a fabric connection that brought no token (or a wrong one) abortively: it has nothing
// to deliver, and a graceful close would keep its endpoint, and its descriptors, until the peer
// acknowledged it (up to 30 s): a peer that never does, opening connections as fast as it
// can, would hold 30 s of them whatever the limit on those that wait.
void drop(Socket &s)
{
    const linger now{1, 0};
    (void)s.setsockopt(SOL_SOCKET, SO_LINGER, &now, sizeof(now));
    s.close();
}

} // namespace

std::shared_ptr<UpgradeListener> UpgradeListener::forAddress(const sockaddr *local, socklen_t len,
                                                             const UpgradeLimits &limits, int *err)
{
    sockaddr_storage addr;
    len = plainAddress(local, len, &addr);
    auto *sa = reinterpret_cast<sockaddr *>(&addr);
    if (sa->sa_family == AF_INET)
        reinterpret_cast<sockaddr_in *>(sa)->sin_port = 0;
    else if (sa->sa_family == AF_INET6)
        reinterpret_cast<sockaddr_in6 *>(sa)->sin6_port = 0;
    else {
        *err = EAFNOSUPPORT;
        return nullptr;
    }
    const std::string key = addressText(sa);
    std::lock_guard<std::mutex> lock(gListenersMutex);
    auto it = gListeners->find(key);
    if (it != gListeners->end())
        return it->second;
    auto l = std::make_shared<UpgradeListener>();
    l->limits_ = limits;
    l->listen_ = std::make_shared<Socket>(sa->sa_family);
    l->listen_->setNonblocking(true);
    int r = l->listen_->bind(sa, len);
    if (r == 0)
        r = l->listen_->listen(128);
    sockaddr_storage bound{};
    socklen_t blen = sizeof(bound);
    if (r == 0)
        r = l->listen_->localAddress(reinterpret_cast<sockaddr *>(&bound), &blen);
    if (r < 0) {
        *err = -r;
        RS_LOG(Warn, "upgrade: no fabric listener on %s: %s", key.c_str(), strerror(-r));
        return nullptr;
    }
    l->port_ = addressPort(reinterpret_cast<sockaddr *>(&bound));
    RS_LOG(Debug, "upgrade: fabric listener on %s port %d", key.c_str(), l->port_);
    if (limits.sameHost) {
        const std::string name = upgradeLinkName(sa, len, l->port_);
        r = addSameHostName(name);
        l->takesLinks_ = r == 0;
        if (r < 0)
            RS_LOG(Info, "upgrade: no same-host links at %s: %s", name.c_str(), strerror(-r));
    }
    (*gListeners)[key] = l;
    return l;
}

std::string upgradeLinkName(const sockaddr *addr, socklen_t len, int port)
{
    sockaddr_storage a;
    plainAddress(addr, len, &a);
    auto *sa = reinterpret_cast<sockaddr *>(&a);
    if (sa->sa_family == AF_INET)
        reinterpret_cast<sockaddr_in *>(sa)->sin_port = htons(static_cast<uint16_t>(port));
    else if (sa->sa_family == AF_INET6)
        reinterpret_cast<sockaddr_in6 *>(sa)->sin6_port = htons(static_cast<uint16_t>(port));
    return "rstream-up/" + addressText(sa);
}

void UpgradeListener::forgetAfterFork()
{
    // Only the forking thread exists in the child: the lock starts over, and the parent's
    // listeners are left alone (leaked), as their fabric objects are the parent's.
    new (&gListenersMutex) std::mutex();
    gListeners = new std::map<std::string, std::shared_ptr<UpgradeListener>>();
}

uint64_t UpgradeListener::nextTokenLocked()
{
    // A system call per 32 connections, not per connection. The listener is this process's
    // alone (a fork child makes its own), so no two processes draw the same tokens.
    if (tokensLeft_ == 0) {
        size_t got = 0;
        auto *p = reinterpret_cast<uint8_t *>(tokens_);
        while (got < sizeof(tokens_)) {
            const ssize_t r = getrandom(p + got, sizeof(tokens_) - got, 0);
            if (r > 0)
                got += static_cast<size_t>(r);
        }
        tokensLeft_ = std::size(tokens_);
    }
    return tokens_[--tokensLeft_];
}

uint64_t UpgradeListener::expect()
{
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t token;
    do {
        token = nextTokenLocked();
    } while (token == 0 || expected_.count(token) || arrived_.count(token));
    expected_.insert(token);
    return token;
}

void UpgradeListener::forget(uint64_t token)
{
    std::shared_ptr<Socket> stale;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        expected_.erase(token);
        auto it = arrived_.find(token);
        if (it != arrived_.end()) {
            stale = std::move(it->second);
            arrived_.erase(it);
        }
    }
    if (stale)
        stale->close(); // its client reads EOF instead of the ack and stays on kernel TCP
}

std::shared_ptr<Socket> UpgradeListener::claim(uint64_t token)
{
    std::lock_guard<std::mutex> lock(mutex_);
    // A poller's look claims for every socket in its switch: one pump (a read of the
    // listener's EQ, a system call on tcp) serves them all in that pass; one that arrives after
    // it is claimed in the next.
    // Outside a pass (a socket's own read or write) every time: a token that comes during a
    // burst of the socket's calls switches it at the next one. (Pumping at most once a
    // millisecond saved a system call or two per short connection, but a download that
    // followed the token's arrival within the millisecond stayed on kernel TCP: e2e_postgres.)
    const uint64_t pass = Connection::HintPass::current();
    if (!pass || pass != pumpedPass_) {
        pumpLocked();
        pumpedPass_ = pass;
    }
    auto it = arrived_.find(token);
    if (it == arrived_.end())
        return nullptr;
    auto s = std::move(it->second);
    arrived_.erase(it);
    return s;
}

void UpgradeListener::pumpLocked()
{
    for (;;) {
        std::shared_ptr<Socket> s;
        if (listen_->accept(&s, nullptr, nullptr) < 0)
            break;
        s->setNonblocking(true);
        RS_LOG(Debug, "upgrade: port %d: a fabric connection, its token not read yet", port_);
        unread_.push_back({std::move(s), nowMs() + limits_.tokenWaitMs});
        acceptGen_++;
        if (unread_.size() > limits_.pendingMax) {
            // More than any burst of real clients: the oldest goes (its client, if any, reads
            // the end and stays on kernel TCP).
            RS_LOG(Info,
                   "upgrade: port %d: over %zu connections without a token: the oldest "
                   "closed",
                   port_, limits_.pendingMax);
            drop(*unread_.front().sock);
            unread_.erase(unread_.begin());
        }
    }
    const int64_t now = nowMs();
    std::erase_if(unread_, [&](Unread &u) {
        uint8_t buf[wire::kUpgradeTokenSize];
        iovec iov{buf, sizeof(buf)};
        ssize_t r = u.sock->recv(&iov, 1, MSG_PEEK | MSG_DONTWAIT);
        if (r == static_cast<ssize_t>(sizeof(buf))) {
            u.sock->recv(&iov, 1, MSG_DONTWAIT);
            const uint64_t token = wire::decodeToken(buf);
            if (expected_.erase(token)) {
                RS_LOG(Debug, "upgrade: port %d: a token arrived", port_);
                arrived_[token] = std::move(u.sock);
            } else {
                RS_LOG(Info, "upgrade: a fabric connection with a token nobody waits for: closed");
                drop(*u.sock);
            }
            return true;
        }
        if (r == -EAGAIN || (r >= 0 && r < static_cast<ssize_t>(sizeof(buf)) && r != 0)) {
            if (now < u.deadlineMs)
                return false;
            RS_LOG(Info, "upgrade: a fabric connection sent no token in time: closed");
        }
        drop(*u.sock);
        return true;
    });
}

void UpgradeListener::addWaiter(int eventFd, std::vector<std::shared_ptr<Connection>> *registered)
{
    std::lock_guard<std::mutex> lock(mutex_);
    // Every socket in its switch registers the same connections: once a pass (a wait's
    // registrations, Waiters::addAll). With 1,000 sockets switching, each wait made a million
    // registrations, and the switches timed out.
    const uint64_t pass = Connection::HintPass::current();
    if (pass && pass == addPass_)
        return;
    for (auto &u : unread_)
        u.sock->addWaiter(eventFd, registered);
    waitedGen_ = acceptGen_;
    addPass_ = pass;
}

int UpgradeListener::prepareWait(std::vector<pollfd> *fds)
{
    std::lock_guard<std::mutex> lock(mutex_);
    // Every socket in its switch asks, and the fds are the same for all of them: in a poller's
    // pass they go into its list once. (Each socket's ask appended the listener and every
    // unread connection: with 1,000 sockets switching at once, a million entries, and ppoll
    // failed with EINVAL past RLIMIT_NOFILE, which redis's epoll_wait reported and died of.)
    const uint64_t pass = Connection::HintPass::current();
    if (pass && pass == waitPass_)
        return 0;
    // A connection queued or a token arrived since the last look, or one accepted after the
    // poller registered its wake-up (the progress thread may take its events and wake only
    // registered pollers): not a time to sleep.
    if (!arrived_.empty() || acceptGen_ != waitedGen_ ||
        listen_->prepareWait(fds, POLLIN) == -EAGAIN)
        return -EAGAIN;
    for (auto &u : unread_)
        if (u.sock->prepareWait(fds, POLLIN) == -EAGAIN)
            return -EAGAIN;
    waitPass_ = pass;
    return 0;
}

} // namespace rstream::shim
