// SPDX-License-Identifier: MIT
// Crash reports: a symbolised backtrace in the log on SIGSEGV/SIGBUS/SIGABRT/SIGFPE/SIGILL.
#pragma once

namespace rstream {

// Installs the crash handler for the process (once; call from a load-time constructor on the
// main thread, which also gets an alternate signal stack so that stack overflows are reported).
// Does nothing when RSTREAM_BACKTRACE=0. The handler writes the faulting thread's backtrace to
// the log, then chains to the handler installed before it or takes the default action, so the
// process still dies of the signal. A handler the program installs later replaces it.
void installCrashHandler();

} // namespace rstream
