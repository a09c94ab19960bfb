// SPDX-License-Identifier: MIT
// The progress thread: finishes what the application left for the engine to do.
//
// Progress is manual: completions are reaped and credits returned inside the application's
// send, recv, peek and wait calls. But a send reports bytes as accepted once they are copied into
// the send ring, and those bytes must reach the peer even if the application never calls again
// (it sleeps, or blocks somewhere we do not see). The tcp provider also needs progress calls to
// push a write that did not fit into the socket at once. So one light thread per process watches
// only the connections that still have such work (unsent or in-flight data, owed credits, a
// pending close) and makes progress on them when the application does not. It idles on an
// eventfd when nothing is watched and never takes a connection's lock while the application
// holds it.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

namespace rstream {

class Connection;

class ProgressThread
{
public:
    static ProgressThread &instance();

    // The connection has work that needs progress without the application. Idempotent.
    void watch(Connection *conn);
    // Called from ~Connection: never touched again after this returns.
    void unwatch(Connection *conn);
    // Takes ownership of a closing connection and destroys it once its data is delivered.
    void adopt(std::unique_ptr<Connection> conn);
    // Waits up to timeoutMs for adopted connections to finish (used at exit).
    void drain(int timeoutMs);

private:
    ProgressThread();
    void run();
    void start();

    std::mutex mutex_;
    std::vector<Connection *> watched_;
    std::vector<std::unique_ptr<Connection>> adopted_;
    int eventFd_ = -1;
    bool started_ = false;
    bool asleep_ = false; // the thread sleeps until signalled (nothing was watched)
};

} // namespace rstream
