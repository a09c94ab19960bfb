// SPDX-License-Identifier: MIT
// The shim's sockets as poll, select and epoll see them: readiness, the fds to sleep on, and
// the connection whose readiness hint a poller checks.

#include "hybrid.h"

#include <poll.h>
#include <time.h>

#include "fabric.h"
#include "hybrid_internal.h"
#include "kernel.h"
#include "upgrade.h"

namespace rstream::shim {

int HybridSocket::kernelPollNow(int events)
{
    // In a pass whose one system call looked at the fd (lookFds): its answer, once.
    if (const uint64_t pass = Connection::HintPass::current()) {
        uint64_t look = kernelLook_.load(std::memory_order_relaxed);
        if (look >> 20 == pass && (look & kLookDone) &&
            kernelLook_.compare_exchange_strong(look, 0, std::memory_order_relaxed))
            return int(look & 0xffff) & (events | POLLERR | POLLHUP | POLLNVAL);
    }
    pollfd p{fd_, static_cast<short>(events), 0};
    const timespec zero{0, 0};
    int r = sys::ppoll(&p, 1, &zero, nullptr);
    return r > 0 ? p.revents : 0;
}

int HybridSocket::listenerPollEvents(Socket *s, int events)
{
    // In a hint pass the kernel fd was checked with the others (lookResults()).
    const uint64_t pass = Connection::HintPass::current();
    const uint64_t look = listenLook_.load(std::memory_order_relaxed);
    int rev = pass && look >> 24 == pass && (look & kLookDone) ? int(look & 0xffff)
                                                               : kernelPollNow(POLLIN);
    if (s)
        rev |= s->pollEvents(POLLIN);
    return rev & (events | POLLERR | POLLHUP);
}

int HybridSocket::pollEvents(int events)
{
    if (Socket *f = fixedSocket()) {
        if (switchedUnseen_.load(std::memory_order_relaxed))
            switchedUnseen_.store(false, std::memory_order_relaxed);
        return f->pollEvents(events);
    }
    if (Socket *l = fixedListen_.load(std::memory_order_acquire))
        return listenerPollEvents(l, events);
    settle();
    switchedUnseen_.store(false, std::memory_order_relaxed);
    if (upgradePending()) {
        // Waiting for the peer's first bytes: a look at the fd tells whether any came (no peek
        // at a connection that has nothing).
        const Upgrade u = upgrade_.load();
        if (u == Upgrade::Maybe || u == Upgrade::Answer)
            return firstBytesPollEvents(u, events);
        upgradeProgress(events);
        const Upgrade v = upgrade_.load();
        if (v == Upgrade::Maybe || v == Upgrade::Answer)
            return firstBytesPollEvents(v, events);
    }
    if (late())
        return latePollEvents(events);
    auto [s, m] = snapshot();
    switch (m) {
    case Mode::Fabric: {
        if (!s)
            return 0; // connecting, waiting for libfabric
        const int rev = s->pollEvents(events);
        // A background fabric attempt that failed since settle() looked (refused: nothing
        // there, or a listener that defers) is no error of the program's connection: the
        // kernel connect takes over, so settle again and answer for that.
        if ((rev & (POLLERR | POLLHUP)) && tentative_.load(std::memory_order_acquire)) {
            settle();
            if (!tentative_.load(std::memory_order_acquire) && mode() != Mode::Fabric)
                return pollEvents(events);
        }
        return rev;
    }
    case Mode::Listener:
        return listenerPollEvents(s.get(), events);
    case Mode::Inherited:
        return POLLERR | POLLHUP;
    default:
        return kernelPollNow(events);
    }
}

int HybridSocket::prepareWait(std::vector<pollfd> *fds, int events)
{
    if (Socket *f = fixedSocket()) {
        if (switchedUnseen_.exchange(false, std::memory_order_acq_rel))
            return -EAGAIN;
        return f->prepareWait(fds, events);
    }
    settle();
    if (late())
        return lateWaitFds(fds, events);
    auto [s, m] = snapshot();
    switch (m) {
    case Mode::Fabric:
        if (switchedUnseen_.exchange(false, std::memory_order_acq_rel))
            return -EAGAIN;
        if (!s) {
            {
                // The light probe's answer or deadline wakes the poller.
                std::lock_guard<std::mutex> lock(mutex_);
                if (pending_ && pending_->probe)
                    return pending_->probe->waitFds(fds);
            }
            // Waiting for libfabric to load: the load's eventfd wakes the poller, which looks
            // again (and the attempt starts then).
            const int loadFd = fabricLoadFd();
            if (loadFd < 0)
                return -EAGAIN;
            fds->push_back({loadFd, POLLIN, 0});
            return 0;
        }
        return s->prepareWait(fds, events);
    case Mode::Listener:
        fds->push_back({fd_, POLLIN, 0});
        return s ? s->prepareWait(fds, POLLIN) : 0;
    case Mode::Inherited:
        return 0;
    default:
        // A client that waits to read sends its HELLO once its connect is done (a look then).
        if (upgrade_.load() == Upgrade::Offer && (events & POLLIN))
            events |= POLLOUT;
        fds->push_back({fd_, static_cast<short>(events), 0});
        return 0;
    }
}

void HybridSocket::addWaiter(int eventFd, std::vector<std::shared_ptr<Connection>> *registered)
{
    if (Socket *f = fixedSocket()) {
        f->addWaiter(eventFd, registered);
        return;
    }
    settle();
    if (upgradePending()) {
        upgradeAddWaiter(eventFd, registered);
        return;
    }
    std::shared_ptr<Socket> s = socket();
    Mode m = mode();
    if (s && (m == Mode::Fabric || m == Mode::Listener))
        s->addWaiter(eventFd, registered);
}

std::shared_ptr<Connection> HybridSocket::hintConnection()
{
    // Only a settled fabric socket: in the upgrade's steps (late ones included) looks go to the
    // kernel fd too, and make progress as they always did.
    Socket *f = fixedSocket();
    return f ? f->hintConnection() : nullptr;
}

uint64_t HybridSocket::generation(int events)
{
    if (Socket *f = fixedSocket())
        return f->generation(events);
    std::shared_ptr<Socket> s = socket();
    // Not while a late switch finishes (late()): readiness comes from the kernel connection's
    // last bytes then, and bytes already in the engine connection become readable only when
    // it ends. Their edge is the first look after it (the engine's count differs from the
    // kernel-backed one); counted from the engine during the switch, data that had arrived
    // (and was counted) meanwhile would never be reported to EPOLLET. Same-host links count
    // only what a look sees, so nothing else would move the count on.
    if (mode() == Mode::Fabric && s && !late())
        return s->generation(events);
    // Kernel-backed readiness has no event count: every look counts as new (EPOLLET acts as
    // level-triggered there, which costs a spurious wake-up, never a lost one).
    // Tagged, so that no value of it equals an engine connection's count: the first look after
    // a switch must differ from the last look before it.
    return (uint64_t(1) << 63) | kernelGen_.fetch_add(1, std::memory_order_relaxed);
}

std::shared_ptr<Connection> HybridSocket::passHintConnection()
{
    Socket *f = fixedSocket();
    return f ? f->passHintConnection() : nullptr;
}

int HybridSocket::lookFds(std::vector<pollfd> *fds)
{
    return lookFdsAs(fds, true);
}

int HybridSocket::lookFdsEach(std::vector<pollfd> *fds)
{
    return lookFdsAs(fds, false);
}

int HybridSocket::lookFdsAs(std::vector<pollfd> *fds, bool epoll)
{
    const uint64_t pass = Connection::HintPass::current();
    if (!pass)
        return 0;
    if (upgradePending() || late()) {
        // Woken by its fd in the sleep that ended the pass before this one on this thread: what
        // the sleep saw is the look (the peek after it reads the bytes), a ppoll less.
        if (const uint64_t slept = sleepLook_.exchange(0, std::memory_order_relaxed);
            slept && slept >> 20 == Connection::HintPass::previous() && waitingFirstBytes()) {
            kernelLook_.store(pass << 20 | kLookDone | (slept & 0xffff), std::memory_order_relaxed);
            return 0;
        }
        fds->push_back({fd_, kKernelLookEvents, 0});
        kernelLook_.store(pass << 20, std::memory_order_relaxed);
        return 1;
    }
    if (mode() != Mode::Listener)
        return 0;
    if (Socket *l = epoll ? fixedListen_.load(std::memory_order_acquire) : nullptr) {
        if (const int ep = lookEp_.load(std::memory_order_acquire); ep >= 0) {
            // The engine socket arms its hint (or not) as for a look of its own fds; the one
            // fd stands for them and the kernel fd.
            const int n = l->lookFds(nullptr);
            fds->push_back({ep, POLLIN, 0});
            listenLook_.store(pass << 24 | uint64_t(n) << 20 | kLookEpoll,
                              std::memory_order_relaxed);
            return 1;
        }
    }
    auto [s, m] = snapshot();
    if (m != Mode::Listener)
        return 0;
    fds->push_back({fd_, POLLIN, 0});
    const int n = s ? s->lookFds(fds) : 0;
    listenLook_.store(pass << 24 | uint64_t(n) << 20, std::memory_order_relaxed);
    return 1 + n;
}

void HybridSocket::lookResults(const pollfd *fds)
{
    const uint64_t pass = Connection::HintPass::current();
    if (uint64_t k = kernelLook_.load(std::memory_order_relaxed); fds && k == pass << 20) {
        kernelLook_.compare_exchange_strong(k, k | kLookDone | uint16_t(fds[0].revents),
                                            std::memory_order_relaxed);
        return;
    }
    uint64_t look = listenLook_.load(std::memory_order_relaxed);
    if (look >> 24 != pass || (look & kLookDone))
        return; // another thread's pass took the word: this look asks the kernel itself
    const int n = int(look >> 20 & 0xf);
    if (look & kLookEpoll) {
        // Something is ready: the looks ask each fd themselves (a connection to accept is
        // rare beside the data a loop waits for). Nothing: all three are quiet. Left out (no
        // fds, lookCanWait()): as quiet as the look before, which keeps its time.
        if (fds && fds[0].revents)
            return;
        if (fds)
            quietLookNs_.store(nowNs(), std::memory_order_relaxed);
        if (Socket *l = fixedListen_.load(std::memory_order_acquire); l && n > 0) {
            const pollfd quiet[2] = {};
            l->lookResults(quiet);
        }
        listenLook_.compare_exchange_strong(look, look | kLookDone, std::memory_order_relaxed);
        return;
    }
    if (!fds)
        return; // not left out (only a look epoll is): this look asks the kernel itself
    if (n > 0)
        if (auto s = socket())
            s->lookResults(fds + 1);
    listenLook_.compare_exchange_strong(look, look | kLookDone | uint16_t(fds[0].revents),
                                        std::memory_order_relaxed);
}

bool HybridSocket::lookIsEpoll()
{
    const uint64_t look = listenLook_.load(std::memory_order_relaxed);
    return (look & kLookEpoll) && look >> 24 == Connection::HintPass::current();
}

bool HybridSocket::lookCanWait(int64_t now)
{
    const int64_t at = quietLookNs_.load(std::memory_order_relaxed);
    return at && now - at < kQuietLookNs && lookIsEpoll();
}

void HybridSocket::sleepResults(const pollfd *fds, int n)
{
    // Only a sleep on the kernel fd alone, for the events a look after it would report (a look
    // asks for POLLOUT too, which a sleep that waits to read does not: it would end at once).
    const uint64_t pass = Connection::HintPass::current();
    if (!pass || n != 1 || fds[0].fd != fd_ || (fds[0].events & POLLOUT) || !fds[0].revents ||
        !waitingFirstBytes())
        return;
    sleepLook_.store(pass << 20 | uint16_t(fds[0].revents), std::memory_order_relaxed);
}

int HybridSocket::parkFds(std::vector<pollfd> *fds)
{
    if (upgradePending() || late())
        return -ENOTSUP;
    auto [s, m] = snapshot();
    if (m != Mode::Listener || !s)
        return -ENOTSUP;
    fds->push_back({fd_, POLLIN, 0});
    return s->parkFds(fds);
}

int HybridSocket::kernelFd()
{
    return mode() == Mode::Kernel && !upgradePending() ? fd_ : -1;
}

bool HybridSocket::roomSoon()
{
    // After a switch the writes go to its connection (latePollEvents asks it for POLLOUT).
    if (upgrade_.load(std::memory_order_acquire) == Upgrade::LateSwitch)
        return upSock_->roomSoon();
    if (Socket *f = fixedSocket())
        return f->roomSoon();
    auto [s, m] = snapshot();
    return s && m == Mode::Fabric ? s->roomSoon() : true;
}

int HybridSocket::latePollEvents(int events)
{
    const Upgrade u = upgrade_.load();
    const int mask = events | POLLERR | POLLHUP;
    if (u == Upgrade::LateSwitch && lateTargetKnown_ && lateRead_ >= lateTarget_)
        return upSock_->pollEvents(events) & mask; // the kernel part is read: the fabric alone
    // Readable means a read does not say EAGAIN (programs such as wrk take that for an error):
    // the end of the kernel connection that may be the peer's switch is not readable until the
    // count says what it is (the count's arrival on the fabric wakes the poller).
    int rev = kernelPollNow(events | POLLRDHUP);
    if (u == Upgrade::LateSwitch) {
        // We have shut down our kernel side (POLLHUP) and write on the fabric.
        rev &= POLLIN | POLLRDHUP | POLLERR;
        if (events & POLLOUT)
            rev |= upSock_->pollEvents(POLLOUT) & (POLLOUT | POLLERR | POLLHUP);
    }
    if ((rev & (POLLRDHUP | POLLHUP)) && lateEndMayBeSwitch(u)) {
        rev &= ~(POLLRDHUP | POLLHUP);
        if (lateKernelAtEnd())
            rev &= ~POLLIN;
    }
    return rev & mask;
}

int HybridSocket::lateWaitFds(std::vector<pollfd> *fds, int events)
{
    std::unique_lock<std::mutex> lock(upgradeMutex_, std::try_to_lock);
    if (!lock.owns_lock())
        return -EAGAIN;
    const Upgrade u = upgrade_.load();
    int r = 0;
    switch (u) {
    case Upgrade::Answer:
        fds->push_back({fd_, static_cast<short>(events), 0});
        break;
    case Upgrade::LateLoad: {
        fds->push_back({fd_, static_cast<short>(events), 0});
        const int loadFd = fabricLoadFd();
        if (loadFd >= 0) {
            fds->push_back({loadFd, POLLIN, 0});
        } else if (fabricReady()) {
            return -EAGAIN; // ready: the next look connects
        } else {
            // The load starts once the connection has lasted kLoadDelayMs (lateStepLocked):
            // the poller looks again then, whatever else it waits for.
            const int64_t due = lateSinceMs_ + kLoadDelayMs;
            if (nowMs() >= due)
                return -EAGAIN;
            pollWakeBy(due * 1000000);
        }
        break;
    }
    case Upgrade::LateConnect:
        fds->push_back({fd_, static_cast<short>(events), 0});
        r = upSock_->prepareWait(fds, POLLOUT);
        break;
    case Upgrade::LateToken: {
        // A kernel end already met waits for the count on the fabric, not on the kernel fd
        // (which would stay readable and spin the poller).
        const int kev = lateKernelEnd_.load() ? (events & ~POLLIN) : events;
        if (kev)
            fds->push_back({fd_, static_cast<short>(kev), 0});
        r = upSock_->prepareWait(fds, POLLIN);
        break;
    }
    case Upgrade::LateServer:
        fds->push_back({fd_, static_cast<short>(events), 0});
        if (acceptOwed_.load(std::memory_order_acquire))
            break; // no token before the ACCEPT; a look sends it once due
        if (pendingUl_) {
            r = pendingUl_->prepareWait(fds);
            if (r == 0)
                r = linkWaitFdsLocked(fds);
        } else if (upSock_)
            fds->push_back({fd_, POLLOUT, 0}); // claimed, a write under way: when it ends
        break;
    case Upgrade::LateSwitch:
        if (!lateTargetKnown_ || (events & POLLOUT) || lateRead_ >= lateTarget_)
            r = upSock_->prepareWait(fds, static_cast<int>(events | POLLIN));
        if ((!lateTargetKnown_ || lateRead_ < lateTarget_) &&
            !(lateKernelEnd_.load() && lateEndMayBeSwitch(u)))
            fds->push_back({fd_, POLLIN, 0});
        break;
    default:
        return -EAGAIN;
    }
    return r;
}

} // namespace rstream::shim
