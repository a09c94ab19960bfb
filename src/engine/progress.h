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
//
// It also stands in for what a kernel does for idle sockets: every connected connection's wait
// fd sits in one epoll set, so words that arrive while the application makes no call (keepalive
// probes, a peer's DISCONNECT) are answered; that set is looked at no more than every
// kPassiveIntervalMs, so busy connections cost at most a few wake-ups a second. And it keeps
// one timer list (keepalive, connection deadlines), checked once per loop and slept on until
// the nearest deadline.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

namespace rstream {

// What the progress thread asks of a connection; Connection implements it. The thread knows its
// clients only through this, and destroys the closing ones it adopted through it.
class ProgressClient
{
public:
    enum
    {
        kProgressDone = 0,
        kProgressMore = 1,
        kProgressBusy = 2,
        // Work remains that only the peer can move (data waiting for its credit, nothing in
        // flight): the thread sleeps on the client's wait fd, armed, instead of polling it.
        kProgressIdle = 3,
        // The application drives the client's progress now: the thread neither polls it nor
        // looks every millisecond, but asks again at *recheckNs.
        kProgressLater = 4
    };
    virtual ~ProgressClient() = default;
    // Makes progress if nobody else is: kProgressDone when no work remains that needs the
    // thread, kProgressMore while some does, kProgressIdle while it waits for the peer,
    // kProgressBusy when the application holds the client (look again within a millisecond),
    // kProgressLater when it drives the client's progress itself until *recheckNs.
    // closedDone: a closing client may be destroyed.
    virtual int backgroundProgress(bool *closedDone, int64_t *recheckNs) = 0;
    // Deadlines: the next one (0: none). *watch: the client now has background work.
    virtual int64_t timerTick(int64_t nowNs, bool *watch) = 0;
    // Its fd in the passive set is readable. false: it leaves the passive set.
    virtual bool passiveProgress(bool *watch) = 0;
    // A closing client has handed everything over (waited for at exit).
    virtual bool closeDelivered() const = 0;
    // The fd that becomes readable when the client has something to process.
    virtual int waitFd() const = 0;
};

// What the progress thread asks of a listening endpoint; Listener implements it.
class AcceptClient
{
public:
    virtual ~AcceptClient() = default;
    // Answers connection requests in the background. The fd to poll for more, or -1; lowers
    // *deadlineNs to when it must be called again even if that fd stays quiet.
    virtual int backgroundAccept(int64_t *deadlineNs) = 0;
};

class ProgressThread
{
public:
    static ProgressThread &instance();

    // The connection has work that needs progress without the application. Idempotent.
    // noneBeforeNs: the thread has nothing to do for it before then (0: it may at once); a
    // thread asleep until no later than that finds it at its own wake-up, without being woken.
    void watch(ProgressClient *conn, int64_t noneBeforeNs = 0);
    // Called from ~Connection: never touched again after this returns.
    void unwatch(ProgressClient *conn);
    // Takes ownership of a closing connection and destroys it once its data is delivered.
    void adopt(std::unique_ptr<ProgressClient> conn);
    // A listening endpoint whose connection requests are answered in the background.
    void watchListener(AcceptClient *listener);
    // Called from ~Listener: never touched again after this returns.
    void unwatchListener(AcceptClient *listener);
    // Waits up to timeoutMs for adopted connections to finish (used at exit).
    void drain(int timeoutMs);
    // Runs at exit just before that wait, once the thread has started: what must not wait
    // behind it (the shim's statistics). The wait can last seconds, and a program that has
    // given its signals their default actions back by then (Python does at exit) dies of the
    // next SIGTERM in it.
    static void setBeforeExitDrain(void (*fn)());

    // A connected connection: its wait fd joins the passive set. Takes no lock, so it may be
    // called with the connection's lock held from any thread, the progress thread included.
    void addPassive(ProgressClient *conn, int fd);
    // Calls conn->timerTick() at or after deadlineNs (CLOCK_MONOTONIC); an earlier deadline
    // replaces a later one. Takes only a leaf lock: callable from anywhere.
    void schedule(ProgressClient *conn, int64_t deadlineNs);
    // The same, but deadlineNs replaces whatever deadline conn had, a later one included; 0
    // drops its timer (a connection's connect deadline once it is connected).
    void reschedule(ProgressClient *conn, int64_t deadlineNs);
    // Called from ~Connection before its wait fd closes: no list, timer or event refers to conn
    // after this returns.
    void forget(ProgressClient *conn, int fd);

    // Timers fire up to this late, so that deadlines close together cost one wake-up.
    static constexpr int64_t kTimerSlackNs = 10 * 1000000;
    static constexpr int64_t kPassiveIntervalNs = 100 * 1000000;

private:
    ProgressThread();
    void run();
    void start();
    void queueTimer(ProgressClient *conn, int64_t deadlineNs, bool exact);
    void runTimersLocked(int64_t now);
    void runPassiveLocked();
    void afterFork();
    void mergePendingLocked();

    std::mutex mutex_;
    std::vector<ProgressClient *> watched_;
    std::mutex listenersMutex_; // guards listeners_ and their use by the thread
    struct WatchedListener
    {
        AcceptClient *client;
        int fd = -1;      // its fd, as its last backgroundAccept() gave it
        bool look = true; // backgroundAccept() at the next round (else fd is polled as it is)
    };
    std::vector<WatchedListener> listeners_;
    std::vector<std::unique_ptr<ProgressClient>> adopted_;
    // The deadline of each connection with a timer, and the same ordered by deadline: a wake-up
    // takes only the timers due (with 4,000 idle connections, walking them all at each one
    // cost an idle process 50 ms of CPU a second).
    std::unordered_map<ProgressClient *, int64_t> timers_;
    std::set<std::pair<int64_t, ProgressClient *>> byDeadline_;
    int64_t nextTimerNs_ = INT64_MAX;
    std::mutex pendingMutex_; // a leaf lock: schedule() may be called from anywhere
    struct PendingTimer
    {
        ProgressClient *conn;
        int64_t deadlineNs;
        bool exact; // reschedule(): replaces a later deadline too, 0 drops the timer
    };
    std::vector<PendingTimer> pending_;
    int64_t pendingMinNs_ = INT64_MAX;
    int64_t passiveNextNs_ = 0; // the passive set is polled again from then on
    int eventFd_ = -1;
    int epollFd_ = -1; // the passive set
    std::atomic<bool> started_{false};
    bool asleep_ = false;              // the thread sleeps until signalled (nothing was watched)
    int64_t sleepUntilNs_ = INT64_MAX; // and when it wakes by itself (asleep_: INT64_MAX none)
};

} // namespace rstream
