// SPDX-License-Identifier: MIT
// Compiles only if <rstream/rsocket.h> declares librdmacm's rsocket functions exactly as
// <rdma/rsocket.h> does: redeclaring an extern "C" function with another signature is an error.

#include <rdma/rsocket.h>

#include <rstream/rsocket.h>

#include "prototypes.h"

// The system header's guard is what keeps the enum from being defined twice.
static_assert(RSTREAM_SEND_BUF == 0x100 && RSTREAM_RECV_BUF == 0x101);

int headerOwnCheck();

int main()
{
    return headerOwnCheck();
}
