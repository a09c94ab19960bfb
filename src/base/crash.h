// SPDX-License-Identifier: MIT
// Crash reports on SIGSEGV/SIGBUS/SIGABRT/SIGFPE/SIGILL, and RS_CHECK for internal invariants.
#pragma once

#include <csignal>

namespace rstream {

// Installs the crash handler for the process (once; call from a load-time constructor on the
// main thread, which also gets an alternate signal stack so that stack overflows are reported).
// Gives fabric libraries' handlers the default action back first (resetFabricSignalHandlers),
// then does nothing more when RSTREAM_BACKTRACE=0. The handler writes the faulting thread's
// backtrace to the log, then chains to the handler installed before it or takes the default
// action, so the process still dies of the signal. A handler the program installs later
// replaces it.
void installCrashHandler();

// Writes the calling thread's backtrace to the log, one line per frame ("#n 0xip function+off
// (object+offset)"), starting at the caller (skip: that many of its callers less). Not for
// signal handlers.
void logBacktrace(int skip = 0);

// An internal invariant does not hold: logs what and where at error level with a backtrace
// (the first 16 times; none with RSTREAM_BACKTRACE=0) and returns false. See RS_CHECK.
bool invariantFailed(const char *what, const char *file, int line);
// Whether a signal's handler is one that a fabric library installed for itself when it loaded
// (libinfinipath, pulled in by libfabric's psm provider, or libpsm or libfabric itself): not
// the program's. libinfinipath's calls exit() from the handler: exit handlers and libfabric's
// destructor then run on top of the interrupted code, which deadlocks when that code holds a
// libfabric or malloc lock and lets other threads run on into what is torn down.
bool isFabricLibraryHandler(const struct sigaction &sa);
// The signals such libraries take.
inline constexpr int kFabricLibrarySignals[] = {SIGINT,  SIGTERM, SIGSEGV, SIGBUS,
                                                SIGABRT, SIGFPE,  SIGILL};
// Sets IPATH_NO_BACKTRACE=1 (unless the program set it), so that libinfinipath takes no signals
// when libfabric is loaded (fiload.cpp), in this process or in exec'd children. Where a program
// linked libfabric itself, so that its libraries were loaded before it ran, gives SIGINT,
// SIGTERM and the crash signals whose handlers they took their default action back. Called at
// load time by librstream.so and by installCrashHandler().
void resetFabricSignalHandlers();

} // namespace rstream

// RS_CHECK(cond): true when cond holds; otherwise the failure is logged with a backtrace and it
// is false, so that the caller fails the affected connection (or operation) instead of taking
// the program down:  if (!RS_CHECK(done <= posted)) { failLocked(...); return; }
#define RS_CHECK(cond)                                                                             \
    (__builtin_expect(static_cast<bool>(cond), 1) ||                                               \
     ::rstream::invariantFailed(#cond, __FILE__, __LINE__))
