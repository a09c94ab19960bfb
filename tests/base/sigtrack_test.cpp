// SPDX-License-Identifier: MIT
// sigtrack: the program's handlers run through the trampoline, which counts them and wakes the
// sleep its thread is about to make, while sigaction still answers with the program's own.

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "sigtrack.h"

namespace rstream {
namespace {

std::atomic<int> gPlain{0}, gInfo{0}, gOther{0};
std::atomic<int> gInfoValue{0};
std::atomic<bool> gInfoContext{false};

void plainHandler(int)
{
    gPlain++;
}
void otherHandler(int)
{
    gOther++;
}
void infoHandler(int, siginfo_t *info, void *uc)
{
    gInfo++;
    gInfoValue = info ? info->si_value.sival_int : -1;
    gInfoContext = uc != nullptr;
}

// A disposition with an empty mask.
struct sigaction action(void (*handler)(int), int flags = 0)
{
    struct sigaction sa = {};
    sa.sa_handler = handler;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    return sa;
}
struct sigaction infoAction(void (*handler)(int, siginfo_t *, void *))
{
    struct sigaction sa = {};
    sa.sa_sigaction = handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    return sa;
}

void *kernelHandler(int sig)
{
    struct sigaction k;
    ::sigaction(sig, nullptr, &k); // libc's: what the kernel has
    return (k.sa_flags & SA_SIGINFO) ? reinterpret_cast<void *>(k.sa_sigaction)
                                     : reinterpret_cast<void *>(k.sa_handler);
}

class SigTrack : public ::testing::Test
{
protected:
    void SetUp() override
    {
        gPlain = gInfo = gOther = 0;
        for (int sig : {SIGUSR1, SIGUSR2, SIGALRM})
            ::signal(sig, SIG_DFL);
    }
    void TearDown() override
    {
        sigtrack::deactivate();
        for (int sig : {SIGUSR1, SIGUSR2, SIGALRM})
            ::signal(sig, SIG_DFL);
    }
    static uint64_t ran() { return sigtrack::thread().ran.load(); }
};

TEST_F(SigTrack, TracksOnlySignalsACallCanSleepThrough)
{
    for (int sig : {SIGUSR1, SIGINT, SIGTERM, SIGQUIT, SIGCHLD, SIGALRM, SIGPIPE, SIGRTMIN})
        EXPECT_TRUE(sigtrack::tracked(sig)) << sig;
    for (int sig :
         {0, SIGKILL, SIGSTOP, SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS, 32, NSIG})
        EXPECT_FALSE(sigtrack::tracked(sig)) << sig;
}

TEST_F(SigTrack, AHandlerSetBeforeIsTakenOverAndStillAnswered)
{
    struct sigaction sa = action(plainHandler, SA_RESTART);
    sigaddset(&sa.sa_mask, SIGUSR2);
    ASSERT_EQ(::sigaction(SIGUSR1, &sa, nullptr), 0);
    sigtrack::activate(::sigaction);
    ASSERT_TRUE(sigtrack::active());
    EXPECT_NE(kernelHandler(SIGUSR1), reinterpret_cast<void *>(plainHandler)) << "no trampoline";
    struct sigaction seen = {};
    ASSERT_EQ(sigtrack::setAction(SIGUSR1, nullptr, &seen), 0);
    EXPECT_EQ(seen.sa_handler, plainHandler);
    EXPECT_EQ(seen.sa_flags, SA_RESTART);
    EXPECT_TRUE(sigismember(&seen.sa_mask, SIGUSR2));
    const uint64_t before = ran();
    raise(SIGUSR1);
    EXPECT_EQ(gPlain.load(), 1);
    EXPECT_EQ(ran(), before + 1);
    // Back in place when tracking ends.
    sigtrack::deactivate();
    EXPECT_EQ(kernelHandler(SIGUSR1), reinterpret_cast<void *>(plainHandler));
}

TEST_F(SigTrack, SetActionAnswersThePreviousHandlerAndPassesSiginfo)
{
    sigtrack::activate(::sigaction);
    struct sigaction sa = infoAction(infoHandler);
    struct sigaction old = {};
    ASSERT_EQ(sigtrack::setAction(SIGUSR2, &sa, &old), 0);
    EXPECT_EQ(old.sa_handler, SIG_DFL);
    sigval v;
    v.sival_int = 4242;
    ASSERT_EQ(sigqueue(getpid(), SIGUSR2, v), 0); // to this (the only) thread of the test
    EXPECT_EQ(gInfo.load(), 1);
    EXPECT_EQ(gInfoValue.load(), 4242);
    EXPECT_TRUE(gInfoContext.load());
    // The same struct as act and old: the previous one comes back, the new one is set.
    struct sigaction both = action(plainHandler);
    ASSERT_EQ(sigtrack::setAction(SIGUSR2, &both, &both), 0);
    EXPECT_EQ(both.sa_sigaction, infoHandler);
    EXPECT_TRUE(both.sa_flags & SA_SIGINFO);
    raise(SIGUSR2);
    EXPECT_EQ(gPlain.load(), 1);
    EXPECT_EQ(gInfo.load(), 1);
}

TEST_F(SigTrack, ResetHandAndIgnoredSignalsAreAsTheKernelKeepsThem)
{
    sigtrack::activate(::sigaction);
    struct sigaction sa = action(plainHandler, SA_RESETHAND);
    ASSERT_EQ(sigtrack::setAction(SIGUSR1, &sa, nullptr), 0);
    raise(SIGUSR1);
    EXPECT_EQ(gPlain.load(), 1);
    struct sigaction seen = {};
    ASSERT_EQ(sigtrack::setAction(SIGUSR1, nullptr, &seen), 0);
    EXPECT_EQ(seen.sa_handler, SIG_DFL) << "SA_RESETHAND: the default after one delivery";
    EXPECT_EQ(kernelHandler(SIGUSR1), reinterpret_cast<void *>(SIG_DFL));
    // Ignored: nothing runs, nothing counts.
    struct sigaction ign = action(SIG_IGN);
    ASSERT_EQ(sigtrack::setAction(SIGUSR1, &ign, nullptr), 0);
    const uint64_t before = ran();
    raise(SIGUSR1);
    EXPECT_EQ(ran(), before);
    EXPECT_EQ(gPlain.load(), 1);
}

TEST_F(SigTrack, SiginfoWithTheDefaultIsTheDefault)
{
    // SA_SIGINFO with a null sa_sigaction is SIG_DFL to the kernel: no trampoline in front.
    sigtrack::activate(::sigaction);
    struct sigaction sa = infoAction(nullptr);
    ASSERT_EQ(sigtrack::setAction(SIGUSR2, &sa, nullptr), 0);
    EXPECT_EQ(kernelHandler(SIGUSR2), nullptr);
    struct sigaction seen = {};
    ASSERT_EQ(sigtrack::setAction(SIGUSR2, nullptr, &seen), 0);
    EXPECT_EQ(seen.sa_sigaction, nullptr);
}

TEST_F(SigTrack, AHandlerSetBehindItsBackIsTakenOverAtResync)
{
    // glibc's signal() reaches the kernel without the interposed sigaction.
    sigtrack::activate(::sigaction);
    ASSERT_NE(::signal(SIGALRM, otherHandler), SIG_ERR);
    sigtrack::resync(SIGALRM);
    EXPECT_NE(kernelHandler(SIGALRM), reinterpret_cast<void *>(otherHandler));
    struct sigaction seen = {};
    ASSERT_EQ(sigtrack::setAction(SIGALRM, nullptr, &seen), 0);
    EXPECT_EQ(seen.sa_handler, otherHandler);
    const uint64_t before = ran();
    raise(SIGALRM);
    EXPECT_EQ(gOther.load(), 1);
    EXPECT_EQ(ran(), before + 1);
    // siginterrupt() changes the trampoline's flags in the kernel: the program's follow.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    ASSERT_EQ(siginterrupt(SIGALRM, 1), 0); // still the programs' to call
#pragma GCC diagnostic pop
    sigtrack::resync(SIGALRM);
    ASSERT_EQ(sigtrack::setAction(SIGALRM, nullptr, &seen), 0);
    EXPECT_EQ(seen.sa_handler, otherHandler);
    EXPECT_FALSE(seen.sa_flags & SA_RESTART);
}

TEST_F(SigTrack, AHandlerWakesTheSleepItsThreadIsAboutToMake)
{
    sigtrack::activate(::sigaction);
    struct sigaction sa = action(plainHandler);
    ASSERT_EQ(sigtrack::setAction(SIGUSR1, &sa, nullptr), 0);
    const int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ASSERT_GE(efd, 0);
    raise(SIGUSR1); // not about to sleep: nothing written
    pollfd p{efd, POLLIN, 0};
    EXPECT_EQ(poll(&p, 1, 0), 0);
    sigtrack::thread().wakeFd = efd;
    raise(SIGUSR1);
    sigtrack::thread().wakeFd = -1;
    EXPECT_EQ(poll(&p, 1, 0), 1) << "the handler did not write the sleep's fd";
    EXPECT_EQ(gPlain.load(), 2);
    close(efd);
}

} // namespace
} // namespace rstream
