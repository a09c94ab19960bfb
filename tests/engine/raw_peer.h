// SPDX-License-Identifier: MIT
// A raw libfabric endpoint playing an rstream peer for the engine tests: it says the hello it is
// given, then sends, writes and reads what a test chooses, so that peers breaking the protocol
// (or keeping to it slowly) can be tried.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/uio.h>

#include <gtest/gtest.h>

#include "wire.h"

namespace rstream {

class RawPeer
{
public:
    // A message that arrived: its word and the payload after it (an IOMAP record).
    struct Message
    {
        uint32_t word = 0;
        std::vector<uint8_t> payload;
    };

    ~RawPeer()
    {
        if (ep_)
            fi_close(&ep_->fid);
        if (cq_)
            fi_close(&cq_->fid);
        if (eq_)
            fi_close(&eq_->fid);
        if (domain_)
            fi_close(&domain_->fid);
        if (fabric_)
            fi_close(&fabric_->fid);
        if (info_)
            fi_freeinfo(info_);
    }

    // An enabled endpoint towards port, with receives posted for the peer's messages.
    void open(uint16_t port)
    {
        fi_info *hints = fi_allocinfo();
        hints->ep_attr->type = FI_EP_MSG;
        hints->caps = FI_MSG | FI_RMA;
        hints->fabric_attr->prov_name = strdup("tcp");
        std::string service = std::to_string(port);
        ASSERT_EQ(fi_getinfo(FI_VERSION(1, 17), "127.0.0.1", service.c_str(), 0, hints, &info_), 0);
        fi_freeinfo(hints);
        ASSERT_EQ(fi_fabric(info_->fabric_attr, &fabric_, nullptr), 0);
        ASSERT_EQ(fi_domain(fabric_, info_, &domain_, nullptr), 0);
        fi_eq_attr eattr{};
        eattr.wait_obj = FI_WAIT_FD;
        ASSERT_EQ(fi_eq_open(fabric_, &eattr, &eq_, nullptr), 0);
        ASSERT_EQ(fi_endpoint(domain_, info_, &ep_, nullptr), 0);
        fi_cq_attr cattr{};
        cattr.format = FI_CQ_FORMAT_DATA;
        ASSERT_EQ(fi_cq_open(domain_, &cattr, &cq_, nullptr), 0);
        ASSERT_EQ(fi_ep_bind(ep_, &eq_->fid, 0), 0);
        ASSERT_EQ(fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV), 0);
        ASSERT_EQ(fi_enable(ep_), 0);
        for (Slot &s : slots_)
            ASSERT_EQ(fi_recv(ep_, s.buf, sizeof(s.buf), nullptr, 0, &s.ctx), 0);
    }

    // Sends the hello; the answer comes from event().
    void hello(const wire::Hello &h)
    {
        iwarp_ = h.flags & wire::kFlagIwarp;
        uint8_t data[wire::kHelloSize];
        wire::encodeHello(h, data);
        ASSERT_EQ(fi_connect(ep_, info_->dest_addr, data, sizeof(data)), 0);
    }

    // The next connection event (FI_CONNECTED...), or -FI_EAVAIL with *err set, within 5 s.
    ssize_t event(uint32_t *ev, int *err)
    {
        alignas(fi_eq_cm_entry) uint8_t buf[sizeof(fi_eq_cm_entry) + 256];
        ssize_t r = fi_eq_sread(eq_, ev, buf, sizeof(buf), 5000, 0);
        // The accepting side's hello: where its receive ring is, and under which key.
        if (r > ssize_t(sizeof(fi_eq_cm_entry)) && *ev == FI_CONNECTED)
            wire::decodeHello(reinterpret_cast<fi_eq_cm_entry *>(buf)->data,
                              size_t(r) - sizeof(fi_eq_cm_entry), &accepted_);
        if (r == -FI_EAVAIL) {
            fi_eq_err_entry e{};
            fi_eq_readerr(eq_, &e, 0);
            *err = e.err;
        }
        return r;
    }

    // A connection with a valid hello for a ring of ringSize bytes, taking ioMapSize windows;
    // flags: more of the hello's flags (kFlagRewind).
    void connect(uint16_t port, bool virtAddr, bool iwarp, uint32_t ringSize,
                 uint32_t ioMapSize = 0, uint16_t flags = 0)
    {
        open(port);
        wire::Hello h;
        h.flags = wire::kFlagGrow | (virtAddr ? wire::kFlagVirtAddr : 0) |
                  (iwarp ? wire::kFlagIwarp : 0) | flags;
        h.ringAddr = virtAddr ? 0x10000 : 0;
        h.ringKey = 1;
        h.ringSize = ringSize;
        h.rxSlots = kSlots;
        h.ioMapSize = ioMapSize;
        hello(h);
        uint32_t ev = 0;
        int err = 0;
        ASSERT_GT(event(&ev, &err), 0) << fi_strerror(err);
        ASSERT_EQ(ev, uint32_t(FI_CONNECTED));
    }

    // A message word, with len bytes of payload as an rstream peer sends it: the payload of a
    // send with immediate, or in iWarp mode after the word in one send.
    void send(uint32_t word, const void *payload = nullptr, size_t len = 0)
    {
        ASSERT_LE(len, sizeof(msg_) - 4);
        std::memcpy(msg_, &word, 4);
        if (len)
            std::memcpy(msg_ + 4, payload, len);
        ssize_t r;
        do {
            r = iwarp_ ? fi_send(ep_, msg_, 4 + len, nullptr, 0, nullptr)
                       : fi_senddata(ep_, len ? msg_ + 4 : nullptr, len, nullptr, word, 0, nullptr);
            progress();
        } while (r == -FI_EAGAIN);
        ASSERT_EQ(r, 0);
    }

    // What the accepting side's hello said.
    const wire::Hello &accepted() const { return accepted_; }

    // An RMA write of len bytes to addr under key, as a peer that guessed them would send it;
    // waits (2 s at most) for its completion: 0, or the provider's error. It completes once the
    // bytes are in place at the target (FI_DELIVERY_COMPLETE): a target that refuses it (and
    // drops the connection) makes it fail or time out.
    int write(uint64_t addr, uint64_t key, const void *data, size_t len)
    {
        writeResult_ = 1;
        iovec iov{const_cast<void *>(data), len};
        fi_rma_iov rma{addr, len, key};
        fi_msg_rma msg{};
        msg.msg_iov = &iov;
        msg.iov_count = 1;
        msg.rma_iov = &rma;
        msg.rma_iov_count = 1;
        msg.context = &writeCtx_;
        ssize_t r;
        do {
            r = fi_writemsg(ep_, &msg, FI_DELIVERY_COMPLETE | FI_COMPLETION);
            progress();
        } while (r == -FI_EAGAIN);
        if (r)
            return static_cast<int>(r);
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
        while (writeResult_ == 1 && std::chrono::steady_clock::now() < until) {
            progress();
            if (writeResult_ == 1)
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        return writeResult_ == 1 ? -FI_ETIMEDOUT : writeResult_;
    }

    // The next message from the peer within timeoutMs; false when none came.
    bool next(Message *m, int timeoutMs)
    {
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
        for (;;) {
            progress();
            if (!inbox_.empty()) {
                *m = std::move(inbox_.front());
                inbox_.pop_front();
                return true;
            }
            if (std::chrono::steady_clock::now() >= until)
                return false;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }

    // Manual progress: completions are taken, messages kept for next(), receives reposted.
    void progress()
    {
        fi_cq_data_entry e[8];
        for (;;) {
            const ssize_t n = fi_cq_read(cq_, e, 8);
            if (n == -FI_EAVAIL) {
                fi_cq_err_entry err{};
                fi_cq_readerr(cq_, &err, 0);
                if (err.op_context == &writeCtx_)
                    writeResult_ = -err.err;
                else if (Slot *s = slotOf(err.op_context))
                    fi_recv(ep_, s->buf, sizeof(s->buf), nullptr, 0, &s->ctx);
                continue;
            }
            if (n <= 0)
                return;
            for (ssize_t i = 0; i < n; i++) {
                if (e[i].op_context == &writeCtx_) {
                    writeResult_ = 0;
                    continue;
                }
                Slot *s = slotOf(e[i].op_context);
                if (!s)
                    continue;
                Message m;
                if (e[i].flags & FI_REMOTE_CQ_DATA) {
                    m.word = static_cast<uint32_t>(e[i].data);
                    m.payload.assign(s->buf, s->buf + std::min(e[i].len, sizeof(s->buf)));
                } else if (e[i].len >= 4) {
                    std::memcpy(&m.word, s->buf, 4);
                    m.payload.assign(s->buf + 4, s->buf + std::min(e[i].len, sizeof(s->buf)));
                }
                inbox_.push_back(std::move(m));
                fi_recv(ep_, s->buf, sizeof(s->buf), nullptr, 0, &s->ctx);
            }
        }
    }

private:
    static constexpr uint32_t kSlots = 16;
    struct Slot
    {
        fi_context2 ctx;
        uint8_t buf[64];
    };

    Slot *slotOf(void *ctx)
    {
        for (Slot &s : slots_)
            if (ctx == &s.ctx)
                return &s;
        return nullptr;
    }

    fi_info *info_ = nullptr;
    fid_fabric *fabric_ = nullptr;
    fid_domain *domain_ = nullptr;
    fid_eq *eq_ = nullptr;
    fid_cq *cq_ = nullptr;
    fid_ep *ep_ = nullptr;
    Slot slots_[kSlots] = {};
    std::deque<Message> inbox_;
    fi_context2 writeCtx_{};
    int writeResult_ = 1; // 1: the write is not complete yet
    wire::Hello accepted_;
    uint8_t msg_[64] = {};
    bool iwarp_ = false;
};

} // namespace rstream
