// SPDX-License-Identifier: MIT
// The same-host link's region and data path: rings in a sealed memfd, checked indices, wake-ups.

#include "samehost.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "connection_detail.h"
#include "kernel.h"
#include "log.h"

namespace rstream {

namespace {
bool validRing(uint64_t size)
{
    return size >= shm::kMinRing && size <= shm::kMaxRing && (size & (size - 1)) == 0;
}

void storeMax(std::atomic<uint64_t> &a, uint64_t v)
{
    uint64_t cur = a.load(std::memory_order_relaxed);
    // Release: a thread that reads v here reads the peer's word it came from as new or newer.
    while (cur < v &&
           !a.compare_exchange_weak(cur, v, std::memory_order_release, std::memory_order_relaxed)) {
    }
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

int SameHostLink::create(uint64_t ring0, uint64_t ring1, int *memfd,
                         std::unique_ptr<SameHostLink> *out)
{
    if (!validRing(ring0) || !validRing(ring1))
        return -EINVAL;
    const size_t size = shm::kHeaderBytes + ring0 + ring1;
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
    link->tx_ = &h->dir[0];
    link->rx_ = &h->dir[1];
    link->txRing_ = link->mem_ + shm::kHeaderBytes;
    link->rxRing_ = link->txRing_ + ring0;
    link->txSize_ = ring0;
    link->rxSize_ = ring1;
    *memfd = fd;
    *out = std::move(link);
    return 0;
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
    if (magic != shm::kMagic || version != shm::kVersion || !validRing(ring0) ||
        !validRing(ring1) || shm::kHeaderBytes + ring0 + ring1 != size)
        return -EPROTO;
    auto *hdr = reinterpret_cast<shm::Header *>(link->mem_);
    link->tx_ = &hdr->dir[1];
    link->rx_ = &hdr->dir[0];
    link->rxRing_ = link->mem_ + shm::kHeaderBytes;
    link->txRing_ = link->rxRing_ + ring0;
    link->rxSize_ = ring0;
    link->txSize_ = ring1;
    *out = std::move(link);
    return 0;
}

void SameHostLink::corrupt(const char *what)
{
    int expected = 0;
    if (err_.compare_exchange_strong(expected, -ECONNRESET)) {
        RS_LOG(Warn, "same-host peer wrote a bad %s: connection reset", what);
        myFlags_.fetch_or(shm::kReset);
        tx_->flags.v.store(myFlags_.load(), std::memory_order_release);
        wakePeer();
    }
}

void SameHostLink::wakePeer()
{
    if (wakeFd_ < 0)
        return;
    // A full pipe already holds a wake-up. Never EPIPE: this end reads the pipe too.
    const char b = 0;
    (void)sys::write(wakeFd_, &b, 1);
}

uint64_t SameHostLink::peerFlags()
{
    const uint64_t f = rx_->flags.v.load(std::memory_order_acquire);
    if (f & ~shm::kKnownFlags) {
        corrupt("flag");
        return 0;
    }
    // Flags are never taken back: what was seen once stays.
    return peerFlagsSeen_.fetch_or(f, std::memory_order_relaxed) | f;
}

size_t SameHostLink::write(const iovec *iov, int iovcnt, size_t skip, size_t len, bool hold)
{
    if (err_.load(std::memory_order_relaxed) || myFlags_.load(std::memory_order_relaxed))
        return 0;
    // What other threads saw is read before the peer's word: a look that stored a newer head
    // after ours was read must not make ours look like a step back.
    const uint64_t seen = txHeadSeen_.load(std::memory_order_acquire);
    const uint64_t tail = txTail_.load(std::memory_order_relaxed);
    const uint64_t head = tx_->head.v.load(std::memory_order_acquire);
    if (head < seen || head > tail) {
        corrupt("head index");
        return 0;
    }
    storeMax(txHeadSeen_, head);
    const uint64_t n = std::min<uint64_t>(len, txSize_ - (tail - head));
    if (n == 0)
        return 0;
    copyRing(txRing_, txSize_, tail & (txSize_ - 1), iov, iovcnt, skip, n, true);
    txTail_.store(tail + n, std::memory_order_release);
    if (!hold) {
        publish(tail + n);
    } else {
        const uint64_t frame = std::clamp<uint64_t>(txSize_ / 4, 4096, 256 * 1024);
        const uint64_t pub = txPublished_.load(std::memory_order_relaxed);
        if (tail + n - pub >= frame)
            publish(pub + (tail + n - pub) / frame * frame);
    }
    return n;
}

void SameHostLink::publish(uint64_t pos)
{
    {
        std::lock_guard<std::mutex> lock(pubMutex_);
        if (pos <= txPublished_.load(std::memory_order_relaxed))
            return;
        txPublished_.store(pos, std::memory_order_relaxed);
        tx_->tail.v.store(pos, std::memory_order_release);
    }
    // Against the reader's store of readerWaiting and its look at tail (both seq_cst).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (tx_->readerWaiting.v.load(std::memory_order_relaxed) &&
        tx_->readerWaiting.v.exchange(0, std::memory_order_acq_rel))
        wakePeer();
}

uint64_t SameHostLink::held() const
{
    return txTail_.load(std::memory_order_acquire) - txPublished_.load(std::memory_order_relaxed);
}

void SameHostLink::flush()
{
    publish(txTail_.load(std::memory_order_acquire));
}

size_t SameHostLink::read(const iovec *iov, int iovcnt, size_t skip, size_t len, bool peek)
{
    if (err_.load(std::memory_order_relaxed))
        return 0;
    const uint64_t seen = rxTailSeen_.load(std::memory_order_acquire); // before tail, as above
    const uint64_t head = rxHead_.load(std::memory_order_relaxed);
    const uint64_t tail = rx_->tail.v.load(std::memory_order_acquire);
    if (tail < seen || tail < head || tail - head > rxSize_) {
        corrupt("tail index");
        return 0;
    }
    storeMax(rxTailSeen_, tail);
    const uint64_t n = std::min<uint64_t>(len, tail - head);
    if (n == 0)
        return 0;
    copyRing(rxRing_, rxSize_, head & (rxSize_ - 1), iov, iovcnt, skip, n, false);
    if (peek)
        return n;
    rxHead_.store(head + n, std::memory_order_release);
    rx_->head.v.store(head + n, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (const uint64_t want = rx_->writerWaiting.v.load(std::memory_order_relaxed)) {
        // The peer's word: any value only decides when it is woken, and an empty ring (room
        // for all of it) always does. The tail read here is at least what was read above.
        const uint64_t now = rx_->tail.v.load(std::memory_order_acquire);
        const uint64_t room = rxSize_ - std::min(rxSize_, now - std::min(now, head + n));
        if (room >= std::min(want, rxSize_) &&
            rx_->writerWaiting.v.exchange(0, std::memory_order_acq_rel))
            wakePeer();
    }
    return n;
}

uint64_t SameHostLink::readable() const
{
    const uint64_t head = rxHead_.load(std::memory_order_relaxed);
    const uint64_t tail = rx_->tail.v.load(std::memory_order_acquire);
    return tail > head ? std::min(tail - head, rxSize_) : 0;
}

uint64_t SameHostLink::unreadByPeer() const
{
    const uint64_t head = tx_->head.v.load(std::memory_order_acquire);
    const uint64_t tail = txTail_.load(std::memory_order_relaxed);
    return tail > head ? tail - head : 0;
}

int SameHostLink::failure(uint64_t *flags)
{
    if (const int e = err_.load(std::memory_order_acquire))
        return e;
    *flags = peerFlags();
    if (const int e = err_.load(std::memory_order_acquire))
        return e;
    return (*flags & shm::kReset) ? -ECONNRESET : 0;
}

ssize_t SameHostLink::recvState()
{
    // Flags before tail: the producer publishes its last tail before SHUT_WR.
    uint64_t f = 0;
    if (const int e = failure(&f))
        return e;
    // seen and head before tail (acquire, against the release stores of the threads that moved
    // them), so that an honest tail is never behind either.
    const uint64_t seen = rxTailSeen_.load(std::memory_order_acquire);
    const uint64_t head = rxHead_.load(std::memory_order_acquire);
    const uint64_t tail = rx_->tail.v.load(std::memory_order_acquire);
    if (tail < seen || tail < head) {
        corrupt("tail index");
        return err_.load();
    }
    storeMax(rxTailSeen_, tail);
    if (tail > head)
        return static_cast<ssize_t>(std::min(tail - head, rxSize_));
    if (f & shm::kShutWr)
        return 0;
    if (peerGone_.load(std::memory_order_acquire))
        // A process that ends with bytes it never read resets its connections, as the kernel
        // does; one that read everything closes them.
        return unreadByPeer() ? -ECONNRESET : 0;
    return -EAGAIN;
}

ssize_t SameHostLink::sendState()
{
    uint64_t f = 0;
    if (const int e = failure(&f))
        return e;
    if (myFlags_.load(std::memory_order_relaxed) || (f & shm::kClosed) ||
        peerGone_.load(std::memory_order_acquire))
        return -EPIPE;
    const uint64_t seen = txHeadSeen_.load(std::memory_order_acquire); // before head: see write()
    const uint64_t head = tx_->head.v.load(std::memory_order_acquire);
    const uint64_t tail = txTail_.load(std::memory_order_acquire);
    if (head < seen || head > tail) {
        corrupt("head index");
        return err_.load();
    }
    storeMax(txHeadSeen_, head);
    return static_cast<ssize_t>(txSize_ - (tail - head));
}

bool SameHostLink::observe(uint64_t *rxChanges, uint64_t *txChanges)
{
    const uint64_t f = peerFlags();
    const uint64_t tail = rx_->tail.v.load(std::memory_order_acquire);
    const uint64_t head = tx_->head.v.load(std::memory_order_acquire);
    const bool gone = peerGone_.load(std::memory_order_acquire);
    const int err = err_.load(std::memory_order_acquire);
    bool rx = tail != seenTail_ || f != seenFlags_ || gone != seenGone_ || err != seenErr_;
    bool tx = head != seenHead_ || gone != seenGone_ || err != seenErr_ ||
              (f & shm::kReset) != (seenFlags_ & shm::kReset);
    seenTail_ = tail;
    seenHead_ = head;
    seenFlags_ = f;
    seenGone_ = gone;
    seenErr_ = err;
    if (rx)
        ++*rxChanges;
    if (tx)
        ++*txChanges;
    return rx || tx;
}

bool SameHostLink::drain()
{
    char buf[256];
    bool any = false;
    for (int i = 0; i < 16; i++) {
        wakeReads_.fetch_add(1, std::memory_order_relaxed);
        const ssize_t r = sys::read(sleepFd_, buf, sizeof(buf));
        if (r == -EAGAIN || r == -EINTR)
            break;
        if (r <= 0) {
            peerGone_.store(true, std::memory_order_release);
            return true;
        }
        any = true;
        if (size_t(r) < sizeof(buf))
            break;
    }
    // Read to the end (or to a signal: the bytes left make the fd readable, so the next
    // sleep ends at once and its arm reads them).
    wakeOwed_.store(false, std::memory_order_relaxed);
    return any;
}

int SameHostLink::arm(bool read, uint64_t room, bool *drained, Drain mode)
{
    *drained = false;
    if (sleepFd_ < 0)
        return 0;
    // The peer writes a byte only after taking a word of this end's (it clears the word
    // first), or for a change of its flags (which the look below reports): a word this end
    // set and now finds cleared is a byte on its way. Set before the read, a word the peer
    // takes at once is either read here or counted at the next arm.
    bool taken = false;
    if (read) {
        taken = rx_->readerWaiting.v.exchange(1, std::memory_order_seq_cst) == 0 && readWord_;
        readWord_ = true;
    } else if (readWord_ && rx_->readerWaiting.v.load(std::memory_order_acquire) == 0) {
        taken = true;
        readWord_ = false;
    }
    if (room) {
        const uint64_t want = std::min(room, txSize_);
        taken |= tx_->writerWaiting.v.exchange(want, std::memory_order_seq_cst) == 0 && roomWord_;
        roomWord_ = true;
    } else if (roomWord_ && tx_->writerWaiting.v.load(std::memory_order_acquire) == 0) {
        taken = true;
        roomWord_ = false;
    }
    if (taken)
        wakeOwed_.store(true, std::memory_order_relaxed);
    if (mode == Drain::Always ||
        (mode == Drain::IfOwed && wakeOwed_.load(std::memory_order_relaxed)))
        *drained = drain();
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const uint64_t f = rx_->flags.v.load(std::memory_order_acquire);
    // Room that came, but less than the room this end waits for, is no change to look at: the
    // peer wakes it once there is that much (the word above). A writer waiting for a third of a
    // ring that its peer read 64 B at a time looked again at each read, two reads of its pipes
    // each (iperf3 -l 64: 186,000 a second). Without a wait for room (none wanted, or there is
    // enough already) a head that moved is looked at, as is one out of range (reset there).
    const uint64_t head = tx_->head.v.load(std::memory_order_acquire);
    const uint64_t tail = txTail_.load(std::memory_order_relaxed);
    const bool roomCame =
        head != seenHead_ && (!room || head < seenHead_ || head > tail ||
                              txSize_ - std::min(txSize_, tail - head) >= std::min(room, txSize_));
    if (rx_->tail.v.load(std::memory_order_acquire) != seenTail_ || roomCame ||
        (seenFlags_ | f) != seenFlags_ || peerGone_.load(std::memory_order_acquire) != seenGone_ ||
        err_.load(std::memory_order_acquire) != seenErr_)
        return -EAGAIN;
    return 0;
}

bool SameHostLink::notice(int64_t nowNs)
{
    if (sleepFd_ < 0 || nowNs - lastNoticeNs_.load(std::memory_order_relaxed) < 1000000)
        return false;
    lastNoticeNs_.store(nowNs, std::memory_order_relaxed);
    // The end of the pipe only shows once the wake-ups before it are read.
    return drain();
}

void SameHostLink::shutWr(bool closed)
{
    flush(); // EOF comes after every byte written
    myFlags_.fetch_or(shm::kShutWr | (closed ? shm::kClosed : 0));
    tx_->flags.v.store(myFlags_.load(), std::memory_order_release);
    wakePeer();
}

void SameHostLink::reset()
{
    myFlags_.fetch_or(shm::kReset);
    tx_->flags.v.store(myFlags_.load(), std::memory_order_release);
    wakePeer();
}

bool SameHostLink::releaseIdleRing()
{
    if (err_.load(std::memory_order_relaxed) || held() || unreadByPeer())
        return false;
    // The peer published head == tail after its last copy out: no read of the ring is under
    // way, and the next byte it reads is written after this.
    return madvise(txRing_, txSize_, MADV_REMOVE) == 0;
}

std::string SameHostLink::debugState() const
{
    char buf[320];
    std::snprintf(
        buf, sizeof(buf),
        "same-host(fd=%d rx tail=%llu head=%llu seen=%llu waiting=%llu flags=%llu | "
        "tx tail=%llu pub=%llu peerHead=%llu waiting=%llu | gone=%d err=%d)",
        sleepFd_, (unsigned long long)rx_->tail.v.load(), (unsigned long long)rxHead_.load(),
        (unsigned long long)seenTail_, (unsigned long long)rx_->readerWaiting.v.load(),
        (unsigned long long)rx_->flags.v.load(), (unsigned long long)txTail_.load(),
        (unsigned long long)txPublished_.load(), (unsigned long long)tx_->head.v.load(),
        (unsigned long long)tx_->writerWaiting.v.load(), int(peerGone_.load()), err_.load());
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
