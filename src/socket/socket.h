// SPDX-License-Identifier: MIT
// A stream socket with Linux TCP semantics on top of the engine's Connection and Listener.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <vector>

#include "connection.h"
#include "listener.h"
#include "pollable.h"
#include "settings.h"

namespace rstream {

// SOL_RDMA options (values as in include/rstream/rsocket.h and librdmacm).
constexpr int kSolRdma = 0x10000;
constexpr int kRdmaSqSize = 0;
constexpr int kRdmaRqSize = 1;
constexpr int kRdmaInline = 2;
constexpr int kRdmaIoMapSize = 3;
constexpr int kRdmaRoute = 4;
constexpr int kSendBuf = 0x100;
constexpr int kRecvBuf = 0x101;
constexpr int kTxSize = 0x102;
constexpr int kRxSize = 0x103;

// Closes a connection when its last user lets go: gracefully, or with a reset if asked.
struct ConnectionCloser
{
    bool abort = false;
    void operator()(Connection *c) const;
};

// What TCP_INFO reports, filled into the kernel's struct tcp_info by fillTcpInfo().
struct TcpInfoFields
{
    uint8_t state = 0; // TCP_ESTABLISHED, TCP_LISTEN, ...
    uint32_t rttUs = 0;
    uint32_t mss = 0;
    uint64_t bytesSent = 0;
    uint64_t bytesReceived = 0;
    uint32_t unackedBytes = 0;
    uint32_t sendBuf = 0;
    uint32_t recvBuf = 0;
};
int fillTcpInfo(const TcpInfoFields &f, void *val, socklen_t *len);

// Everything a socket user can observe: states, errors, options, readiness. Shared by the
// rsocket API and the preload shim; neither knows about fds here. All methods return 0 (or a
// byte count) or -errno. Thread-safe: a socket may be used from several threads at once.
class Socket : public Pollable
{
public:
    // domain AF_INET or AF_INET6, type SOCK_STREAM (flags already stripped).
    static int create(int domain, int type, int protocol, std::shared_ptr<Socket> *out);
    explicit Socket(int family, const Settings &settings = Settings::fromEnv());
    ~Socket() override;
    Socket(const Socket &) = delete;
    Socket &operator=(const Socket &) = delete;

    int family() const { return family_; }
    bool nonblocking() const { return nonblock_.load(std::memory_order_relaxed); }
    void setNonblocking(bool on) { nonblock_.store(on, std::memory_order_relaxed); }

    int bind(const sockaddr *addr, socklen_t len);
    int listen(int backlog);
    // nonblock: the caller's view (O_NONBLOCK of the socket); out gets a connected socket.
    int accept(std::shared_ptr<Socket> *out, sockaddr *addr, socklen_t *len);
    int connect(const sockaddr *addr, socklen_t len);
    // A new socket (neither bound nor connected) made a connected one over a same-host link set
    // up outside the fabric (the preload shim's in-band setup), with the addresses of the
    // connection it carries on; its options apply as for connect().
    int adoptSameHost(std::unique_ptr<SameHostLink> link, const sockaddr *local, socklen_t llen,
                      const sockaddr *peer, socklen_t plen);
    // The settings a connection of this socket's gets: its own, with the ring sizes its
    // SO_SNDBUF and SO_RCVBUF asked for (what sizes a same-host link's rings before it exists).
    Settings connectionSettings();
    // MSG_DONTWAIT, MSG_PEEK, MSG_WAITALL, MSG_TRUNC, MSG_NOSIGNAL (the caller raises SIGPIPE).
    ssize_t send(const iovec *iov, int iovcnt, int flags);
    ssize_t recv(const iovec *iov, int iovcnt, int flags);
    int shutdown(int how);
    // The connection's Connection::allowAfterClose(), where it has one.
    void allowAfterClose(uint64_t bytes);
    // riomap(3), riounmap(3), riowrite(3) on a connected socket: prot PROT_WRITE (a window the
    // peer can write) or PROT_NONE (recorded only), flags 0. riowrite takes MSG_DONTWAIT and
    // MSG_NOSIGNAL (the caller raises SIGPIPE); other flags are ignored, as rsockets does.
    off_t riomap(void *buf, size_t len, int prot, int flags, off_t offset);
    int riounmap(void *buf, size_t len);
    ssize_t riowrite(const void *buf, size_t count, off_t offset, int flags);
    // Graceful close (abortive with SO_LINGER 0; waits up to the linger time if set).
    void close();

    int setsockopt(int level, int name, const void *val, socklen_t len);
    int getsockopt(int level, int name, void *val, socklen_t *len);
    int localAddress(sockaddr *addr, socklen_t *len);
    int peerAddress(sockaddr *addr, socklen_t *len);
    // FIONREAD: bytes readable now.
    int readable(int *bytes);

    // Pollable: readiness as Linux's tcp_poll computes it.
    int pollEvents(int events) override;
    int prepareWait(std::vector<pollfd> *fds, int events) override;
    void addWaiter(int eventFd, std::vector<std::shared_ptr<Connection>> *registered) override;
    uint64_t generation(int events) override;
    std::shared_ptr<Connection> hintConnection() override;
    std::shared_ptr<Connection> passHintConnection() override;
    // A listener's: its queue's and its requests' fds, once its hint is armed. With fds null
    // it only counts them (a caller that looks at them through an epoll of its own).
    int lookFds(std::vector<pollfd> *fds) override;
    // A listener's two fds (Listener::waitFd(), readyFd()): false when not listening.
    bool listenerFds(int *waitFd, int *readyFd);
    void lookResults(const pollfd *fds) override;
    int parkFds(std::vector<pollfd> *fds) override;
    bool roomSoon() override
    {
        return !roomStalled_.load(std::memory_order_relaxed) ||
               roomSoon_.load(std::memory_order_relaxed);
    }

    // The caller reported the connect's completion itself (a blocking connect that returned 0):
    // a later connect() gives EISCONN, not the "0 once" of a nonblocking connect.
    void confirmConnected();
    // How a connect stands, without consuming its error: 0 connected, -EINPROGRESS, or the
    // -errno it failed with (-ENOTCONN when none was made).
    int connectStatus();
    // The last connect failed with a Defer refusal: the listener's process runs the shim and
    // wants the connection over kernel TCP, to upgrade it in whichever process serves it.
    bool connectDeferred();
    // A listener shared with a fork child defers every connection request (Listener::setDeferring).
    void setDeferring(bool on);
    std::string debugState();
    // The engine connection (null before connect and on listeners), for diagnostics.
    std::shared_ptr<Connection> connection();
    bool isListening();
    bool isConnected();
    // Statistics.
    uint64_t bytesSent();
    uint64_t bytesReceived();

private:
    enum class State
    {
        Fresh,      // nothing yet (maybe bound)
        Listening,  // listener_ accepts
        Connecting, // conn_ connecting
        Connected,  // conn_ established (or accepted)
        Closed      // listener shut down
    };

    // The socket options setsockopt and getsockopt know: one table, in sockopt.cpp.
    struct Option;
    static const Option *findOption(int level, int name);
    // -ENOPROTOOPT for a level a socket of this family has no options at.
    int checkLevel(int level, bool get) const; // 0, or the errno Linux gives for level
    void inheritOptionsLocked(Socket *s) const;
    // TCP_INFO, read outside the mutex (conn as it was under it).
    int tcpInfo(const std::shared_ptr<Connection> &conn, void *val, socklen_t *len);
    // The largest single write the engine makes is a quarter of the ring; report what a
    // loopback TCP connection would, capped by that.
    int ringMss() const { return std::min<int>(65483, std::max<int>(sendRing_ / 4, 536)); }
    int reportError(int err);
    int applySettings(Settings *s);
    void refreshConnectLocked();
    void releaseProbe();
    // The socket's connection from now on (connect, or a same-host link adopted).
    void useConnectionLocked(std::shared_ptr<Connection> c, size_t sendBuf);
    void applyKeepaliveLocked();
    // TCP_CORK, as set, to the connection.
    void applyCorkLocked();
    void applyUserTimeoutLocked();
    void setStateLocked(State s)
    {
        state_ = s;
        stateChanges_++;
    }

    const int family_;
    Settings settings_;
    std::atomic<bool> nonblock_{false};
    // A listener's look in a hint pass (lookFds): the pass << 2, | 2 when its fds were handed
    // to the poller, | 1 when they were found not readable.
    std::atomic<uint64_t> listenLook_{0};
    // The connection is a same-host link (for good: a link never goes back to the fabric), so
    // a pass need not ask for it (passHintConnection(): a lock and two reference counts). Set
    // once seen, cleared with a new connection; seen late, a pass only makes progress.
    std::atomic<bool> sameHostConn_{false};

    std::mutex mutex_; // state, options; never held while blocking
    State state_ = State::Fresh;
    std::shared_ptr<Connection> conn_;
    std::shared_ptr<Listener> listener_;
    int soError_ = 0;            // pending SO_ERROR (a failed connect, a reset)
    bool errorReported_ = false; // the connection's error was returned once; then EOF/EPIPE
    bool failedConnect_ = false; // closed by a failed connect: reads see EOF
    bool deferred_ = false;      // that connect was refused with a Defer refusal
    bool shutWr_ = false;
    bool connectPending_ = false; // nonblocking connect not yet confirmed by a second connect
    // The connection's first send ring size, for POLLOUT: writable with a third of it free. Not
    // the ring's size now (it grows; a same-host link's is 256 KiB): a sleeping poller is woken
    // at a third of that, and the gap between the two batches a small-write stream's wake-ups.
    // With a third of the ring now for both, iperf3 -l 64 same-host ran 20 % slower at 2.5
    // times the writer's CPU.
    uint32_t sendRing_ = 0;
    // A look asked for POLLOUT finds no room: whether to spin for it (roomSoon()). roomStalled_:
    // the last such look found none, so the next is the same wait.
    RoomRate roomRate_;
    std::atomic<bool> roomStalled_{false};
    std::atomic<bool> roomSoon_{true};
    uint64_t stateChanges_ = 0;
    int probeFd_ = -1; // holds the bound port until the fabric endpoint binds it
    sockaddr_storage bound_{};
    socklen_t boundLen_ = 0;

    // Options.
    int rcvTimeoutMs_ = -1;
    int sndTimeoutMs_ = -1;
    bool keepalive_ = false;
    int keepIdle_ = 7200, keepIntvl_ = 75, keepCnt_ = 9;
    bool keepaliveApplied_ = false;
    bool reuseAddr_ = false;
    bool reusePort_ = false;
    linger linger_{0, 0};
    bool noDelay_ = false;
    int maxSeg_ = 0;
    bool v6Only_ = false;
    int inlineSize_ = 0;
    int sndBufReq_ = 0; // SO_SNDBUF as set (before doubling)
    int rcvBufReq_ = 0;
    std::map<std::pair<int, int>, int> generic_; // options kept for getsockopt only
};

} // namespace rstream
