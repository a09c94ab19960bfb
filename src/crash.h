// SPDX-License-Identifier: MIT
// Crash reports: a symbolised backtrace in the log on SIGSEGV/SIGBUS/SIGABRT/SIGFPE/SIGILL.
#pragma once

namespace rstream {

// Installs the crash handler for the process (once; call from a load-time constructor on the
// main thread, which also gets an alternate signal stack so that stack overflows are reported).
// Gives fabric libraries' handlers the default action back first (resetFabricSignalHandlers),
// then does nothing more when RSTREAM_BACKTRACE=0. The handler writes the faulting thread's
// backtrace to the log, then chains to the handler installed before it or takes the default
// action, so the process still dies of the signal. A handler the program installs later
// replaces it.
void installCrashHandler();

// Gives SIGINT, SIGTERM and the crash signals their default action back where a fabric library
// took them for itself when it loaded, before the program ran (libinfinipath, pulled in by
// libfabric's psm provider, calls exit() from its handler: exit handlers and libfabric's
// destructor then run on top of the interrupted code, which deadlocks when that code holds a
// libfabric or malloc lock and lets other threads run on into what is torn down). Also sets
// IPATH_NO_BACKTRACE=1 so that exec'd children keep the dispositions they inherit, SIG_IGN
// included. Called at load time by librstream.so and by installCrashHandler().
void resetFabricSignalHandlers();

} // namespace rstream
