// SPDX-License-Identifier: MIT
// The same-host link's region: the sealed memfd made and checked, its mapping, the link's fds
// across fork, and what it holds (its pages given back when idle, resident bytes, diagnostics).

#include "samehost.h"

#include <cerrno>
#include <cstdio>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "kernel.h"

namespace rstream {

namespace {
bool validRing(uint64_t size)
{
    return size >= shm::kMinRing && size <= shm::kMaxRing && (size & (size - 1)) == 0;
}

// The links of this process. A fork child closes its copies of their pipes' fds: the connections
// are the parent's (the shim reports EIO on them in the child), and a copy held by a child
// would keep the peer from seeing the parent's end when the parent dies.
std::mutex gLinksMutex;
std::vector<SameHostLink *> gLinks;
[[maybe_unused]] const int gForkHandlers =
    pthread_atfork([] { gLinksMutex.lock(); }, [] { gLinksMutex.unlock(); },
                   [] {
                       for (SameHostLink *l : gLinks)
                           l->forgetAfterFork();
                       gLinksMutex.unlock();
                   });
} // namespace

void SameHostLink::forgetAfterFork()
{
    if (sleepFd_ >= 0)
        sys::close(sleepFd_);
    if (wakeFd_ >= 0)
        sys::close(wakeFd_);
    sleepFd_ = wakeFd_ = -1;
    err_.store(-EIO, std::memory_order_relaxed);
}

void SameHostLink::setWakeFds(int sleepFd, int wakeFd)
{
    sleepFd_ = sleepFd;
    wakeFd_ = wakeFd;
    std::lock_guard<std::mutex> lock(gLinksMutex);
    gLinks.push_back(this);
}

SameHostLink::~SameHostLink()
{
    {
        std::lock_guard<std::mutex> lock(gLinksMutex);
        std::erase(gLinks, this);
    }
    if (sleepFd_ >= 0)
        sys::close(sleepFd_);
    if (wakeFd_ >= 0)
        sys::close(wakeFd_);
    if (mem_)
        munmap(mem_, memSize_);
}

int SameHostLink::mapRegion(int memfd, size_t size)
{
    void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (p == MAP_FAILED)
        return -errno;
    mem_ = static_cast<uint8_t *>(p);
    memSize_ = size;
    return 0;
}

int SameHostLink::create(uint64_t ring0, uint64_t ring1, uint64_t cap0, uint64_t cap1, int *memfd,
                         std::unique_ptr<SameHostLink> *out)
{
    if (!validRing(ring0) || !validRing(ring1) || !validRing(cap0) || !validRing(cap1) ||
        cap0 < ring0 || cap1 < ring1)
        return -EINVAL;
    // The capacities are only address space until a ring grows into them: a memfd's pages are
    // backed as they are touched.
    const size_t size = shm::kHeaderBytes + cap0 + cap1;
    // Not in any file system: only a process the fd is handed to can map it.
    int fd = memfd_create("rstream-samehost", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -errno;
    std::unique_ptr<SameHostLink> link(new SameHostLink());
    int r = 0;
    if (ftruncate(fd, static_cast<off_t>(size)) < 0)
        r = -errno;
    // The peer can neither shrink the region under this end's mapping (a SIGBUS) nor grow it.
    if (r == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
        r = -errno;
    if (r == 0)
        r = link->mapRegion(fd, size);
    if (r < 0) {
        sys::close(fd);
        return r;
    }
    auto *h = reinterpret_cast<shm::Header *>(link->mem_);
    h->magic = shm::kMagic;
    h->version = shm::kVersion;
    h->ringSize[0] = ring0;
    h->ringSize[1] = ring1;
    h->ringCap[0] = cap0;
    h->ringCap[1] = cap1;
    link->placeRings(0, ring0, ring1, cap0, cap1);
    *memfd = fd;
    *out = std::move(link);
    return 0;
}

void SameHostLink::placeRings(int mine, uint64_t ring0, uint64_t ring1, uint64_t cap0,
                              uint64_t cap1)
{
    auto *h = reinterpret_cast<shm::Header *>(mem_);
    const uint64_t ring[2] = {ring0, ring1}, cap[2] = {cap0, cap1};
    uint8_t *area[2] = {mem_ + shm::kHeaderBytes, mem_ + shm::kHeaderBytes + cap0};
    const int theirs = 1 - mine;
    tx_ = &h->dir[mine];
    rx_ = &h->dir[theirs];
    txRing_ = area[mine];
    rxRing_ = area[theirs];
    txInit_ = ring[mine];
    rxInit_ = ring[theirs];
    txCap_ = cap[mine];
    rxCap_ = cap[theirs];
    txSize_.store(ring[mine]);
    rxSize_.store(ring[theirs]);
}

int SameHostLink::attach(int memfd, std::unique_ptr<SameHostLink> *out)
{
    const int seals = fcntl(memfd, F_GET_SEALS);
    if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
        return -EPROTO;
    struct stat st;
    if (fstat(memfd, &st) < 0)
        return -EPROTO;
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    if (size < shm::kHeaderBytes + 2 * shm::kMinRing ||
        size > shm::kHeaderBytes + 2 * shm::kMaxRing)
        return -EPROTO;
    std::unique_ptr<SameHostLink> link(new SameHostLink());
    int r = link->mapRegion(memfd, size);
    if (r < 0)
        return r == -EPERM || r == -EACCES ? -EPROTO : r;
    // Read once: the sizes this end works with from now on are its own copies.
    const auto *h = reinterpret_cast<volatile const shm::Header *>(link->mem_);
    const uint32_t magic = h->magic, version = h->version;
    const uint64_t ring0 = h->ringSize[0], ring1 = h->ringSize[1];
    const uint64_t cap0 = h->ringCap[0], cap1 = h->ringCap[1];
    if (magic != shm::kMagic || version != shm::kVersion || !validRing(ring0) ||
        !validRing(ring1) || !validRing(cap0) || !validRing(cap1) || cap0 < ring0 || cap1 < ring1 ||
        shm::kHeaderBytes + cap0 + cap1 != size)
        return -EPROTO;
    link->placeRings(1, ring0, ring1, cap0, cap1);
    *out = std::move(link);
    return 0;
}

bool SameHostLink::releaseIdleRing()
{
    if (err_.load(std::memory_order_relaxed) || held() || unreadByPeer())
        return false;
    // The peer published head == tail after its last copy out: no read of the ring is under
    // way, and the next byte it reads is written after this.
    return madvise(txRing_, txSize_.load(std::memory_order_relaxed), MADV_REMOVE) == 0;
}

std::string SameHostLink::debugState() const
{
    char buf[400];
    std::snprintf(
        buf, sizeof(buf),
        "same-host(fd=%d rx ring=%llu tail=%llu head=%llu seen=%llu base=%llu/%llu waiting=%llu "
        "flags=%llu | tx ring=%llu tail=%llu pub=%llu base=%llu peerHead=%llu waiting=%llu | "
        "gone=%d err=%d)",
        sleepFd_, (unsigned long long)rxSize_.load(), (unsigned long long)rx_->tail.v.load(),
        (unsigned long long)rxHead_.load(), (unsigned long long)seenTail_,
        (unsigned long long)rxBase_.load(), (unsigned long long)rx_->tail.rebaseAt.load(),
        (unsigned long long)rx_->readerWaiting.v.load(), (unsigned long long)rx_->flags.v.load(),
        (unsigned long long)txSize_.load(), (unsigned long long)txTail_.load(),
        (unsigned long long)txPublished_.load(), (unsigned long long)txBase_.load(),
        (unsigned long long)tx_->head.v.load(), (unsigned long long)tx_->writerWaiting.v.load(),
        int(peerGone_.load()), err_.load());
    return buf;
}

size_t SameHostLink::residentBytes() const
{
    const long page = sysconf(_SC_PAGESIZE);
    const size_t pages = (memSize_ + page - 1) / page;
    std::vector<unsigned char> vec(pages);
    if (mincore(mem_, memSize_, vec.data()) < 0)
        return 0;
    size_t n = 0;
    for (unsigned char v : vec)
        n += v & 1;
    return n * page;
}

} // namespace rstream
