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

    int localAddress(sockaddr_storage *addr, socklen_t *len) const;

    // For the progress thread: answers connection requests into the accept queue (up to the
    // backlog) as the kernel completes handshakes before accept(). Returns the fd to poll for
    // more, or -1 when the queue is full or the application holds the listener; lowers
    // *deadlineNs to when it must be called again regardless.
    int backgroundAccept(int64_t *deadlineNs) override;
    // Off (in a parent, for a listener shared with a fork child): requests are answered only
    // when this process looks at the listener (accept, poll). One that it does not look at
    // within a grace is refused, so that the peer falls back to kernel TCP at once instead of
    // after its connect timeout: the parent of a prefork server never accepts again.
    void setBackgroundAccept(bool on);
    // The grace: short while the process has not looked at the listener since it went off (a
    // prefork master), longer once it has (an event loop busy for a moment).
    static constexpr int64_t kIdleGraceNs = 10 * 1000000;
    static constexpr int64_t kBusyGraceNs = 250 * 1000000;

private:
    // A request read from the EQ but not answered yet (background accept off).
    struct Held
    {
        fi_info *info;
        wire::Hello peer;
        int64_t sinceNs;
    };
    // The next connection request with a valid hello (bad ones are refused here): 0, or
    // -EAGAIN when none is queued.
    int readRequestLocked(fi_info **info, wire::Hello *peer);
    int answerLocked(fi_info *info, const wire::Hello &peer, std::unique_ptr<Connection> *out);
    int acceptOne(std::unique_ptr<Connection> *out);
    // The application looks at the listener: held requests are answered from now on.
    void appPumpLocked();
    void pumpLocked();
    // Background accept off: requests wait in held_; the stale ones are refused. Returns the
    // next deadline (INT64_MAX: none).
    int64_t holdLocked(int64_t now);
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
    std::atomic<bool> background_{true};
    std::deque<std::unique_ptr<Connection>> ready_; // handshakes answered, not yet accepted
    std::deque<Held> held_;
    int64_t appLookNs_ = 0;     // when the application last looked at the listener
    int64_t sharedSinceNs_ = 0; // when background accept went off
    bool refusedLogged_ = false;
};

} // namespace rstream
