// SPDX-License-Identifier: MIT
// What the provider's own socket sends returned inside one engine call, as an interposer saw them.
//
// A tcp provider holds back what its socket did not take (the rest of a short send, or all of a
// send that met EAGAIN) until a progress pass registers the socket's POLLOUT and pushes it. The
// engine cannot see that from the post, which succeeds either way; it makes a pass after the post
// to be sure. Where the program's socket calls are interposed (the preload shim), the provider's
// sends (send, sendto, sendmsg; its wake-up signal is a write, not counted) pass through the
// interposer, which reports them here: a post whose sends the interposer saw, every one of them
// taken whole, left nothing in the provider. Without an interposer no send is seen, and the
// engine makes its pass as before. (A send made inside the post by a signal handler counts
// too. It can hide that the provider queued the post behind a send it still holds; but the pass
// that verified that earlier send registered its POLLOUT, and the pass it brings pushes both.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <sys/socket.h>
#include <sys/types.h>

namespace rstream {

struct ProviderSendWatch
{
    bool on = false;   // an engine call is watching this thread's sends
    uint32_t seen = 0; // sends the interposer saw since
    bool held = false; // one of them was not taken whole
};

inline thread_local ProviderSendWatch tProviderSends;

// Called by an interposer for each send it passes through to the kernel: ret is what the kernel
// returned for len bytes (or -1). A zerocopy send completes later, on the socket's error queue:
// it counts as held.
inline void noteProviderSend(ssize_t ret, size_t len, int flags)
{
    ProviderSendWatch &w = tProviderSends;
    if (!w.on)
        return;
    w.seen++;
    if (ret < 0 || static_cast<size_t>(ret) < len || (flags & MSG_ZEROCOPY))
        w.held = true;
}

// The same for a sendmsg: its bytes are its iovecs' (summed only while a post watches).
inline void noteProviderSendmsg(ssize_t ret, const msghdr *msg, int flags)
{
    if (!tProviderSends.on || !msg)
        return;
    size_t len = 0;
    for (size_t i = 0; i < msg->msg_iovlen; i++)
        len += msg->msg_iov[i].iov_len;
    noteProviderSend(ret, len, flags);
}

// Watches this thread's sends for as long as it lives (one post).
class ProviderSendScope
{
public:
    ProviderSendScope() { tProviderSends = {true, 0, false}; }
    ~ProviderSendScope() { tProviderSends.on = false; }
    ProviderSendScope(const ProviderSendScope &) = delete;
    ProviderSendScope &operator=(const ProviderSendScope &) = delete;

    // The provider sent, and the kernel took all of it. No send seen (none made: the provider
    // queued the post behind an earlier one; or no interposer) is not knowing.
    bool allTaken() const { return tProviderSends.seen > 0 && !tProviderSends.held; }
};

} // namespace rstream
