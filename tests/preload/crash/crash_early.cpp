// SPDX-License-Identifier: MIT
// A library whose constructor installs a SIGSEGV handler before the preloaded shim's constructor
// runs (libraries a program links with initialize first): the shim must chain to it.
// CRASH_TEST_EARLY=exit: the handler exits 42; =return: it restores the default and returns, so
// the fault recurs and kills.

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

extern "C" {
void rstream_test_early_lib();
void rstream_test_early_lib() {}
}

namespace {

bool gReturn;

void earlyHandler(int sig)
{
    const char msg[] = "early handler ran\n";
    ssize_t w = write(STDOUT_FILENO, msg, sizeof(msg) - 1);
    (void)w;
    if (!gReturn)
        _exit(42);
    signal(sig, SIG_DFL);
}

__attribute__((constructor)) void installEarly()
{
    const char *mode = getenv("CRASH_TEST_EARLY");
    if (!mode)
        return;
    gReturn = !strcmp(mode, "return");
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = earlyHandler;
    sigaction(SIGSEGV, &sa, nullptr);
}

} // namespace
