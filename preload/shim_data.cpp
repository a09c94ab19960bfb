// SPDX-License-Identifier: MIT
// The Shim object's data path: send, recv, read, write and their vector forms, sendfile.

#include <algorithm>
#include <climits>
#include <ctime>
#include <memory>

#include "clock.h"
#include "shim_object.h"

namespace rstream::shim {

namespace {

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
        ssize_t n =
            offset ? pread(inFd, buf.get(), want, pos) : shim().real.read()(inFd, buf.get(), want);
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

// The engine's side of the calls shim_object.h defines inline: their kernel path stays there.

ssize_t Shim::recvEngine(HybridSocket &s, void *buf, size_t len, int flags)
{
    return boundary([&] {
        iovec iov{buf, len};
        return doRecv(s, &iov, 1, flags);
    });
}

ssize_t Shim::recvfromEngine(HybridSocket &s, void *buf, size_t len, int flags, sockaddr *from,
                             socklen_t *fromlen)
{
    return boundary([&] { return recvFrom(s, buf, len, flags, from, fromlen); });
}

ssize_t Shim::recvmsgEngine(HybridSocket &s, msghdr *msg, int flags)
{
    return boundary([&] { return recvMsg(s, msg, flags); });
}

ssize_t Shim::readvEngine(HybridSocket &s, const iovec *iov, int iovcnt)
{
    return boundary([&]() -> ssize_t {
        if (iovcnt < 0)
            return -EINVAL;
        return doRecv(s, iov, static_cast<size_t>(iovcnt), 0);
    });
}

int Shim::recvmmsg(const void *ra, int fd, mmsghdr *vec, unsigned int vlen, int flags,
                   timespec *timeout)
{
    auto s = dataSocket(fd, ra);
    if (!s)
        return real.recvmmsg()(fd, vec, vlen, flags, timeout);
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

// ---- send -------------------------------------------------------------------------------------

ssize_t Shim::sendEngine(HybridSocket &s, const void *buf, size_t len, int flags)
{
    return boundary([&] {
        iovec iov{const_cast<void *>(buf), len};
        return doSend(s, &iov, 1, flags);
    });
}

ssize_t Shim::sendmsgEngine(HybridSocket &s, const msghdr *msg, int flags)
{
    return boundary([&] { return sendMsg(s, msg, flags); });
}

ssize_t Shim::writevEngine(HybridSocket &s, const iovec *iov, int iovcnt)
{
    return boundary([&]() -> ssize_t {
        if (iovcnt < 0)
            return -EINVAL;
        return doSend(s, iov, static_cast<size_t>(iovcnt), 0);
    });
}

int Shim::sendmmsg(const void *ra, int fd, mmsghdr *vec, unsigned int vlen, int flags)
{
    auto s = dataSocket(fd, ra);
    if (!s)
        return real.sendmmsg()(fd, vec, vlen, flags);
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

ssize_t Shim::sendfile(const void *ra, int outFd, int inFd, off_t *offset, size_t count)
{
    auto s = dataSocket(outFd, ra);
    if (!s)
        return real.sendfile()(outFd, inFd, offset, count);
    return boundary([&] {
        NoCancel nc; // glibc declares sendfile noexcept
        return sendFile(*s, inFd, offset, count);
    });
}

ssize_t Shim::sendfile64(const void *ra, int outFd, int inFd, off64_t *offset, size_t count)
{
    auto s = dataSocket(outFd, ra);
    if (!s)
        return real.sendfile64()(outFd, inFd, offset, count);
    return boundary([&] {
        NoCancel nc;
        return sendFile(*s, inFd, offset, count);
    });
}

} // namespace rstream::shim
