// SPDX-License-Identifier: MIT
// The live export of the shim's statistics (/dev/shm/rstream-<pid>) that rstream-stat reads,
// its refresher thread, and the registry of open connections it lists.

#include "shimregistry.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <linux/futex.h>
#include <mutex>
#include <new>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>

#include "configvars.h"
#include "connection.h"
#include "kernel.h"
#include "log.h"

namespace rstream::shim {

using namespace exportfile;

namespace {

int64_t realtimeNs()
{
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
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

void afterForkChild()
{
    // Only the forking thread runs here. The parent's records, export and refresher are not
    // the child's: it starts over and creates its own export on its first connection.
    gGeneration.fetch_add(1, std::memory_order_relaxed);
    Registry &r = Registry::instance();
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
    s.sameHostConnections.store(0);
    s.sameHostBytesSent.store(0);
    s.sameHostBytesReceived.store(0);
    for (auto &f : s.fallbacks)
        f.store(0);
    // Taken before the fork by this same thread: unlocked, not constructed anew over the held
    // lock (which TSan, and any checking mutex, still sees held).
    r.mutex.unlock();
}

} // namespace

Registry::Registry()
{
    pthread_atfork([] { instance().mutex.lock(); }, [] { instance().mutex.unlock(); },
                   afterForkChild);
}

Registry &Registry::instance()
{
    // Never destroyed: records may close from other static destructors and at exit.
    static Registry *r = new Registry();
    return *r;
}

void publishTotals()
{
    Header *h = Registry::instance().header.load(std::memory_order_acquire);
    if (!h)
        return;
    ShimStats &s = shimStats();
    h->sameHostConnections.store(s.sameHostConnections.load(std::memory_order_relaxed),
                                 std::memory_order_relaxed);
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

Header *Registry::ensureExportLocked()
{
    if (Header *h = header.load(std::memory_order_relaxed))
        return h;
    if (exportTried)
        return nullptr;
    exportTried = true;
    if (!config::getFlag("RSTREAM_EXPORT"))
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
    sys::close(fd);
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
    s->ringResidentKib.store(0, std::memory_order_relaxed);
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
    c.sameHost = rec.sameHost();
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
        s->ringResidentKib.store(
            static_cast<uint32_t>(std::min<uint64_t>(f.ringResident / 1024, UINT32_MAX)),
            std::memory_order_relaxed);
        s->refreshed.store(request, std::memory_order_release);
    }
    // The last references to connections closed meanwhile go here, outside the lock.
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

} // namespace rstream::shim
