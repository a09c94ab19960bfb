// SPDX-License-Identifier: MIT
// rstream-perf's rr test over plain libfabric: the endpoints, CQs and event loop of one run.
//
// Why two CQ layouts: on libfabric 1.17's tcp provider every fi_cq_read and fi_trywait runs
// a progress pass over the endpoints bound to the CQ, an epoll_wait each. With a CQ per
// connection a server pays a pass per connection per request; with one CQ for all, one pass
// finds every connection that is ready. Either way a side sleeps in epoll_wait over the CQs'
// wait fds, after fi_trywait said nothing is pending. A CQ that nobody read since its last
// successful fi_trywait is still armed, so only the ones read are tried again.
//
// Every mode and mr_mode bit getInfo() offers is honoured: each operation's context starts with
// an fi_context2 (FI_CONTEXT, FI_CONTEXT2), and with FI_MR_LOCAL all buffers live in one
// registered region whose descriptor goes with every send and receive.

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include "configvars.h"
#include "perf_rr_raw.h"

namespace rstream::perf::rr {
namespace {

constexpr int64_t kEqCheckNs = 10'000'000;
constexpr int kCqBatch = 32;

} // namespace

int getInfo(const char *node, const char *service, uint64_t flags, fi_info **out)
{
    fi_info *hints = fi_allocinfo();
    if (!hints)
        return -ENOMEM;
    // As perf_raw.cpp: tcp unless RSTREAM_PROVIDER names another. Every mode and mr_mode bit
    // offered here is honoured below; others keep a provider out.
    const char *prov = config::getString("RSTREAM_PROVIDER");
    hints->ep_attr->type = FI_EP_MSG;
    hints->caps = FI_MSG;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
    hints->domain_attr->threading = FI_THREAD_DOMAIN; // one thread uses all of it
    hints->fabric_attr->prov_name = strdup(prov ? prov : "tcp");
    int ret = fi_getinfo(FI_VERSION(1, 17), node, service, flags, hints, out);
    fi_freeinfo(hints);
    if (ret)
        logErr("fi_getinfo", ret);
    return ret;
}

Session::~Session()
{
    for (auto &c : conns_) {
        closeFid(c->ep ? &c->ep->fid : nullptr);
        if (c->cq != sharedCq_)
            closeFid(c->cq ? &c->cq->fid : nullptr);
    }
    closeFid(sharedCq_ ? &sharedCq_->fid : nullptr);
    closeFid(mr_ ? &mr_->fid : nullptr);
    closeFid(eq_ ? &eq_->fid : nullptr);
    closeFid(domain_ ? &domain_->fid : nullptr);
    if (epfd_ >= 0)
        close(epfd_);
    free(slab_);
}

int Session::openCq(fid_cq **cq, int *fd, size_t size)
{
    fi_cq_attr attr = {};
    attr.size = size;
    attr.format = FI_CQ_FORMAT_CONTEXT;
    attr.wait_obj = FI_WAIT_FD;
    int ret = fi_cq_open(domain_, &attr, cq, nullptr);
    if (ret) {
        logErr("fi_cq_open", ret);
        return ret;
    }
    ret = fi_control(&(*cq)->fid, FI_GETWAIT, fd);
    if (ret)
        logErr("fi_control(FI_GETWAIT)", ret);
    return ret;
}

int Session::watch(int fd, Conn *conn)
{
    epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.ptr = conn;
    if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev)) {
        int err = errno;
        fprintf(stderr, "rstream-perf: raw: epoll_ctl: %s\n", strerror(err));
        return -err;
    }
    return 0;
}

int Session::open(fid_fabric *fabric, const fi_info *info)
{
    fabric_ = fabric;
    injectSize_ = info->tx_attr->inject_size;
    size_t slabLen = 2 * size_t(hello_.size) * hello_.conns;
    if (posix_memalign(reinterpret_cast<void **>(&slab_), 4096, slabLen)) {
        logErr("buffers", -ENOMEM);
        return -ENOMEM;
    }
    memset(slab_, 0, slabLen);
    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epfd_ < 0) {
        logErr("epoll_create1", -errno);
        return -errno;
    }
    events_.resize(hello_.conns + 1);
    int ret = fi_domain(fabric, const_cast<fi_info *>(info), &domain_, nullptr);
    if (ret) {
        logErr("fi_domain", ret);
        return ret;
    }
    fi_eq_attr eqAttr = {};
    eqAttr.size = 2 * hello_.conns + 16;
    eqAttr.wait_obj = FI_WAIT_UNSPEC;
    ret = fi_eq_open(fabric, &eqAttr, &eq_, nullptr);
    if (ret) {
        logErr("fi_eq_open", ret);
        return ret;
    }
    if (info->domain_attr->mr_mode & FI_MR_LOCAL) {
        // One region for all the buffers: the only one in the domain, so key 0 is unique.
        ret = fi_mr_reg(domain_, slab_, slabLen, FI_SEND | FI_RECV, 0, 0, 0, &mr_, nullptr);
        if (ret) {
            logErr("fi_mr_reg", ret);
            return ret;
        }
        desc_ = fi_mr_desc(mr_);
    }
    if (hello_.cq == RrCq::Shared) {
        int fd = -1;
        size_t depth = size_t(hello_.conns) * (1 + kTxSlots) + 64;
        ret = openCq(&sharedCq_, &fd, depth);
        if (!ret)
            ret = watch(fd, nullptr);
    }
    return ret;
}

int Session::addConn(fi_info *info, Conn **out)
{
    auto conn = std::make_unique<Conn>();
    Conn *c = conn.get();
    size_t slot = conns_.size();
    conns_.push_back(std::move(conn));
    c->rx = slab_ + 2 * slot * hello_.size;
    c->tx = c->rx + hello_.size;
    c->recvOp.conn = c;
    c->recvOp.recv = true;
    for (Op &op : c->txOps)
        op.conn = c;
    int ret = fi_endpoint(domain_, info, &c->ep, c);
    if (ret) {
        logErr("fi_endpoint", ret);
        return ret;
    }
    if (sharedCq_) {
        c->cq = sharedCq_;
    } else {
        ret = openCq(&c->cq, &c->waitFd, 1 + kTxSlots + 8);
        if (!ret)
            ret = watch(c->waitFd, c);
        if (ret)
            return ret;
    }
    ret = fi_ep_bind(c->ep, &eq_->fid, 0);
    if (!ret)
        ret = fi_ep_bind(c->ep, &c->cq->fid, FI_TRANSMIT | FI_RECV);
    if (!ret)
        ret = fi_enable(c->ep);
    if (!ret)
        ret = int(fi_recv(c->ep, c->rx, hello_.size, desc_, 0, &c->recvOp));
    if (ret) {
        logErr("endpoint setup", ret);
        return ret;
    }
    *out = c;
    return 0;
}

int Session::waitConnected(Conn *conn, const char *what)
{
    alignas(fi_eq_cm_entry) uint8_t buf[sizeof(fi_eq_cm_entry) + 64];
    const int event = readEvent(eq_, buf, sizeof(buf), kEqTimeoutMs, nullptr);
    const int ret = event < 0 ? event : 0;
    if (ret == -ECONNREFUSED) {
        fprintf(stderr,
                "rstream-perf: raw: %s: refused (is the server busy, or do its --size, "
                "--cq or --transport differ?)\n",
                what);
        return ret;
    }
    if (ret < 0) {
        logErr(what, ret);
        return ret;
    }
    auto *entry = reinterpret_cast<fi_eq_cm_entry *>(buf);
    if (uint32_t(event) != FI_CONNECTED || entry->fid != &conn->ep->fid) {
        fprintf(stderr, "rstream-perf: raw: %s: unexpected event %d\n", what, event);
        return -ECONNREFUSED;
    }
    live_++;
    return 0;
}

int Session::post(Conn *conn)
{
    if (conn->gone)
        return 0;
    ssize_t ret;
    Op *op = nullptr;
    if (hello_.size <= injectSize_) {
        ret = fi_inject(conn->ep, conn->tx, hello_.size, 0);
    } else {
        for (Op &o : conn->txOps)
            op = op || o.busy ? op : &o;
        ret = op ? fi_send(conn->ep, conn->tx, hello_.size, desc_, 0, op) : -FI_EAGAIN;
    }
    if (ret == -FI_EAGAIN) {
        if (!conn->owed)
            owed_.push_back(conn);
        conn->owed = true;
        return 0;
    }
    if (ret) {
        logErr(hello_.size <= injectSize_ ? "fi_inject" : "fi_send", int(ret));
        return int(ret);
    }
    if (op)
        op->busy = true;
    conn->owed = false;
    return 0;
}

void Session::markGone(Conn *conn)
{
    if (conn->gone)
        return;
    conn->gone = true;
    live_--;
    // A dead endpoint's wait fd may stay readable: it must not wake the loop again.
    if (conn->waitFd >= 0)
        epoll_ctl(epfd_, EPOLL_CTL_DEL, conn->waitFd, nullptr);
}

int Session::onCompletion(Op *op)
{
    Conn *conn = op->conn;
    if (!op->recv) {
        op->busy = false;
        return 0;
    }
    if (conn->gone)
        return 0;
    int ret = int(fi_recv(conn->ep, conn->rx, hello_.size, desc_, 0, &conn->recvOp));
    if (ret) {
        logErr("fi_recv", ret);
        return ret;
    }
    if (server_) {
        answered++;
    } else {
        int64_t now = nowNs();
        stats->record(conn->sentNs, now);
        if (pacer) {
            pacer->schedule(conn, conn->dueNs, now);
            return 0;
        }
        conn->sentNs = now;
    }
    return post(conn);
}

int Session::onError(fid_cq *cq)
{
    fi_cq_err_entry err = {};
    ssize_t ret = fi_cq_readerr(cq, &err, 0);
    if (ret < 0) {
        logErr("fi_cq_readerr", int(ret));
        return int(ret);
    }
    auto *op = static_cast<Op *>(err.op_context);
    if (!op || op->conn->gone)
        return 0;
    op->busy = false;
    // A client cannot go on without all of its connections; a server's client may go at any
    // time (its receives are cancelled then), which ends that connection, not the run.
    if (!server_ || err.err != FI_ECANCELED)
        fprintf(stderr, "rstream-perf: raw: a connection failed: %s\n", fi_strerror(err.err));
    if (!server_)
        return -ECONNRESET;
    markGone(op->conn);
    return 0;
}

int Session::drain(fid_cq *cq)
{
    fi_cq_entry entries[kCqBatch];
    for (;;) {
        ssize_t n = fi_cq_read(cq, entries, kCqBatch);
        if (n == -FI_EAGAIN)
            return 0;
        if (n == -FI_EAVAIL) {
            int ret = onError(cq);
            if (ret)
                return ret;
            continue;
        }
        if (n < 0) {
            logErr("fi_cq_read", int(n));
            return int(n);
        }
        for (ssize_t i = 0; i < n; i++) {
            // fi_inject makes no completion; everything else carries its Op.
            if (!entries[i].op_context)
                continue;
            int ret = onCompletion(static_cast<Op *>(entries[i].op_context));
            if (ret)
                return ret;
        }
    }
}

int Session::checkEq()
{
    int64_t now = nowNs();
    if (now - eqCheckNs_ < kEqCheckNs)
        return 0;
    eqCheckNs_ = now;
    for (;;) {
        alignas(fi_eq_cm_entry) uint8_t buf[sizeof(fi_eq_cm_entry) + 64];
        uint32_t event = 0;
        ssize_t ret = fi_eq_read(eq_, &event, buf, sizeof(buf), 0);
        fid_t f = nullptr;
        if (ret == -FI_EAGAIN)
            return 0;
        if (ret == -FI_EAVAIL) {
            fi_eq_err_entry err = {};
            if (fi_eq_readerr(eq_, &err, 0) < 0)
                return -EIO;
            f = err.fid;
        } else if (ret < 0) {
            logErr("fi_eq_read", int(ret));
            return int(ret);
        } else if (event == FI_SHUTDOWN) {
            f = reinterpret_cast<fi_eq_cm_entry *>(buf)->fid;
        }
        auto *conn = f ? static_cast<Conn *>(f->context) : nullptr;
        if (!conn)
            continue;
        if (!server_ && !conn->gone) {
            fprintf(stderr, "rstream-perf: raw: the server closed a connection\n");
            return -ECONNRESET;
        }
        markGone(conn);
    }
}

int Session::retryOwed()
{
    std::vector<Conn *> owed;
    owed.swap(owed_);
    for (Conn *conn : owed) {
        conn->owed = false;
        int ret = post(conn);
        if (ret)
            return ret;
    }
    return 0;
}

int Session::stepShared(int timeoutMs)
{
    int ret = drain(sharedCq_);
    if (!ret)
        ret = retryOwed();
    if (ret || !owed_.empty())
        return ret;
    fid *fids[1] = {&sharedCq_->fid};
    ret = fi_trywait(fabric_, fids, 1);
    if (ret == -FI_EAGAIN)
        return 0;
    if (ret) {
        logErr("fi_trywait", ret);
        return ret;
    }
    if (epoll_wait(epfd_, events_.data(), 1, sleepMs(timeoutMs)) < 0 && errno != EINTR) {
        logErr("epoll_wait", -errno);
        return -errno;
    }
    return 0;
}

int Session::stepOwn(int timeoutMs)
{
    for (Conn *conn : ready_) {
        conn->ready = false;
        if (conn->gone)
            continue;
        int ret = drain(conn->cq);
        if (ret)
            return ret;
        read_.push_back(conn);
    }
    ready_.clear();
    int ret = retryOwed();
    if (ret)
        return ret;
    // Sends still owed wait for their CQ's progress: read it again next round.
    for (Conn *conn : owed_)
        read_.push_back(conn);
    for (Conn *conn : read_) {
        if (conn->ready || conn->gone)
            continue;
        fid *fids[1] = {&conn->cq->fid};
        ret = fi_trywait(fabric_, fids, 1);
        if (ret == -FI_EAGAIN) {
            conn->ready = true;
            ready_.push_back(conn);
        } else if (ret) {
            logErr("fi_trywait", ret);
            return ret;
        }
    }
    read_.clear();
    int n = epoll_wait(epfd_, events_.data(), int(events_.size()),
                       ready_.empty() ? sleepMs(timeoutMs) : 0);
    if (n < 0 && errno != EINTR) {
        logErr("epoll_wait", -errno);
        return -errno;
    }
    for (int i = 0; i < n; i++) {
        auto *conn = static_cast<Conn *>(events_[i].data.ptr);
        if (!conn->ready) {
            conn->ready = true;
            ready_.push_back(conn);
        }
    }
    return 0;
}

int Session::sendDue()
{
    if (!pacer)
        return 0;
    int64_t due = 0;
    for (Conn *conn; (conn = pacer->takeDue(nowNs(), &due));) {
        if (conn->gone)
            continue;
        conn->dueNs = due;
        conn->sentNs = nowNs();
        int ret = post(conn);
        if (ret)
            return ret;
    }
    return 0;
}

int Session::sleepMs(int timeoutMs) const
{
    return pacer ? pacer->timeoutMs(nowNs(), timeoutMs) : timeoutMs;
}

int Session::step(int timeoutMs)
{
    int ret = checkEq();
    if (!ret)
        ret = sendDue();
    if (ret)
        return ret;
    timeoutMs = std::min(timeoutMs, kSleepMs);
    return sharedCq_ ? stepShared(timeoutMs) : stepOwn(timeoutMs);
}

int Session::start()
{
    int64_t now = nowNs();
    for (auto &c : conns_) {
        // Every CQ is read before the first sleep: none has been through fi_trywait yet.
        if (!sharedCq_) {
            c->ready = true;
            ready_.push_back(c.get());
        }
        if (server_)
            continue;
        c->sentNs = c->dueNs = now;
        int ret = post(c.get());
        if (ret)
            return ret;
    }
    return 0;
}

void Session::shutdown()
{
    for (auto &c : conns_) {
        if (!c->gone)
            fi_shutdown(c->ep, 0);
    }
}

} // namespace rstream::perf::rr
