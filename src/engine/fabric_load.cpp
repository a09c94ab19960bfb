// SPDX-License-Identifier: MIT
// Loading libfabric on a thread of its own, for callers that must not wait for it.
//
// Loading libfabric and setting up its providers takes ~0.3 s, which a nonblocking connect must
// not spend on the caller's thread (it would freeze an event loop): the first one starts the load
// on a thread of its own and its socket waits, tentative, for it. Pollers of such sockets sleep
// on an eventfd that the thread makes readable, for good, when it is done: they look again, and
// the socket starts its fabric attempt then. Process-wide and never freed: the thread touches
// nothing else, so closing a socket meanwhile is safe.

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <poll.h>
#include <sys/eventfd.h>
#include <thread>

#include "fabric.h"
#include "kernel.h"
#include "log.h"

namespace rstream {

namespace {

class BackgroundLoad
{
public:
    static BackgroundLoad &instance()
    {
        static auto *l = new BackgroundLoad();
        return *l;
    }
    bool ready() const { return ready_.load(std::memory_order_acquire); }
    int fd() const { return fd_.load(std::memory_order_acquire); }
    // Starts the load once; false when it could not be started (then the caller loads).
    bool start(const Settings &settings)
    {
        std::call_once(once_, [this, &settings] {
            const int fd = sys::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
            if (fd < 0) {
                RS_LOG(Warn, "fabric: no eventfd to load libfabric in the background (%s)",
                       strerror(-fd));
                return;
            }
            // A program that exits while the thread loads would run libfabric's destructors
            // under it (the exit waits for the dlopen, then finalizes what the thread is still
            // setting up: a crash). So the exit waits for the load first, which it takes at most.
            atexit([] { waitFabricLoad(); });
            // The thread must not take the program's signals.
            sigset_t all, old;
            sigfillset(&all);
            pthread_sigmask(SIG_SETMASK, &all, &old);
            try {
                std::thread([this, fd, settings] {
                    loadFabric(settings);
                    ready_.store(true, std::memory_order_release);
                    const uint64_t one = 1;
                    if (sys::write(fd, &one, sizeof(one)) < 0)
                        RS_LOG(Warn, "fabric: cannot signal the end of libfabric's load");
                }).detach();
                fd_.store(fd, std::memory_order_release);
            } catch (...) {
                RS_LOG(Warn, "fabric: no thread to load libfabric in the background");
                sys::close(fd);
            }
            pthread_sigmask(SIG_SETMASK, &old, nullptr);
        });
        return fd() >= 0;
    }

private:
    std::once_flag once_;
    std::atomic<bool> ready_{false};
    std::atomic<int> fd_{-1};
};

} // namespace

bool loadFabricInBackground(const Settings &settings)
{
    auto &l = BackgroundLoad::instance();
    if (l.ready())
        return false;
    // Loaded already by a listener or a blocking call.
    if (l.fd() < 0 && fabricLoadDone())
        return false;
    return l.start(settings);
}

bool fabricLoadReady()
{
    return BackgroundLoad::instance().ready();
}

int fabricLoadFd()
{
    return BackgroundLoad::instance().fd();
}

bool fabricReady()
{
    auto &l = BackgroundLoad::instance();
    return l.ready() || (l.fd() < 0 && fabricLoadDone());
}

void waitFabricLoad()
{
    auto &l = BackgroundLoad::instance();
    while (!l.ready()) {
        pollfd p{l.fd(), POLLIN, 0};
        if (p.fd < 0)
            return; // no background load: nothing to wait for
        const timespec tick{0, 100 * 1000000L};
        sys::ppoll(&p, 1, &tick, nullptr);
    }
}

} // namespace rstream
