// SPDX-License-Identifier: MIT
// The same-host transport: a connection's two byte streams in memory shared by its two processes.
//
// When both ends of a connection run in one kernel and one network namespace, the accepting end
// creates a sealed memfd (samehost_setup.cpp) holding a header and two rings, one for each
// direction, and a pipe for each end's wake-ups, and hands the memfd and the connecting end's
// pipe ends with SCM_RIGHTS over a UNIX stream socket to the connecting end's inbox (the socket
// is closed once they are across). Each end sleeps on the read end of its own pipe: its one fd
// is what pollers sleep on. It wakes the peer with a byte into the peer's pipe, written through
// a description of that pipe it opened itself with O_RDWR: as a reader of the pipe too, its
// writes never meet a pipe without readers (no EPIPE, no SIGPIPE), and no flag the peer sets on
// descriptions of its own (O_NONBLOCK) reaches it. That description is the only writer into the
// other end's pipe, so when a process goes the kernel closes it and the peer's read end reports
// the end: the liveness channel. A byte through a pipe costs about a third of what one through a
// UNIX socket does (no buffer allocated and accounted for each).
//
// Each direction is a single-producer single-consumer ring. The producer copies bytes in at
// tail and publishes tail; the consumer copies them out at head and publishes head: one copy in,
// one copy out, no system call while both ends are busy. A side about to sleep sets its waiting
// word (readerWaiting, writerWaiting) and looks again; the other side, after publishing, clears
// it and writes one byte into its pipe, so a wake-up costs a system call only when someone sleeps.
// A writer asks for the room it waits for (a third of the ring, as the kernel wakes a writer),
// so that a reader taking small pieces of a full ring does not wake it for each.
//
// A ring starts at its setup size and may grow, once, up to the region's capacity for that
// direction (reserved at setup, backed only as touched), when a write finds it full: a bulk
// writer, or bytes the peer leaves unread, as Linux's buffers grow. Its producer publishes where
// the bigger ring starts (growAt, its tail then) and its size before any byte past that point;
// the bytes before it stay where they are in the first ring, and the bytes after it go first
// into the part of the region the first ring did not use, so nothing in flight moves and the
// consumer, reading growAt, knows where each byte is: below growAt at pos mod the first size,
// from it at (pos + first size - growAt) mod the new size. Until the consumer has read past
// growAt the producer writes no more than the new part holds.
//
// A producer that finds its ring empty, at least a page past where its bytes last started, has
// the next bytes start at the ring's offset 0 again: it stores their position (rebaseAt, beside
// tail) before any tail past it. The consumer, which has read everything before it, takes it on
// at that position: from there a byte at pos is at (pos - rebaseAt) mod the size (and a growth
// after it counts from growAt as above). A connection moving small messages keeps to its rings'
// first pages instead of cycling through them, which stayed resident until it went idle.
//
// The peer is untrusted: every index and flag it writes is read once, checked against what this
// end knows (tail never behind what was seen nor more than a ring ahead of head, head never past
// tail), and a bad one resets the connection. Offsets are taken modulo the ring size this end
// validated at setup, so no value the peer writes reaches memory outside the region; the memfd is
// sealed against resizing, so the mapping cannot be cut short under this end.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <sys/uio.h>

namespace rstream {

namespace shm {
constexpr uint32_t kMagic = 0x52534831; // "RSH1"
constexpr uint32_t kVersion = 3;        // 3: rebaseAt
// The producer's flags: no more data after tail (SHUT_WR, close), or an abortive close.
constexpr uint64_t kShutWr = 1;
constexpr uint64_t kReset = 2;
constexpr uint64_t kClosed = 4; // with kShutWr: the producer closed its end and reads no more
constexpr uint64_t kKnownFlags = kShutWr | kReset | kClosed;
constexpr size_t kHeaderBytes = 4096;
constexpr uint64_t kMinRing = 4096;
constexpr uint64_t kMaxRing = 64ull << 20;

struct alignas(64) Word
{
    std::atomic<uint64_t> v;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared words must be lock-free");

// The producer's tail and where its bytes last started at the ring's offset 0, on one line: the
// consumer reads both at each look.
struct alignas(64) TailWords
{
    std::atomic<uint64_t> v;        // bytes written, ever
    std::atomic<uint64_t> rebaseAt; // stored while the ring was empty, before a tail past it
};

// One direction's words, each on a cache line of its own.
struct DirCtl
{
    TailWords tail;     // producer
    Word flags;         // producer: kShutWr, kReset
    Word head;          // consumer: bytes consumed, ever
    Word readerWaiting; // consumer sets 1 before sleeping; the producer clears it and wakes it
    // producer sets the bytes of room it waits for (>= 1) before sleeping; the consumer clears
    // it and wakes it once that much is free (or the ring is empty, whatever the value)
    Word writerWaiting;
    // producer, once: the position from which the ring is bigger, then that size's log2 (0
    // until it grew; stored after growAt, before any tail past it)
    Word growAt;
    Word grownLog2;
};

// Direction 0 carries the accepting end's bytes, direction 1 the connecting end's.
struct Header
{
    uint32_t magic;
    uint32_t version;
    uint64_t ringSize[2]; // at setup
    uint64_t ringCap[2];  // the most each may grow to: the region holds this much
    alignas(64) DirCtl dir[2];
};
static_assert(sizeof(Header) <= kHeaderBytes);
} // namespace shm

class SameHostLink
{
public:
    ~SameHostLink();
    SameHostLink(const SameHostLink &) = delete;
    SameHostLink &operator=(const SameHostLink &) = delete;

    // The accepting end: a sealed memfd with rings of ring0 (its bytes) and ring1 (the peer's)
    // bytes, each able to grow to cap0 and cap1 (the region's size), powers of two within
    // kMinRing..kMaxRing. *memfd is the caller's to send and close.
    static int create(uint64_t ring0, uint64_t ring1, uint64_t cap0, uint64_t cap1, int *memfd,
                      std::unique_ptr<SameHostLink> *out);
    static int create(uint64_t ring0, uint64_t ring1, int *memfd,
                      std::unique_ptr<SameHostLink> *out)
    {
        return create(ring0, ring1, ring0, ring1, memfd, out);
    }
    // The connecting end: maps a memfd the peer sent after checking its seals, size and header.
    // -EPROTO for anything a well-behaved peer would not send.
    static int attach(int memfd, std::unique_ptr<SameHostLink> *out);
    // The read end of this end's pipe (to sleep on) and this end's read-write description of the
    // peer's pipe (to wake it): the link owns them from now on.
    void setWakeFds(int sleepFd, int wakeFd);
    // In a fork child: the link is the parent's; its fds are closed here, its calls fail (EIO).
    void forgetAfterFork();
    int fd() const { return sleepFd_; }
    // The rings' sizes now (the send ring's as this end grew it, the receive ring's as this end
    // has learnt of its growth).
    uint64_t sendRing() const { return txSize_.load(std::memory_order_acquire); }
    uint64_t recvRing() const { return rxSize_.load(std::memory_order_acquire); }
    // Sender side: the send ring may grow to upTo bytes (rounded up to a power of two, at most
    // the region's capacity), once, when a write finds it full; 0: it keeps its size (SO_SNDBUF
    // set, as Linux stops growing a buffer whose size was set).
    void allowGrowth(uint64_t upTo);
    // Sender side: whether an empty send ring starts again at its beginning (Settings::ringRewind).
    void allowRebase(bool on) { rebase_.store(on, std::memory_order_relaxed); }
    uint64_t sendRingMax() const { return txCap_; }
    // Whether a write into the full ring would grow it (write() grows it then).
    bool canGrow() const { return txGrowTo_.load(std::memory_order_relaxed) != 0; }

    // Sender side (one sender at a time): copies up to len bytes from the iovecs, skip bytes in,
    // into the ring; returns the bytes copied (0 when the ring is full or the link failed).
    // hold (TCP_CORK, MSG_MORE): the peer sees whole frames (a quarter of the ring) only; the
    // rest waits for a write without hold or flush().
    size_t write(const iovec *iov, int iovcnt, size_t skip, size_t len, bool hold = false);
    // Bytes written and held back from the peer; flush() publishes them (any thread).
    uint64_t held() const;
    void flush();
    // Receiver side (one receiver at a time): copies up to len bytes out; peek leaves them.
    size_t read(const iovec *iov, int iovcnt, size_t skip, size_t len, bool peek);

    // Readiness, from any thread. recvState: bytes readable, 0 at EOF, -EAGAIN, -ECONNRESET.
    // sendState: bytes of room, or -EPIPE (shut down, or the peer closed), -ECONNRESET.
    ssize_t recvState();
    ssize_t sendState();
    uint64_t unreadByPeer() const; // bytes sent that the peer has not read yet
    // The peer's read count as it wrote it (unchecked: for telling whether the peer reads).
    uint64_t peerReadCount() const { return tx_->head.v.load(std::memory_order_acquire); }
    uint64_t readable() const;
    // Serial numbers of what changed what a poller sees: data or EOF arrived, room appeared.
    // Each call compares with the last and counts a change.
    bool observe(uint64_t *rxChanges, uint64_t *txChanges);

    // Before sleeping on fd(): reads the wake-up bytes (and notices a peer that went), sets the
    // waiting words for what is wanted (room: the bytes of room to be woken for, 0 for none),
    // and returns -EAGAIN when something changed since the last observe() (look again instead
    // of sleeping). *drained: wake-up bytes were read, which other sleepers on the same fd may
    // have been woken for. mode says when the wake-up bytes are read: Always (the caller saw
    // fd() readable, or cannot tell) or IfOwed (it has not seen fd() readable since its last
    // arm: read only where the peer took a waiting word of this end's, as it then writes a byte).
    enum class Drain
    {
        Always,
        IfOwed
    };
    // roomMatters: whether the peer's reads are a change to look at (a caller that only waits
    // to read sleeps through them).
    int arm(bool read, uint64_t room, bool *drained, Drain mode = Drain::Always,
            bool roomMatters = true);
    // The room a writer waits for: a third of the ring, when poll reports POLLOUT (as Linux's
    // sk_stream_is_writeable), and when a blocking send goes on.
    uint64_t writableRoom() const { return (sendRing() + 2) / 3; }
    // Reads the wake-up bytes now and then even without sleeping, so that a peer that went is
    // noticed by a program that only polls without blocking (bounded: once a millisecond).
    // true: bytes were read, which sleepers on fd() may have been woken for (as arm()).
    bool notice(int64_t nowNs);

    // This end: no more data (SHUT_WR; closed: nothing read any more either, so the peer's
    // writes fail with EPIPE), or an abortive close; the peer is woken either way.
    void shutWr(bool closed = false);
    void reset();
    // The link failed locally (a bad index or flag from the peer): its error, 0 if none.
    int error() const { return err_.load(std::memory_order_acquire); }
    // Sender side (one sender at a time): when everything sent has been read, the send ring's
    // pages go back to the system (the peer's mapping loses them too, and reads nothing there
    // until this end writes again). true when released.
    bool releaseIdleRing();
    // One line of state, for diagnostics.
    std::string debugState() const;
    // Bytes of the region backed by memory now (mincore).
    size_t residentBytes() const;

    // Tests: the words of this end's receive direction, as a hostile peer would write them.
    shm::DirCtl *testRecvDir() { return rx_; }
    // Tests: reads of the pipe so far (each a system call).
    uint64_t testWakeReads() const { return wakeReads_.load(std::memory_order_relaxed); }
    shm::DirCtl *testSendDir() { return tx_; }

private:
    SameHostLink() = default;
    int mapRegion(int memfd, size_t size);
    // Points this end at the region's two directions with the sizes it checked; mine: the
    // direction it produces (0: the maker's).
    void placeRings(int mine, uint64_t ring0, uint64_t ring1, uint64_t cap0, uint64_t cap1);
    void corrupt(const char *what);
    void wakePeer();
    void publish(uint64_t pos); // the peer may read up to pos
    uint64_t peerFlags();       // validated; 0 after a bad value (the link failed)
    // The link's error, or -ECONNRESET for the peer's reset, else 0; *flags: the peer's flags.
    int failure(uint64_t *flags);
    bool drain(); // true: bytes were read, or the peer went
    // The tail the producer may reach with the peer's head at head (the ring's geometry).
    uint64_t txMaxTail(uint64_t head) const;
    // The same for the receive direction, as this end knows it: the peer's growth is taken on
    // (checked) once it is published; 0 after a bad one (the link failed).
    uint64_t rxMaxTail(uint64_t head);
    bool adoptRxGrowth();
    void grow(uint64_t tail);
    // Where the byte at pos is in a ring of size now that started at init bytes, with the bytes
    // from base at offset 0 and, if it grew, those from growAt after the first ring's place.
    static uint64_t offsetOf(uint64_t pos, uint64_t base, uint64_t init, uint64_t size,
                             uint64_t growAt)
    {
        if (size != init && pos >= growAt && growAt > base)
            return (pos - growAt + init) & (size - 1);
        return (pos - base) & ((size != init && base >= growAt ? size : init) - 1);
    }
    void copyOut(uint64_t head, const iovec *iov, int iovcnt, size_t skip, size_t n);

    uint8_t *mem_ = nullptr;
    size_t memSize_ = 0;
    int sleepFd_ = -1;          // this end's pipe, read end
    int wakeFd_ = -1;           // the peer's pipe, read-write
    shm::DirCtl *tx_ = nullptr; // this end produces
    shm::DirCtl *rx_ = nullptr; // this end consumes
    uint8_t *txRing_ = nullptr;
    uint8_t *rxRing_ = nullptr;
    // The rings' first sizes and the most they may grow to (set up once), their sizes now, and
    // the positions from which the grown sizes apply (stored before the size: read after it).
    uint64_t txInit_ = 0, rxInit_ = 0, txCap_ = 0, rxCap_ = 0;
    std::atomic<uint64_t> txSize_{0}, rxSize_{0};
    std::atomic<uint64_t> txGrowAt_{0}, rxGrowAt_{0};
    // Where the bytes last started at offset 0 again (rebaseAt): this end's own, as it stored it
    // and as it took the peer's on (the receiver's, one receiver at a time).
    std::atomic<uint64_t> txBase_{0}, rxBase_{0};
    std::atomic<bool> rebase_{true};
    std::atomic<uint64_t> txGrowTo_{0}; // the size a full send ring grows to; 0: none
    std::mutex rxGrowMutex_;            // lookers taking on the peer's growth
    // This end's own copies: the peer never writes these.
    std::atomic<uint64_t> txTail_{0};      // sender: what it copied in
    std::atomic<uint64_t> txPublished_{0}; // what the peer may read (tail in the region)
    std::mutex pubMutex_;                  // publishers: the sender, flush() from elsewhere
    std::atomic<uint64_t> rxHead_{0};      // receiver: what it published
    std::atomic<uint64_t> rxTailSeen_{0};
    std::atomic<uint64_t> txHeadSeen_{0};
    std::atomic<uint64_t> myFlags_{0};
    std::atomic<uint64_t> peerFlagsSeen_{0};
    std::atomic<bool> peerGone_{false}; // the pipe ended: the peer's process went
    std::atomic<int> err_{0};
    std::atomic<int64_t> lastNoticeNs_{0};
    // The waiting words this end set and has not seen taken (arm()'s callers hold one lock),
    // and whether a wake-up byte may wait in the pipe: the peer took a word since the last read
    // that found the pipe empty.
    bool readWord_ = false, roomWord_ = false;
    std::atomic<bool> wakeOwed_{true};
    std::atomic<uint64_t> wakeReads_{0};
    // observe()'s last view.
    uint64_t seenTail_ = 0, seenHead_ = 0, seenFlags_ = 0;
    bool seenGone_ = false;
    int seenErr_ = 0;
};

} // namespace rstream
