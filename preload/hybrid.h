// SPDX-License-Identifier: MIT
// The shim's sockets: a kernel fd the application sees, served by the fabric when the peer
// has a fabric listener and by kernel TCP otherwise.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <netinet/in.h>
#include <string>
#include <sys/socket.h>
#include <sys/uio.h>
#include <utility>
#include <vector>

#include "kernel.h"
#include "poller.h"
#include "shimconfig.h"
#include "shimstats.h"
#include "socket.h"
#include "upgrade_wire.h"

namespace rstream::shim {

class UpgradeListener;

// A kernel TCP connect to a destination's fabric port (hybrid_probe.cpp): whether anything
// listens there, before libfabric is loaded.
struct LightProbe
{
    int fd = -1;
    int timerFd = -1; // wakes pollers at the deadline
    int64_t deadlineMs = 0;
    LightProbe() = default;
    LightProbe(const LightProbe &) = delete;
    LightProbe &operator=(const LightProbe &) = delete;
    ~LightProbe();
    // Starts it: 0 (connecting or connected) or -errno (refused at once, no fd...).
    int start(const sockaddr *dest, socklen_t len, int timeoutMs);
    // 0: something listens; -EINPROGRESS: not known yet; -errno: nothing (-ETIMEDOUT past
    // the deadline).
    int status();
    // The fds that wake a poller when status() may have changed; -EAGAIN: look again.
    int waitFds(std::vector<pollfd> *fds);
    // The whole probe, blocking (sleeps in ppoll): status()'s answer.
    static int run(const sockaddr *dest, socklen_t len, int timeoutMs);
};
// Whether a light probe can see fabric listeners (the tcp provider's are kernel TCP ones), and
// whether connects use it now (libfabric not loaded yet).
bool lightProbePossible();
bool lightProbeApplies();
// The beacon of a shim listener on local (an fd, -1 when it could not be had), and whether
// dest, an address of this host, has a shim listener behind it (hybrid_probe.cpp).
int openBeacon(const sockaddr *local);
void closeBeacon(int fd, const sockaddr *local);
// Whether addr is an address of this host (in its network namespace).
bool hostAddress(const sockaddr *addr);
bool shimListenerHere(const sockaddr *dest);

// Whether this process has used the fabric (a fork child of such a process must not).
bool engineUsed();

// A kernel socket's local and peer addresses (length 0: not known), for records and logs.
struct KernelAddresses
{
    sockaddr_storage local{}, peer{};
    socklen_t localLen = sizeof(local), peerLen = sizeof(peer);
    const sockaddr *localAddr() const { return reinterpret_cast<const sockaddr *>(&local); }
    const sockaddr *peerAddr() const { return reinterpret_cast<const sockaddr *>(&peer); }
};

class HybridSocket : public Pollable
{
public:
    enum class Mode
    {
        Undecided, // created; kernel answers everything until connect or listen decides
        Fabric,    // connected over the fabric
        Kernel,    // kernel TCP: the shim forwards everything to the kernel fd
        Listener,  // listening on both: the kernel fd and a fabric listener
        Inherited  // inherited across fork from a parent that owns the fabric connection
    };

    HybridSocket(int fd, int family, bool nonblocking, const ShimConfig &config);
    ~HybridSocket() override;
    HybridSocket(const HybridSocket &) = delete;
    HybridSocket &operator=(const HybridSocket &) = delete;

    // A connection the kernel accepted on a listener of ours: kernel TCP, upgraded in-band to
    // the fabric at its first I/O in whichever process does it, when the client offers.
    static std::shared_ptr<HybridSocket> acceptedKernel(int fd, int family, bool nonblocking,
                                                        const ShimConfig &config);
    // What a new socket's addresses are known to be without asking the kernel (accept4 gave
    // the peer's; a listener bound to one address gives the local one): len 0 for unknown.
    // Before the socket is shared.
    void knowAddresses(const sockaddr_storage &local, socklen_t llen, const sockaddr_storage &peer,
                       socklen_t plen);
    // A listener's local address, when its accepted connections all have it (bound to one
    // address): 0 otherwise.
    socklen_t acceptedLocal(sockaddr_storage *out);

    int fd() const { return fd_; }
    // Kernel TCP with an in-band upgrade still possible (client or server side): the shim
    // routes its calls here, and pollers treat it as an engine socket until it is decided.
    bool upgradePending() const
    {
        return upgrade_.load(std::memory_order_acquire) != Upgrade::None;
    }
    // For the poller: a look that moves the upgrade on (never blocks: it only tries the
    // upgrade's lock); readiness then comes from the kernel fd or latePollEvents. A server
    // polled for reading answers an offer that arrived, so that readiness means data.
    // leave: the program waits to read; a message found whole with bytes after it is left at
    // the head of the stream for its read (true then: the fd's POLLIN is the program's bytes).
    bool upgradeProgress(int events, bool leave = false);
    // After a fork either process may read an inherited connection: what a look left is not
    // known any more.
    static void noteFork() { forkEpoch_.fetch_add(1, std::memory_order_relaxed); }
    void upgradeAddWaiter(int eventFd, std::vector<std::shared_ptr<Connection>> *registered);
    // For exec: the upgrade state worth carrying into the new program ('s': a server socket that
    // has not seen its peer's first bytes, 'c': a client that has not sent its HELLO), or 0.
    char inheritableUpgrade();
    // In the new program: takes that state over.
    void adoptInherited(char state);
    int family() const { return family_; }
    Mode mode() const { return mode_.load(std::memory_order_acquire); }
    // A nonblocking connect tries the fabric in the background: the socket answers as a
    // connecting fabric socket until the attempt settles, then as a fabric socket or, after a
    // kernel connect on the same fd, as a kernel one. Every entry point settles first.
    void settle()
    {
        if (tentative_.load(std::memory_order_acquire))
            settleSlow();
    }
    // What O_NONBLOCK the application set (the kernel fd of a listener is always nonblocking).
    bool nonblocking() const { return nonblock_.load(std::memory_order_relaxed); }
    void setNonblocking(bool on);
    void setNonblockingEngine(bool on); // the same, leaving the kernel fd's flags alone
    // fcntl F_GETFL / F_SETFL as the application sees them (other commands: the kernel fd).
    int getFlags();
    int setFlags(int flags);

    // The syscalls, with their contracts: 0, a count or a new fd, or -errno. Calls for a
    // socket in Kernel mode may also be forwarded by the caller directly.
    int bind(const sockaddr *addr, socklen_t len);
    int listen(int backlog);
    // A new fd: for a fabric connection *newSock is its HybridSocket (the caller installs it
    // under the returned fd); for a kernel connection *newSock stays null (the caller keeps its
    // record: a fallback of reason kernel_peer).
    // A kernel connection's peer address lands in *kpeer (*kplen 0 when the call did not
    // give it whole).
    int accept(sockaddr *addr, socklen_t *len, int flags, std::shared_ptr<HybridSocket> *newSock,
               sockaddr_storage *kpeer = nullptr, socklen_t *kplen = nullptr);
    // A listener that serves kernel TCP only (its fabric side could not be had), and why: the
    // caller records the connections it accepts (kernel accept on its fd) as such fallbacks.
    bool kernelListener(Fallback *why);
    int connect(const sockaddr *addr, socklen_t len);
    ssize_t send(const iovec *iov, int iovcnt, int flags);
    ssize_t recv(const iovec *iov, int iovcnt, int flags);
    int shutdown(int how);
    int setsockopt(int level, int name, const void *val, socklen_t len);
    int getsockopt(int level, int name, void *val, socklen_t *len);
    int getsockname(sockaddr *addr, socklen_t *len);
    int getpeername(sockaddr *addr, socklen_t *len);
    int fionread(int *bytes);
    // The application closes fd (this socket's own fd or a dup of it): called before the
    // shim closes the kernel fd. The engine side is released when the last reference goes.
    void onFdClosed(int fd);
    // After fork, in the child: the fabric state belongs to the parent; operations fail with
    // EIO and close never touches the parent's connection.
    void markInherited();
    // Before fork: what the connection owes its peer goes out while no child can write.
    void beforeFork();
    // After fork, in the parent: a listener shared with the child answers fabric connection
    // requests only when the parent itself polls or accepts.
    void onForkParent();

    // Pollable.
    int pollEvents(int events) override;
    int prepareWait(std::vector<pollfd> *fds, int events) override;
    void addWaiter(int eventFd, std::vector<std::shared_ptr<Connection>> *registered) override;
    uint64_t generation(int events) override;
    std::shared_ptr<Connection> hintConnection() override;
    std::shared_ptr<Connection> passHintConnection() override;
    // A listener's: its look epoll, else its kernel fd, then its engine socket's
    // (Socket::lookFds). A socket in its upgrade or switch, still on kernel TCP: its kernel fd,
    // whose revents the pass's first kernelPollNow() then answers with.
    int lookFds(std::vector<pollfd> *fds) override;
    int lookFdsEach(std::vector<pollfd> *fds) override;
    bool lookIsEpoll() override;
    bool lookCanWait(int64_t now) override;
    void lookResults(const pollfd *fds) override;
    void sleepResults(const pollfd *fds, int n) override;
    // In its upgrade, waiting for the peer's first bytes (the server for the offer, the client
    // for the answer).
    bool waitingFirstBytes() const
    {
        const Upgrade u = upgrade_.load();
        return u == Upgrade::Maybe || u == Upgrade::Answer;
    }
    int parkFds(std::vector<pollfd> *fds) override;
    int kernelFd() override;
    bool roomSoon() override;

    std::string debugState();
    // At exit: a kernel connection that got established is counted now (see onFdClosed).
    void noteExit();

private:
    // The in-band upgrade (upgrade_wire.h).
    enum class Upgrade : uint8_t
    {
        None,  // decided: nothing more to do
        Offer, // client: HELLO goes out once connected, before any byte of ours
        Maybe, // server: the client's first bytes may be a HELLO
        // From here the connection runs over kernel TCP, the application's bytes counted, until
        // it switches to the fabric (hybrid_late.cpp).
        Answer,      // client: HELLO sent; the server's first bytes are its answer, or its data
        LateLoad,    // client: ACCEPT read, libfabric loading
        LateConnect, // client: its fabric connect under way (upSock_)
        LateToken,   // client: token sent, waiting for the server's ack and count
        LateServer,  // server: ACCEPT sent, waiting for the client's token
        LateSwitch,  // both: writes on upSock_; reads on kernel TCP up to lateTarget_, then it
    };
    static bool isLate(Upgrade u) { return u >= Upgrade::Answer && u <= Upgrade::LateSwitch; }
    bool late() const { return isLate(upgrade_.load(std::memory_order_acquire)); }
    // The late switch's steps (hybrid_late.cpp); none waits.
    void lateStepLocked();
    void lateGiveUpLocked(const char *why);
    void serverGiveUpLocked(const char *why); // LateServer: the token is no longer expected
    bool lateFinishLocked(); // both directions on the fabric: the socket becomes a fabric one
    ssize_t lateIo(bool out, const iovec *iov, int iovcnt, int flags);
    int latePollEvents(int events);
    // Readiness while the peer's offer (Maybe) or answer (Answer) is awaited: readable only
    // for the application's bytes, never for the upgrade message alone.
    int firstBytesPollEvents(Upgrade u, int events);
    // Whether an end of the kernel connection met in state u may be the peer's switch (its
    // count on the fabric decides), and whether the kernel connection is at its end (a peek).
    bool lateEndMayBeSwitch(Upgrade u) const;
    bool lateKernelAtEnd();
    int lateFionread(int *bytes);
    int lateWaitFds(std::vector<pollfd> *fds, int events);
    int lateShutdown(int how);
    void lateAccount(); // counted when it ends before or during the switch
    // Reads the peer's count on upSock_ into lateBuf_ (need bytes in all); true when complete,
    // false while not (*closed: the fabric connection ended first).
    bool lateReadCount(size_t need, bool *closed);
    // Runs the upgrade as far as it goes before an I/O: 0 to go on (with whatever mode it
    // left), or -errno for the caller (-EAGAIN, -EINTR, ...). Only a blocking read waits (for
    // the peer's first bytes, as the kernel would), and never under the upgrade's lock.
    // A read passes its buffers (iov, got): an upgrade message it takes comes off the kernel
    // connection with the bytes after it, in one recvmsg, and *got is how many of those it
    // read (0: none; the caller reads on as before).
    int upgradeStep(bool out, int flags, const iovec *iov = nullptr, int iovcnt = 0,
                    ssize_t *got = nullptr);
    // Client: the HELLO goes out with the program's first write, in one segment with its
    // bytes, or alone once the program waits to read (a server that speaks first, or hands the
    // connection on across fork or exec, finds it waiting), then Answer.
    void sendOfferLocked();
    // A write in Offer: the HELLO and the program's bytes in one sendmsg. False when another
    // thread sent the HELLO first (the caller writes as in Answer); else *result is the
    // program's bytes sent, or -errno with nothing sent.
    bool offerWithWrite(const iovec *iov, int iovcnt, int flags, ssize_t *result);
    // One sendmsg of an upgrade message (n bytes) and then iov: the program's bytes sent (the
    // message went whole), -errno with nothing sent, or -ECONNRESET after shutting the
    // connection down when only part of the message went (never seen on a fresh connection,
    // whose send buffer is empty; the stream could not be repaired).
    ssize_t sendPrefixed(const uint8_t *msg, size_t n, const iovec *iov, int iovcnt, int flags);
    // Whether the kernel connection is established and has not carried a byte of ours (sent or
    // queued): where an upgrade message sent on its own cannot land inside the stream.
    bool kernelUntouched();
    // Server, LateServer: the ACCEPT still owed goes out on its own (its write lock held).
    // False when it could not go: the connection then stays on kernel TCP.
    bool sendOwedAcceptLocked();
    // Server, LateServer: no ACCEPT will go (its write lock held); the next step gives up.
    void dropOwedAcceptLocked();
    // Server, LateServer: the program's first write, with the owed ACCEPT ahead of its bytes
    // (lateWriteMutex_ held); lateIo's answer.
    ssize_t writeOwedAcceptLocked(const iovec *iov, int iovcnt, int flags);
    // Client, Answer: reads the server's answer at the head of its bytes (-EAGAIN: not here).
    int clientAnswerLocked(bool leave = false);
    // Server, Maybe: the client's first bytes (-EAGAIN for a read: not here yet).
    int serverUpgradeLocked(bool out, bool leave = false);
    // The peer's upgrade message at the head of the kernel stream: the one a look left there
    // (head_, then forgotten), else peeked at; > 0 with *msg, *size and *after (bytes follow
    // it) set, or as peekKernel (*match: whether and how much of a message it is).
    ssize_t headMessageLocked(wire::UpgradeMessage *msg, size_t *size, wire::UpgradeMatch *match,
                              bool *after);
    // Leaves a message a look found whole, with bytes after it, for the read (upgradeMutex_).
    void leaveHeadLocked(const wire::UpgradeMessage &msg, size_t size);
    void serveUpgradeLocked();
    // Reads the first bytes of the kernel stream without taking them: > 0, 0 at EOF, -errno.
    ssize_t peekKernel(void *buf, size_t len, bool wait);
    // Takes len bytes that a peek showed.
    void consumeKernel(size_t len);
    // Takes an upgrade message of size bytes that a peek showed: with the bytes after it into
    // the buffers of the read in this step (fuse_), else alone. A connection's first read was
    // a peek, a read of the message and a read of the program's bytes.
    void takeMessageLocked(size_t size);
    struct HeadMessage
    {
        wire::UpgradeMessage msg;
        size_t size = 0; // 0: none left
        uint32_t epoch = 0;
    } head_;
    static inline std::atomic<uint32_t> forkEpoch_{0};
    static constexpr int kFuseMaxIov = 16; // a read of more buffers reads apart
    struct FusedRead
    {
        const iovec *iov = nullptr; // the read's buffers, for this step only (upgradeMutex_)
        int iovcnt = 0;
        ssize_t got = 0; // the program's bytes taken with the message
    } fuse_;
    bool sendUpgradeMessage(int type, uint16_t port = 0, uint64_t token = 0);
    // The upgrade is over: the connection stays on kernel TCP, counted as a fallback for why.
    void stayKernelLocked(Fallback why, const char *detail);
    // The upgrade is over: the connection continues on s (accepted: the server side). The
    // kernel connection's addresses as they were when the switch began (both ends have shut it
    // down since, which may have taken them).
    void adoptUpgradedLocked(std::shared_ptr<Socket> s, bool accepted);
    bool upgradeBlocking(int flags) const { return !nonblocking() && !(flags & MSG_DONTWAIT); }

    struct Option
    {
        int level;
        int name;
        std::vector<uint8_t> value;
    };

    // Starts a nonblocking fabric connect (0 or -EINPROGRESS with *out set, else -errno);
    // connectFabric also waits for it, bounded by the connect timeout.
    int startFabric(const sockaddr *addr, socklen_t len, std::shared_ptr<Socket> *out);
    // An engine socket for this one's connection: its options, nonblocking.
    std::shared_ptr<Socket> newEngineSocket(const Settings &settings);
    // The switch over a same-host link set up in-band (hybrid_link.cpp). Client: true when
    // the switch goes on over a link it sent (or gave up on sending one), false for the fabric.
    bool lateLinkLocked();
    // Server: whether its client may send a link (noted at the HELLO), the link claimed by the
    // ACCEPT's token (null: none yet), and one dropped when the server gives up.
    void noteLinkPossible(const UpgradeListener &ul);
    std::shared_ptr<Socket> claimLinkLocked();
    void dropLinkLocked();
    int linkWaitFdsLocked(std::vector<pollfd> *fds); // LateServer: a link's arrival wakes a poller
    // s, a new engine socket, made the connection's over the link (nullptr when it was not).
    std::shared_ptr<Socket> linkSocketLocked(std::shared_ptr<Socket> s,
                                             std::unique_ptr<SameHostLink> link);
    int connectFabric(const sockaddr *addr, socklen_t len, std::shared_ptr<Socket> *out);
    // The engine socket and the mode, read together.
    std::pair<std::shared_ptr<Socket>, Mode> snapshot();
    // The engine socket once it is this socket's for good (a settled fabric or same-host
    // connection: none while connecting, in an upgrade or switch, or inherited), read without
    // mutex_ or a reference count: the pollers' looks and the data path ask for it at every
    // call (a lock and two atomic counts each, a fifth of a select() loop's time). sock_ keeps
    // it alive as long as *this; null otherwise.
    Socket *fixedSocket()
    {
        Socket *f = fixed_.load(std::memory_order_acquire);
        return f ? f : fixSocket();
    }
    Socket *fixSocket();
    // The same after settle(). A Fabric socket waiting for libfabric to load (see connect) has
    // no engine socket yet: then -EAGAIN (Wait::No), or first the wait for the load and the
    // start of the attempt (Wait::Load), or for the attempt to settle too, as a blocking call
    // on a connecting socket waits for the connection (Wait::Settle).
    enum class Wait
    {
        No,
        Load,
        Settle
    };
    int settledSnapshot(Wait wait, std::shared_ptr<Socket> *s, Mode *m);
    // A blocking call on a socket whose light probe is under way: sleeps until it may have
    // news (at most 100 ms); false when no probe runs.
    bool waitProbe();
    Wait wait(int flags); // for send and recv
    // send (out) or recv on the engine, or on the kernel fd after a fallback.
    ssize_t io(bool out, const iovec *iov, int iovcnt, int flags);
    void countIo(bool out, ssize_t r, int flags); // the bytes a fabric io() moved, in the record
    // recvmsg and sendmsg on the kernel fd, for a socket that fell back while the caller waited.
    ssize_t kernelIo(bool out, const iovec *iov, int iovcnt, int flags);
    std::shared_ptr<Socket> socket();
    int kernelPollNow(int events);
    void countFallbackIfEstablished();
    void settleSlow();
    void adoptFabricLocked(const sockaddr *addr, socklen_t len, int fport);
    int connectKernel(const sockaddr *addr, socklen_t len, bool inet, Fallback why, int port,
                      const std::string &key, int fabricErr, bool offer = false);
    struct Pending
    {
        sockaddr_storage addr{}; // the application's destination
        sockaddr_storage dest{}; // its fabric listener's (the attempt starts later while loading)
        socklen_t len = 0;
        std::string key; // the fabric destination (negative cache)
        int port = 0;
        int fport = 0;
        // Before the attempt (and libfabric's load): whether anything listens on fport.
        std::unique_ptr<LightProbe> probe;
        bool offerAfterProbe = false; // the listener deferred lately: no fabric attempt
    };
    std::unique_ptr<Pending> pending_;
    std::atomic<bool> tentative_{false};
    // A late switch finished since pollEvents() last looked: what the engine connection holds
    // became readable at that moment (an edge for EPOLLET), so a poller must look before it
    // sleeps (prepareWait() answers -EAGAIN once).
    std::atomic<bool> switchedUnseen_{false};
    std::mutex settleMutex_;
    int deferredError_ = 0; // errno of a kernel connect that failed at once, for SO_ERROR
    int applyOptions(Socket &s);
    // The record of a kernel connection to peer, once connect() went ahead (established or in
    // progress; countFallbackIfEstablished() marks it established).
    void recordKernelLocked(const sockaddr *peer, socklen_t peerLen);

    const int fd_;
    const int family_;
    const ShimConfig &config_;
    std::atomic<Mode> mode_{Mode::Undecided};
    std::atomic<bool> nonblock_{false};
    std::atomic<uint64_t> kernelGen_{0};
    // A listener's look in a hint pass: the pass << 24, the count of its engine socket's look
    // fds << 20, bit 19 once the results came, and its kernel fd's revents.
    std::atomic<uint64_t> listenLook_{0};
    static constexpr uint64_t kLookDone = uint64_t(1) << 19;
    // The kernel fd's look in a hint pass, for a socket in its upgrade or switch: the pass << 20,
    // kLookDone once the result came, and the revents. Used once: the socket may read from the
    // fd after it (an upgrade message), and the next look asks the kernel.
    std::atomic<uint64_t> kernelLook_{0};
    static constexpr short kKernelLookEvents = POLLIN | POLLOUT | POLLPRI | POLLRDHUP;
    // What a sleep on the kernel fd saw of the peer's first bytes, for the look right after it
    // (sleepResults()): the sleep's pass << 20 and the revents; 0: nothing.
    std::atomic<uint64_t> sleepLook_{0};

    std::atomic<Socket *> fixed_{nullptr}; // fixedSocket(); set once, cleared in a fork child
    // A listener's fabric listener, read without mutex_ (sock_ keeps it alive; it never changes
    // once listening) by the looks that each pass of a poller makes; cleared in a fork child.
    std::atomic<Socket *> fixedListen_{nullptr};
    // A listener's look epoll: its kernel fd and its fabric listener's two fds, so that a look
    // asks one fd (lookFds(): an epoll_wait, when it is all a pass checks); -1: none (a fork
    // child, or none could be made). Closed with the last reference: a pass may still use it.
    std::atomic<int> lookEp_{-1};
    // bind(2) of fd_ to addr; for port 0 of the socket's own family, a port the kernel picks
    // whose fabric port is free too, so that listen() gets its fabric listener
    // (hybrid_listen.cpp).
    int bindPortPair(const sockaddr *addr, socklen_t len);
    void openLookEpoll(Socket &s);                       // mutex_ held
    int listenerPollEvents(Socket *s, int events);       // Mode::Listener; s: its fabric listener
    int lookFdsAs(std::vector<pollfd> *fds, bool epoll); // lookFds(), lookFdsEach()
    static constexpr uint64_t kLookEpoll = uint64_t(1) << 18; // listenLook_: through lookEp_
    // When a look through lookEp_ last found nothing (0: never), and how long a pass that
    // returns anyway may go by it (lookCanWait()).
    std::atomic<int64_t> quietLookNs_{0};
    static constexpr int64_t kQuietLookNs = 100000;
    std::mutex mutex_;
    std::shared_ptr<Socket> sock_; // Fabric: the connection; Listener: the fabric listener
    std::vector<Option> options_;  // set before the path was decided, replayed on it
    sockaddr_storage bound_{};
    socklen_t boundLen_ = 0;
    sockaddr_storage peer_{}; // the address the application connected to
    socklen_t peerLen_ = 0;
    // The kernel connection's addresses where known without a system call (knowAddresses(),
    // a connect's specific address, or fetched once by addresses()): len 0 for unknown (mutex_).
    sockaddr_storage knownLocal_{}, knownPeer_{};
    socklen_t knownLocalLen_ = 0, knownPeerLen_ = 0;
    sockaddr_storage listenLocal_{}; // a listener's, when bound to one address (mutex_)
    socklen_t listenLocalLen_ = 0;
    bool fallbackCounted_ = false;
    std::string refusedKey_; // the fabric destination that refused this kernel connection
    void forgetRefusal();    // unless it connected, its negative cache entry goes
    Fallback fallback_ = Fallback::None; // why this socket (or listener) is on kernel TCP
    bool kernelListener_ = false;
    std::unique_ptr<ConnRecord> record_; // once connected: statistics and the live export
    // record_'s byte counters, set before the mode turns Fabric (the data path adds to them).
    exportfile::ByteCounters *bytes_ = nullptr;
    bool accepted_ = false; // from a fabric listener (or the server side of an upgrade)
    bool upgraded_ = false; // moved to the fabric in-band: addresses as the kernel had them
    sockaddr_storage upLocal_{};
    socklen_t upLocalLen_ = 0;
    int appPort_ = 0;    // the application's listening port (fabric listeners use another)
    int beaconFd_ = -1;  // a listener's beacon (hybrid_probe.cpp)
    int beaconFd4_ = -1; // and a dual-stack one's for IPv4 clients
    sockaddr_storage beaconAddr_{};
    void dropBeaconsLocked(); // closes both beacons (mutex_ held, or the last reference)
    bool noFabric_ = false;   // inherited across fork: kernel TCP only
    int rcvTimeoutMs_ = -1;
    std::atomic<bool> acceptFabricFirst_{true};
    std::atomic<Upgrade> upgrade_{Upgrade::None};
    std::mutex upgradeMutex_;  // one upgrade step at a time; taken before mutex_
    bool serverWrote_ = false; // Maybe: the server wrote first, so it cannot answer a HELLO
    std::atomic<bool> dataAfterMsg_{false}; // the upgrade message just taken had bytes after it
    std::shared_ptr<UpgradeListener> pendingUl_; // LateServer: where the client connects
    uint64_t pendingToken_ = 0;                  // the token (server: expected; client: to send)
    // Server, LateServer: the ACCEPT waits for the program's first write, to go in one segment
    // with it, or until acceptDueMs_ for a server that only reads (lateWriteMutex_ for the
    // change: a write and a look may both try to send it).
    std::atomic<bool> acceptOwed_{false};
    std::atomic<bool> acceptDropped_{false}; // a write went without it: the next step gives up
    int64_t acceptDueMs_ = 0;
    std::shared_ptr<Socket> upSock_; // the switch's fabric connection
    int64_t upStepDeadlineMs_ = 0;   // LateConnect: when the fabric connect fails; LateServer:
                                     // when the server stops waiting for the client's token
    // The late switch: the application's bytes over kernel TCP since LATER (client) or the
    // ACCEPT (server), the count of them the peer declared (known once it did), and the peer's
    // count message as it arrives.
    std::mutex lateWriteMutex_; // kernel writes and the switch of writes: the count is exact
    std::mutex lateReadMutex_;  // kernel reads and the switch of reads
    uint64_t lateWritten_ = 0, lateRead_ = 0, lateTarget_ = 0;
    bool lateTargetKnown_ = false;
    bool lateShutWr_ = false;    // the application shut down writing before the switch
    bool lateFabricEnd_ = false; // the fabric connection ended before the peer's count came
    std::atomic<bool> lateKernelEnd_{false}; // a read or peek met the kernel connection's end
    uint8_t lateBuf_[9] = {};
    size_t lateBufLen_ = 0;
    uint16_t latePort_ = 0;                     // client: the server's fabric port
    bool lateLinkTried_ = false;                // client: a same-host link was tried
    bool lateLink_ = false;                     // client: upSock_ is a same-host link's
    bool linkPossible_ = false;                 // server: the client may send a link
    int64_t linkLookMs_ = 0;                    // server: when the inbox is looked at next
    int64_t lateSinceMs_ = 0;                   // client: when the HELLO went
    sockaddr_storage lateLocal_{}, latePeer_{}; // the kernel connection's, when the switch began
                                                // (the client's fabric connect, the server's claim)
    socklen_t lateLocalLen_ = 0, latePeerLen_ = 0;
    void lateNoteAddresses();
    // The kernel connection's addresses: the known ones, the others from the kernel.
    KernelAddresses addresses();
    // Moved on the fabric before the socket became a fabric one (added to its record then).
    std::atomic<uint64_t> lateFabricSent_{0}, lateFabricReceived_{0};
};

} // namespace rstream::shim
