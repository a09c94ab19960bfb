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
//
// The beacon: a shim listener also binds an abstract UNIX socket named after its address
// (never accepted from: a connect to it only shows that it exists). A client whose destination
// is an address of this host looks for it: when it is there, a shim listener serves that
// address, which is all the in-band upgrade needs to know, so the offer goes out with the
// kernel connect, without a fabric attempt and without libfabric. Abstract names live in the
// network namespace, as the addresses do; only the listener's process (and its fork children)
// hold it, and it goes with the listener.

#include "hybrid.h"

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <netinet/in.h>
#include <poll.h>
#include <set>
#include <string>
#include <sys/timerfd.h>
#include <sys/un.h>

#include "clock.h"
#include "fabric.h"
#include "hybrid_internal.h"
#include "shim.h"
#include "shimaddr.h"

namespace rstream::shim {

namespace {

// The beacon's abstract name for a listening address ("rstream/1.2.3.4:80", "rstream/[::]:80").
socklen_t beaconName(const std::string &addr, sockaddr_un *out)
{
    std::memset(out, 0, sizeof(*out));
    out->sun_family = AF_UNIX;
    const std::string name = "rstream/" + addr;
    const size_t n = std::min(name.size(), sizeof(out->sun_path) - 1);
    std::memcpy(out->sun_path + 1, name.data(), n); // sun_path[0] = 0: abstract
    return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

// Looks for beacons through one socket: a refused connect leaves a UNIX socket unconnected, so
// the second name (a wildcard listener's) costs one system call, not three.
class BeaconLook
{
public:
    ~BeaconLook()
    {
        if (fd_ >= 0)
            sys::close(fd_);
    }

    bool there(const std::string &addr)
    {
        if (fd_ < 0)
            fd_ = sys::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd_ < 0)
            return false;
        sockaddr_un a;
        const socklen_t len = beaconName(addr, &a);
        // Connected, or a full backlog (nothing is ever accepted): there. ECONNREFUSED: not.
        const int r = sys::connect(fd_, reinterpret_cast<sockaddr *>(&a), len);
        return r == 0 || r == -EAGAIN || r == -EINPROGRESS;
    }

private:
    int fd_ = -1;
};

} // namespace

// Whether addr is one of this host's (in this network namespace): loopback, or an address a
// socket can bind.
bool hostAddress(const sockaddr *addr)
{
    uint8_t bytes[16];
    const int family = addressBytes(addr, bytes);
    if (family == AF_INET && bytes[0] == 127)
        return true;
    static const uint8_t loop6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    if (family == AF_INET6 && std::memcmp(bytes, loop6, 16) == 0)
        return true;
    sockaddr_storage ss{};
    socklen_t len;
    if (family == AF_INET) {
        auto *in = reinterpret_cast<sockaddr_in *>(&ss);
        in->sin_family = AF_INET;
        std::memcpy(&in->sin_addr, bytes, 4);
        len = sizeof(sockaddr_in);
    } else {
        auto *in6 = reinterpret_cast<sockaddr_in6 *>(&ss);
        in6->sin6_family = AF_INET6;
        std::memcpy(&in6->sin6_addr, bytes, 16);
        if (addr->sa_family == AF_INET6)
            in6->sin6_scope_id = reinterpret_cast<const sockaddr_in6 *>(addr)->sin6_scope_id;
        len = sizeof(sockaddr_in6);
    }
    const int s = sys::socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return false;
    const int r = sys::bind(s, reinterpret_cast<sockaddr *>(&ss), len);
    sys::close(s);
    return r == 0;
}

namespace {

// The beacons of this process's own listeners: connects to those are answered over the fabric
// directly (a listener takes its own process's fabric connects), no upgrade needed.
std::mutex gOwnMutex;
std::set<std::string> *gOwn = new std::set<std::string>();

bool ownBeacon(const std::string &addr)
{
    std::lock_guard<std::mutex> lock(gOwnMutex);
    return gOwn->count(addr) != 0;
}

} // namespace

void closeBeacon(int fd, const sockaddr *local)
{
    if (fd < 0)
        return;
    {
        std::lock_guard<std::mutex> lock(gOwnMutex);
        gOwn->erase(describe(local));
    }
    sys::close(fd);
}

int openBeacon(const sockaddr *local)
{
    sockaddr_un a;
    const std::string addr = describe(local);
    const socklen_t len = beaconName(addr, &a);
    int s = sys::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    s = moveHigh(s);
    // Taken: another process's listener on the same address (SO_REUSEPORT), a shim one too.
    if (sys::bind(s, reinterpret_cast<sockaddr *>(&a), len) < 0 || sys::listen(s, 1) < 0) {
        sys::close(s);
        return -1;
    }
    std::lock_guard<std::mutex> lock(gOwnMutex);
    gOwn->insert(addr);
    return s;
}

bool shimListenerHere(const sockaddr *dest)
{
    if (!hostAddress(dest))
        return false;
    // The destination's own address, then the wildcard address of its family.
    uint8_t bytes[16];
    const std::string names[] = {describe(dest),
                                 (addressBytes(dest, bytes) == AF_INET ? "0.0.0.0:" : "[::]:") +
                                     std::to_string(addressPort(dest))};
    BeaconLook look;
    for (const std::string &n : names) {
        if (ownBeacon(n))
            return false; // our own listener: the fabric directly
        if (look.there(n))
            return true;
    }
    return false;
}

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
