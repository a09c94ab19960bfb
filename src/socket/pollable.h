// SPDX-License-Identifier: MIT
// What poll, select and epoll need from a socket the engine serves.
#pragma once

#include <cerrno>
#include <cstdint>
#include <memory>
#include <poll.h>
#include <vector>

namespace rstream {

class Connection;

// A socket's prepareWait() may ask the poller to look again by a time (monotonic ns) even if no
// fd turns ready: a step of its own that is due then (the shim's switch waits a while before it
// loads libfabric). Per thread; the poller takes the earliest.
void pollWakeBy(int64_t ns);
// The earliest time asked for since the last call (0: none), and forgets it.
int64_t takePollWakeBy();

class Pollable
{
public:
    virtual ~Pollable() = default;
    // Readiness as poll(2) reports it, making progress as it asks; only the bits in events
    // plus POLLERR/POLLHUP.
    virtual int pollEvents(int events) = 0;
    // Appends the fds to sleep on, armed so that sleeping is safe: 0, or -EAGAIN when
    // something is already pending.
    virtual int prepareWait(std::vector<pollfd> *fds, int events) = 0;
    // Registers a wake-up eventfd with the connections whose progress by other threads must
    // wake the caller (see Connection::addWaiter), appending them to registered so that the
    // caller unregisters there.
    virtual void addWaiter(int eventFd, std::vector<std::shared_ptr<Connection>> *registered) = 0;
    // Moves whenever readiness for events (POLLIN/POLLOUT) may have newly arisen; EPOLLET
    // reports again only when it moved.
    virtual uint64_t generation(int events) = 0;
    // The connection whose armed wait fd a poller checks before it looks (see
    // Connection::hintFd), or null: then every look makes progress.
    virtual std::shared_ptr<Connection> hintConnection() { return nullptr; }
    // The same for a poll or select pass, which only wants a connection that may have a hint
    // fd (a same-host link never has one: its looks read shared memory).
    virtual std::shared_ptr<Connection> passHintConnection() { return hintConnection(); }
    // Other fds a poller checks in its one system call of a hint pass (a listener's: its queue,
    // its fabric requests, a shim listener's kernel fd), appended to fds. lookResults() then
    // gets their revents, in that order, and pollEvents() in the same pass answers from them
    // instead of a system call of its own for each. Returns how many were appended.
    virtual int lookFds(std::vector<pollfd> *) { return 0; }
    virtual void lookResults(const pollfd *) {}
    // Whether the one fd this socket's lookFds() gave in the current pass is an epoll fd that
    // stands for all of its fds (readable when any of them is): a pass with nothing else to
    // check asks it with epoll_wait, a third of a ppoll's cost (the shim's listeners).
    virtual bool lookIsEpoll() { return false; }
    // Whether a pass that returns anyway (another of its members is ready) may leave out that
    // look epoll: the socket's last look found nothing this recently. The pass then hands
    // lookResults() null: as quiet as before. A listener's next connection waits a little
    // longer for its accept beside busy members; a server reading 64 B a select() paid an
    // epoll_wait at each of them for it (two fifths of its CPU).
    virtual bool lookCanWait(int64_t /*nowNs*/) { return false; }
    // The look fds one by one, none standing for others: for a caller that answers them from
    // wake-ups of those very fds (an epoll set's listener woken by its parked fds).
    virtual int lookFdsEach(std::vector<pollfd> *fds) { return lookFds(fds); }
    // After a sleep (in a hint pass) on the fds prepareWait() gave: their revents, n of them.
    // A socket may answer its look in the next pass from them (HybridSocket).
    virtual void sleepResults(const pollfd *, int) {}
    // For an epoll set that parks a member without a connection (a listener): arms it and
    // appends the fds that turn readable when it may have become ready; 0, -EAGAIN when
    // something is pending already, -ENOTSUP when it cannot be parked so.
    virtual int parkFds(std::vector<pollfd> *) { return -ENOTSUP; }
    // A socket that ended up on kernel TCP (a fallback) belongs in the kernel's poll and epoll:
    // its kernel fd, or -1 while the engine serves it.
    virtual int kernelFd() { return -1; }
    // After a look asked for POLLOUT found no room: whether a poller should spin for it (the
    // peer reads what is queued within a wake-up's time, RoomRate) rather than sleep at once.
    virtual bool roomSoon() { return true; }
};

} // namespace rstream
