// SPDX-License-Identifier: MIT
// This test binary run again as one test of its own (a client or server process of a test).
#pragma once

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <initializer_list>
#include <spawn.h>
#include <string>
#include <unistd.h>
#include <vector>

extern char **environ;

namespace rstest {

// Runs this binary again with only test (a disabled one, named in full) and the environment
// variable assign ("NAME=value") added, the variables named in drop left out, fd3 as its fd 3
// and no other descriptor of this process's (a socket a child held open would send no FIN
// when this process closes it); gtest's output in brief, or none with muteStdout. posix_spawn
// runs nothing of this process in the child but the exec: a fork child of a multithreaded
// process inherits the locks other threads held at the fork (under ASan, the allocator's).
// Its pid, or -errno.
inline pid_t spawnSelf(const char *test, const std::string &assign, int fd3,
                       std::initializer_list<const char *> drop, bool muteStdout = false)
{
    char exe[4096];
    const ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (len <= 0)
        return -errno;
    exe[len] = 0;
    std::string add = assign;
    std::vector<char *> envp;
    for (char **e = environ; *e; e++) {
        bool keep = true;
        for (const char *name : drop) {
            const size_t n = std::strlen(name);
            keep = keep && !(std::strncmp(*e, name, n) == 0 && (*e)[n] == '=');
        }
        if (keep)
            envp.push_back(*e);
    }
    envp.push_back(add.data());
    envp.push_back(nullptr);
    std::string filter = std::string("--gtest_filter=") + test;
    char disabled[] = "--gtest_also_run_disabled_tests", brief[] = "--gtest_brief=1";
    char *argv[] = {exe, filter.data(), disabled, brief, nullptr};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd3, 3);
    posix_spawn_file_actions_addclosefrom_np(&fa, 4);
    if (muteStdout)
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    pid_t pid = -1;
    const int r = posix_spawn(&pid, exe, &fa, nullptr, argv, envp.data());
    posix_spawn_file_actions_destroy(&fa);
    return r ? -r : pid;
}

} // namespace rstest
