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
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>

#include "clock.h"
#include "fabric.h"
#include "hybrid_internal.h"
#include "poller.h"
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

// Looks for beacons through one socket, kept for the process: a refused connect and one that
// found a full backlog leave a UNIX socket unconnected, so a local connect's look costs one system
// call, not three (a socket of its own made and closed were two more per connection of a client
// that makes short ones). A look that finds the socket busy (another thread's look) makes one of
// its own, as before; so does a fork child whose parent's thread held the lock at the fork.
class BeaconLook
{
public:
    ~BeaconLook()
    {
        if (own_ >= 0)
            sys::close(own_);
        if (locked_)
            gMutex.unlock();
    }

    bool there(const std::string &addr)
    {
        sockaddr_un a;
        const socklen_t len = beaconName(addr, &a);
        for (int attempt = 0; attempt < 2; attempt++) {
            const int fd = socketFd();
            if (fd < 0)
                return false;
            // Connected, or a full backlog (nothing is ever accepted): there. ECONNREFUSED: not.
            const int r = sys::connect(fd, reinterpret_cast<sockaddr *>(&a), len);
            if (r == -ECONNREFUSED || r == -EAGAIN)
                return r == -EAGAIN;
            // Connected (the beacon's backlog had room) or in an unexpected state: not reused.
            drop(fd);
            if (r == 0 || r == -EINPROGRESS)
                return true;
        }
        return false;
    }

private:
    static inline std::mutex gMutex;
    static inline int gFd = -1;
    static inline ino_t gIno = 0;
    static inline uint64_t gForkGen = 0;

    int own_ = -1;
    bool locked_ = false;

    int socketFd()
    {
        if (!locked_ && own_ < 0)
            locked_ = gMutex.try_lock();
        if (!locked_) {
            if (own_ < 0)
                own_ = sys::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            return own_;
        }
        if (gFd >= 0 && gForkGen != forkGeneration()) {
            // A fork child's copy of its parent's socket: its own from now on (two processes
            // connecting one socket would race), closed only if the number is still that socket.
            closeIfOurs();
            gFd = -1;
        }
        if (gFd < 0) {
            const int s = sys::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            if (s < 0)
                return s;
            gFd = moveHigh(s);
            struct stat st;
            gIno = fstat(gFd, &st) == 0 ? st.st_ino : 0;
            gForkGen = forkGeneration();
        }
        return gFd;
    }

    void drop(int fd)
    {
        if (fd == own_) {
            sys::close(own_);
            own_ = -1;
            return;
        }
        // The program may have closed ours (close_range, a raw close) and reused the number.
        closeIfOurs();
        gFd = -1;
    }

    static void closeIfOurs()
    {
        struct stat st;
        if (gIno && fstat(gFd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == gIno)
            sys::close(gFd);
    }
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
    if (sys::bind(s, reinterpret_cast<sockaddr *>(&a), len) < 0 || sys::listen(s, 0) < 0) {
        sys::close(s);
        return -1;
    }
    // A look's connect is queued while the backlog has room, and a queued one connects the
    // client's socket, which then cannot look again. One connect of ours fills it (the queued
    // connection stays after its socket is closed), so that every look finds it full (EAGAIN)
    // and a client keeps one socket for all of its looks.
    if (const int fill = sys::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        fill >= 0) {
        (void)sys::connect(fill, reinterpret_cast<sockaddr *>(&a), len);
        sys::close(fill);
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
