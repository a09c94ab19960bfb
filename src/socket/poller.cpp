// SPDX-License-Identifier: MIT
// poll and select over engine sockets and kernel fds: spin, then sleep on wait fds.

#include "poller.h"
#include "hint_pass.h"
#include "poller_internal.h"
#include "signals_held.h"

#include <cerrno>
#include <sched.h>

namespace rstream {

using namespace detail;

namespace detail {
thread_local ThreadWake tWake;
// poll and select's spin, learnt from this thread's earlier waits (an event loop's thread).
thread_local AdaptiveSpin tPollSpin;
thread_local int64_t tWakeByNs = 0;

namespace {
// poll's and select's working vectors, kept by each thread between calls: a call that finds
// something ready at once allocates nothing. A call made while the thread's are in use (a
// signal handler's poll inside the program's) works on vectors of its own. Reached through a
// plain pointer and freed by a pthread key's destructor, as ThreadWake (no thread_local with
// a destructor: its registration takes the dynamic loader's lock).
struct PollScratch
{
    std::vector<std::shared_ptr<Pollable>> socks;
    std::vector<short> interest;
    std::vector<pollfd> kfds, lookFds, sleepFds, selectFds;
    std::vector<nfds_t> kidx;
    std::vector<WatchLook> looks; // what each socket's last look saw of its connection
    std::vector<int> fired;       // wait fds the last sleep saw readable
    HintCheck hints;
    bool pollBusy = false, selectBusy = false;
};
thread_local PollScratch *tScratch = nullptr;

PollScratch *threadScratch()
{
    static pthread_key_t key;
    static const bool keyed =
        pthread_key_create(&key, [](void *p) { delete static_cast<PollScratch *>(p); }) == 0;
    if (!tScratch && keyed) {
        tScratch = new (std::nothrow) PollScratch;
        if (tScratch)
            pthread_setspecific(key, tScratch);
    }
    return tScratch;
}

// The thread's scratch while this lasts, or one of its own when that is in use (busy).
class ScratchLease
{
public:
    explicit ScratchLease(bool PollScratch::*busy) : busy_(busy)
    {
        PollScratch *s = threadScratch();
        if (s && !(s->*busy_)) {
            s->*busy_ = true;
            s_ = s;
        } else {
            own_ = std::make_unique<PollScratch>();
            s_ = own_.get();
        }
    }
    ~ScratchLease()
    {
        if (own_)
            return;
        // The sockets are let go now, the memory kept.
        s_->socks.clear();
        s_->hints.clear();
        s_->*busy_ = false;
    }
    ScratchLease(const ScratchLease &) = delete;
    ScratchLease &operator=(const ScratchLease &) = delete;
    PollScratch &operator*() { return *s_; }

private:
    bool PollScratch::*busy_;
    PollScratch *s_ = nullptr;
    std::unique_ptr<PollScratch> own_;
};
} // namespace
[[maybe_unused]] const int gForkHandlers =
    pthread_atfork(nullptr, nullptr, [] { tWake.forgetAfterFork(); });
void HintCheck::add(Pollable &s, const std::vector<int> &fired)
{
    if (auto c = s.passHintConnection()) {
        if (const int fd = c->passHintFd();
            fd >= 0 && std::find(fired.begin(), fired.end(), fd) == fired.end()) {
            conns_.push_back(std::move(c));
            fds_.push_back({fd, POLLIN, 0});
        }
    }
    const size_t at = lookFds_.size();
    if (const int n = s.lookFds(&lookFds_); n > 0) {
        looks_.emplace_back(&s, at); // the caller holds s for the pass
        epollLook_ = n == 1 && s.lookIsEpoll();
    }
}

void HintCheck::appendTo(std::vector<pollfd> *fds) const
{
    fds->insert(fds->end(), fds_.begin(), fds_.end());
    fds->insert(fds->end(), lookFds_.begin(), lookFds_.end());
}

void HintCheck::apply(const pollfd *fds) const
{
    for (size_t i = 0; i < conns_.size(); i++)
        if (!fds[i].revents)
            conns_[i]->hintQuiet();
    for (auto &[s, at] : looks_)
        s->lookResults(fds + conns_.size() + at);
}

void HintCheck::applySkipped() const
{
    for (auto &look : looks_)
        look.first->lookResults(nullptr);
}

void HintCheck::applyQuiet() const
{
    for (auto &c : conns_)
        c->hintQuiet();
}

void HintCheck::clear()
{
    conns_.clear();
    fds_.clear();
    looks_.clear();
    lookFds_.clear();
    epollLook_ = false;
}
} // namespace detail

void pollWakeBy(int64_t ns)
{
    if (ns > 0 && (tWakeByNs == 0 || ns < tWakeByNs))
        tWakeByNs = ns;
}

int64_t takePollWakeBy()
{
    const int64_t ns = tWakeByNs;
    tWakeByNs = 0;
    return ns;
}

namespace {
// pollFds; *startNs: when its first look found nothing (0: answered at once).
int pollAt(pollfd *fds, nfds_t nfds, int timeoutMs, const sigset_t *mask, SocketResolver resolve,
           int spinUs, int64_t *startNs)
{
    if (nfds > 0 && !fds)
        return -EFAULT;
    ScratchLease lease(&PollScratch::pollBusy);
    PollScratch &sc = *lease;
    const LooksWithoutSleep noSleep(timeoutMs == 0);
    auto &socks = sc.socks;
    auto &interest = sc.interest;
    auto &kfds = sc.kfds;
    auto &kidx = sc.kidx;
    socks.assign(nfds, nullptr);
    interest.assign(nfds, 0);
    kfds.clear();
    kidx.clear();
    bool any = false;
    for (nfds_t i = 0; i < nfds; i++) {
        fds[i].revents = 0;
        if (fds[i].fd >= 0)
            socks[i] = resolve(fds[i].fd);
        if (socks[i]) {
            any = true;
            interest[i] = fds[i].events;
        } else if (fds[i].fd >= 0) {
            kfds.push_back(fds[i]);
            kidx.push_back(i);
        }
    }
    if (!any) {
        if (timeoutMs != 0)
            *startNs = nowNs(); // it may sleep: select's timeout counts down
        return ppollMs(fds, nfds, timeoutMs, mask);
    }
    // The clock is read only once the first look finds nothing: a call answered at once (an
    // event loop's usual case) needs no time, and its timeout counts from then.
    int64_t start = 0, deadline = -1;
    // Only a wait on an engine connection spins (as epoll's, EpollSet::wait()).
    int64_t capNs = int64_t(spinUs) * 1000;
    int64_t spinEnd = 0;
    bool missed = false, roomWait = false;
    SignalsHeld held;

    auto &lookFds = sc.lookFds; // the kernel fds, then the hint fds
    auto &hints = sc.hints;
    auto &looks = sc.looks;
    auto &fired = sc.fired;
    fired.clear();
    // The first look of a call that may sleep, when only connections are to be checked: the
    // check of their armed wait fds is left to the sleep (it ends at once on one that is
    // readable, and the look after it makes progress there). The ppoll before it found nothing
    // at almost every request of a client that sends and then polls for the answer. A look
    // that finds something ready is made again with the check: poll reports all that is.
    bool sleepChecks = timeoutMs != 0 && kfds.empty();
    bool leftToSleep = false; // the last check took the hint fds for quiet without asking
    auto lookAt = [&](nfds_t i) -> int {
        Connection::clearLook();
        fds[i].revents = static_cast<short>(socks[i]->pollEvents(fds[i].events));
        looks[i] = Connection::lastLook();
        return fds[i].revents ? 1 : 0;
    };
    auto check = [&]() -> int {
        int count = 0;
        leftToSleep = false;
        Connection::HintPass pass;
        hints.clear();
        for (auto &s : socks)
            if (s)
                hints.add(*s, fired);
        fired.clear();
        looks.assign(nfds, WatchLook{nullptr, 0});
        // A listener's look epoll is all there is to check (a select() loop's usual set): the
        // others are looked at first, and where one is ready the listener's look may be left
        // out (Pollable::lookCanWait).
        Pollable *sole = kfds.empty() && hints.singleEpoll() ? hints.soleLook() : nullptr;
        if (sole)
            for (nfds_t i = 0; i < nfds; i++)
                if (socks[i] && socks[i].get() != sole)
                    count += lookAt(i);
        if (sole && count > 0 && sole->lookCanWait(nowNs())) {
            hints.applySkipped();
        } else if (sleepChecks && hints.onlyConnections()) {
            hints.applyQuiet();
            leftToSleep = true;
        } else if (!kfds.empty() || !hints.empty()) {
            lookFds.assign(kfds.begin(), kfds.end());
            hints.appendTo(&lookFds);
            int r;
            if (kfds.empty() && hints.singleEpoll()) {
                // One listener among engine connections (a select() loop's usual set): an
                // epoll_wait that takes nothing costs a third of a ppoll on its fds.
                epoll_event ev;
                r = sys::epollWait(lookFds[0].fd, &ev, 1, 0);
                lookFds[0].revents = r > 0 ? POLLIN : 0;
            } else {
                const timespec zero{0, 0};
                r = sys::ppoll(lookFds.data(), lookFds.size(), &zero, nullptr);
            }
            if (r < 0)
                return r;
            hints.apply(lookFds.data() + kfds.size());
            for (size_t k = 0; k < kfds.size(); k++) {
                fds[kidx[k]].revents = lookFds[k].revents;
                if (lookFds[k].revents)
                    count++;
            }
        }
        for (nfds_t i = 0; i < nfds; i++)
            if (socks[i] && (!sole || socks[i].get() == sole))
                count += lookAt(i);
        return count;
    };

    const int wakeFd = tWake.fd();
    if (wakeFd < 0)
        return -ENOMEM;
    auto &sleepFds = sc.sleepFds;
    for (;;) {
        int count = check();
        // It returns now: every fd as it is. A first check that asked the kernel (a listener's
        // look fds beside the connections) already did: a select() loop over a busy fabric
        // connection and its listener made two ppoll calls a call.
        if (leftToSleep && count != 0)
            count = (sleepChecks = false, check());
        sleepChecks = false; // the looks after the first check the fds (a spin's, a sleep's)
        if (count != 0 || timeoutMs == 0) {
            if (count > 0 && missed && !roomWait)
                tPollSpin.record(nowNs() - start, capNs, spinEnd - start);
            return count;
        }
        int64_t now = nowNs();
        if (!missed) {
            missed = true;
            start = *startNs = now;
            deadline = timeoutMs < 0 ? -1 : start + int64_t(timeoutMs) * 1000000;
            // A wait that includes room to write (an engine socket asked for POLLOUT has not a
            // third of its ring free) spins the whole cap if its peer reads fast enough to
            // run dry during a sleep's wake-up, and not at all if not (RoomRate): room comes
            // as the peer reads, a little at a time, and a spin that caught each piece burnt a
            // CPU for writes no larger. It does not teach the window of the waits for data.
            bool slowRoom = false, engine = false;
            for (nfds_t i = 0; i < nfds; i++) {
                if (socks[i] && (interest[i] & POLLOUT)) {
                    roomWait = true;
                    slowRoom = slowRoom || !socks[i]->roomSoon();
                }
                engine = engine || (socks[i] && socks[i]->hintConnection());
            }
            if (!engine)
                capNs = 0;
            spinEnd = start + (slowRoom ? 0 : roomWait ? capNs : tPollSpin.windowNs(capNs));
            held.hold();
        }
        if (deadline >= 0 && now >= deadline) {
            if (now - start > capNs && !roomWait)
                tPollSpin.record(now - start, capNs, spinEnd - start);
            return 0;
        }
        if (now < spinEnd) {
            sched_yield();
            continue;
        }
        // Register first, then look again, then arm: progress made by another thread after
        // the look writes the eventfd, progress still pending makes arming fail.
        Waiters waiters(wakeFd);
        waiters.addAll(socks);
        // A look again only if a connection holds the eventfd and changed since the last look
        // (or was not looked at in it): its progress since would wake nobody. Without, the
        // sleep's fds show what came since, and an arm that finds something ends the sleep
        // before it begins.
        if (waiters.changedSince(looks)) {
            count = check();
            if (count != 0)
                return count;
        }
        sleepFds.assign(kfds.begin(), kfds.end());
        sleepFds.push_back({wakeFd, POLLIN, 0});
        if (int r = held.beginSleep(wakeFd); r < 0)
            return r;
        const sigset_t *sleepMask = held.sleepMask(mask);
        const int r = armAndSleep(socks, interest, &sleepFds, deadline, sleepMask, waiters);
        if (held.endSleep())
            return -EINTR;
        if (r < 0)
            return r;
        // The wait fds the sleep saw readable: their looks make progress without a check.
        for (size_t k = kfds.size() + 1; k < sleepFds.size(); k++)
            if (sleepFds[k].revents & POLLIN)
                fired.push_back(sleepFds[k].fd);
    }
}
} // namespace

int pollFds(pollfd *fds, nfds_t nfds, int timeoutMs, const sigset_t *mask, SocketResolver resolve,
            int spinUs)
{
    int64_t start = 0;
    return pollAt(fds, nfds, timeoutMs, mask, resolve, spinUs, &start);
}

int selectFds(int nfds, fd_set *readfds, fd_set *writefds, fd_set *exceptfds, timeval *timeout,
              const sigset_t *mask, SocketResolver resolve, int spinUs)
{
    if (nfds < 0 || nfds > FD_SETSIZE)
        return -EINVAL;
    int timeoutMs = -1;
    if (timeout) {
        if (timeout->tv_sec < 0 || timeout->tv_usec < 0)
            return -EINVAL;
        long long ms =
            static_cast<long long>(timeout->tv_sec) * 1000 + (timeout->tv_usec + 999) / 1000;
        timeoutMs = static_cast<int>(std::min<long long>(ms, 1 << 30));
    }
    ScratchLease lease(&PollScratch::selectBusy);
    std::vector<pollfd> &pfds = (*lease).selectFds;
    pfds.clear();
    for (int fd = 0; fd < nfds; fd++) {
        short ev = 0;
        if (readfds && FD_ISSET(fd, readfds))
            ev |= POLLIN;
        if (writefds && FD_ISSET(fd, writefds))
            ev |= POLLOUT;
        if (exceptfds && FD_ISSET(fd, exceptfds))
            ev |= POLLPRI;
        if (ev)
            pfds.push_back({fd, ev, 0});
    }
    int64_t start = 0;
    int r = pollAt(pfds.data(), pfds.size(), timeoutMs, mask, resolve, spinUs, &start);
    if (timeout) {
        // Answered at once: the time taken is within a look, well below the microseconds the
        // kernel's own answer takes.
        int64_t left = int64_t(timeoutMs) * 1000000 - (start ? nowNs() - start : 0);
        if (left < 0 || r > 0)
            left = std::max<int64_t>(left, 0);
        timeout->tv_sec = left / 1000000000;
        timeout->tv_usec = (left % 1000000000) / 1000;
    }
    if (r < 0)
        return r;
    for (auto &p : pfds)
        if (p.revents & POLLNVAL)
            return -EBADF;
    if (readfds)
        FD_ZERO(readfds);
    if (writefds)
        FD_ZERO(writefds);
    if (exceptfds)
        FD_ZERO(exceptfds);
    int count = 0;
    for (auto &p : pfds) {
        // As the kernel's select: readable includes hang-up and error, writable includes error.
        if ((p.events & POLLIN) && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
            FD_SET(p.fd, readfds);
            count++;
        }
        if ((p.events & POLLOUT) && (p.revents & (POLLOUT | POLLERR))) {
            FD_SET(p.fd, writefds);
            count++;
        }
        if ((p.events & POLLPRI) && (p.revents & POLLPRI)) {
            FD_SET(p.fd, exceptfds);
            count++;
        }
    }
    return count;
}

} // namespace rstream
