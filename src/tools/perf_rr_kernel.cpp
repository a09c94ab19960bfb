// SPDX-License-Identifier: MIT
// rstream-perf's rr test over kernel sockets: nonblocking, epoll, plain libc calls only, so the
// same binary under LD_PRELOAD=librstream_preload.so measures the shim.
//
// Each connection starts with the client's hello (perf_rr.cpp); then the client writes a
// request, the server reads all of it and writes a reply of the same size, and so on. Reads
// and writes may move part of a message: each connection keeps how far it got, and a side
// with a reply or request it could not finish waits for EPOLLOUT before reading again.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <memory>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <string>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>

#include "perf.h"

namespace rstream::perf {
namespace {

constexpr int kMaxEvents = 64;

void logErr(const char *what, int err)
{
    fprintf(stderr, "rstream-perf: kernel: %s: %s\n", what, strerror(-err));
}

// Owns a file descriptor.
class Fd
{
public:
    Fd() = default;
    explicit Fd(int fd) : fd_(fd) {}
    ~Fd() { reset(); }
    Fd(const Fd &) = delete;
    Fd &operator=(const Fd &) = delete;
    int get() const { return fd_; }
    void reset(int fd = -1)
    {
        if (fd_ >= 0)
            close(fd_);
        fd_ = fd;
    }

private:
    int fd_ = -1;
};

// One connection's place in its messages. A side reads only while it owes nothing.
struct Conn
{
    Fd fd;
    uint32_t got = 0;     // bytes of the hello or the message being read
    uint32_t owed = 0;    // bytes of the message being written still to go
    bool writing = false; // registered for EPOLLOUT instead of EPOLLIN
    bool hello = false;   // server: the hello has arrived
    int64_t sentNs = 0;   // client: when the outstanding request went
    int64_t dueNs = 0;    // client, paced: when it was due
    uint8_t helloBuf[kRrHelloBytes];
};

// The event loop both sides share; the side decides what a complete message means.
class Loop
{
public:
    int open();
    int add(Conn *conn);
    void remove(Conn *conn) { epoll_ctl(ep_.get(), EPOLL_CTL_DEL, conn->fd.get(), nullptr); }
    // Starts writing a message of size bytes: 0, or -errno when the connection failed.
    int startWrite(Conn *conn, uint32_t size);
    // Moves what a readable or writable connection allows: 1 when a message was read
    // whole, 0 when not yet, -ECONNRESET at EOF, or -errno.
    int pump(Conn *conn, uint32_t events, uint32_t size);
    int wait(epoll_event *events, int timeoutMs);
    int fd() const { return ep_.get(); }

    std::vector<uint8_t> buf;

private:
    int flush(Conn *conn, uint32_t size);
    int watch(Conn *conn, bool writing);

    Fd ep_;
};

int Loop::open()
{
    ep_.reset(epoll_create1(EPOLL_CLOEXEC));
    if (ep_.get() < 0) {
        logErr("epoll_create1", -errno);
        return -errno;
    }
    return 0;
}

int Loop::add(Conn *conn)
{
    epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.ptr = conn;
    if (epoll_ctl(ep_.get(), EPOLL_CTL_ADD, conn->fd.get(), &ev)) {
        logErr("epoll_ctl", -errno);
        return -errno;
    }
    return 0;
}

int Loop::watch(Conn *conn, bool writing)
{
    if (conn->writing == writing)
        return 0;
    epoll_event ev = {};
    ev.events = writing ? EPOLLOUT : EPOLLIN;
    ev.data.ptr = conn;
    if (epoll_ctl(ep_.get(), EPOLL_CTL_MOD, conn->fd.get(), &ev))
        return -errno;
    conn->writing = writing;
    return 0;
}

int Loop::flush(Conn *conn, uint32_t size)
{
    while (conn->owed) {
        ssize_t n = write(conn->fd.get(), buf.data() + (size - conn->owed), conn->owed);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return watch(conn, true);
        if (n <= 0)
            return n < 0 ? -errno : -EIO;
        conn->owed -= uint32_t(n);
    }
    return watch(conn, false);
}

int Loop::startWrite(Conn *conn, uint32_t size)
{
    conn->owed = size;
    return flush(conn, size);
}

int Loop::pump(Conn *conn, uint32_t events, uint32_t size)
{
    if (conn->owed) {
        if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
            return 0;
        int ret = flush(conn, size);
        if (ret || conn->owed)
            return ret;
    }
    // The reader's bytes go to the hello or to a scratch buffer: the content does not matter.
    uint8_t *dst = conn->hello ? buf.data() + size : conn->helloBuf;
    uint32_t want = conn->hello ? size : uint32_t(kRrHelloBytes);
    for (;;) {
        ssize_t n = read(conn->fd.get(), dst + conn->got, want - conn->got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (n < 0)
            return -errno;
        if (n == 0)
            return -ECONNRESET;
        conn->got += uint32_t(n);
        if (conn->got == want) {
            conn->got = 0;
            return 1;
        }
    }
}

int Loop::wait(epoll_event *events, int timeoutMs)
{
    int n = epoll_wait(ep_.get(), events, kMaxEvents, timeoutMs);
    if (n < 0 && errno != EINTR) {
        logErr("epoll_wait", -errno);
        return -errno;
    }
    return n < 0 ? 0 : n;
}

// SIGINT or SIGTERM asked the server to stop: it returns from main, so that a program around
// it (the preload shim's statistics) sees a normal exit.
std::atomic<bool> gStop{false};

void onStopSignal(int)
{
    gStop.store(true, std::memory_order_relaxed);
}

int untilMs(int64_t deadlineNs)
{
    int64_t left = deadlineNs - nowNs();
    if (left <= 0)
        return 0;
    return int(std::min<int64_t>(left / 1'000'000 + 1, 1000));
}

void noDelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// One server run: from the first connection until all of its connections have gone.
class ServerRun
{
public:
    ServerRun(const RrOptions &opts, Loop &loop, int listenFd)
        : opts_(opts), loop_(loop), listenFd_(listenFd)
    {}
    int serve();

private:
    int onListen();
    void onConn(Conn *conn, uint32_t events);
    void drop(Conn *conn);
    int watchListen(bool on);

    const RrOptions &opts_;
    Loop &loop_;
    int listenFd_;
    Conn listenTag_;
    std::vector<std::unique_ptr<Conn>> conns_;
    RrHello hello_;
    bool started_ = false;
    bool listening_ = false;
    uint32_t joined_ = 0;
    uint64_t answered_ = 0;
    int64_t limitNs_ = 0;
};

int ServerRun::watchListen(bool on)
{
    if (on == listening_)
        return 0;
    epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.ptr = &listenTag_;
    if (epoll_ctl(loop_.fd(), on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, listenFd_, &ev)) {
        logErr("epoll_ctl", -errno);
        return -errno;
    }
    listening_ = on;
    return 0;
}

void ServerRun::drop(Conn *conn)
{
    loop_.remove(conn);
    for (auto &c : conns_) {
        if (c.get() == conn) {
            c = std::move(conns_.back());
            conns_.pop_back();
            break;
        }
    }
}

int ServerRun::onListen()
{
    for (;;) {
        int fd = accept4(listenFd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED || errno == EINTR)
                return 0;
            // Out of descriptors or memory: the run goes on with what it has.
            logErr("accept4", -errno);
            return 0;
        }
        auto conn = std::make_unique<Conn>();
        conn->fd.reset(fd);
        noDelay(fd);
        if (loop_.add(conn.get()))
            continue;
        if (conns_.empty() && !started_)
            limitNs_ = nowNs() + kRrHelloNs;
        conns_.push_back(std::move(conn));
    }
}

void ServerRun::onConn(Conn *conn, uint32_t events)
{
    uint32_t size = started_ ? hello_.size : 0;
    int ret = conn->hello ? loop_.pump(conn, events, size) : loop_.pump(conn, events, 0);
    if (ret == 1 && !conn->hello) {
        RrHello h;
        ret = rrAdmit(opts_, conn->helloBuf, sizeof(conn->helloBuf), &h);
        if (!ret && started_ &&
            (h.runId != hello_.runId || h.size != hello_.size || joined_ >= hello_.conns)) {
            fprintf(stderr, "rstream-perf: kernel: refusing a connection: a run is on\n");
            ret = -EBUSY;
        }
        if (!ret && !started_) {
            hello_ = h;
            started_ = true;
            limitNs_ = nowNs() + int64_t(h.durationMs) * 1'000'000 + kGraceNs;
            loop_.buf.assign(2 * size_t(h.size), 0);
        }
        if (!ret) {
            conn->hello = true;
            if (++joined_ == hello_.conns)
                watchListen(false); // the next client waits in the backlog
            return;
        }
    } else if (ret == 1) {
        answered_++;
        ret = loop_.startWrite(conn, hello_.size);
        if (!ret)
            return;
    }
    if (ret == 0)
        return;
    if (ret != -ECONNRESET && ret != -EPIPE && ret != -EPROTO && ret != -EBUSY)
        logErr("connection", ret);
    drop(conn);
}

int ServerRun::serve()
{
    int ret = watchListen(true);
    int64_t start = 0;
    epoll_event events[kMaxEvents];
    while (!ret) {
        if (gStop.load(std::memory_order_relaxed)) {
            ret = -EINTR;
            break;
        }
        bool idle = conns_.empty() && !started_;
        if ((started_ && conns_.empty()) || (!idle && nowNs() >= limitNs_))
            break;
        int n = loop_.wait(events, idle ? -1 : untilMs(limitNs_));
        if (n < 0)
            ret = n;
        for (int i = 0; i < n && !ret; i++) {
            auto *conn = static_cast<Conn *>(events[i].data.ptr);
            if (conn == &listenTag_) {
                ret = onListen();
            } else {
                // A dropped connection's event may still be in this batch.
                bool live = false;
                for (auto &c : conns_)
                    live = live || c.get() == conn;
                if (live)
                    onConn(conn, events[i].events);
            }
            if (!start && started_)
                start = nowNs();
        }
    }
    if (!conns_.empty() && !ret)
        fprintf(stderr, "rstream-perf: kernel: a run outlived its time, closing it\n");
    for (auto &c : conns_)
        loop_.remove(c.get());
    conns_.clear();
    watchListen(false);
    if (started_) {
        printf("kernel rr %u B: %u connections, %llu requests answered in %.2f s\n", hello_.size,
               joined_, (unsigned long long)answered_, double(nowNs() - start) / 1e9);
        fflush(stdout);
    }
    return ret;
}

} // namespace

int rrKernelServer(const RrOptions &opts)
{
    sockaddr_storage addr;
    socklen_t len = 0;
    int ret = resolveAddress("kernel", opts.host, opts.port, true, &addr, &len);
    if (ret)
        return ret;
    Fd listenFd(socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    int one = 1;
    if (listenFd.get() < 0 ||
        setsockopt(listenFd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
        bind(listenFd.get(), reinterpret_cast<const sockaddr *>(&addr), len) ||
        listen(listenFd.get(), 1024)) {
        ret = -errno;
        logErr("listen", ret);
        return ret;
    }
    Loop loop;
    ret = loop.open();
    if (ret)
        return ret;
    // Without SA_RESTART: the signal ends the wait it comes in (EINTR).
    struct sigaction sa = {};
    sa.sa_handler = onStopSignal;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    printf("rstream-perf: kernel rr server on %s:%u\n", opts.host.c_str(), opts.port);
    fflush(stdout);
    while (!ret) {
        ServerRun run(opts, loop, listenFd.get());
        ret = run.serve();
    }
    return ret == -EINTR ? 0 : ret;
}

int rrKernelClient(const RrOptions &opts, RrResult *result)
{
    sockaddr_storage addr;
    socklen_t len = 0;
    int ret = resolveAddress("kernel", opts.host, opts.port, false, &addr, &len);
    if (ret)
        return ret;
    Loop loop;
    ret = loop.open();
    if (ret)
        return ret;
    loop.buf.assign(2 * size_t(opts.size), 0);
    uint8_t hello[kRrHelloBytes];
    rrEncode(rrHello(opts), hello);
    std::vector<Conn> conns(opts.conns);
    for (Conn &conn : conns) {
        conn.fd.reset(socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
        int fd = conn.fd.get();
        if (fd < 0 || connect(fd, reinterpret_cast<const sockaddr *>(&addr), len)) {
            ret = -errno;
            logErr("connect", ret);
            return ret;
        }
        noDelay(fd);
        // Blocking still: the hello goes whole before the loop takes over.
        for (size_t done = 0; done < sizeof(hello);) {
            ssize_t n = write(fd, hello + done, sizeof(hello) - done);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                ret = n < 0 ? -errno : -EIO;
                logErr("hello", ret);
                return ret;
            }
            done += size_t(n);
        }
        int flags = fcntl(fd, F_GETFL);
        if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK)) {
            ret = -errno;
            logErr("fcntl", ret);
            return ret;
        }
        conn.hello = true;
        ret = loop.add(&conn);
        if (ret)
            return ret;
    }

    RrStats stats(opts.seconds, nowNs());
    RrPacer<Conn> pacer(opts.rate, opts.conns);
    for (Conn &conn : conns) {
        conn.sentNs = conn.dueNs = nowNs();
        ret = loop.startWrite(&conn, opts.size);
        if (ret) {
            logErr("request", ret);
            return ret;
        }
    }
    epoll_event events[kMaxEvents];
    while (!ret && !stats.over(nowNs())) {
        int64_t due = 0;
        for (Conn *conn; !ret && (conn = pacer.takeDue(nowNs(), &due));) {
            conn->dueNs = due;
            conn->sentNs = nowNs();
            ret = loop.startWrite(conn, opts.size);
        }
        if (ret)
            break;
        int n = loop.wait(events, pacer.timeoutMs(nowNs(), untilMs(stats.endNs())));
        if (n < 0)
            return n;
        for (int i = 0; i < n && !ret; i++) {
            auto *conn = static_cast<Conn *>(events[i].data.ptr);
            ret = loop.pump(conn, events[i].events, opts.size);
            if (ret == 1) {
                int64_t now = nowNs();
                stats.record(conn->sentNs, now);
                ret = 0;
                if (pacer.paced()) {
                    pacer.schedule(conn, conn->dueNs, now);
                    continue;
                }
                conn->sentNs = now;
                ret = loop.startWrite(conn, opts.size);
            }
        }
    }
    if (ret) {
        logErr(ret == -ECONNRESET ? "the server closed a connection" : "run", ret);
        return ret;
    }
    stats.finish(result);
    return 0;
}

} // namespace rstream::perf
