// SPDX-License-Identifier: MIT
// Passive endpoints: connection requests are validated, answered and handed out as connections.

#include "listener.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "address.h"
#include "clock.h"
#include "kernel.h"
#include "log.h"
#include "progress.h"
#include "upgrade_wire.h"
#include "wire.h"

namespace rstream {

namespace {

// How long the tcp provider may wait in one read for the rest of a connection request.
constexpr int kRequestReadTimeoutMs = 50;
// How soon the progress thread looks again at a listener whose lock the application held.
constexpr int64_t kBusyRetryNs = 1000000;

// The tcp provider (libfabric 1.17, and upstream still) reads a connection request with a
// blocking recv() on the socket it accepted, from inside fi_eq_read: a peer that sends a header
// announcing private data and then nothing would hold whoever reads this listener's EQ (accept()
// and the progress thread, so every connection's background progress) until it sends more or
// goes away. Accepted sockets inherit SO_RCVTIMEO from the listening socket, so a timeout there
// bounds that wait: the provider sees EAGAIN, leaves the request half read and drops the peer
// once it sends again or closes. The listening socket is the one in the EQ's epoll set (waitFd,
// listed in /proc/self/fdinfo) that listens at addr.
void boundRequestReads(int waitFd, const sockaddr_storage &addr, socklen_t addrLen)
{
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", waitFd);
    const int f = ::open(path, O_RDONLY | O_CLOEXEC);
    char buf[4096];
    size_t n = 0;
    if (f >= 0) {
        ssize_t r;
        while (n < sizeof(buf) - 1 && (r = sys::read(f, buf + n, sizeof(buf) - 1 - n)) > 0)
            n += size_t(r);
        sys::close(f);
    }
    buf[n] = 0;
    for (const char *p = buf; (p = std::strstr(p, "tfd:")) != nullptr; p += 4) {
        const int fd = std::atoi(p + 4);
        int listening = 0;
        socklen_t l = sizeof(listening);
        if (sys::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &l) < 0 || !listening)
            continue;
        sockaddr_storage name{};
        socklen_t nameLen = sizeof(name);
        if (sys::getsockname(fd, reinterpret_cast<sockaddr *>(&name), &nameLen) < 0 ||
            nameLen != addrLen || std::memcmp(&name, &addr, nameLen) != 0)
            continue;
        const timeval tv{0, kRequestReadTimeoutMs * 1000};
        if (sys::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0)
            return;
    }
    RS_LOG(Info, "listener: the provider's socket was not found: a peer that stalls in the "
                 "middle of a connection request holds this listener until it goes");
}

// A port the kernel would give a listening socket of its own at addr's address (one no
// socket holds: without SO_REUSEADDR, a bind to port 0 skips ports that connections use), or
// -errno. The probe is closed at once; the caller binds there.
int freeListenPort(const void *addr)
{
    const auto *sa = static_cast<const sockaddr *>(addr);
    if (!sa || (sa->sa_family != AF_INET && sa->sa_family != AF_INET6))
        return -EAFNOSUPPORT;
    sockaddr_storage probe{};
    const socklen_t len = sa->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memcpy(&probe, sa, len);
    setAddressPort(reinterpret_cast<sockaddr *>(&probe), 0);
    const int fd = sys::socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return fd;
    socklen_t l = sizeof(probe);
    int ret = sys::bind(fd, reinterpret_cast<sockaddr *>(&probe), len);
    if (ret == 0)
        ret = sys::getsockname(fd, reinterpret_cast<sockaddr *>(&probe), &l);
    sys::close(fd);
    return ret < 0 ? ret : addressPort(reinterpret_cast<sockaddr *>(&probe));
}

} // namespace

Listener::Listener(const Settings &settings) : settings_(settings)
{
    // -1 (not -errno) when it cannot be had: pollers then sleep on the EQ's wait fd alone.
    readyFd_ = std::max(sys::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), -1);
}

Listener::~Listener()
{
    ProgressThread::instance().unwatchListener(this);
    // Connections nobody accepted are reset, as the kernel resets them; requests nobody
    // answered are refused.
    ready_.clear();
    // The endpoint before the EQ it is bound to.
    pep_.reset();
    eq_.reset();
    if (info_)
        fi_freeinfo(info_);
    if (readyFd_ >= 0)
        sys::close(readyFd_);
}

int Listener::bind(const sockaddr *addr, socklen_t len)
{
    std::lock_guard<std::mutex> lock(mutex_);
    if (pep_)
        return -EINVAL;
    if (!addr || len > sizeof(addr_) || (addr->sa_family != AF_INET && addr->sa_family != AF_INET6))
        return -EAFNOSUPPORT;
    int ret = getInfo(settings_, addr, len, nullptr, 0, &info_);
    if (ret < 0)
        return ret;
    ret = Domain::get(info_, settings_.strict, &domain_);
    if (ret < 0)
        return ret;
    fi_eq_attr eattr{};
    eattr.wait_obj = FI_WAIT_FD;
    ret = fi_eq_open(domain_->fabric(), &eattr, eq_.out(), this);
    if (ret)
        return fiErr(ret);
    ret = fi_control(&eq_->fid, FI_GETWAIT, &waitFd_);
    if (ret)
        return fiErr(ret);
    ret = fi_passive_ep(domain_->fabric(), info_, pep_.out(), this);
    if (ret)
        return fiErr(ret);
    ret = fi_pep_bind(pep_, &eq_->fid, 0);
    if (ret)
        return fiErr(ret);
    std::memcpy(&addr_, addr, len);
    addrLen_ = len;
    return 0;
}

int Listener::listen(int backlog)
{
    std::lock_guard<std::mutex> lock(mutex_);
    if (!pep_)
        return -EDESTADDRREQ;
    // Linux queues backlog + 1 connections, capped by somaxconn.
    backlog_ = static_cast<size_t>(std::clamp(backlog, 0, 4096)) + 1;
    if (listening_)
        return 0;
    const bool requestedPortZero = addressPort(reinterpret_cast<const sockaddr *>(&addr_)) == 0;
    int ret = fi_listen(pep_);
    // Bound to port 0, the provider's socket (SO_REUSEADDR) may be handed a port that one of
    // its connections uses as its local one: the bind goes through, the listen fails with
    // EADDRINUSE (the rsocket tests met it beside other tests). A port the kernel would give a
    // listening socket of its own can listen: ask for one without SO_REUSEADDR and bind there.
    for (int i = 0; ret && requestedPortZero && i < 4; i++) {
        const int err = fiErr(ret);
        if (err != -EADDRINUSE && err != -EIO)
            break;
        const int port = freeListenPort(info_->src_addr);
        if (port <= 0)
            break;
        RS_LOG(Debug, "listener: the port chosen could not listen: port %d instead", port);
        setAddressPort(static_cast<sockaddr *>(info_->src_addr), port);
        pep_.reset();
        ret = fi_passive_ep(domain_->fabric(), info_, pep_.out(), this);
        if (ret == 0)
            ret = fi_pep_bind(pep_, &eq_->fid, 0);
        if (ret == 0)
            ret = fi_listen(pep_);
        // Another program may take the port between the probe and the bind: try again.
        if (ret)
            setAddressPort(static_cast<sockaddr *>(info_->src_addr), 0);
    }
    if (ret) {
        ret = fiErr(ret);
        return ret == -EIO ? -EADDRINUSE : ret;
    }
    size_t l = sizeof(addr_);
    if (fi_getname(&pep_->fid, &addr_, &l) == 0)
        addrLen_ = static_cast<socklen_t>(l);
    if (info_->fabric_attr->prov_name && std::strcmp(info_->fabric_attr->prov_name, "tcp") == 0)
        boundRequestReads(waitFd_, addr_, addrLen_);
    listening_ = true;
    ProgressThread::instance().watchListener(this);
    return 0;
}

void Listener::pumpLocked()
{
    while (ready_.size() < backlog_) {
        std::unique_ptr<Connection> conn;
        if (acceptOne(&conn) < 0)
            break;
        ready_.push_back(std::move(conn));
        if (ready_.size() == 1)
            syncReadyFdLocked();
    }
}

int Listener::backgroundAccept(int64_t *deadlineNs)
{
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) {
        // The application is accepting: it takes what has come, but a request after its call
        // would wait for its next one, which a program blocked elsewhere never makes (a shim
        // server blocked in a kernel recv while its client's fabric connect to the upgrade
        // listener timed out). Not polled this round: looked at again in a millisecond.
        *deadlineNs = std::min(*deadlineNs, nowNs() + kBusyRetryNs);
        return -1;
    }
    if (!listening_)
        return -1;
    backgroundLooks_.fetch_add(1, std::memory_order_relaxed);
    pumpLocked();
    if (ready_.size() >= backlog_)
        return -1;
    // The wait fd stays readable after the EQ was read until fi_trywait re-arms it.
    fid *fids[1] = {&eq_->fid};
    fi_trywait(domain_->fabric(), fids, 1);
    return waitFd_;
}

void Listener::setDeferring(bool on)
{
    // No call into the progress thread: this runs in fork's parent handler, while the thread's
    // own handlers may hold its locks. The thread already polls this listener's wait fd and
    // reads the new setting with the next request.
    std::lock_guard<std::mutex> lock(mutex_);
    deferring_.store(on, std::memory_order_relaxed);
}

int Listener::readRequestLocked(fi_info **info, wire::Hello *peer)
{
    alignas(fi_eq_cm_entry) uint8_t buf[sizeof(fi_eq_cm_entry) + 256];
    auto &entry = *reinterpret_cast<fi_eq_cm_entry *>(buf);
    for (;;) {
        uint32_t event = 0;
        // The tcp provider reads connection requests inside fi_eq_read and takes errno for why
        // a short read failed: a stale EAGAIN there keeps a peer that sent half a header (and
        // then waits) half read instead of dropping it.
        errno = 0;
        ssize_t ret = fi_eq_read(eq_, &event, buf, sizeof(buf), 0);
        if (ret == -FI_EAGAIN)
            return -EAGAIN;
        // Something was read: the wait fd may stay signalled until the next trywait. A read
        // that found nothing leaves an arm as it was (accept reads at every call, and the
        // poller's parking after it then needs no trywait: two system calls on tcp).
        armedClean_ = false;
        if (ret == -FI_EAVAIL) {
            fi_eq_err_entry err{};
            fi_eq_readerr(eq_, &err, 0);
            RS_LOG(Debug, "listener: EQ error %d", err.err);
            continue;
        }
        if (ret < 0)
            return fiErr(static_cast<int>(ret));
        if (event != FI_CONNREQ) {
            if (entry.info)
                fi_freeinfo(entry.info);
            continue;
        }
        size_t dataLen = size_t(ret) > sizeof(entry) ? ret - sizeof(entry) : 0;
        int r = wire::decodeHello(entry.data, dataLen, peer);
        if (r < 0) {
            RS_LOG(Info, "listener: rejecting a peer with a bad hello (%s)", strerror(-r));
            fi_reject(pep_, entry.info->handle, nullptr, 0);
            fi_freeinfo(entry.info);
            continue;
        }
        *info = entry.info;
        return 0;
    }
}

int Listener::answerLocked(fi_info *info, const wire::Hello &peer, std::unique_ptr<Connection> *out)
{
    // A connect that can take a Defer from another process (or from this one, once it has
    // forked): which process will serve the connection is not known here (fork, exec), so it
    // goes over kernel TCP and upgrades in the process that does its first I/O.
    if ((peer.flags & wire::kFlagUpgrade) &&
        (deferring_.load(std::memory_order_relaxed) ||
         (settings_.upgrade && peer.process != processNonce()))) {
        uint8_t refusal[wire::kRefusalSize];
        wire::encodeRefusal(wire::RefusalReason::Defer, refusal);
        fi_reject(pep_, info->handle, refusal, sizeof(refusal));
        fi_freeinfo(info);
        return -ECONNREFUSED;
    }
    auto conn = std::make_unique<Connection>(settings_);
    bool rejectable;
    int r = conn->startAccept(info, peer, &rejectable); // takes info
    if (r < 0) {
        RS_LOG(Info, "listener: cannot accept: %s", strerror(-r));
        if (rejectable)
            fi_reject(pep_, info->handle, nullptr, 0);
        return r;
    }
    *out = std::move(conn);
    return 0;
}

int Listener::acceptOne(std::unique_ptr<Connection> *out)
{
    for (;;) {
        fi_info *info;
        wire::Hello peer;
        int r = readRequestLocked(&info, &peer);
        if (r < 0)
            return r;
        if (answerLocked(info, peer, out) == 0)
            return 0;
    }
}

int Listener::accept(std::unique_ptr<Connection> *out, bool nonblock, int timeoutMs)
{
    timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (!listening_)
                return -EINVAL;
            // Always read: accept is what reads the EQ for some (the upgrade listener's pump),
            // so a clean arm is no reason to skip it here (that left their requests unread).
            pumpLocked();
            if (!ready_.empty()) {
                *out = std::move(ready_.front());
                ready_.pop_front();
                syncReadyFdLocked();
                return 0;
            }
            if (nonblock)
                return -EAGAIN;
            if (armLocked() == -EAGAIN)
                continue;
        }
        int timeout = -1;
        if (timeoutMs >= 0) {
            timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            long elapsed =
                (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
            if (elapsed >= timeoutMs)
                return -ETIMEDOUT;
            timeout = static_cast<int>(timeoutMs - elapsed);
        }
        // The progress thread may answer the request first: its queue signals readyFd_.
        pollfd pfd[2] = {{waitFd_, POLLIN, 0}, {readyFd_, POLLIN, 0}};
        if (sys::poll(pfd, 2, timeout) == -EINTR)
            return -EINTR;
    }
}

int Listener::arm()
{
    std::lock_guard<std::mutex> lock(mutex_);
    // Armed, and the EQ not read since: its wait fd shows whatever comes, and a poller that
    // parks the listener before every sleep saves the read and the trywait (a system call
    // each on tcp).
    if (armedClean_ && ready_.empty())
        return 0;
    pumpLocked();
    return armLocked();
}

bool Listener::pending()
{
    std::lock_guard<std::mutex> lock(mutex_);
    pumpLocked();
    return !ready_.empty();
}

bool Listener::pendingArm()
{
    std::lock_guard<std::mutex> lock(mutex_);
    pumpLocked();
    if (!ready_.empty())
        return true;
    (void)armLocked(); // sets hintArmed_ when it succeeds
    return false;
}

void Listener::syncReadyFdLocked()
{
    // Readable exactly while connections wait in the queue.
    uint64_t v;
    if (ready_.empty()) {
        if (sys::read(readyFd_, &v, sizeof(v)) < 0) {
            // Already drained.
        }
    } else {
        v = 1;
        if (sys::read(readyFd_, &v, sizeof(v)) < 0) {
            // Was not signalled.
        }
        v = 1;
        if (sys::write(readyFd_, &v, sizeof(v)) < 0) {
            // Cannot overflow at 1.
        }
    }
}

int Listener::armLocked()
{
    if (!eq_)
        return 0;
    if (!ready_.empty())
        return -EAGAIN;
    fid *fids[1] = {&eq_->fid};
    int ret = fi_trywait(domain_->fabric(), fids, 1);
    if (ret == -FI_EAGAIN) {
        armedClean_ = false; // something to read first
        return -EAGAIN;
    }
    if (ret == 0) {
        hintArmed_.store(true, std::memory_order_release);
        armedClean_ = true;
    }
    return ret ? fiErr(ret) : 0;
}

int Listener::localAddress(sockaddr_storage *addr, socklen_t *len) const
{
    if (!addrLen_)
        return -EINVAL;
    std::memcpy(addr, &addr_, addrLen_);
    *len = addrLen_;
    return 0;
}

} // namespace rstream
