// SPDX-License-Identifier: MIT
// What poll, select and epoll need from a socket the engine serves.
#pragma once

#include <cstdint>
#include <memory>
#include <poll.h>

namespace rstream {

class Connection;

class Pollable
{
public:
    virtual ~Pollable() = default;
    // Readiness as poll(2) reports it, making progress as it asks; only the bits in events
    // plus POLLERR/POLLHUP.
    virtual int pollEvents(int events) = 0;
    // The fds to sleep on (at most max), armed so that sleeping is safe: returns how many, or
    // -EAGAIN when something is already pending.
    virtual int prepareWait(pollfd *fds, int max, int events) = 0;
    // Registers a wake-up eventfd with the connection that progress by other threads writes
    // (see Connection::addWaiter); returns that connection so the caller unregisters there.
    virtual std::shared_ptr<Connection> addWaiter(int eventFd) = 0;
    // Moves whenever readiness for events (POLLIN/POLLOUT) may have newly arisen; EPOLLET
    // reports again only when it moved.
    virtual uint64_t generation(int events) = 0;
    // A socket that ended up on kernel TCP (a fallback) belongs in the kernel's poll and epoll:
    // its kernel fd, or -1 while the engine serves it.
    virtual int kernelFd() { return -1; }
};

} // namespace rstream
