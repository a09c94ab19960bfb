// SPDX-License-Identifier: MIT
// poll and select over engine sockets and kernel fds: spin, then sleep on wait fds.

#include "poller.h"
#include "poller_internal.h"

#include <cerrno>
#include <sched.h>

namespace rstream {

using namespace detail;

namespace detail {
thread_local ThreadWake tWake;
// poll and select's spin, learnt from this thread's earlier waits (an event loop's thread).
thread_local AdaptiveSpin tPollSpin;
thread_local int64_t tWakeByNs = 0;
[[maybe_unused]] const int gForkHandlers =
    pthread_atfork(nullptr, nullptr, [] { tWake.forgetAfterFork(); });
void HintCheck::add(Pollable &s)
{
    if (auto c = s.hintConnection()) {
        if (const int fd = c->hintFd(); fd >= 0) {
            conns_.push_back(std::move(c));
            fds_.push_back({fd, POLLIN, 0});
        }
    }
}

void HintCheck::appendTo(std::vector<pollfd> *fds) const
{
    fds->insert(fds->end(), fds_.begin(), fds_.end());
}

void HintCheck::apply(const pollfd *fds) const
{
    for (size_t i = 0; i < conns_.size(); i++)
        if (!fds[i].revents)
            conns_[i]->hintQuiet();
}

void HintCheck::clear()
{
    conns_.clear();
    fds_.clear();
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

int pollFds(pollfd *fds, nfds_t nfds, int timeoutMs, const sigset_t *mask, SocketResolver resolve,
            int spinUs)
{
    if (nfds > 0 && !fds)
        return -EFAULT;
    std::vector<std::shared_ptr<Pollable>> socks(nfds);
    std::vector<short> interest(nfds);
    std::vector<pollfd> kfds;
    std::vector<nfds_t> kidx;
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
        return ppollMs(fds, nfds, timeoutMs, mask);
    }
    const int64_t start = nowNs();
    const int64_t deadline = timeoutMs < 0 ? -1 : start + int64_t(timeoutMs) * 1000000;
    const int64_t capNs = int64_t(spinUs) * 1000;
    int64_t spinEnd = 0;
    bool missed = false;

    std::vector<pollfd> lookFds; // the kernel fds, then the hint fds
    HintCheck hints;
    auto check = [&]() -> int {
        int count = 0;
        Connection::HintPass pass;
        hints.clear();
        for (auto &s : socks)
            if (s)
                hints.add(*s);
        if (!kfds.empty() || !hints.empty()) {
            lookFds.assign(kfds.begin(), kfds.end());
            hints.appendTo(&lookFds);
            const timespec zero{0, 0};
            int r = sys::ppoll(lookFds.data(), lookFds.size(), &zero, nullptr);
            if (r < 0)
                return r;
            hints.apply(lookFds.data() + kfds.size());
            for (size_t k = 0; k < kfds.size(); k++) {
                fds[kidx[k]].revents = lookFds[k].revents;
                if (lookFds[k].revents)
                    count++;
            }
        }
        for (nfds_t i = 0; i < nfds; i++) {
            if (socks[i]) {
                fds[i].revents = static_cast<short>(socks[i]->pollEvents(fds[i].events));
                if (fds[i].revents)
                    count++;
            }
        }
        return count;
    };

    const int wakeFd = tWake.fd();
    if (wakeFd < 0)
        return -ENOMEM;
    std::vector<pollfd> sleepFds;
    for (;;) {
        int count = check();
        if (count != 0 || timeoutMs == 0) {
            if (count > 0 && missed)
                tPollSpin.record(nowNs() - start, capNs);
            return count;
        }
        int64_t now = nowNs();
        if (!missed) {
            missed = true;
            spinEnd = start + tPollSpin.windowNs(capNs);
        }
        if (deadline >= 0 && now >= deadline) {
            if (now - start > capNs)
                tPollSpin.record(now - start, capNs);
            return 0;
        }
        if (now < spinEnd) {
            sched_yield();
            continue;
        }
        // Register first, then look again, then arm: progress made by another thread after
        // the look writes the eventfd, progress still pending makes arming fail.
        Waiters waiters(wakeFd);
        for (auto &s : socks)
            if (s)
                waiters.add(*s);
        count = check();
        if (count != 0)
            return count;
        sleepFds.assign(kfds.begin(), kfds.end());
        sleepFds.push_back({wakeFd, POLLIN, 0});
        if (int r = armAndSleep(socks, interest, &sleepFds, deadline, mask, waiters); r < 0)
            return r;
    }
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
    std::vector<pollfd> pfds;
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
    const int64_t start = nowNs();
    int r = pollFds(pfds.data(), pfds.size(), timeoutMs, mask, resolve, spinUs);
    if (timeout) {
        int64_t left = int64_t(timeoutMs) * 1000000 - (nowNs() - start);
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
