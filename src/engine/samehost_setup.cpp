// SPDX-License-Identifier: MIT
// Same-host setup: the host key, the process's inbox, and the hand-over of a link's region.

#include "samehost_setup.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <iterator>
#include <mutex>
#include <poll.h>
#include <pthread.h>
#include <string>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <vector>

#include "clock.h"
#include "fabric.h"
#include "kernel.h"
#include "log.h"

namespace rstream {

namespace {

uint32_t fnv(uint32_t h, const void *data, size_t len)
{
    const auto *p = static_cast<const uint8_t *>(data);
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

// The address of the abstract socket name (without its leading NUL), or 0 when it does not fit.
socklen_t abstractAddress(const std::string &name, sockaddr_un *a)
{
    std::memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    if (name.empty() || name.size() + 1 > sizeof(a->sun_path))
        return 0;
    std::memcpy(a->sun_path + 1, name.data(), name.size());
    return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

std::string inboxName(uint32_t id)
{
    char buf[32];
    std::snprintf(buf, sizeof(buf), "rstream-inbox-%08x", id);
    return buf;
}

// Abstract: no file to leave behind or to guard, and only the network namespace sees it.
socklen_t inboxAddress(uint32_t id, sockaddr_un *a)
{
    return abstractAddress(inboxName(id), a);
}

// What arrived at the inbox and is not collected yet: a socket whose token and fds were read
// (memfd >= 0; the socket is closed then), or one accepted before its sender wrote them.
struct Arrival
{
    int sock;
    int memfd;
    uint64_t token;
    int64_t sinceNs;
    int sleepFd = -1; // this end's pipe, as the sender made it
    int peerFd = -1;  // an end of the peer's pipe
};

// The fds an arrival carries, in this order: the region, the read end of the connecting end's
// pipe, the write end of the accepting end's.
constexpr int kArrivalFds = 3;

void closeArrival(const Arrival &a)
{
    for (int fd : {a.sock, a.memfd, a.sleepFd, a.peerFd})
        if (fd >= 0)
            sys::close(fd);
}

// This process's own description of a pipe end the peer sent (a pipe, or -EPROTO): the peer keeps
// its own, whose flags it may change (clearing O_NONBLOCK would make a write or read here block).
int ownPipeEnd(int fd, int flags)
{
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISFIFO(st.st_mode))
        return -EPROTO;
    return sys::reopen(fd, flags | O_NONBLOCK);
}

constexpr size_t kMaxArrivals = 256;
// A same-host ring's size when the buffers asked for are smaller: a copy each way needs no
// more than the caches hold, and pages are only backed as they are touched.
constexpr uint64_t kSameHostRing = 256 * 1024;
constexpr int64_t kArrivalTtlNs = 30'000'000'000;

class Inbox
{
public:
    static Inbox &instance()
    {
        static Inbox *inbox = new Inbox(); // never destroyed: used until the process ends
        return *inbox;
    }

    uint32_t id()
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (fd_ < 0 && !failed_)
            openLocked();
        return fd_ >= 0 ? id_ : 0;
    }

    std::string name()
    {
        std::lock_guard<std::mutex> lock(mutex_);
        return fd_ < 0 ? std::string() : inboxName(id_);
    }

    int fd()
    {
        std::lock_guard<std::mutex> lock(mutex_);
        return fd_;
    }

    // Another name this inbox answers to (an abstract socket's, without the leading NUL).
    int addAlias(const std::string &name)
    {
        sockaddr_un a;
        const socklen_t len = abstractAddress(name, &a);
        if (!len)
            return -ENAMETOOLONG;
        std::lock_guard<std::mutex> lock(mutex_);
        const int s = sys::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (s < 0)
            return s;
        int r = sys::bind(s, reinterpret_cast<sockaddr *>(&a), len);
        if (r == 0)
            r = sys::listen(s, 512);
        if (r < 0) {
            sys::close(s);
            return r;
        }
        aliases_.push_back(s);
        return 0;
    }

    // The arrival with this token, taken out: 0, or -EAGAIN when it is not there (yet).
    int take(uint64_t token, Arrival *out)
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (fd_ < 0 && aliases_.empty())
            return -ENOTCONN;
        const size_t i = sweepLocked(token);
        if (i == arrivals_.size())
            return -EAGAIN;
        *out = arrivals_[i];
        arrivals_.erase(arrivals_.begin() + static_cast<long>(i));
        return 0;
    }

    // For a poller that waits for the arrival with this token: -EAGAIN when it is there (a look
    // takes it), else 0 with the fds that turn readable when something comes to the names
    // (their listening sockets, arrivals not read yet), appended once a pass (HintPass: every
    // socket that waits for a link asks, and they are the same fds).
    int waitFds(uint64_t token, uint64_t pass, std::vector<pollfd> *fds)
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (aliases_.empty())
            return -ENOTCONN;
        if (sweepLocked(token) != arrivals_.size())
            return -EAGAIN;
        if (pass && pass == waitPass_)
            return 0;
        waitPass_ = pass;
        for (int l : aliases_)
            fds->push_back({l, POLLIN, 0});
        for (const Arrival &a : arrivals_)
            if (a.memfd < 0)
                fds->push_back({a.sock, POLLIN, 0});
        return 0;
    }

    // A fork child has a copy of the parent's inbox socket: the inbox is the parent's, the
    // child opens one of its own when it needs one.
    void forgetAfterFork()
    {
        if (fd_ >= 0)
            sys::close(fd_);
        fd_ = -1;
        // The aliases' sockets stay the parent's: a child that accepted on its copies would
        // take the parent's arrivals.
        for (int l : aliases_)
            sys::close(l);
        aliases_.clear();
        failed_ = false;
        for (Arrival &a : arrivals_)
            closeArrival(a);
        arrivals_.clear();
    }

private:
    // Accepts what came, reads the arrivals that wrote, drops the bad and the stale: the index
    // of the arrival with token, or arrivals_.size() when it is not there.
    size_t sweepLocked(uint64_t token)
    {
        acceptArrivedLocked();
        const int64_t now = nowNs();
        size_t found = SIZE_MAX;
        for (size_t i = 0; i < arrivals_.size();) {
            Arrival &a = arrivals_[i];
            // Accepted between its sender's connect and its write: kept until it writes.
            const int r = a.memfd < 0 ? readArrival(&a) : 0;
            if (r < 0 && (r != -EAGAIN || now - a.sinceNs > kArrivalTtlNs)) {
                dropLocked(i);
                continue;
            }
            if (a.memfd >= 0 && a.token == token && found == SIZE_MAX) {
                found = i++;
                continue;
            }
            if (now - a.sinceNs > kArrivalTtlNs) {
                dropLocked(i);
                continue;
            }
            i++;
        }
        // Whoever fills the inbox with sockets of no connection only delays their own.
        while (arrivals_.size() > kMaxArrivals) {
            if (found == 0)
                return 0; // the oldest is the one asked for: it goes to its taker now
            dropLocked(0);
            if (found != SIZE_MAX)
                found--;
        }
        return found == SIZE_MAX ? arrivals_.size() : found;
    }

    // The listening sockets are polled first: an accept that finds nothing still makes and
    // frees a socket in the kernel (about 1 us here, five times the poll), and a server closing
    // a connection whose client could have sent a link sweeps for it, every short connection.
    void acceptArrivedLocked()
    {
        pollfd fds[8];
        size_t n = 0;
        auto flush = [&] {
            const timespec zero{0, 0};
            if (n && sys::ppoll(fds, static_cast<nfds_t>(n), &zero, nullptr) > 0) {
                for (size_t i = 0; i < n; i++)
                    if (fds[i].revents)
                        acceptAllLocked(fds[i].fd);
            }
            n = 0;
        };
        for (int l : aliases_) {
            fds[n++] = {l, POLLIN, 0};
            if (n == std::size(fds))
                flush();
        }
        if (fd_ >= 0)
            fds[n++] = {fd_, POLLIN, 0};
        flush();
    }

    void acceptAllLocked(int listening)
    {
        for (;;) {
            const int s = sys::accept4(listening, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (s < 0)
                return;
            arrivals_.push_back({s, -1, 0, nowNs()});
        }
    }

    void openLocked()
    {
        for (int attempt = 0; attempt < 4; attempt++) {
            uint32_t id = static_cast<uint32_t>(randomKey());
            if (!id)
                continue;
            int s = sys::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            if (s < 0)
                break;
            sockaddr_un a;
            socklen_t len = inboxAddress(id, &a);
            if (sys::bind(s, reinterpret_cast<sockaddr *>(&a), len) == 0 &&
                sys::listen(s, 512) == 0) {
                fd_ = s;
                id_ = id;
                return;
            }
            sys::close(s);
        }
        RS_LOG(Info, "same-host: no inbox socket; connections use the fabric");
        failed_ = true;
    }

    // Reads the token and the memfd of an arrival: 0 once read, -EAGAIN while nothing came yet,
    // -EPROTO for anything else (the arrival is dropped).
    static int readArrival(Arrival *a)
    {
        uint64_t token = 0;
        iovec iov{&token, sizeof(token)};
        alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
        msghdr m{};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = control;
        m.msg_controllen = sizeof(control);
        const ssize_t r = sys::recvmsg(a->sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (r == -EAGAIN)
            return -EAGAIN;
        int fds[kArrivalFds], n = 0, extra = 0;
        for (cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < k; i++) {
                int fd;
                std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(fd));
                if (n < kArrivalFds) {
                    fds[n++] = fd;
                } else {
                    sys::close(fd);
                    extra++;
                }
            }
        }
        if (r != sizeof(token) || n != kArrivalFds || extra || (m.msg_flags & MSG_CTRUNC) ||
            !token) {
            for (int i = 0; i < n; i++)
                sys::close(fds[i]);
            return -EPROTO;
        }
        // The sender's socket has done its part: what stays are the fds.
        sys::close(a->sock);
        a->sock = -1;
        a->memfd = fds[0];
        a->sleepFd = fds[1];
        a->peerFd = fds[2];
        a->token = token;
        return 0;
    }

    void dropLocked(size_t i)
    {
        closeArrival(arrivals_[i]);
        arrivals_.erase(arrivals_.begin() + static_cast<long>(i));
    }

    std::mutex mutex_;
    int fd_ = -1;
    uint32_t id_ = 0;
    bool failed_ = false;
    std::vector<int> aliases_; // listening sockets of the names added by addAlias()
    std::vector<Arrival> arrivals_;
    uint64_t waitPass_ = 0; // the poller's pass that waitFds() last gave the fds to
};

[[maybe_unused]] const int gForkHandlers =
    pthread_atfork(nullptr, nullptr, [] { Inbox::instance().forgetAfterFork(); });

} // namespace

uint32_t sameHostKey()
{
    // The boot id names the kernel (the same in every container of the machine); the network
    // namespace's inode, where abstract sockets live, the namespace.
    static const std::string boot = [] {
        char buf[64] = {};
        FILE *f = std::fopen("/proc/sys/kernel/random/boot_id", "re");
        if (!f)
            return std::string();
        size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
        std::fclose(f);
        return std::string(buf, n);
    }();
    struct stat st;
    if (boot.empty() || stat("/proc/self/ns/net", &st) < 0)
        return 0;
    // And the setup's format (kArrivalFds: what an inbox takes, and the region's version), so
    // that two builds that set links up differently never offer each other one: their
    // connections stay on the fabric.
    const uint32_t format = kArrivalFds | shm::kVersion << 8;
    uint32_t h = fnv(2166136261u, boot.data(), boot.size());
    h = fnv(h, &format, sizeof(format));
    h = fnv(h, &st.st_dev, sizeof(st.st_dev));
    h = fnv(h, &st.st_ino, sizeof(st.st_ino));
    return h ? h : 1;
}

void offerSameHost(wire::Hello *hello)
{
    const uint32_t key = sameHostKey();
    const uint32_t inbox = key ? Inbox::instance().id() : 0;
    if (!inbox)
        return;
    uint64_t token = 0;
    while (!token)
        token = randomKey();
    hello->hostKey = key;
    hello->inbox = inbox;
    hello->token = token;
}

SameHostOffer::~SameHostOffer()
{
    closeSent();
}

void SameHostOffer::closeSent()
{
    // The mapping keeps the region, and the peer has its own fds once sent: what was sent
    // waits in the inbox with its data after the socket is closed.
    auto closeOne = [](int &fd) {
        if (fd >= 0)
            sys::close(fd);
        fd = -1;
    };
    closeOne(sock_);
    for (int &fd : fds_)
        closeOne(fd);
}

int SameHostOffer::open(const std::string &name, const SameHostRings &rings)
{
    sockaddr_un a;
    const socklen_t len = abstractAddress(name, &a);
    return len ? open(a, len, rings) : -ENAMETOOLONG;
}

int SameHostOffer::open(const sockaddr_un &a, socklen_t len, const SameHostRings &rings)
{
    if (sock_ >= 0 || link_)
        return -EISCONN;
    int r = sock_ = sys::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    // A UNIX connect completes at once, or fails (EAGAIN: the inbox's backlog is full; nothing
    // listening there: ECONNREFUSED).
    if (r >= 0)
        r = sys::connect(sock_, reinterpret_cast<const sockaddr *>(&a), len);
    if (r < 0) {
        closeSent();
        return r;
    }
    int memfd = -1;
    std::unique_ptr<SameHostLink> link;
    r = SameHostLink::create(rings.ring, rings.ring, rings.sendCap, rings.recvCap, &memfd, &link);
    if (r < 0) {
        closeSent();
        return r;
    }
    // mine: this end sleeps on its read end; theirs: the peer's. Each end writes into the
    // other's through a read-write description of its own, the only writer left once the
    // ends sent are closed here.
    int mine[2] = {-1, -1}, theirs[2] = {-1, -1}, wake = -1;
    if ((r = sys::pipe2(mine, O_NONBLOCK | O_CLOEXEC)) < 0 ||
        (r = sys::pipe2(theirs, O_NONBLOCK | O_CLOEXEC)) < 0 ||
        (r = wake = sys::reopen(theirs[0], O_RDWR | O_NONBLOCK)) < 0) {
        for (int fd : {memfd, mine[0], mine[1], theirs[0], theirs[1], wake})
            if (fd >= 0)
                sys::close(fd);
        closeSent();
        RS_LOG(Debug, "same-host: no pipes (%s)", strerror(-r));
        return r;
    }
    sys::close(theirs[1]);
    fds_[0] = memfd;
    fds_[1] = theirs[0];
    fds_[2] = mine[1];
    link->setWakeFds(mine[0], wake);
    link_ = std::move(link);
    return 0;
}

int SameHostOffer::peerCredentials(ucred *out) const
{
    if (sock_ < 0)
        return -ENOTCONN;
    socklen_t len = sizeof(*out);
    return sys::getsockopt(sock_, SOL_SOCKET, SO_PEERCRED, out, &len);
}

int SameHostOffer::send(uint64_t token)
{
    if (sock_ < 0 || !token)
        return -ENOTCONN;
    iovec iov{&token, sizeof(token)};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(fds_))] = {};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof(control);
    cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(fds_));
    std::memcpy(CMSG_DATA(c), fds_, sizeof(fds_));
    const ssize_t n = sys::sendmsg(sock_, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    closeSent();
    return n == sizeof(token) ? 0 : (n < 0 ? static_cast<int>(n) : -EIO);
}

SameHostRings sameHostRings(const Settings &settings)
{
    constexpr uint64_t kMax = shm::kMaxRing / 16;
    SameHostRings r;
    r.ring = std::bit_ceil(
        std::clamp<uint64_t>(std::max(settings.sendBuf, settings.recvBuf), kSameHostRing, kMax));
    r.sendCap = std::bit_ceil(std::clamp<uint64_t>(settings.sendBufMax, r.ring, kMax));
    r.recvCap = std::bit_ceil(std::clamp<uint64_t>(settings.recvBufMax, r.ring, kMax));
    return r;
}

int acceptSameHost(const wire::Hello &peer, const SameHostRings &rings,
                   std::unique_ptr<SameHostLink> *out)
{
    if (!peer.token || !peer.inbox || peer.hostKey != sameHostKey())
        return -EXDEV;
    sockaddr_un a;
    const socklen_t len = inboxAddress(peer.inbox, &a);
    SameHostOffer offer;
    int r = offer.open(a, len, rings);
    if (r == 0)
        r = offer.send(peer.token);
    if (r < 0) {
        RS_LOG(Debug, "same-host: peer's inbox not reachable (%s): staying on the fabric",
               strerror(-r));
        return r;
    }
    *out = offer.takeLink();
    return 0;
}

int addSameHostName(const std::string &name)
{
    return Inbox::instance().addAlias(name);
}

int sameHostWaitFds(uint64_t token, uint64_t pass, std::vector<pollfd> *fds)
{
    return Inbox::instance().waitFds(token, pass, fds);
}

int collectSameHost(uint64_t token, int timeoutMs, std::unique_ptr<SameHostLink> *out)
{
    const int64_t deadline = nowNs() + int64_t(timeoutMs) * 1000000;
    Arrival a{-1, -1, 0, 0};
    for (;;) {
        int r = Inbox::instance().take(token, &a);
        if (r == 0)
            break;
        if (r != -EAGAIN)
            return r;
        const int64_t left = deadline - nowNs();
        if (left <= 0)
            return -ETIMEDOUT;
        pollfd p{Inbox::instance().fd(), POLLIN, 0};
        (void)sys::poll(&p, 1, static_cast<int>(std::min<int64_t>(left / 1000000 + 1, 10)));
    }
    std::unique_ptr<SameHostLink> link;
    int r = SameHostLink::attach(a.memfd, &link);
    const int sleepFd = r < 0 ? r : ownPipeEnd(a.sleepFd, O_RDONLY);
    const int wakeFd = sleepFd < 0 ? sleepFd : ownPipeEnd(a.peerFd, O_RDWR);
    closeArrival(a);
    if (r < 0 || sleepFd < 0 || wakeFd < 0) {
        if (sleepFd >= 0)
            sys::close(sleepFd);
        return r < 0 ? r : (sleepFd < 0 ? sleepFd : wakeFd);
    }
    link->setWakeFds(sleepFd, wakeFd);
    *out = std::move(link);
    return 0;
}

std::string sameHostInboxName()
{
    return Inbox::instance().name();
}

} // namespace rstream
