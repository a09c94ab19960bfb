// SPDX-License-Identifier: MIT
// The shim's statistics: counters, connection records, RSTREAM_STATS and the live export.

#include "shimstats.h"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <linux/futex.h>
#include <linux/tcp.h>
#include <mutex>
#include <netinet/in.h>
#include <new>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "connection.h"
#include "fabric.h"
#include "log.h"
#include "settings.h"

namespace rstream {

using namespace exportfile;

namespace {

// Incremented in every fork child: records of an older generation are the parent's.
std::atomic<uint32_t> gGeneration{0};

// The connections that closed, for RSTREAM_STATS (the most recent kMaxClosed).
constexpr size_t kMaxClosed = 4096;
struct ClosedRecord
{
    int fd;
    bool fabric;
    Fallback why;
    bool accepted;
    sockaddr_in6 local; // or a sockaddr_in
    sockaddr_in6 peer;
    uint64_t sent;
    uint64_t received;
};

int64_t realtimeNs()
{
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void copyAddress(sockaddr_storage *out, const sockaddr *in, socklen_t len)
{
    std::memset(out, 0, sizeof(*out));
    if (in && len >= sizeof(sa_family_t))
        std::memcpy(out, in, std::min<size_t>(len, sizeof(sockaddr_in6)));
}

// "1.2.3.4:80", "[::1]:80", or "-" when unknown.
std::string formatAddress(const void *addr)
{
    sockaddr_storage ss{};
    std::memcpy(&ss, addr, sizeof(sockaddr_in6));
    char buf[INET6_ADDRSTRLEN] = "?";
    if (ss.ss_family == AF_INET) {
        auto *in = reinterpret_cast<const sockaddr_in *>(&ss);
        inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
        return std::string(buf) + ":" + std::to_string(ntohs(in->sin_port));
    }
    if (ss.ss_family == AF_INET6) {
        auto *in6 = reinterpret_cast<const sockaddr_in6 *>(&ss);
        inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
        return "[" + std::string(buf) + "]:" + std::to_string(ntohs(in6->sin6_port));
    }
    return "-";
}

void storeAddress(std::atomic<uint64_t> (&words)[4], const sockaddr_storage &a)
{
    uint64_t w[4] = {};
    std::memcpy(w, &a, sizeof(sockaddr_in6));
    for (int i = 0; i < 4; i++)
        words[i].store(w[i], std::memory_order_relaxed);
}

long futexWait(std::atomic<uint32_t> *word, uint32_t expected)
{
    return syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAIT, expected, nullptr,
                   nullptr, 0);
}

void futexWake(std::atomic<uint32_t> *word)
{
    syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
            0);
}

std::string exportPath(pid_t pid)
{
    return std::string(kDir) + "/" + kPrefix + std::to_string(pid);
}

void afterForkChild();

} // namespace

// The open records, the closed ones and the export; one lock, taken when a connection opens
// or closes, by the refresher when asked, and at exit.
struct Registry
{
    std::mutex mutex;
    std::vector<ConnRecord *> live;
    std::vector<ClosedRecord> closed; // a ring once full
    size_t closedNext = 0;
    uint64_t unlisted = 0;
    std::atomic<Header *> header{nullptr};
    bool exportTried = false;
    std::vector<uint32_t> freeSlots;
    uint32_t nextSlot = 0;
    bool refresherStarted = false;

    Registry()
    {
        pthread_atfork([] { instance().mutex.lock(); }, [] { instance().mutex.unlock(); },
                       afterForkChild);
    }

    static Registry &instance()
    {
        // Never destroyed: records may close from other static destructors and at exit.
        static Registry *r = new Registry();
        return *r;
    }

    Header *ensureExportLocked();
    Slot *claimLocked(ConnRecord &rec);
    void releaseLocked(ConnRecord &rec);
    void startRefresherLocked(Header *h);
    void refresh(Header *h, uint32_t request);
    void closedLocked(const ConnRecord &rec, uint64_t sent, uint64_t received);
};

namespace {

void publishTotals()
{
    Header *h = Registry::instance().header.load(std::memory_order_acquire);
    if (!h)
        return;
    ShimStats &s = shimStats();
    h->fabricConnections.store(s.fabricConnections.load(std::memory_order_relaxed),
                               std::memory_order_relaxed);
    h->fallbackConnections.store(s.fallbackConnections.load(std::memory_order_relaxed),
                                 std::memory_order_relaxed);
    h->fabricListeners.store(s.fabricListeners.load(std::memory_order_relaxed),
                             std::memory_order_relaxed);
    h->kernelListeners.store(s.kernelListeners.load(std::memory_order_relaxed),
                             std::memory_order_relaxed);
    for (int i = 0; i < kFallbackCount; i++)
        h->fallbacks[i].store(s.fallbacks[i].load(std::memory_order_relaxed),
                              std::memory_order_relaxed);
}

void afterForkChild()
{
    // Only the forking thread runs here. The parent's records, export and refresher are not
    // the child's: it starts over and creates its own export on its first connection.
    gGeneration.fetch_add(1, std::memory_order_relaxed);
    Registry &r = Registry::instance();
    new (&r.mutex) std::mutex();
    if (Header *h = r.header.load(std::memory_order_relaxed)) {
        // The parent's records that live on in the child point into the shared mapping: it
        // becomes private zeroed memory, so that nothing of the child reaches the parent's file.
        void *p = mmap(h, kFileSize, PROT_READ | PROT_WRITE,
                       MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        (void)p;
    }
    r.header.store(nullptr, std::memory_order_relaxed);
    r.exportTried = false;
    r.live.clear();
    r.closed.clear();
    r.closedNext = 0;
    r.unlisted = 0;
    r.freeSlots.clear();
    r.nextSlot = 0;
    r.refresherStarted = false;
    ShimStats &s = shimStats();
    s.fabricConnections.store(0);
    s.fallbackConnections.store(0);
    s.fabricBytesSent.store(0);
    s.fabricBytesReceived.store(0);
    s.fabricListeners.store(0);
    s.kernelListeners.store(0);
    for (auto &f : s.fallbacks)
        f.store(0);
}

} // namespace

Header *Registry::ensureExportLocked()
{
    if (Header *h = header.load(std::memory_order_relaxed))
        return h;
    if (exportTried)
        return nullptr;
    exportTried = true;
    const char *env = std::getenv("RSTREAM_EXPORT");
    if (env && !std::strcmp(env, "0"))
        return nullptr;
    const pid_t pid = getpid();
    const std::string path = exportPath(pid);
    // Built under another name and renamed: a reader never sees it half made.
    const std::string tmp = std::string(kDir) + "/." + kPrefix + std::to_string(pid) + ".tmp";
    int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        RS_LOG(Info, "no live statistics for rstream-stat: cannot create %s: %s", tmp.c_str(),
               strerror(errno));
        return nullptr;
    }
    void *mem = MAP_FAILED;
    if (ftruncate(fd, static_cast<off_t>(kFileSize)) == 0)
        mem = mmap(nullptr, kFileSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);
    if (mem == MAP_FAILED) {
        ::unlink(tmp.c_str());
        RS_LOG(Info, "no live statistics for rstream-stat: %s: %s", tmp.c_str(), strerror(err));
        return nullptr;
    }
    auto *h = static_cast<Header *>(mem); // the file is zeroed: every atomic starts at 0
    std::memcpy(h->magic, kMagic, sizeof(kMagic));
    h->version = kVersion;
    h->headerSize = kHeaderSize;
    h->slotSize = sizeof(Slot);
    h->slotCount = kSlots;
    h->pid = static_cast<int32_t>(pid);
    h->startedNs = static_cast<uint64_t>(realtimeNs());
    std::snprintf(h->provider, sizeof(h->provider), "%s",
                  chooseProvider(Settings::fromEnv()).c_str());
    std::snprintf(h->program, sizeof(h->program), "%s", program_invocation_short_name);
    header.store(h, std::memory_order_release);
    publishTotals();
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        RS_LOG(Info, "no live statistics for rstream-stat: cannot create %s: %s", path.c_str(),
               strerror(errno));
        ::unlink(tmp.c_str());
        // Kept mapped (records may point into it), but nobody can find it.
        return h;
    }
    RS_LOG(Debug, "live statistics for rstream-stat in %s", path.c_str());
    return h;
}

Slot *Registry::claimLocked(ConnRecord &rec)
{
    Header *h = ensureExportLocked();
    if (!h)
        return nullptr;
    uint32_t index;
    if (!freeSlots.empty()) {
        index = freeSlots.back();
        freeSlots.pop_back();
    } else if (nextSlot < kSlots) {
        index = nextSlot++;
    } else {
        h->dropped.fetch_add(1, std::memory_order_relaxed);
        return nullptr;
    }
    Slot *s = &slots(h)[index];
    const uint32_t q = s->seq.load(std::memory_order_relaxed);
    s->seq.store(q + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    s->fd.store(rec.fd_, std::memory_order_relaxed);
    s->path.store(rec.fabric_ ? kPathFabric : kPathKernel, std::memory_order_relaxed);
    s->fallback.store(static_cast<uint32_t>(rec.why_), std::memory_order_relaxed);
    s->accepted.store(rec.accepted_ ? 1 : 0, std::memory_order_relaxed);
    s->openedNs.store(static_cast<uint64_t>(realtimeNs()), std::memory_order_relaxed);
    storeAddress(s->local, rec.local_);
    storeAddress(s->peer, rec.peer_);
    s->bytes.sent.store(0, std::memory_order_relaxed);
    s->bytes.received.store(0, std::memory_order_relaxed);
    s->refreshed.store(0, std::memory_order_relaxed);
    s->engineState.store(kEngineUnknown, std::memory_order_relaxed);
    s->engineError.store(0, std::memory_order_relaxed);
    s->rttUs.store(0, std::memory_order_relaxed);
    s->sendQueued.store(0, std::memory_order_relaxed);
    s->recvQueued.store(0, std::memory_order_relaxed);
    s->peerCreditBytes.store(0, std::memory_order_relaxed);
    s->peerCreditSlots.store(0, std::memory_order_relaxed);
    s->owedBytes.store(0, std::memory_order_relaxed);
    s->owedSlots.store(0, std::memory_order_relaxed);
    s->sendBuf.store(0, std::memory_order_relaxed);
    s->recvBuf.store(0, std::memory_order_relaxed);
    s->state.store(kOpen, std::memory_order_relaxed);
    s->seq.store(q + 2, std::memory_order_release);
    if (h->used.load(std::memory_order_relaxed) < index + 1)
        h->used.store(index + 1, std::memory_order_release);
    return s;
}

void Registry::releaseLocked(ConnRecord &rec)
{
    Slot *s = rec.slot_;
    if (!s)
        return;
    Header *h = header.load(std::memory_order_relaxed);
    const uint32_t q = s->seq.load(std::memory_order_relaxed);
    s->seq.store(q + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    s->state.store(kFree, std::memory_order_relaxed);
    s->seq.store(q + 2, std::memory_order_release);
    if (h)
        freeSlots.push_back(static_cast<uint32_t>(s - slots(h)));
    rec.slot_ = nullptr;
}

void Registry::closedLocked(const ConnRecord &rec, uint64_t sent, uint64_t received)
{
    ClosedRecord c{};
    c.fd = rec.fd_;
    c.fabric = rec.fabric_;
    c.why = rec.why_;
    c.accepted = rec.accepted_;
    std::memcpy(&c.local, &rec.local_, sizeof(c.local));
    std::memcpy(&c.peer, &rec.peer_, sizeof(c.peer));
    c.sent = sent;
    c.received = received;
    if (closed.size() < kMaxClosed) {
        closed.push_back(c);
        return;
    }
    closed[closedNext] = c;
    closedNext = (closedNext + 1) % kMaxClosed;
    unlisted++;
}

// The refresher: asleep on the export's request word until rstream-stat asks, then it reads
// the queues and credits of every fabric connection into its slot.
void Registry::startRefresherLocked(Header *h)
{
    if (refresherStarted)
        return;
    refresherStarted = true;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); // the program's signals are not for this thread
    try {
        std::thread([this, h] {
            uint32_t served = h->refreshDone.load(std::memory_order_relaxed);
            for (;;) {
                const uint32_t req = h->refreshRequest.load(std::memory_order_acquire);
                if (req == served) {
                    futexWait(&h->refreshRequest, req);
                    continue;
                }
                refresh(h, req);
                served = req;
                h->refreshDone.store(req, std::memory_order_release);
                futexWake(&h->refreshDone);
            }
        }).detach();
        h->refresher.store(1, std::memory_order_release);
    } catch (...) {
        RS_LOG(Info, "rstream-stat will show no queues or credits: no refresher thread");
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

void Registry::refresh(Header *h, uint32_t request)
{
    struct Work
    {
        Slot *slot;
        uint32_t seq;
        std::shared_ptr<Connection> conn;
    };
    std::vector<Work> work;
    {
        std::lock_guard<std::mutex> lock(mutex);
        if (header.load(std::memory_order_relaxed) != h)
            return;
        for (ConnRecord *r : live)
            if (r->fabric_ && r->slot_)
                if (auto c = r->conn_.lock())
                    work.push_back({r->slot_, r->slot_->seq.load(std::memory_order_relaxed), c});
    }
    for (Work &w : work) {
        Connection::FlowState f;
        bool ok = false;
        // The application may hold the connection: a few short tries, then the old values.
        for (int i = 0; i < 20 && !(ok = w.conn->flowState(&f)); i++)
            std::this_thread::sleep_for(std::chrono::microseconds(500));
        // The slot may have been given to another connection meanwhile.
        if (!ok || w.slot->seq.load(std::memory_order_acquire) != w.seq)
            continue;
        uint32_t st = kEngineUnknown;
        if (f.state == 1 || f.state == 2)
            st = kEngineConnecting;
        else if (f.error)
            st = kEngineError;
        else if (f.state == 4)
            st = kEngineClosed;
        else if (f.state == 3)
            st = f.shutWr && f.peerShutWr ? kEngineClosing
                 : f.shutWr               ? kEngineShutWr
                 : f.peerShutWr           ? kEnginePeerShutWr
                                          : kEngineEstablished;
        Slot *s = w.slot;
        s->engineState.store(st, std::memory_order_relaxed);
        s->engineError.store(f.error, std::memory_order_relaxed);
        s->rttUs.store(f.rttUs, std::memory_order_relaxed);
        s->sendQueued.store(f.sendQueued, std::memory_order_relaxed);
        s->recvQueued.store(f.recvQueued, std::memory_order_relaxed);
        s->peerCreditBytes.store(f.peerCreditBytes, std::memory_order_relaxed);
        s->peerCreditSlots.store(f.peerCreditSlots, std::memory_order_relaxed);
        s->owedBytes.store(f.owedBytes, std::memory_order_relaxed);
        s->owedSlots.store(f.owedSlots, std::memory_order_relaxed);
        s->sendBuf.store(f.sendBuf, std::memory_order_relaxed);
        s->recvBuf.store(f.recvBuf, std::memory_order_relaxed);
        s->refreshed.store(request, std::memory_order_release);
    }
    // The last references to connections closed meanwhile go here, outside the lock.
}

ShimStats &shimStats()
{
    static auto *stats = new ShimStats();
    return *stats;
}

void countFabricConnection()
{
    shimStats().fabricConnections.fetch_add(1, std::memory_order_relaxed);
    publishTotals();
}

void countFallback(Fallback why)
{
    ShimStats &s = shimStats();
    s.fallbackConnections.fetch_add(1, std::memory_order_relaxed);
    const auto i = static_cast<size_t>(why);
    if (i < static_cast<size_t>(kFallbackCount))
        s.fallbacks[i].fetch_add(1, std::memory_order_relaxed);
    publishTotals();
}

void countListener(bool fabric)
{
    (fabric ? shimStats().fabricListeners : shimStats().kernelListeners)
        .fetch_add(1, std::memory_order_relaxed);
    publishTotals();
}

ConnRecord::ConnRecord(int fd, bool fabric, Fallback why, bool accepted, const sockaddr *local,
                       socklen_t localLen, const sockaddr *peer, socklen_t peerLen)
    : fd_(fd), fabric_(fabric), why_(why), accepted_(accepted),
      generation_(gGeneration.load(std::memory_order_relaxed)), established_(fabric || accepted)
{
    copyAddress(&local_, local, localLen);
    copyAddress(&peer_, peer, peerLen);
    Registry &r = Registry::instance();
    std::lock_guard<std::mutex> lock(r.mutex);
    index_ = r.live.size();
    r.live.push_back(this);
    slot_ = r.claimLocked(*this);
    if (slot_) {
        bytes_ = &slot_->bytes;
        if (fabric_)
            r.startRefresherLocked(r.header.load(std::memory_order_relaxed));
    }
}

ConnRecord::~ConnRecord()
{
    if (generation_ != gGeneration.load(std::memory_order_relaxed))
        return; // a fork child's copy of its parent's connection
    const uint64_t sent = fabric_ ? bytes_->sent.load(std::memory_order_relaxed)
                                  : kernelSent_.load(std::memory_order_relaxed);
    const uint64_t received = fabric_ ? bytes_->received.load(std::memory_order_relaxed)
                                      : kernelReceived_.load(std::memory_order_relaxed);
    if (fabric_) {
        shimStats().fabricBytesSent.fetch_add(sent, std::memory_order_relaxed);
        shimStats().fabricBytesReceived.fetch_add(received, std::memory_order_relaxed);
    }
    Registry &r = Registry::instance();
    std::lock_guard<std::mutex> lock(r.mutex);
    if (index_ < r.live.size() && r.live[index_] == this) {
        r.live[index_] = r.live.back();
        r.live[index_]->index_ = index_;
        r.live.pop_back();
    }
    if (established_.load(std::memory_order_relaxed))
        r.closedLocked(*this, sent, received);
    r.releaseLocked(*this);
}

void ConnRecord::setConnection(const std::shared_ptr<Connection> &conn)
{
    std::lock_guard<std::mutex> lock(Registry::instance().mutex);
    conn_ = conn;
}

void ConnRecord::readKernelBytes(int (*getsockopt)(int, int, int, void *, socklen_t *), int fd)
{
    struct tcp_info ti;
    std::memset(&ti, 0, sizeof(ti));
    socklen_t len = sizeof(ti);
    const int saved = errno;
    // Payload bytes sent once (bytes_acked would count the SYN too); older kernels: acked.
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 &&
        len >= offsetof(struct tcp_info, tcpi_bytes_received) + sizeof(ti.tcpi_bytes_received)) {
        const bool hasSent =
            len >= offsetof(struct tcp_info, tcpi_bytes_retrans) + sizeof(ti.tcpi_bytes_retrans);
        kernelSent_.store(hasSent ? ti.tcpi_bytes_sent - ti.tcpi_bytes_retrans
                                  : ti.tcpi_bytes_acked,
                          std::memory_order_relaxed);
        kernelReceived_.store(ti.tcpi_bytes_received -
                                  tcpFinCounted(ti.tcpi_state, ti.tcpi_bytes_received),
                              std::memory_order_relaxed);
    }
    errno = saved;
}

std::string addressText(const sockaddr *addr)
{
    sockaddr_in6 a{};
    if (addr && addr->sa_family == AF_INET)
        std::memcpy(&a, addr, sizeof(sockaddr_in));
    else if (addr && addr->sa_family == AF_INET6)
        std::memcpy(&a, addr, sizeof(sockaddr_in6));
    return formatAddress(&a);
}

std::string shimStatsJson(int (*getsockopt)(int, int, int, void *, socklen_t *))
{
    ShimStats &s = shimStats();
    Registry &r = Registry::instance();
    std::lock_guard<std::mutex> lock(r.mutex);
    std::string records;
    uint64_t openSent = 0;
    uint64_t openReceived = 0;
    auto add = [&](int fd, bool fabric, Fallback why, bool accepted, const void *local,
                   const void *peer, uint64_t sent, uint64_t received, bool open) {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "{\"fd\": %d, \"path\": \"%s\", ", fd,
                      fabric ? "fabric" : "kernel");
        records += records.empty() ? "" : ", ";
        records += buf;
        if (!fabric)
            records += std::string("\"reason\": \"") + fallbackName(why) + "\", ";
        records += std::string("\"direction\": \"") + (accepted ? "accepted" : "connected") +
                   "\", \"local\": \"" + formatAddress(local) + "\", \"peer\": \"" +
                   formatAddress(peer) + "\", ";
        std::snprintf(buf, sizeof(buf),
                      "\"sent\": %" PRIu64 ", \"received\": %" PRIu64 ", \"open\": %s}", sent,
                      received, open ? "true" : "false");
        records += buf;
    };
    // Closed ones first, oldest first.
    for (size_t i = 0; i < r.closed.size(); i++) {
        const ClosedRecord &c = r.closed[(r.closedNext + i) % r.closed.size()];
        add(c.fd, c.fabric, c.why, c.accepted, &c.local, &c.peer, c.sent, c.received, false);
    }
    for (ConnRecord *c : r.live) {
        if (!c->established_.load(std::memory_order_relaxed))
            continue;
        uint64_t sent, received;
        if (c->fabric_) {
            sent = c->bytes_->sent.load(std::memory_order_relaxed);
            received = c->bytes_->received.load(std::memory_order_relaxed);
            openSent += sent;
            openReceived += received;
        } else {
            if (getsockopt)
                c->readKernelBytes(getsockopt, c->fd_);
            sent = c->kernelSent_.load(std::memory_order_relaxed);
            received = c->kernelReceived_.load(std::memory_order_relaxed);
        }
        add(c->fd_, c->fabric_, c->why_, c->accepted_, &c->local_, &c->peer_, sent, received, true);
    }
    std::string reasons;
    for (int i = 1; i < kFallbackCount; i++) {
        char buf[64];
        std::snprintf(buf, sizeof(buf), "%s\"%s\": %" PRIu64, i > 1 ? ", " : "", kFallbackNames[i],
                      s.fallbacks[i].load(std::memory_order_relaxed));
        reasons += buf;
    }
    char buf[640];
    std::snprintf(buf, sizeof(buf),
                  "{\"pid\": %d, \"provider\": \"%s\", \"fabric_connections\": %" PRIu64
                  ", \"fallback_connections\": %" PRIu64 ", \"fabric_bytes_sent\": %" PRIu64
                  ", \"fabric_bytes_received\": %" PRIu64 ", \"fabric_listeners\": %" PRIu64
                  ", \"kernel_listeners\": %" PRIu64 ", \"fallback_reasons\": {",
                  static_cast<int>(getpid()), chooseProvider(Settings::fromEnv()).c_str(),
                  s.fabricConnections.load(), s.fallbackConnections.load(),
                  s.fabricBytesSent.load() + openSent, s.fabricBytesReceived.load() + openReceived,
                  s.fabricListeners.load(), s.kernelListeners.load());
    std::string json = buf;
    json += reasons + "}, \"connections\": [" + records +
            "], \"connections_unlisted\": " + std::to_string(r.unlisted) + "}";
    return json;
}

void exportAtLoad()
{
    // Whatever this pid's file holds was written by the program this process ran before
    // execve (or by an unrelated process that died with the pid): not ours.
    const pid_t pid = getpid();
    ::unlink(exportPath(pid).c_str());
    ::unlink((std::string(kDir) + "/." + kPrefix + std::to_string(pid) + ".tmp").c_str());
}

void exportAtExit()
{
    Registry &r = Registry::instance();
    Header *h = r.header.load(std::memory_order_acquire);
    if (!h)
        return;
    h->refresher.store(0, std::memory_order_relaxed);
    ::unlink(exportPath(getpid()).c_str());
}

} // namespace rstream
