// SPDX-License-Identifier: MIT
// Interposers for the data path: send, recv, read, write and their vector and fortified forms.

#include <algorithm>
#include <climits>
#include <ctime>
#include <memory>

#include "clock.h"
#include "shim.h"

using namespace rstream;
using namespace rstream::shim;

namespace {

// The socket when the engine carries fd's data; null when the kernel fd answers (not ours, or
// a socket whose path is the kernel's or not decided yet).
std::shared_ptr<HybridSocket> dataSocket(int fd, const void *ra)
{
    auto s = engineSocket(fd, ra);
    if (s && !dataMode(s->mode()))
        return nullptr;
    return s;
}

ssize_t doRecv(HybridSocket &s, const iovec *iov, size_t iovcnt, int flags)
{
    if (iovcnt > IOV_MAX)
        return -EINVAL;
    pthread_testcancel();
    EngineCall ec;
    return s.recv(iov, static_cast<int>(iovcnt), flags);
}

// The engine returns -EPIPE and leaves the signal to us: the kernel raises it on the calling
// thread unless MSG_NOSIGNAL was given. Raised outside the EngineCall so that the program's
// handler runs as the program.
ssize_t doSend(HybridSocket &s, const iovec *iov, size_t iovcnt, int flags)
{
    if (iovcnt > IOV_MAX)
        return -EINVAL;
    pthread_testcancel();
    ssize_t r;
    {
        EngineCall ec;
        r = s.send(iov, static_cast<int>(iovcnt), flags);
    }
    if (r == -EPIPE && !(flags & MSG_NOSIGNAL))
        pthread_kill(pthread_self(), SIGPIPE);
    return r;
}

ssize_t recvFrom(HybridSocket &s, void *buf, size_t len, int flags, sockaddr *from,
                 socklen_t *fromlen)
{
    iovec iov{buf, len};
    ssize_t r = doRecv(s, &iov, 1, flags);
    // A stream socket has no source address to report, as TCP.
    if (r >= 0 && from && fromlen)
        *fromlen = 0;
    return r;
}

ssize_t recvMsg(HybridSocket &s, msghdr *msg, int flags)
{
    if (!msg)
        return -EFAULT;
    if (msg->msg_iovlen > IOV_MAX)
        return -EMSGSIZE;
    ssize_t r = doRecv(s, msg->msg_iov, msg->msg_iovlen, flags);
    if (r >= 0) {
        msg->msg_namelen = 0;
        msg->msg_controllen = 0;
        msg->msg_flags = 0;
    }
    return r;
}

ssize_t sendMsg(HybridSocket &s, const msghdr *msg, int flags)
{
    if (!msg)
        return -EFAULT;
    if (msg->msg_iovlen > IOV_MAX)
        return -EMSGSIZE;
    // As TCP: a destination address on a connected stream socket is ignored, and so are
    // control messages.
    return doSend(s, msg->msg_iov, msg->msg_iovlen, flags);
}

// sendfile onto an engine socket: the file's bytes go through a bounded buffer. The file
// position (or *offset) advances by what was sent, as the kernel's sendfile does.
template <class Off>
ssize_t sendFile(HybridSocket &s, int inFd, Off *offset, size_t count)
{
    constexpr size_t kChunk = 64 * 1024;
    if (count == 0)
        return 0;
    std::unique_ptr<char[]> buf(new char[std::min(count, kChunk)]);
    Off pos = offset ? *offset : 0;
    ssize_t total = 0;
    ssize_t error = 0;
    while (static_cast<size_t>(total) < count) {
        const size_t want = std::min(count - total, kChunk);
        ssize_t n = offset ? pread(inFd, buf.get(), want, pos) : real_read()(inFd, buf.get(), want);
        if (n < 0) {
            error = -errno;
            break;
        }
        if (n == 0)
            break;
        iovec iov{buf.get(), static_cast<size_t>(n)};
        ssize_t w = doSend(s, &iov, 1, 0);
        ssize_t unsent = w < 0 ? n : n - w;
        if (unsent > 0 && !offset)
            lseek(inFd, -unsent, SEEK_CUR); // give back what was read but not sent
        if (w < 0) {
            error = w;
            break;
        }
        total += w;
        pos += w;
        if (unsent > 0)
            break;
    }
    if (offset)
        *offset = pos;
    return total > 0 ? total : error;
}

} // namespace

// ---- recv -------------------------------------------------------------------------------------

namespace {

ssize_t recvAt(const void *ra, int fd, void *buf, size_t len, int flags)
{
    auto s = dataSocket(fd, ra);
    if (!s)
        return real_recv()(fd, buf, len, flags);
    return boundary([&] {
        iovec iov{buf, len};
        return doRecv(*s, &iov, 1, flags);
    });
}

ssize_t recvfromAt(const void *ra, int fd, void *buf, size_t len, int flags, sockaddr *from,
                   socklen_t *fromlen)
{
    auto s = dataSocket(fd, ra);
    if (!s)
        return real_recvfrom()(fd, buf, len, flags, from, fromlen);
    return boundary([&] { return recvFrom(*s, buf, len, flags, from, fromlen); });
}

ssize_t readAt(const void *ra, int fd, void *buf, size_t len)
{
    auto s = dataSocket(fd, ra);
    if (!s)
        return real_read()(fd, buf, len);
    return boundary([&] {
        iovec iov{buf, len};
        return doRecv(*s, &iov, 1, 0);
    });
}

} // namespace

RS_EXPORT ssize_t recv(int fd, void *buf, size_t len, int flags)
{
    return recvAt(RS_CALLER(), fd, buf, len, flags);
}

RS_EXPORT ssize_t recvfrom(int fd, void *buf, size_t len, int flags, sockaddr *from,
                           socklen_t *fromlen)
{
    return recvfromAt(RS_CALLER(), fd, buf, len, flags, from, fromlen);
}

RS_EXPORT ssize_t read(int fd, void *buf, size_t len)
{
    return readAt(RS_CALLER(), fd, buf, len);
}

RS_EXPORT ssize_t recvmsg(int fd, msghdr *msg, int flags)
{
    auto s = dataSocket(fd, RS_CALLER());
    if (!s)
        return real_recvmsg()(fd, msg, flags);
    return boundary([&] { return recvMsg(*s, msg, flags); });
}

RS_EXPORT int recvmmsg(int fd, mmsghdr *vec, unsigned int vlen, int flags, timespec *timeout)
{
    auto s = dataSocket(fd, RS_CALLER());
    if (!s)
        return real_recvmmsg()(fd, vec, vlen, flags, timeout);
    return boundary([&]() -> int {
        if (!vec)
            return -EFAULT;
        if (timeout &&
            (timeout->tv_sec < 0 || timeout->tv_nsec < 0 || timeout->tv_nsec >= 1000000000))
            return -EINVAL;
        vlen = std::min<unsigned>(vlen, UIO_MAXIOV);
        // As the kernel: the timeout is looked at after each message; MSG_WAITFORONE makes
        // every message after the first nonblocking.
        const int64_t deadline =
            timeout ? nowNs() + int64_t(timeout->tv_sec) * 1000000000 + timeout->tv_nsec : -1;
        int f = flags & ~MSG_WAITFORONE;
        int count = 0;
        ssize_t err = 0;
        for (unsigned i = 0; i < vlen; i++) {
            ssize_t r = recvMsg(*s, &vec[i].msg_hdr, f);
            if (r < 0) {
                err = r;
                break;
            }
            vec[i].msg_len = static_cast<unsigned>(r);
            count++;
            if (flags & MSG_WAITFORONE)
                f |= MSG_DONTWAIT;
            if (deadline >= 0 && nowNs() >= deadline)
                break;
        }
        if (timeout) {
            int64_t left = deadline >= 0 ? std::max<int64_t>(deadline - nowNs(), 0) : 0;
            timeout->tv_sec = left / 1000000000;
            timeout->tv_nsec = left % 1000000000;
        }
        return count > 0 ? count : static_cast<int>(err);
    });
}

RS_EXPORT ssize_t readv(int fd, const iovec *iov, int iovcnt)
{
    auto s = dataSocket(fd, RS_CALLER());
    if (!s)
        return real_readv()(fd, iov, iovcnt);
    return boundary([&]() -> ssize_t {
        if (iovcnt < 0)
            return -EINVAL;
        return doRecv(*s, iov, static_cast<size_t>(iovcnt), 0);
    });
}

// ---- send -------------------------------------------------------------------------------------

RS_EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags)
{
    auto s = dataSocket(fd, RS_CALLER());
    if (!s)
        return real_send()(fd, buf, len, flags);
    return boundary([&] {
        iovec iov{const_cast<void *>(buf), len};
        return doSend(*s, &iov, 1, flags);
    });
}

RS_EXPORT ssize_t sendto(int fd, const void *buf, size_t len, int flags, const sockaddr *to,
                         socklen_t tolen)
{
    auto s = dataSocket(fd, RS_CALLER());
    if (!s)
        return real_sendto()(fd, buf, len, flags, to, tolen);
    return boundary([&] {
        iovec iov{const_cast<void *>(buf), len};
        return doSend(*s, &iov, 1, flags); // the address is ignored, as on connected TCP
    });
}

RS_EXPORT ssize_t sendmsg(int fd, const msghdr *msg, int flags)
{
    auto s = dataSocket(fd, RS_CALLER());
    if (!s)
        return real_sendmsg()(fd, msg, flags);
    return boundary([&] { return sendMsg(*s, msg, flags); });
}

RS_EXPORT int sendmmsg(int fd, mmsghdr *vec, unsigned int vlen, int flags)
{
    auto s = dataSocket(fd, RS_CALLER());
    if (!s)
        return real_sendmmsg()(fd, vec, vlen, flags);
    return boundary([&]() -> int {
        if (!vec)
            return -EFAULT;
        vlen = std::min<unsigned>(vlen, UIO_MAXIOV);
        int count = 0;
        for (unsigned i = 0; i < vlen; i++) {
            ssize_t r = sendMsg(*s, &vec[i].msg_hdr, flags);
            if (r < 0)
                return count > 0 ? count : static_cast<int>(r);
            vec[i].msg_len = static_cast<unsigned>(r);
            count++;
        }
        return count;
    });
}

RS_EXPORT ssize_t write(int fd, const void *buf, size_t len)
{
    auto s = dataSocket(fd, RS_CALLER());
    if (!s)
        return real_write()(fd, buf, len);
    return boundary([&] {
        iovec iov{const_cast<void *>(buf), len};
        return doSend(*s, &iov, 1, 0);
    });
}

RS_EXPORT ssize_t writev(int fd, const iovec *iov, int iovcnt)
{
    auto s = dataSocket(fd, RS_CALLER());
    if (!s)
        return real_writev()(fd, iov, iovcnt);
    return boundary([&]() -> ssize_t {
        if (iovcnt < 0)
            return -EINVAL;
        return doSend(*s, iov, static_cast<size_t>(iovcnt), 0);
    });
}

RS_EXPORT ssize_t sendfile(int outFd, int inFd, off_t *offset, size_t count) noexcept
{
    auto s = dataSocket(outFd, RS_CALLER());
    if (!s)
        return real_sendfile()(outFd, inFd, offset, count);
    return boundary([&] {
        NoCancel nc; // glibc declares sendfile noexcept
        return sendFile(*s, inFd, offset, count);
    });
}

RS_EXPORT ssize_t sendfile64(int outFd, int inFd, off64_t *offset, size_t count) noexcept
{
    auto s = dataSocket(outFd, RS_CALLER());
    if (!s)
        return real_sendfile64()(outFd, inFd, offset, count);
    return boundary([&] {
        NoCancel nc;
        return sendFile(*s, inFd, offset, count);
    });
}

// ---- Fortified variants -----------------------------------------------------------------------

// glibc's contract for these: abort through __chk_fail when the length exceeds the buffer the
// compiler saw; otherwise they are the plain calls.

RS_EXPORT ssize_t __read_chk(int fd, void *buf, size_t nbytes, size_t buflen)
{
    if (nbytes > buflen)
        __chk_fail();
    return readAt(RS_CALLER(), fd, buf, nbytes);
}

RS_EXPORT ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags)
{
    if (len > buflen)
        __chk_fail();
    return recvAt(RS_CALLER(), fd, buf, len, flags);
}

RS_EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t len, size_t buflen, int flags,
                                 sockaddr *from, socklen_t *fromlen)
{
    if (len > buflen)
        __chk_fail();
    return recvfromAt(RS_CALLER(), fd, buf, len, flags, from, fromlen);
}
