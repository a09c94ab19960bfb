// SPDX-License-Identifier: MIT
// What librstream_preload.so builds on: the real-function table, internal calls, the C boundary.
#pragma once

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cxxabi.h>
#include <fcntl.h>
#include <memory>
#include <new>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "boundary.h"
#include "fdtable.h"
#include "hybrid.h"
#include "log.h"
#include "poller.h"

// Exported entry points; everything else in the module is hidden (-fvisibility=hidden).
#define RS_EXPORT extern "C" __attribute__((visibility("default")))
// In an exported function: the return address into whoever called it.
#define RS_CALLER() __builtin_return_address(0)

// The fortified variants glibc's headers route to under _FORTIFY_SOURCE (declared here because
// the module is built without it, so the headers do not declare them).
extern "C" {
ssize_t __read_chk(int fd, void *buf, size_t nbytes, size_t buflen);
ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags);
ssize_t __recvfrom_chk(int fd, void *buf, size_t len, size_t buflen, int flags, sockaddr *from,
                       socklen_t *fromlen);
int __poll_chk(pollfd *fds, nfds_t nfds, int timeout, size_t fdslen);
int __ppoll_chk(pollfd *fds, nfds_t nfds, const timespec *timeout, const sigset_t *ss,
                size_t fdslen);
[[noreturn]] void __chk_fail(void);
}

namespace rstream::shim {

// ---- Real functions -------------------------------------------------------------------------

// Looks name up with dlsym(RTLD_NEXT) (fallback: a second name, for fcntl64/sendfile64 on a
// libc without them) and stores it in slot. Aborts with a message when libc lacks both.
void *resolveReal(std::atomic<void *> &slot, const char *name, const char *fallback);

#define RS_REAL_LIST(X)                                                                            \
    X(socket, nullptr)                                                                             \
    X(fopen, nullptr)                                                                              \
    X(fopen64, nullptr)                                                                            \
    X(socketpair, nullptr)                                                                         \
    X(bind, nullptr)                                                                               \
    X(listen, nullptr)                                                                             \
    X(accept, nullptr)                                                                             \
    X(accept4, nullptr)                                                                            \
    X(connect, nullptr)                                                                            \
    X(send, nullptr)                                                                               \
    X(sendto, nullptr)                                                                             \
    X(sendmsg, nullptr)                                                                            \
    X(sendmmsg, nullptr)                                                                           \
    X(recv, nullptr)                                                                               \
    X(recvfrom, nullptr)                                                                           \
    X(recvmsg, nullptr)                                                                            \
    X(recvmmsg, nullptr)                                                                           \
    X(read, nullptr)                                                                               \
    X(readv, nullptr)                                                                              \
    X(write, nullptr)                                                                              \
    X(writev, nullptr)                                                                             \
    X(sendfile, nullptr)                                                                           \
    X(sendfile64, "sendfile")                                                                      \
    X(close, nullptr)                                                                              \
    X(shutdown, nullptr)                                                                           \
    X(dup, nullptr)                                                                                \
    X(dup2, nullptr)                                                                               \
    X(dup3, nullptr)                                                                               \
    X(fcntl, nullptr)                                                                              \
    X(fcntl64, "fcntl")                                                                            \
    X(ioctl, nullptr)                                                                              \
    X(getsockopt, nullptr)                                                                         \
    X(setsockopt, nullptr)                                                                         \
    X(getsockname, nullptr)                                                                        \
    X(getpeername, nullptr)                                                                        \
    X(poll, nullptr)                                                                               \
    X(ppoll, nullptr)                                                                              \
    X(select, nullptr)                                                                             \
    X(pselect, nullptr)                                                                            \
    X(epoll_create, nullptr)                                                                       \
    X(epoll_create1, nullptr)                                                                      \
    X(epoll_ctl, nullptr)                                                                          \
    X(epoll_wait, nullptr)                                                                         \
    X(epoll_pwait, nullptr)                                                                        \
    X(eventfd, nullptr)                                                                            \
    X(pipe, nullptr)                                                                               \
    X(pipe2, nullptr)                                                                              \
    X(fork, nullptr)                                                                               \
    X(daemon, nullptr)                                                                             \
    X(sigaction, nullptr)                                                                          \
    X(signal, nullptr)                                                                             \
    X(sysv_signal, nullptr)                                                                        \
    X(sigset, nullptr)                                                                             \
    X(siginterrupt, nullptr)                                                                       \
    X(__read_chk, nullptr)                                                                         \
    X(__recv_chk, nullptr)                                                                         \
    X(__recvfrom_chk, nullptr)                                                                     \
    X(__poll_chk, nullptr)                                                                         \
    X(__ppoll_chk, nullptr)

// sigset() and siginterrupt() are deprecated, and still the program's to call.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
// The real functions, one slot each (the table the Shim object owns). The lookups are lazy and
// lock-free: calls arrive before our constructor runs (from other libraries' constructors), and
// two threads racing to resolve store the same pointer. Constant-initialized: all null.
class RealFunctions
{
public:
#define RS_REAL_GET(name, fallback)                                                                \
    decltype(&::name) name()                                                                       \
    {                                                                                              \
        void *p = name##_.load(std::memory_order_acquire);                                         \
        if (__builtin_expect(p == nullptr, 0))                                                     \
            p = resolveReal(name##_, #name, fallback);                                             \
        return reinterpret_cast<decltype(&::name)>(p);                                             \
    }
    RS_REAL_LIST(RS_REAL_GET)
#undef RS_REAL_GET

    // Resolves every real function now (from the constructor), so that later calls, maybe from
    // a signal handler, never run dlsym, and binds the kernel seam (kernel.h) to them: from then
    // on the layers below reach the kernel without passing through the interposers.
    void resolveAll();

private:
#define RS_REAL_SLOT(name, fallback) std::atomic<void *> name##_{nullptr};
    RS_REAL_LIST(RS_REAL_SLOT)
#undef RS_REAL_SLOT
};
#pragma GCC diagnostic pop

// ---- Sockets --------------------------------------------------------------------------------

// An epoll instance of the program's, and whether an engine socket was ever added to it: until
// then epoll_ctl and epoll_wait go straight to the kernel.
struct ShimEpoll : EpollSet
{
    using EpollSet::EpollSet;
    std::atomic<bool> engine{false};
};

const ShimConfig &shimConfig();
int spinUs();
// Whether a mode carries data through the engine (else the kernel fd answers).
inline bool dataMode(const HybridSocket &s)
{
    const HybridSocket::Mode m = s.mode();
    return m == HybridSocket::Mode::Fabric || m == HybridSocket::Mode::Inherited ||
           (m == HybridSocket::Mode::Kernel && s.upgradePending());
}
// The pollable behind fd for the poller (SocketResolver): the shim's table, through shim().
std::shared_ptr<Pollable> resolvePollable(int fd);

// ---- Internal calls -------------------------------------------------------------------------

// Depth of calls into src/ on this thread: sockets and polls the engine and libfabric make from
// inside them go straight to the kernel. initial-exec: no __tls_get_addr (which may allocate)
// on the fast path of every interposer.
extern constinit thread_local int tDepth __attribute__((tls_model("initial-exec")));

class EngineCall
{
public:
    EngineCall() { ++tDepth; }
    ~EngineCall() { --tDepth; }
    EngineCall(const EngineCall &) = delete;
    EngineCall &operator=(const EngineCall &) = delete;
};

// Whether code at this return address belongs to the shim, libfabric, its providers or the
// verbs libraries (threads they start never pass through an EngineCall).
bool internalAddress(const void *ra);
inline bool internalCall(const void *ra)
{
    return tDepth > 0 || internalAddress(ra);
}

// Moves an fd an internal caller created above the range the application uses (see
// internal.cpp for how RLIMIT_NOFILE is handled); returns the fd to use (highfd.cpp).
int moveHigh(int fd);
// Puts sigtrack's trampoline in front of the program's handlers (signals.cpp), at load.
void activateSignalTracking();
void setHighFdBase(int base);
void initFdLimit();

// ---- The C boundary -------------------------------------------------------------------------

void noteInternalError();

// The C boundary (src/base/boundary.h), reporting internal errors in the shim's log.
template <class F>
auto boundary(F &&f) -> decltype(f())
{
    return cBoundary(std::forward<F>(f), noteInternalError);
}

// Cancellation off for engine calls made from interposers glibc declares noexcept: a forced
// unwind out of them would call std::terminate.
class NoCancel
{
public:
    NoCancel() { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old_); }
    ~NoCancel() { pthread_setcancelstate(old_, nullptr); }
    NoCancel(const NoCancel &) = delete;
    NoCancel &operator=(const NoCancel &) = delete;

private:
    int old_ = PTHREAD_CANCEL_ENABLE;
};

} // namespace rstream::shim
