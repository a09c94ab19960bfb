// SPDX-License-Identifier: MIT
// The same compile-time checks with <rstream/rsocket.h> alone (its own RDMA_* enum), and then
// <rdma/rsocket.h> included after it, which must add nothing.

#include <rstream/rsocket.h>

#include "prototypes.h"

#include <rdma/rsocket.h>

static_assert(RSTREAM_TX_SIZE == 0x102 && RSTREAM_RX_SIZE == 0x103);

int headerOwnCheck();

int headerOwnCheck()
{
    return 0;
}
