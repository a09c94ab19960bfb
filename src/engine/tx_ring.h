// SPDX-License-Identifier: MIT
// The transmit queue's op contexts: used in order, released in order as they complete, and the
// writes and injects among them still in flight. Pure bookkeeping: the connection posts the ops
// and frees what they held.
#pragma once

#include <cstdint>
#include <memory>

#include <rdma/fabric.h>

namespace rstream {

// The context of one posted op (a write, a send, or an inject that reports nothing).
struct TxOp
{
    fi_context2 ctx;
    uint64_t len; // ring bytes released on completion
    uint64_t seq; // position in the queue (next() when posted)
    bool done;
    bool record; // an IOMAP send: frees a record buffer when released
};

// A ring of cap() op contexts, used in order and released in order as ops complete.
class TxOpRing
{
public:
    // Sizes the ring: 0, or -ENOMEM.
    int init(uint32_t cap);
    // Frees the contexts (none may be posted any more).
    void reset();

    uint32_t cap() const { return cap_; }
    uint64_t head() const { return head_; } // oldest op not yet released
    uint64_t next() const { return next_; } // next op to use
    uint64_t used() const { return next_ - head_; }
    bool empty() const { return head_ == next_; }
    // Whether n more ops fit.
    bool hasRoom(uint64_t n) const { return next_ - head_ + n <= cap_; }
    // The slot of the next op, for the buffers kept alongside each (control words).
    uint32_t nextIndex() const { return static_cast<uint32_t>(next_ % cap_); }

    // The next op's context, set up for len ring bytes; it is used once commit() says it was
    // posted. Only with hasRoom(1).
    TxOp &prepare(uint64_t len)
    {
        TxOp &op = ops_[next_ % cap_];
        op.len = len;
        op.seq = next_;
        op.done = false;
        return op;
    }
    // The op prepare() returned was posted.
    void commit() { next_++; }

    // A posted op carrying ring bytes: counted in writesInFlight() until released.
    void countWrite() { writes_++; }
    uint64_t writesInFlight() const { return writes_; }

    // Small writes go out as injects, which complete at once and report nothing. The provider
    // may still hold them (tcp, when the socket is full) until progress is made, so they count
    // as pending until a later op with a completion completes: ops leave in order.
    void onInject(const TxOp &op)
    {
        injectPending_ = true;
        injectSeq_ = op.seq;
    }
    bool injectPending() const { return injectPending_; }
    // The provider reported op's completion: any inject posted before it has left.
    void onReported(const TxOp &op)
    {
        if (injectPending_ && op.seq > injectSeq_)
            injectPending_ = false;
    }

    // The op whose context this is, or null when it is not one of ours (a receive).
    TxOp *find(void *context) const
    {
        auto *op = static_cast<TxOp *>(context);
        return op >= ops_.get() && op < ops_.get() + cap_ ? op : nullptr;
    }
    // Completion marks an op done; it is released once all before it are.
    static void complete(TxOp *op) { op->done = true; }
    // The oldest op when it is done (the next to release), else null.
    TxOp *doneHead() const
    {
        if (head_ == next_)
            return nullptr;
        TxOp &op = ops_[head_ % cap_];
        return op.done ? &op : nullptr;
    }
    // Releases the op doneHead() returned; returns the ring bytes it held.
    uint64_t release()
    {
        TxOp &op = ops_[head_ % cap_];
        const uint64_t len = op.len;
        if (len)
            writes_--;
        op.record = false;
        op.done = false;
        op.len = 0;
        head_++;
        return len;
    }

private:
    std::unique_ptr<TxOp[]> ops_; // cap_ entries, used in order
    uint32_t cap_ = 0;
    uint64_t head_ = 0;
    uint64_t next_ = 0;
    uint64_t writes_ = 0;
    bool injectPending_ = false;
    uint64_t injectSeq_ = 0; // seq of the last inject
};

} // namespace rstream
