// SPDX-License-Identifier: MIT
// A passive endpoint that accepts stream connections.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <sys/socket.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_eq.h>

#include "connection.h"
#include "fabric.h"
#include "fid.h"
#include "progress.h"
#include "settings.h"
#include "wire.h"

namespace rstream {

class Listener : public AcceptClient
{
public:
    explicit Listener(const Settings &settings = Settings::fromEnv());
    ~Listener() override;
    Listener(const Listener &) = delete;
    Listener &operator=(const Listener &) = delete;

    // Settings apply to the connections accepted from now on.
    Settings &settings() { return settings_; }

    int bind(const sockaddr *addr, socklen_t len);
    int listen(int backlog);
    // A new connection, or -EAGAIN (nonblocking) / -EINTR / -ETIMEDOUT (timeoutMs >= 0).
    int accept(std::unique_ptr<Connection> *out, bool nonblock = false, int timeoutMs = -1);

    // Pollers sleep on both: readyFd() is readable while answered connections wait in the
    // accept queue (the progress thread may answer them), waitFd() when requests arrive.
    int waitFd() const { return waitFd_; }
    int readyFd() const { return readyFd_; }
    // 0 when it is safe to sleep on the two fds, -EAGAIN when a connection is already pending.
    int arm();
    // Whether accept() would find a connection now.
    bool pending();
    // Readiness hint for pollers (as Connection::hintFd): true once fi_trywait succeeded after
    // a look that found nothing. From then on a request or an answered connection makes
    // waitFd() or readyFd() readable, so a poller that finds neither readable knows that
    // nothing is pending without asking the provider (on tcp a system call a look).
    bool hintArmed() const { return hintArmed_.load(std::memory_order_acquire); }
    // pending(), and when nothing is, arms the hint (fi_trywait) for the next look.
    bool pendingArm();

    int localAddress(sockaddr_storage *addr, socklen_t *len) const;

    // For the progress thread: answers connection requests into the accept queue (up to the
    // backlog) as the kernel completes handshakes before accept(). Returns the fd to poll for
    // more, or -1 when the queue is full or the application holds the listener; lowers
    // *deadlineNs to when it must be called again regardless.
    int backgroundAccept(int64_t *deadlineNs) override;
    // How many of those calls read the EQ (tests: the thread looks only when requests come).
    uint64_t backgroundLooks() const { return backgroundLooks_.load(std::memory_order_relaxed); }
    // Connects that can take a Defer refusal (wire::kFlagUpgrade, the shim's) are refused with
    // one (upgrade_wire.h) when they come from another process and this listener has
    // Settings::upgrade, and from any process once it is deferring: which process will serve
    // the connection is not known here (fork, exec), and a fabric connection would stay with
    // this one. The peer connects over kernel TCP and upgrades in-band. Deferring is set in a
    // parent for a listener shared with a fork child. Other connects are answered as ever.
    void setDeferring(bool on);

private:
    // The next connection request with a valid hello (bad ones are refused here): 0, or
    // -EAGAIN when none is queued.
    int readRequestLocked(fi_info **info, wire::Hello *peer);
    int answerLocked(fi_info *info, const wire::Hello &peer, std::unique_ptr<Connection> *out);
    int acceptOne(std::unique_ptr<Connection> *out);
    void pumpLocked();
    void syncReadyFdLocked();
    int armLocked();

    Settings settings_;
    std::shared_ptr<Domain> domain_;
    fi_info *info_ = nullptr;
    // Closed by the destructor, the endpoint before its EQ.
    FidPtr<fid_pep> pep_;
    FidPtr<fid_eq> eq_;
    int waitFd_ = -1;
    int readyFd_ = -1;
    std::mutex mutex_;
    sockaddr_storage addr_{};
    socklen_t addrLen_ = 0;
    bool listening_ = false;
    size_t backlog_ = 1;
    std::atomic<bool> deferring_{false};
    std::atomic<bool> hintArmed_{false};
    std::atomic<uint64_t> backgroundLooks_{0};
    bool armedClean_ = false; // trywait succeeded, and nothing was read from the EQ since (mutex_)
    std::deque<std::unique_ptr<Connection>> ready_; // handshakes answered, not yet accepted
};

} // namespace rstream
