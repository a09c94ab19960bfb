// SPDX-License-Identifier: MIT
// A stream connection over one libfabric MSG endpoint.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <netinet/in.h>
#include <poll.h>
#include <string>
#include <sys/socket.h>
#include <sys/uio.h>
#include <vector>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>

#include "credits.h"
#include "fabric.h"
#include "fid.h"
#include "hint_pass.h"
#include "keepalive.h"
#include "progress.h"
#include "ring.h"
#include "ring_growth.h"
#include "samehost.h"
#include "settings.h"
#include "spin.h"
#include "tx_ring.h"
#include "watch.h"
#include "window_table.h"
#include "wire.h"

namespace rstream {

class Listener;

// Flags for send/recv.
enum IoFlags : int
{
    kNonBlock = 1 << 0, // return -EAGAIN instead of waiting
    kPeek = 1 << 1,     // recv: copy without consuming
    kWaitAll = 1 << 2,  // recv: wait for the whole length (or EOF/error)
    kMore = 1 << 3,     // send: more data follows (MSG_MORE), so a partial write waits
};

// Events for wait().
enum WaitEvents : int
{
    kReadable = 1 << 0,
    kWritable = 1 << 1,
};

class Connection : public ProgressClient
{
public:
    explicit Connection(const Settings &settings = Settings::fromEnv());
    ~Connection() override;
    Connection(const Connection &) = delete;
    Connection &operator=(const Connection &) = delete;
    // Connections of this process made and not yet destroyed: what a leak check compares
    // before and after, since each holds its endpoint's fds, memory and registrations.
    static long liveCount() { return live_.load(std::memory_order_relaxed); }

    // Settings may change until connect().
    Settings &settings() { return settings_; }

    // Binds the local address used to connect. Optional.
    int bind(const sockaddr *addr, socklen_t len);

    // Starts connecting. Blocking: 0 when established, or -errno. Nonblocking: -EINPROGRESS,
    // then connectResult() or wait(kWritable) tell when it is done.
    int connect(const sockaddr *addr, socklen_t len, bool nonblock = false);
    // 0 once established, -EINPROGRESS while connecting, -errno if it failed (kept sticky).
    int connectResult();
    // The failed connect was refused with a Defer refusal (upgrade_wire.h): the listener's
    // process runs the shim and takes the connection over kernel TCP, to upgrade it there.
    bool refusedWithDefer() const { return deferred_.load(std::memory_order_acquire); }

    // Bytes sent (maybe fewer than len), or -EAGAIN/-EPIPE/-ECONNRESET/-ENOTCONN/-EINTR/-ETIMEDOUT.
    // timeoutMs < 0 waits forever; ignored with kNonBlock.
    ssize_t send(const void *buf, size_t len, int flags = 0, int timeoutMs = -1);
    ssize_t sendv(const iovec *iov, int iovcnt, int flags = 0, int timeoutMs = -1);
    // Bytes received, 0 at EOF, or -errno.
    ssize_t recv(void *buf, size_t len, int flags = 0, int timeoutMs = -1);
    ssize_t recvv(const iovec *iov, int iovcnt, int flags = 0, int timeoutMs = -1);
    // Tests only: called by recv() between choosing the bytes it copies and copying them, when
    // set, so that a test can make another thread's work (a RESET) land in between.
    static inline std::atomic<void (*)(Connection *)> testBeforeRecvCopy{nullptr};
    // Tests only: when set, registerRegion() asks it first and fails with what it returns when
    // that is a -errno, as a provider out of registrations (fi_mr_reg) would.
    static inline std::atomic<int (*)(size_t len, uint64_t access)> testRegisterFault{nullptr};

    // riomap(3): makes [buf, buf + len) a window the peer can riowrite() into, at the riowrite
    // offset `offset`, or, with offset -1, at one chosen here (the buffer's address when free).
    // *chosen gets the offset. remote false (PROT_NONE) only records the mapping. The peer
    // learns of the window before any stream data sent after this call. -EINVAL for bad
    // arguments or an offset range overlapping another window, -ENOMEM when the peer's table
    // (its ioMapSize) is full, -ENOTCONN before the connection is established.
    int mapWindow(void *buf, size_t len, bool remote, off_t offset, off_t *chosen);
    // riounmap(3): the mapping of exactly buf and len goes; the memory is the application's
    // again when this returns: a window the peer knows is withdrawn in the stream, and this
    // waits for the peer's UNMAPPED (ordered behind every write it made into the window), or
    // resets the connection after settings().unmapTimeoutMs. -EINVAL when there is no such
    // mapping.
    int unmapWindow(void *buf, size_t len);
    // riowrite(3): writes len bytes into the peer's window covering [offset, offset + len),
    // after all stream data sent before. Bytes written (all of them unless kNonBlock or a
    // timeout cut it short), or -EINVAL (no such window), or send()'s errors.
    ssize_t writeWindow(const void *buf, size_t len, off_t offset, int flags = 0,
                        int timeoutMs = -1);

    // Readiness, making progress as it asks. peekRecv: bytes readable now, 0 at EOF, -EAGAIN
    // when nothing yet, -errno on error. peekSend: bytes that can be queued now (0 = full), or
    // -errno (-ENOTCONN while connecting, -EPIPE after shutdown(WR), -ECONNRESET).
    ssize_t peekRecv();
    ssize_t peekSend();
    // Both, as poll needs them: with one round of progress, or none while the connection is
    // quiet (see hintFd()); ring: the send ring's size now (it grows; same-host: the link's).
    void peek(ssize_t *recv, ssize_t *send, uint64_t *ring = nullptr);

    // Readiness hints, for pollers that look at many connections (poll, select, epoll). A look
    // that finds nothing new arms the wait fd, and until that fd turns readable nothing can be
    // pending in the provider: a look then needs no progress call (on tcp a system call per
    // connection and look). A poller starts a pass (HintPass), checks the armed wait fds of all
    // its connections (passHintFd(): the fd while armed, else -1) in one system call, and calls
    // hintQuiet() for each fd found not readable; peek() on this thread within that pass then
    // reads the state as it is. Any other look, or one whose fd was readable, makes progress.
    int hintFd() const
    {
        // A same-host link's fd while armed since its last change, for epoll to park on. A poll
        // or select pass leaves it out (passHintFd()): the link's look reads shared memory, where
        // a check of its fd would cost a system call at every look, even one answered at once.
        if (shOn_.load(std::memory_order_acquire))
            return shArmed_.load(std::memory_order_relaxed) ? shFd_.load(std::memory_order_acquire)
                                                            : -1;
        return armed_.load(std::memory_order_acquire) ? waitFd_ : -1;
    }
    int passHintFd() const { return shOn_.load(std::memory_order_acquire) ? -1 : hintFd(); }
    void hintQuiet() { hintPass_.store(HintPass::current(), std::memory_order_relaxed); }
    using HintPass = rstream::HintPass;

    // shutdown(2) semantics: SHUT_RD, SHUT_WR, SHUT_RDWR.
    int shutdown(int how);
    void allowAfterClose(uint64_t bytes); // after close, this much peer data is no reset
    // Graceful close: data already accepted is still delivered, then the peer sees EOF. The
    // object may be destroyed right after; delivery finishes in the background.
    static void close(std::unique_ptr<Connection> conn);
    // Abortive close: the peer sees ECONNRESET.
    static void abort(std::unique_ptr<Connection> conn);

    // The fd to poll for any change of this connection (data, space, connection, EOF).
    int waitFd() const override
    {
        const int fd = shFd_.load(std::memory_order_acquire);
        return fd >= 0 ? fd : waitFd_;
    }
    // Arms the wait fd before sleeping on it: 0 when it is safe to sleep, -EAGAIN when events
    // are already pending (make progress and look again instead).
    int arm();
    // Waits up to timeoutMs (<0 forever) for any of events; returns the events ready (0 on
    // timeout), or -EINTR. Errors and EOF count as ready for both.
    int wait(int events, int timeoutMs);

    // External pollers (rpoll, the shim's poll/epoll): an eventfd registered here is written
    // whenever progress made by any thread changes readiness, because reading the CQ resets
    // the wait fd's signal. Register before the last readiness check, unregister after waking.
    void addWaiter(int eventFd);
    void removeWaiter(int eventFd);
    // Pollers' standing registrations (watch.h, which says when a parked slot is marked).
    void addWatch(std::shared_ptr<WatchSlot> slot);
    void removeWatch(const WatchSlot *slot);
    uint64_t watchSeq() const { return watchSeq_.load(); }
    // This thread's last peek(): the connection and its watchSeq() (read with what it saw).
    static WatchLook lastLook() { return tLook; }
    static void clearLook() { tLook = WatchLook{nullptr, 0}; }
    // arm(), and on success (0) the watchSeq() read under the lock once armed. fdSeen false: not
    // seen readable since the last arm (a same-host link reads it only for an owed wake-up).
    int arm(uint64_t *seq, bool fdSeen = true);
    // Events that can make it newly readable (data, EOF, errors) or writable (edge-triggered).
    uint64_t rxEventCount() const { return rxEvents_.load(std::memory_order_relaxed); }
    uint64_t txEventCount() const { return txEvents_.load(std::memory_order_relaxed); }

    // TCP_CORK: while on, only full writes go out; what is left waits until the cork comes off,
    // a close or shutdown(SHUT_WR), or kCorkMaxNs, as Linux holds partial frames. A send with
    // kMore holds its data the same way until a send without it.
    void setCork(bool on);
    // SO_SNDBUF / SO_RCVBUF on the connected socket: the send or receive ring stops growing.
    void fixBufferSizes(bool send, bool recv);
    static constexpr int64_t kCorkMaxNs = 200'000'000;

    // SO_KEEPALIVE with TCP_KEEPIDLE, TCP_KEEPINTVL and TCP_KEEPCNT in one call: once nothing
    // has arrived for idleSec seconds, a probe goes every intervalSec seconds; the peer's engine
    // answers it, and any word from the peer counts as an answer. After count unanswered probes
    // the connection fails with -ETIMEDOUT. A value of 0 keeps the current one (initially
    // 7200/75/9, as on Linux); -EINVAL when out of Linux's ranges (1..32767, 1..32767, 1..127).
    // May be called before connect(); the timer starts once connected.
    int setKeepalive(bool on, int idleSec = 0, int intervalSec = 0, int count = 0);
    // TCP_USER_TIMEOUT: the connection fails with ETIMEDOUT once data it holds has waited this
    // long without the peer taking any of it (no credit, no completion), as Linux does when a
    // zero window lasts; 0 (the default) waits for as long as the peer lives.
    void setUserTimeout(unsigned ms);
    void keepalive(bool *on, int *idleSec, int *intervalSec, int *count) const;

    // What TCP_INFO reports.
    struct Info
    {
        bool connecting = false;
        bool connected = false;
        bool peerShutWr = false; // EOF seen or coming
        bool shutWr = false;     // our side shut down for writing
        int error = 0;           // sticky -errno, 0 if none
        uint32_t rttUs = 0;      // round-trip estimate (connection handshake), 0 if unknown
        uint64_t bytesSent = 0;
        uint64_t bytesReceived = 0;
        uint32_t sendBuf = 0;
        uint32_t recvBuf = 0;
        uint32_t unackedBytes = 0; // queued or in flight towards the peer
        uint32_t probes = 0;       // keepalive probes sent and not answered yet
        uint64_t probesSent = 0;   // keepalive probes sent in all
        uint32_t sendGrowths = 0;  // times the send ring grew
        uint32_t recvGrowths = 0;  // times the receive ring grew (the peer switched)
    };
    Info info();

    // Queues and credits for diagnostics (rstream-stat): read as they are, without making
    // progress. false when another thread holds the connection right now (ask again later).
    struct FlowState
    {
        int state = 0; // 0 idle, 1 connecting, 2 accepting, 3 connected, 4 closed
        int error = 0; // sticky -errno
        bool shutWr = false;
        bool peerShutWr = false;
        uint32_t rttUs = 0;
        uint64_t sendQueued = 0;      // in the send ring: unsent or in flight
        uint64_t recvQueued = 0;      // in the receive ring, not read yet
        uint64_t peerCreditBytes = 0; // room in the peer's ring we may write into
        uint32_t peerCreditSlots = 0; // messages the peer can still receive
        uint64_t owedBytes = 0;       // ring space consumed and not yet returned to the peer
        uint32_t owedSlots = 0;       // receive slots reposted and not yet returned
        uint32_t sendBuf = 0;
        uint32_t recvBuf = 0;
        uint64_t ringResident = 0; // bytes of the two rings backed by memory now (mincore)
    };
    bool flowState(FlowState *out);

    int localAddress(sockaddr_storage *addr, socklen_t *len) const;
    int peerAddress(sockaddr_storage *addr, socklen_t *len) const;

    bool iwarpMode() const { return iwarp_; }
    // The bytes move through memory shared with the peer's process on this machine (samehost.h),
    // not the fabric: chosen in the connection setup when both ends are in one kernel and one
    // network namespace and both allow it (Settings::sameHost).
    bool sameHost() const { return shOn_.load(std::memory_order_acquire); }
    // Makes this new connection (never connected) an established one over link, a same-host
    // link set up outside the fabric (the preload shim's in-band setup, samehost_setup.h),
    // with the addresses of the connection it carries on. -EISCONN when not new.
    int adoptSameHost(std::unique_ptr<SameHostLink> link, const sockaddr *local, socklen_t llen,
                      const sockaddr *peer, socklen_t plen);
    // Tests: the same-host link, to play a hostile peer's part on its shared words.
    SameHostLink *testSameHostLink() { return sh_.get(); }

    // Progress calls made on this connection (each asks the provider for completions: on tcp a
    // system call): what the tests of readiness hints count.
    uint64_t progressCalls() const { return progressCalls_.load(std::memory_order_relaxed); }
    // KEEPALIVE words the peer sent (its probes, and its checks that injected writes left).
    uint64_t keepalivesReceived() const { return kaReceived_.load(std::memory_order_relaxed); }
    // Resident bytes of the send and receive rings in use (mincore), and how many times idle
    // rings gave their pages back (tests and statistics); rstream's own memory for the
    // connection (its mapping's resident pages, its tables, the object: not the provider's).
    size_t ringResidentBytes();
    size_t ownMemoryBytes();
    uint64_t ringReleases() const { return ringReleases_.load(std::memory_order_relaxed); }
    // DATA words this end sent that rewound the peer's ring to its start (wire.h; tests).
    uint64_t ringRewinds() const { return rewinds_.load(std::memory_order_relaxed); }
    // The spins blocking waits chose before sleeping, summed (AdaptiveSpin; tests).
    uint64_t spinChosenNs() const { return spinChosenNs_.load(std::memory_order_relaxed); }

    // Statistics.
    uint64_t bytesSent() const { return bytesSent_.load(std::memory_order_relaxed); }
    uint64_t bytesReceived() const { return bytesReceived_.load(std::memory_order_relaxed); }
    // One line of internal state, for diagnostics.
    std::string debugState();

    // For the progress thread: makes progress if nobody else is. Returns kProgressDone when no
    // work remains that needs progress without the application, kProgressMore while some does
    // (unsent or in-flight data, owed messages, a pending close), kProgressBusy/kProgressLater
    // when the application holds the connection or drives its progress itself (look again in a
    // millisecond / at *recheckNs). closedDone: a closing connection may be destroyed.
    int backgroundProgress(bool *closedDone, int64_t *recheckNs) override;
    // For the progress thread at exit: a closing connection has handed everything over.
    bool closeDelivered() const override { return delivered_.load(std::memory_order_acquire); }
    // For the progress thread's timer: connection deadlines and keepalive. Returns the next
    // deadline (0: none). *watch: the connection now has background work and is marked watched.
    int64_t timerTick(int64_t nowNs, bool *watch) override;
    // For the progress thread when the wait fd of a connection in its passive set is readable
    // (the application may be making no calls): answers what arrived. false: it is finished
    // (failed or shut down) and leaves the passive set.
    bool passiveProgress(bool *watch) override;

private:
    friend class Listener;
    static inline std::atomic<long> live_{0};
    enum class State
    {
        Idle,
        Connecting,
        Accepting,
        Connected,
        Closed
    };

    struct RxSlot
    {
        fi_context2 ctx;
    };

    int setup(const fi_info *info);
    int openEndpoint(fi_info *info);
    int registerMemory();
    // Under *wantKey when given (one try), else a random key or the provider's.
    int registerRegion(void *buf, size_t len, uint64_t access, fid_mr **mr,
                       const uint64_t *wantKey = nullptr);
    uint64_t keyOfSize(uint64_t key) const; // cut to the domain's key size
    int postReceive(uint32_t index);
    // Answers a connection request; takes connreq. On failure, *rejectable tells whether the
    // request is still the caller's to fi_reject (else the endpoint took it, and dropping the
    // connection refuses the peer).
    int startAccept(fi_info *connreq, const wire::Hello &peer, bool *rejectable);
    int acceptLocked(fi_info *connreq, const wire::Hello &peer);
    int applyPeerHello(const wire::Hello &peer);
    wire::Hello localHello() const;

    // All below run with mutex_ held. app: called for the application (not the progress thread).
    void progressLocked(bool app = true);
    void processEqLocked();
    void processCqLocked();
    // record: the IOMAP record that came with the word, null if none.
    void handleWordLocked(uint32_t word, const uint8_t *record = nullptr);
    void handleIoMapLocked(uint32_t id, const uint8_t *record);
    void onUnmappedLocked();
    bool flushRecordsLocked();
    bool canWriteWindowLocked() const;
    // The peer may write into our windows: it knows them and the endpoint is up.
    bool peerMayWriteLocked() const;
    // The windows just taken out of the table had queued withdrawals: sends them and waits
    // (unlocking) until they are answered, the connection is down, or unmapTimeoutMs passed
    // (then it is reset), so that no write of the peer's lands in them afterwards.
    void withdrawLocked(std::unique_lock<std::mutex> &lock, uint32_t queued);
    // Withdraws every window of ours and waits as above, then closes their regions.
    void releaseWindowsLocked(std::unique_lock<std::mutex> &lock);
    void onTxCompleteLocked(TxOp *op);
    // force: nothing waits to coalesce behind writes in flight. uncork: corked data goes too
    // (a riowrite must follow it).
    void flushLocked(bool force, bool uncork = false);
    // Ring growth. Receiver: asks the peer to move to a bigger ring when it ran out of credit
    // while the application reads in bulk, or (full) when the ring is full of unread bytes.
    // Sender: the send ring grows, once empty, when it is what holds the application back.
    void maybeGrowRecvLocked(bool full = false);
    void onSwitchLocked();
    void onGrowLocked(uint32_t log2);
    void maybeGrowSendLocked();
    uint64_t readableLocked() const { return rxOld_.readable() + rx_.readable(); }
    // The application consumed n bytes: the old ring's first, then the current one's.
    void consumeLocked(uint64_t n);
    void discardReadableLocked();
    int sendWordLocked(uint32_t word);
    void sendCreditsLocked();
    void failLocked(int err, const char *why);
    void disconnectLocked(wire::Ctrl how);
    bool needsBackgroundLocked() const;
    // The background work left is data that waits for the peer's credit, and nothing else.
    bool waitsForPeerLocked() const;
    // ... is learning that sends left the provider (injects; writes seen sent whole), no more.
    bool onlyLeftSendsPendingLocked() const;
    bool takePendingLocked(); // what the last look did not take; true: it changed something
    int rearmLocked(bool light = false); // an arm that takes what is pending until it holds
    bool reapAfterSendLocked(); // a send after a pause reaps its write's completion at once
    ssize_t peekRecvLocked() const;
    // Nothing but the peer can change the state (no unsent data, credit or word owed, no
    // deadline to check): while armed, a look needs no progress.
    bool quietLocked() const;
    ssize_t peekSendLocked() const;
    void watch();
    void wakeSleepersLocked();
    // Moves watchSeq() and marks the parked watch slots (see addWatch()).
    void notifyWatchesLocked();
    // The wait fd no longer signals what comes next: a parked poller must look and arm again.
    void disarmLocked();
    int armLocked(bool light = false); // light: may skip fi_trywait (see wait.cpp)
    // quiet_signal.cpp: once connected; after each send; an arm without a system call.
    void quietSignalLocked();
    void noteTxPostedLocked(bool sentWhole = false); // the kernel took all the post sent
    void lightArmLocked();
    ssize_t recvLocked(const iovec *iov, int iovcnt, int flags);

    // progressed: the caller has just made progress and found nothing, so the first look is
    // skipped (on tcp, a CQ poll is a system call).
    int waitFor(int events, int64_t deadlineNs, bool progressed = false);
    // waitFor()'s and shWaitFor()'s steps after a look that found nothing: spin (Again), give
    // up (TimedOut), or arm and sleep (Sleep); *now is the time it read.
    enum class WaitStep
    {
        Sleep,
        Again,
        TimedOut
    };
    WaitStep spinStepLocked(std::unique_lock<std::mutex> &lock, int64_t deadlineNs, int64_t capNs,
                            int64_t *missNs, int64_t *spinEnd, int64_t *now);
    // Sleeps (mutex_ released) on fds[0..n-1] and this thread's wake-up eventfd, which it puts
    // in fds[n], registered as a sleeper, until untilNs (0: no bound), signals as held says
    // (signals_held.h: its mask, or its handlers' count). 0, or -EINTR, -ENOMEM.
    int sleepLocked(std::unique_lock<std::mutex> &lock, pollfd *fds, int n, int64_t untilNs,
                    int64_t nowNs, class SignalsHeld &held);
    int64_t keepaliveLocked(int64_t now);
    int64_t userTimeoutLocked(int64_t now); // the next look (0: none)
    int checkCmDataSize(size_t *max);       // *max: the CM data the provider carries
    int openQueues(bool waitSet);
    // The same-host transport (samehost_conn.cpp). sendMutex_ / recvMutex_ held by the callers
    // of shSendv / shRecvv.
    ssize_t shSendv(const iovec *iov, int iovcnt, int flags, int64_t deadlineNs);
    ssize_t shRecvv(const iovec *iov, int iovcnt, int flags, int64_t deadlineNs);
    int shWaitFor(int events, int64_t deadlineNs);
    int shReadyLocked(int events);
    ssize_t shRecvStateLocked();
    ssize_t shNoticeLocked(ssize_t state); // -EAGAIN: looks at the link's pipe (bounded)
    void shPeekLocked(ssize_t *recv, ssize_t *send);
    int shArmLocked(bool fdSeen);
    // Once the link is up: the setup's endpoint, queues and rings are closed and freed.
    void shReleaseFabricLocked();
    // Closes the endpoint, then its regions, queues and fds, and frees its rings (idempotent).
    void freeEndpoint();
    int64_t shTimerLocked(int64_t nowNs); // cork and idle ring: the next deadline (0: none)
    // The link is up and the fabric's part is done: pollers sleep on the link's fd from now on.
    void shConnectedLocked();
    // The connecting end, on the peer's answer: collects the link it sent (0), or -errno.
    int shCollectLocked(const wire::Hello &peer);
    void shCloseLocked(bool abortive);
    int shShutdownLocked(int how);
    void shInfoLocked(Info *i);
    void shFlowLocked(FlowState *out);
    uint64_t bytesMovedLocked() const; // sent and received, for the idle rings' timer
    size_t ringResidentLocked();
    void armRingTimerLocked();             // after the application moved bytes
    int64_t ringTickLocked(int64_t nowNs); // the timer: release or look again (0: disarmed)

    Settings settings_;
    std::shared_ptr<Domain> domain_;
    fi_info *info_ = nullptr;
    // Closed by the destructor in the order they depend on each other: the endpoint first.
    FidPtr<fid_wait> waitSet_;
    FidPtr<fid_eq> eq_;
    FidPtr<fid_cq> cq_;
    FidPtr<fid_mr> localMr_;
    FidPtr<fid_mr> remoteMr_; // the receive ring in use
    FidPtr<fid_mr> nextMr_;   // the ring a GROW announced, until the peer's SWITCH
    FidPtr<fid_ep> ep_;
    int waitFd_ = -1;
    int ownWaitFd_ = -1; // the epoll fd over the CQ's and the EQ's fds, without a wait set
    void *localDesc_ = nullptr;

    // One anonymous mapping: send ring area | receive ring area | slot words | control words.
    // The ring areas are reserved for growth; pages are only backed once touched.
    uint8_t *mem_ = nullptr;
    size_t memSize_ = 0;
    uint8_t *sendBase_ = nullptr;
    uint8_t *recvArea_ = nullptr; // the registered receive area; rings follow each other in it
    size_t sendReserve_ = 0;
    size_t recvReserve_ = 0;
    uint8_t *recvBase_ = nullptr; // the current receive ring
    uint8_t *slotBufs_ = nullptr; // one per posted receive: iWarp words and IOMAP records
    size_t slotStride_ = 0;
    uint8_t *recordBufs_ = nullptr; // kRecordBufs sources of IOMAP sends
    uint32_t *ctrlWords_ = nullptr; // sources for control sends that cannot be injected

    std::mutex mutex_;     // state, rings, credits, the CQ and EQ
    std::mutex sendMutex_; // one sender at a time (copies run without mutex_)
    std::mutex recvMutex_; // one receiver at a time

    State state_ = State::Idle;
    int error_ = 0; // sticky -errno once the connection failed
    bool iwarp_ = false;
    bool peerShutWr_ = false;           // EOF arrives after the ring drains
    bool peerGone_ = false;             // the provider reported the endpoint shut down
    std::atomic<bool> deferred_{false}; // refused with a Defer refusal
    bool shutWr_ = false;               // we want SHUT_WR sent after the data
    bool shutWrSent_ = false;
    bool disconnectSent_ = false;
    bool shutRd_ = false;
    bool closing_ = false;    // close(): disconnect once the data is delivered
    bool closed_ = false;     // disconnect sent, endpoint shut down
    bool cork_ = false;       // TCP_CORK
    bool more_ = false;       // the last send had kMore
    bool corkHeld_ = false;   // the last flush left partial data for the cork
    int64_t corkSinceNs_ = 0; // when corked data began to wait (0: none)
    int64_t connectDeadlineNs_ = 0, connectStartNs_ = 0;
    int64_t dryReadNs_ = 0; // recvv(): when a read last left the ring dry, armed (0: not since)
    uint32_t rttUs_ = 0;
    int64_t closeDeadlineNs_ = 0;
    bool watched_ = false;      // registered with the progress thread
    bool peerClosed_ = false;   // the peer sent DISCONNECT: writes get EPIPE
    std::vector<int> sleepers_; // wake-up eventfds of the threads asleep in waitFor()
    std::vector<std::shared_ptr<WatchSlot>> watches_; // pollers' standing registrations
    std::atomic<uint64_t> watchSeq_{0};
    static inline thread_local WatchLook tLook{nullptr, 0};
    // A fi_trywait succeeded and neither the CQ nor the EQ has been read since: anything new
    // makes the wait fd readable (see hintFd()). Written under mutex_, read without it.
    std::atomic<bool> armed_{false};
    std::atomic<uint64_t> hintPass_{0}; // the pass that found the armed wait fd not readable
    bool changed_ = false;              // progress changed what waiters may be waiting for
    uint32_t eqSkips_ = 0;              // progress calls since the EQ was last read while connected
    bool cqDrained_ = false;            // the last read found the CQ empty (armLocked())
    // quiet_signal.cpp: signal out of the wait fd; CQ emptied; a send posted since the last pass.
    bool quietSignal_ = false, cqTaken_ = false, unverified_ = false;
    uint64_t closeAllowance_ = 0; // allowAfterClose()
    bool eqDue_ = false;          // the CQ reported an error since the EQ was last found empty
    sockaddr_storage bindAddr_{};
    socklen_t bindLen_ = 0;
    bool passive_ = false; // in the progress thread's passive set

    KeepaliveTimer ka_;
    int64_t userTimeoutNs_ = 0;
    int64_t stallSinceNs_ = 0; // when data was first seen waiting with no progress since
    uint64_t stallEvents_ = 0; // txEvents_ then
    bool kaAckOwed_ = false;   // the peer probed; KEEPALIVE_ACK not sent yet

    SendRing tx_;
    RecvRing rx_;
    // Growth. Receiver: the ring before the last SWITCH while it still holds unread bytes (size
    // 0: none), a GROW awaiting its SWITCH. Sender: the peer's GROW awaiting our SWITCH.
    RecvRing rxOld_;
    uint8_t *rxOldBase_ = nullptr;
    bool rxCopying_ = false; // recv() copies out of the rings without the lock (see recvv)
    RingGrowth growth_;
    PeerCredits peer_;
    LocalCredits local_;
    uint64_t peerRingAddr_ = 0;
    uint64_t peerKey_ = 0;    // of the peer's ring in use (wire::nextRingKey() after each SWITCH)
    bool peerRewind_ = false; // the peer takes DATA words that rewind its ring (kDataRewind)
    std::atomic<uint64_t> rewinds_{0}; // DATA words this end sent with kDataRewind (tests)

    // riomap windows. Ours: ids below the peer's ioMapSize; records go out in stream order.
    static constexpr uint32_t kRecordBufs = 8;
    static constexpr int kWindowWritable = 1 << 8; // waitFor(): writeWindow() can go on
    WindowTable windows_;
    uint64_t recordsPosted_ = 0;
    uint64_t recordsDone_ = 0;
    // Withdrawals of our windows: queued, sent, answered (UNMAPPED); and the peer's withdrawals
    // we owe an UNMAPPED for.
    uint64_t withdrawalsQueued_ = 0;
    uint64_t withdrawalsSent_ = 0;
    uint64_t withdrawalsAnswered_ = 0;
    uint32_t unmappedOwed_ = 0;

    TxOpRing txOps_;
    RxSlot *rxSlots_ = nullptr;
    uint32_t rxCount_ = 0;
    size_t injectSize_ = 0; // largest write the provider injects
    sockaddr_storage localAddr_{};
    socklen_t localLen_ = 0;
    sockaddr_storage peerAddr_{};
    socklen_t peerLen_ = 0;

    std::atomic<uint64_t> rxEvents_{0};
    std::atomic<uint64_t> txEvents_{0};
    std::atomic<bool> delivered_{false}; // closing: DISCONNECT sent and all sends completed
    // When the application last made progress, and how many of its threads sleep in waitFor():
    // the progress thread keeps out of the way of an application that drives progress itself.
    std::atomic<int64_t> appProgressNs_{0};
    std::atomic<int> appSleeping_{0};
    int64_t lastSendNs_ = 0;   // reapAfterSendLocked()
    uint64_t untakenNext_ = 0; // txOps_.next() past the last op not seen sent whole (tx.cpp)
    AdaptiveSpin spin_;        // waitFor()'s spin before it sleeps
    RoomRate roomRate_;        // whether its waits for room spin
    std::atomic<uint64_t> spinChosenNs_{0}; // the spins waitFor() chose, summed (tests)
    // Idle ring release (ring_idle.cpp): armed once bytes moved since the last release; the
    // bytes moved when armed; when the timer is due.
    bool ringRelease_ = false; // rings may give their pages back (setup(): provider, settings)
    bool ringTimerArmed_ = false;
    uint64_t ringStamp_ = 0;
    int64_t ringDueNs_ = 0;
    std::atomic<uint64_t> ringReleases_{0};
    std::atomic<uint64_t> progressCalls_{0};
    std::atomic<uint64_t> kaReceived_{0};
    // The same-host link: set before the data path starts (the accepting end, before it
    // answers; the connecting end, when the answer arrives) and kept until destruction.
    std::unique_ptr<SameHostLink> sh_;
    std::atomic<bool> shOn_{false};
    std::atomic<int> shFd_{-1};         // the link's fd, once pollers sleep on it
    std::atomic<bool> shShutRd_{false}; // SHUT_RD, read by the receiver without mutex_
    std::atomic<bool> shArmed_{false};  // armed, and no change looked at since
    uint64_t shToken_ = 0;              // the offer this end made or took
    std::atomic<uint64_t> bytesSent_{0};
    std::atomic<uint64_t> bytesReceived_{0};
};

} // namespace rstream
