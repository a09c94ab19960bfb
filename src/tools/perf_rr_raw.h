// SPDX-License-Identifier: MIT
// rstream-perf's rr test over plain libfabric: one run's endpoints and queues
// (perf_rr_session.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <sys/epoll.h>
#include <vector>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include "perf.h"
#include "perf_fabric.h"

namespace rstream::perf::rr {

constexpr int kEqTimeoutMs = 10000;
// A sleep's bound, so that disconnects (reported on the EQ) are seen while all is quiet.
constexpr int kSleepMs = 100;
// Sends a connection may have in flight: a reply's completion can come after the next request.
constexpr int kTxSlots = 2;

// fi_getinfo for FI_EP_MSG with the provider of RSTREAM_PROVIDER (default tcp).
int getInfo(const char *node, const char *service, uint64_t flags, fi_info **out);

struct Conn;

// An operation's context: the provider's fi_context2 first (FI_CONTEXT/FI_CONTEXT2), then ours.
struct Op
{
    fi_context2 ctx;
    Conn *conn;
    bool recv;
    bool busy;
};

struct Conn
{
    fid_ep *ep = nullptr;
    fid_cq *cq = nullptr; // its own, or the shared one (not owned)
    int waitFd = -1;
    uint8_t *rx = nullptr;
    uint8_t *tx = nullptr;
    Op recvOp;
    Op txOps[kTxSlots];
    int64_t sentNs = 0; // client: when the outstanding request went
    int64_t dueNs = 0;  // client, paced: when it was due
    bool owed = false;  // a message waits for room to be sent
    bool ready = false; // own CQ: to be read this round
    bool gone = false;
};

// The endpoints of one run (a client's, or the server's for one client) and their queues.
class Session
{
public:
    Session(const RrHello &hello, bool server) : hello_(hello), server_(server) {}
    ~Session();
    Session(const Session &) = delete;
    Session &operator=(const Session &) = delete;

    int open(fid_fabric *fabric, const fi_info *info);
    // Opens an endpoint for info and posts its receive; the caller connects or accepts it.
    int addConn(fi_info *info, Conn **out);
    int waitConnected(Conn *conn, const char *what);
    // Sends a request or reply on conn, or leaves it owed when there is no room yet.
    int post(Conn *conn);
    // Marks every CQ to be read; the client sends its first requests.
    int start();
    // Handles what completed and, when nothing has, sleeps up to timeoutMs.
    int step(int timeoutMs);
    void shutdown();

    RrStats *stats = nullptr;       // the client's
    RrPacer<Conn> *pacer = nullptr; // the client's, when paced
    uint64_t answered = 0;          // the server's
    uint32_t live() const { return live_; }

private:
    int openCq(fid_cq **cq, int *fd, size_t size);
    int watch(int fd, Conn *conn);
    int drain(fid_cq *cq);
    int onCompletion(Op *op);
    int onError(fid_cq *cq);
    void markGone(Conn *conn);
    int checkEq();
    int retryOwed();
    int sendDue();
    int sleepMs(int timeoutMs) const; // timeoutMs, or less when a paced request falls due
    int stepShared(int timeoutMs);
    int stepOwn(int timeoutMs);

    RrHello hello_;
    bool server_;
    fid_fabric *fabric_ = nullptr;
    fid_domain *domain_ = nullptr;
    fid_eq *eq_ = nullptr;
    fid_cq *sharedCq_ = nullptr;
    fid_mr *mr_ = nullptr;
    void *desc_ = nullptr;
    uint8_t *slab_ = nullptr;
    size_t injectSize_ = 0;
    int epfd_ = -1;
    std::vector<std::unique_ptr<Conn>> conns_;
    std::vector<Conn *> ready_;
    std::vector<Conn *> read_;
    std::vector<Conn *> owed_;
    std::vector<epoll_event> events_;
    uint32_t live_ = 0;
    int64_t eqCheckNs_ = 0;
};

} // namespace rstream::perf::rr
