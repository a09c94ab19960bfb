// SPDX-License-Identifier: MIT
// The light probe: whether anything listens on a destination's fabric port, learned with a
// kernel TCP connect instead of libfabric.
//
// Loading libfabric takes about 0.3 s (its provider libraries calibrate clocks in their
// constructors), so a connect that needs it first would make every short-lived client that
// much slower, most of all towards the many servers that do not run the shim. With the tcp
// provider a fabric listener is a kernel TCP listener on the fabric port, so before libfabric
// is loaded the shim asks the kernel: a refusal means no fabric listener (kernel TCP at once,
// libfabric never loaded); a connection means something listens, and the fabric attempt
// goes ahead as before (the probe closes without sending a byte, which the provider's
// listener drops as a connection that never asked for anything).

#include "hybrid.h"

#include <cerrno>
#include <poll.h>
#include <sys/timerfd.h>

#include "clock.h"
#include "fabric.h"
#include "hybrid_internal.h"
#include "shim.h"

namespace rstream::shim {

bool lightProbePossible()
{
    // Other providers (verbs) listen where a kernel connect cannot see them.
    return chooseProvider(Settings::fromEnv()) == "tcp";
}

bool lightProbeApplies()
{
    // Once libfabric is loaded the fabric attempt itself tells as quickly.
    return !fabricLoadDone() && lightProbePossible();
}

LightProbe::~LightProbe()
{
    if (fd >= 0)
        sys::close(fd);
    if (timerFd >= 0)
        sys::close(timerFd);
}

int LightProbe::start(const sockaddr *dest, socklen_t len, int timeoutMs)
{
    int s = sys::socket(dest->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0)
        return s;
    fd = moveHigh(s);
    deadlineMs = nowMs() + timeoutMs;
    int r = sys::connect(fd, dest, len);
    if (r == 0 || r == -EINPROGRESS)
        return 0;
    return r;
}

int LightProbe::status()
{
    pollfd p{fd, POLLOUT, 0};
    const timespec zero{0, 0};
    if (sys::ppoll(&p, 1, &zero, nullptr) <= 0)
        return nowMs() >= deadlineMs ? -ETIMEDOUT : -EINPROGRESS;
    int err = 0;
    socklen_t elen = sizeof(err);
    if (sys::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) < 0)
        return -EIO;
    return -err;
}

int LightProbe::waitFds(std::vector<pollfd> *fds)
{
    if (timerFd < 0) {
        // The deadline must wake a poller too: a destination that drops the SYN never
        // answers.
        timerFd = sys::timerfdCreate(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        if (timerFd >= 0) {
            timerFd = moveHigh(timerFd);
            const int64_t left = std::max<int64_t>(deadlineMs - nowMs(), 1);
            const itimerspec at{{0, 0}, {left / 1000, (left % 1000) * 1000000L}};
            timerfd_settime(timerFd, 0, &at, nullptr);
        }
    }
    fds->push_back({fd, POLLOUT, 0});
    if (timerFd >= 0)
        fds->push_back({timerFd, POLLIN, 0});
    else
        return -EAGAIN; // no timer: look again rather than sleep past the deadline
    return 0;
}

int LightProbe::run(const sockaddr *dest, socklen_t len, int timeoutMs)
{
    LightProbe p;
    if (int r = p.start(dest, len, timeoutMs); r < 0)
        return r;
    for (;;) {
        const int st = p.status();
        if (st != -EINPROGRESS)
            return st;
        const int64_t left = std::min<int64_t>(std::max<int64_t>(p.deadlineMs - nowMs(), 1), 100);
        pollfd pf{p.fd, POLLOUT, 0};
        const timespec ts{0, left * 1000000L};
        sys::ppoll(&pf, 1, &ts, nullptr);
    }
}

bool HybridSocket::waitProbe()
{
    std::vector<pollfd> fds;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!pending_ || !pending_->probe)
            return false;
        pending_->probe->waitFds(&fds);
    }
    const timespec tick{0, 100 * 1000000L};
    sys::ppoll(fds.data(), fds.size(), &tick, nullptr);
    return true;
}

} // namespace rstream::shim
