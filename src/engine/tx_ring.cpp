// SPDX-License-Identifier: MIT
// The transmit queue's op contexts (tx_ring.h): sizing and freeing them.

#include "tx_ring.h"

#include <cerrno>
#include <new>

namespace rstream {

int TxOpRing::init(uint32_t cap)
{
    ops_.reset(new (std::nothrow) TxOp[cap]());
    if (!ops_)
        return -ENOMEM;
    cap_ = cap;
    head_ = next_ = writes_ = 0;
    injectPending_ = false;
    injectSeq_ = 0;
    return 0;
}

void TxOpRing::reset()
{
    ops_.reset();
    cap_ = 0;
}

} // namespace rstream
