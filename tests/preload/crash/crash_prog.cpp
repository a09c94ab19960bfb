// SPDX-License-Identifier: MIT
// Crashes on purpose, as the mode argument says, for the shim's crash report tests.
// C functions (extern "C") so that the backtrace shows their plain names.

#include <arpa/inet.h>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

extern "C" {

void rstream_test_crash_here();
void rstream_test_abort_here();
int rstream_test_divide_here(int x);
int rstream_test_recurse_here(int depth);
#ifdef CRASH_TEST_EARLY_LIB
void rstream_test_early_lib(); // in libcrash_early: a use, so that the program links with it
#endif

// Through a volatile pointer, so that the compiler cannot see the null dereference.
int *volatile gNull = nullptr;
volatile int gZero = 0;
volatile int gNever = -1; // a depth never reached: ends the recursion for the compiler only

__attribute__((noinline)) void rstream_test_crash_here()
{
    *gNull = 1;
}

__attribute__((noinline)) void rstream_test_abort_here()
{
    abort();
}

__attribute__((noinline)) int rstream_test_divide_here(int x)
{
    return x / gZero;
}

// Each frame keeps a buffer alive, so the recursion exhausts the stack quickly and is no loop.
__attribute__((noinline)) int rstream_test_recurse_here(int depth)
{
    volatile char pad[1024];
    pad[0] = static_cast<char>(depth);
    if (depth == gNever)
        return 0;
    return rstream_test_recurse_here(depth + 1) + pad[0];
}

} // extern "C"

namespace {

void say(const char *s)
{
    ssize_t w = write(STDOUT_FILENO, s, strlen(s));
    (void)w;
}

void programHandler(int)
{
    say("program handler ran\n");
    _exit(42);
}

void *crashThread(void *)
{
    printf("tid %ld\n", static_cast<long>(syscall(SYS_gettid)));
    fflush(stdout);
    rstream_test_crash_here();
    return nullptr;
}

} // namespace

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "segv";
#ifdef CRASH_TEST_EARLY_LIB
    rstream_test_early_lib();
#endif
    if (!strcmp(mode, "segv")) {
        rstream_test_crash_here();
    } else if (!strcmp(mode, "abort")) {
        rstream_test_abort_here();
    } else if (!strcmp(mode, "fpe")) {
        printf("%d\n", rstream_test_divide_here(1));
    } else if (!strcmp(mode, "overflow")) {
        printf("%d\n", rstream_test_recurse_here(0));
    } else if (!strcmp(mode, "handler")) {
        // Installed after the shim loaded: replaces the shim's handler.
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = programHandler;
        sigaction(SIGSEGV, &sa, nullptr);
        rstream_test_crash_here();
    } else if (!strcmp(mode, "socket")) {
        // A listening socket first: the shim's engine starts (and logs) before the crash.
        int s = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a;
        memset(&a, 0, sizeof(a));
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (s < 0 || bind(s, reinterpret_cast<sockaddr *>(&a), sizeof(a)) < 0 || listen(s, 4) < 0)
            perror("listen");
        rstream_test_crash_here();
    } else if (!strcmp(mode, "thread")) {
        pthread_t t;
        pthread_create(&t, nullptr, crashThread, nullptr);
        pthread_join(t, nullptr);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    say("still alive\n");
    return 0;
}
