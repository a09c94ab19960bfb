// SPDX-License-Identifier: MIT
// rstream-perf's plain-libfabric pieces that its raw transports share: errors, closing, listening.
#pragma once

#include <cstdint>
#include <string>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>

namespace rstream::perf {

void logErr(const char *what, int err); // "rstream-perf: raw: what: error"
void closeFid(fid *f);                  // null allowed
// Reads one EQ event, waiting up to timeoutMs (0: not at all): the event number, or -errno
// (-ETIMEDOUT when none came; an error entry's own error). *bytes: what the read returned.
int readEvent(fid_eq *eq, void *buf, size_t len, int timeoutMs, ssize_t *bytes);

// A passive endpoint listening for a raw server, with its fabric and EQ.
struct Listening
{
    fid_fabric *fabric = nullptr;
    fid_eq *eq = nullptr;
    fid_pep *pep = nullptr;
};
// Opens and listens as info says; says "rstream-perf: NAME server on HOST:PORT (provider P)" or
// why not. Whatever was opened is in *out either way, for closeListening().
int listenOn(const fi_info *info, const char *name, const std::string &host, uint16_t port,
             Listening *out);
void closeListening(Listening *l);

} // namespace rstream::perf
