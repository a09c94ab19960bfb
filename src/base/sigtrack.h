// SPDX-License-Identifier: MIT
// Signal tracking: a blocking call learns that a handler ran on its thread without holding
// signals off (two system calls a sleep), through a trampoline in front of the program's handlers.
#pragma once

#include <atomic>
#include <cstdint>
#include <signal.h>

namespace rstream::sigtrack {

using SigactionFn = int (*)(int, const struct sigaction *, struct sigaction *);

// Whether the program's handlers run through the trampoline (the shim, RSTREAM_SIGNAL_TRACK).
bool active();

struct ThreadState;
using ThreadStateFn = ThreadState &(*)();

// Puts the trampoline in front of every handler in place, with real (libc's sigaction) to reach
// the kernel from now on; the handlers the program sets later go through setAction. Once.
// state gives the calling thread's ThreadState, which the trampoline reads in a handler: it
// must be in static TLS (initial-exec, the shim's), as a handler must not be the first to touch
// a lazily allocated TLS block. It is the caller's, not this library's: initial-exec TLS here
// would mark librstream.so STATIC_TLS, and a program could no longer dlopen it (Python's ctypes
// found no room). Null: TLS of this library's own, for executables that link it statically.
void activate(SigactionFn real, ThreadStateFn state = nullptr);
// Tests only: the program's handlers go back in place, tracking ends.
void deactivate();

// Whether sig goes through the trampoline when it has a handler: not the faults (delivered to
// the instruction that caused them, never to a sleeping call), SIGKILL, SIGSTOP nor glibc's own.
bool tracked(int sig);

// sigaction as the program sees it: the handler it set, never the trampoline. -1 with errno
// set, as sigaction.
int setAction(int sig, const struct sigaction *act, struct sigaction *old);

// After a call that set sig's handler behind setAction's back (glibc's signal(), sigset(),
// siginterrupt() reach the kernel without its sigaction): the trampoline goes in front of the
// handler the kernel has now, or takes its new flags.
void resync(int sig);

// What the trampoline keeps of one thread: how many handlers ran on it, and the fd its next
// sleep waits on (-1: not about to sleep), which a handler writes so that the sleep ends.
struct ThreadState
{
    std::atomic<uint64_t> ran{0};
    std::atomic<int> wakeFd{-1};
};
// This thread's, while tracking is active.
ThreadState &thread();

} // namespace rstream::sigtrack
