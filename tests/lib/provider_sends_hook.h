// SPDX-License-Identifier: MIT
// The provider's socket sends as the preload shim's interposer reports them to the engine
// (src/base/provider_sends.h), for a test: include in one source file of an executable linked
// with export_dynamic, whose send, sendto and sendmsg libfabric then binds to.
#pragma once

#include <atomic>
#include <cerrno>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "provider_sends.h"

namespace rstream::test {
// Off: the sends go unreported, as under librstream.so, which interposes nothing.
inline std::atomic<bool> gReportSends{true};
// Set: the next send made inside an engine post gives the kernel only half its bytes, as a
// full socket buffer would take them (then cleared).
inline std::atomic<bool> gCutNextSend{false};

inline size_t cutLength(size_t len)
{
    if (len > 1 && rstream::tProviderSends.on && gCutNextSend.exchange(false))
        return len / 2;
    return len;
}

inline ssize_t reportSend(ssize_t r, size_t len, int flags)
{
    if (gReportSends)
        rstream::noteProviderSend(r, len, flags);
    return r;
}
} // namespace rstream::test

extern "C" ssize_t sendto(int fd, const void *buf, size_t len, int flags, const sockaddr *to,
                          socklen_t tolen)
{
    const size_t n = rstream::test::cutLength(len);
    return rstream::test::reportSend(syscall(SYS_sendto, fd, buf, n, flags, to, tolen), len, flags);
}

extern "C" ssize_t send(int fd, const void *buf, size_t len, int flags)
{
    return sendto(fd, buf, len, flags, nullptr, 0);
}

extern "C" ssize_t sendmsg(int fd, const msghdr *msg, int flags)
{
    size_t len = 0;
    for (size_t i = 0; msg && i < msg->msg_iovlen; i++)
        len += msg->msg_iov[i].iov_len;
    // Cut short by sending fewer iovec entries' worth: the first half of the bytes, whole.
    msghdr m = *msg;
    iovec part[64];
    const size_t want = rstream::test::cutLength(len);
    if (want < len && msg->msg_iovlen <= 64) {
        size_t left = want, k = 0;
        for (; k < msg->msg_iovlen && left; k++) {
            part[k] = msg->msg_iov[k];
            if (part[k].iov_len > left)
                part[k].iov_len = left;
            left -= part[k].iov_len;
        }
        m.msg_iov = part;
        m.msg_iovlen = k;
    }
    return rstream::test::reportSend(syscall(SYS_sendmsg, fd, &m, flags), len, flags);
}
