// SPDX-License-Identifier: MIT
// Internal descriptors above the range the application uses (see initFdLimit in internal.cpp).

#include <atomic>
#include <cerrno>
#include <fcntl.h>

#include "kernel.h"
#include "shim.h"

namespace rstream::shim {

namespace {

// Internal fds go at or above this number; 0 while they cannot (before the constructor ran, or
// when the limit leaves no room above it).
std::atomic<int> gHighBase{0};

} // namespace

void setHighFdBase(int base)
{
    gHighBase.store(base, std::memory_order_relaxed);
}

int moveHigh(int fd)
{
    const int base = gHighBase.load(std::memory_order_relaxed);
    if (fd < 0 || base == 0 || fd >= base)
        return fd;
    const int saved = errno;
    const int high = sys::fcntl(fd, F_DUPFD_CLOEXEC, base);
    if (high < 0) {
        errno = saved; // no room (the program lowered its limit): stay where we are
        return fd;
    }
    sys::close(fd);
    errno = saved;
    return high;
}

} // namespace rstream::shim
