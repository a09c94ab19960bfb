// SPDX-License-Identifier: MIT
// Same-host setup: the host key, the process's inbox, and the hand-over of a link's region.

#include "samehost_setup.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
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

socklen_t inboxAddress(uint32_t id, sockaddr_un *a)
{
    std::memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    // Abstract: no file to leave behind or to guard, and only the network namespace sees it.
    const int n = std::snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "rstream-inbox-%08x", id);
    return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

// What arrived at the inbox and is not collected yet: a socket whose token and memfd were read
// (memfd >= 0), or one accepted before its sender wrote them.
struct Arrival
{
    int sock;
    int memfd;
    uint64_t token;
    int64_t sinceNs;
};

constexpr size_t kMaxArrivals = 256;
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
        if (fd_ < 0)
            return {};
        char buf[32];
        std::snprintf(buf, sizeof(buf), "rstream-inbox-%08x", id_);
        return buf;
    }

    int fd()
    {
        std::lock_guard<std::mutex> lock(mutex_);
        return fd_;
    }

    // The arrival with this token, taken out: 0, or -EAGAIN when it is not there (yet).
    int take(uint64_t token, int *sock, int *memfd)
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (fd_ < 0)
            return -ENOTCONN;
        for (;;) {
            int s = sys::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (s < 0)
                break;
            arrivals_.push_back({s, -1, 0, nowNs()});
        }
        const int64_t now = nowNs();
        for (size_t i = 0; i < arrivals_.size();) {
            Arrival &a = arrivals_[i];
            // Accepted between its sender's connect and its write: kept until it writes.
            const int r = a.memfd < 0 ? readArrival(&a) : 0;
            if (r < 0 && (r != -EAGAIN || now - a.sinceNs > kArrivalTtlNs)) {
                dropLocked(i);
                continue;
            }
            if (a.memfd >= 0 && a.token == token) {
                *sock = a.sock;
                *memfd = a.memfd;
                arrivals_.erase(arrivals_.begin() + static_cast<long>(i));
                return 0;
            }
            if (now - a.sinceNs > kArrivalTtlNs) {
                dropLocked(i);
                continue;
            }
            i++;
        }
        // Whoever fills the inbox with sockets of no connection only delays their own.
        while (arrivals_.size() > kMaxArrivals)
            dropLocked(0);
        return -EAGAIN;
    }

    // A fork child has a copy of the parent's inbox socket: the inbox is the parent's, the
    // child opens one of its own when it needs one.
    void forgetAfterFork()
    {
        if (fd_ >= 0)
            sys::close(fd_);
        fd_ = -1;
        failed_ = false;
        for (Arrival &a : arrivals_) {
            sys::close(a.sock);
            if (a.memfd >= 0)
                sys::close(a.memfd);
        }
        arrivals_.clear();
    }

private:
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
        int memfd = -1, extra = 0;
        for (cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < n; i++) {
                int fd;
                std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(fd));
                if (memfd < 0)
                    memfd = fd;
                else {
                    sys::close(fd);
                    extra++;
                }
            }
        }
        if (r != sizeof(token) || memfd < 0 || extra || (m.msg_flags & MSG_CTRUNC) || !token) {
            if (memfd >= 0)
                sys::close(memfd);
            return -EPROTO;
        }
        a->memfd = memfd;
        a->token = token;
        return 0;
    }

    void dropLocked(size_t i)
    {
        sys::close(arrivals_[i].sock);
        if (arrivals_[i].memfd >= 0)
            sys::close(arrivals_[i].memfd);
        arrivals_.erase(arrivals_.begin() + static_cast<long>(i));
    }

    std::mutex mutex_;
    int fd_ = -1;
    uint32_t id_ = 0;
    bool failed_ = false;
    std::vector<Arrival> arrivals_;
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
    uint32_t h = fnv(2166136261u, boot.data(), boot.size());
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

int acceptSameHost(const wire::Hello &peer, uint64_t ringSize, std::unique_ptr<SameHostLink> *out)
{
    if (!peer.token || !peer.inbox || peer.hostKey != sameHostKey())
        return -EXDEV;
    int memfd = -1;
    std::unique_ptr<SameHostLink> link;
    int r = SameHostLink::create(ringSize, ringSize, &memfd, &link);
    if (r < 0)
        return r;
    int s = sys::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) {
        sys::close(memfd);
        return s;
    }
    sockaddr_un a;
    socklen_t len = inboxAddress(peer.inbox, &a);
    // A UNIX connect completes at once, or fails (EAGAIN: the inbox's backlog is full).
    r = sys::connect(s, reinterpret_cast<sockaddr *>(&a), len);
    if (r == 0) {
        uint64_t token = peer.token;
        iovec iov{&token, sizeof(token)};
        alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
        msghdr m{};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = control;
        m.msg_controllen = sizeof(control);
        cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        std::memcpy(CMSG_DATA(c), &memfd, sizeof(int));
        const ssize_t n = sys::sendmsg(s, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
        r = n == sizeof(token) ? 0 : (n < 0 ? static_cast<int>(n) : -EIO);
    }
    sys::close(memfd); // the mapping keeps the region; the peer has its own fd
    if (r < 0) {
        RS_LOG(Debug, "same-host: peer's inbox not reachable (%s): staying on the fabric",
               strerror(-r));
        sys::close(s);
        return r;
    }
    link->setSocket(s);
    *out = std::move(link);
    return 0;
}

int collectSameHost(uint64_t token, int timeoutMs, std::unique_ptr<SameHostLink> *out)
{
    const int64_t deadline = nowNs() + int64_t(timeoutMs) * 1000000;
    int sock = -1, memfd = -1;
    for (;;) {
        int r = Inbox::instance().take(token, &sock, &memfd);
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
    int r = SameHostLink::attach(memfd, &link);
    sys::close(memfd);
    if (r < 0) {
        sys::close(sock);
        return r;
    }
    link->setSocket(sock);
    *out = std::move(link);
    return 0;
}

std::string sameHostInboxName()
{
    return Inbox::instance().name();
}

} // namespace rstream
