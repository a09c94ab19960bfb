// SPDX-License-Identifier: MIT
// Load-time setup, fork/vfork/daemon and the statistics file written at exit.

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

#include "configvars.h"
#include "crash.h"
#include "progress.h"
#include "shim_object.h"
#include "upgrade.h"

namespace rstream::shim {

namespace {

// For a debugger: `call rstreamDebugDump()` prints every shim socket's state to stderr.
extern "C" __attribute__((used)) void rstreamDebugDump()
{
    EngineCall ec;
    shim().forEachSocket([](HybridSocket &s) {
        std::string line = s.debugState() + "\n";
        ssize_t r = shim().real.write()(2, line.data(), line.size());
        (void)r;
    });
}

// ---- fork -------------------------------------------------------------------------------------

void inChild()
{
    logAfterFork(); // before this handler logs: a %p log file is the child's own
    try {
        EngineCall ec;
        // The fabric connections belong to the parent; the child's copies of the fds only
        // report EIO and never tear the parent's connections down. Kernel connections still
        // to be upgraded come along: the child upgrades them at its first I/O, on an engine of
        // its own (the engine and the upgrade listeners start over in the child).
        HybridSocket::noteFork();
        shim().forEachSocket([](HybridSocket &s) { s.markInherited(); });
        UpgradeListener::forgetAfterFork();
    } catch (...) {
        noteInternalError();
    }
    if (engineUsed())
        RS_LOG(Debug, "preload: fork child of a process that used the fabric: the parent's "
                      "fabric connections are not the child's (EIO); new ones are");
}

void beforeFork()
{
    try {
        EngineCall ec;
        shim().forEachSocket([](HybridSocket &s) { s.beforeFork(); });
    } catch (...) {
        noteInternalError();
    }
}

void inParent()
{
    try {
        EngineCall ec;
        // A listener now shared with a child (prefork and fork-per-connection servers) defers
        // its fabric connection requests: the peers connect over kernel TCP and upgrade in
        // whichever process serves the connection.
        HybridSocket::noteFork();
        shim().forEachSocket([](HybridSocket &s) { s.onForkParent(); });
    } catch (...) {
        noteInternalError();
    }
}

// ---- Statistics -------------------------------------------------------------------------------

// RSTREAM_STATS as it was at load (the program may change its environment later).
char gStatsPath[4096];

std::string statsPath()
{
    std::string p;
    for (const char *c = gStatsPath; *c; c++) {
        if (c[0] == '%' && c[1] == 'p') {
            p += std::to_string(getpid());
            c++;
        } else {
            p += *c;
        }
    }
    return p;
}

void writeStats()
{
    // Once per process: before the progress thread's exit drain, and again as an exit handler
    // of its own (which runs after it, or alone when the thread never started). A fork child
    // has a pid of its own and writes its own file.
    static std::atomic<pid_t> writtenBy{0};
    const pid_t self = getpid();
    if (writtenBy.exchange(self) == self)
        return;
    try {
        EngineCall ec;
        // Kernel connections established since their connect returned count now.
        shim().forEachSocket([](HybridSocket &s) { s.noteExit(); });
        const std::string json = shimStatsJson() + "\n";
        const std::string path = statsPath();
        int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
            RS_LOG(Warn, "preload: cannot write statistics to %s: %s", path.c_str(),
                   strerror(errno));
            return;
        }
        size_t done = 0;
        while (done < json.size()) {
            ssize_t w = shim().real.write()(fd, json.data() + done, json.size() - done);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                break;
            done += static_cast<size_t>(w);
        }
        shim().real.close()(fd);
    } catch (...) {
        noteInternalError();
    }
}

void exportAtExitHandler()
{
    try {
        EngineCall ec;
        exportAtExit();
    } catch (...) {
        noteInternalError();
    }
}

// ---- Load -------------------------------------------------------------------------------------

__attribute__((constructor)) void shimInit()
{
    // Before libfabric's verbs provider initializes (it does so on first use, after this): the
    // verbs memory registrations stay valid across the program's forks.
    setenv("RDMAV_FORK_SAFE", "1", 0);
    shim().real.resolveAll();
    activateSignalTracking(); // before the program sets a handler (RSTREAM_SIGNAL_TRACK)
    initFdLimit();
    const char *stats = config::getString("RSTREAM_STATS");
    if (stats && strlen(stats) < sizeof(gStatsPath)) {
        strcpy(gStatsPath, stats);
        // Inherited by fork and daemon() children, which write their own file (%p).
        atexit(writeStats);
        ProgressThread::setBeforeExitDrain(writeStats);
    }
    pthread_atfork(beforeFork, inParent, inChild);
    try {
        EngineCall ec;
        shim().adoptInheritedSockets();
    } catch (...) {
        noteInternalError();
    }
    installCrashHandler(); // RSTREAM_BACKTRACE=0 turns it off
    // The live export (rstream-stat) is made on the first connection and removed at exit; one
    // this pid has already is the program's that ran before execve.
    exportAtLoad();
    atexit(exportAtExitHandler);
    RS_LOG(Debug, "preload: loaded into %s (statistics %s)", program_invocation_short_name,
           gStatsPath[0] ? gStatsPath : "off");
}

} // namespace

pid_t Shim::fork()
{
    return real.fork()(); // the atfork handlers above do the work
}

// A vfork child would run the shim's code on the parent's stack and in its memory: a real fork
// instead, which is what vfork is allowed to be.
pid_t Shim::vfork()
{
    return real.fork()();
}

// glibc's daemon forks through fork's atfork handlers; the child carries on as the daemon.
int Shim::daemon(int nochdir, int noclose)
{
    return real.daemon()(nochdir, noclose);
}

} // namespace rstream::shim
