// SPDX-License-Identifier: MIT
// What a test measures of its own process: open descriptors, resident memory, CPU time.
#pragma once

#include <cstdio>
#include <dirent.h>
#include <fstream>
#include <malloc.h>
#include <string>
#include <sys/resource.h>
#include <unistd.h>

namespace rstest {

// Descriptors open in this process.
inline int countFds()
{
    int n = 0;
    if (DIR *d = opendir("/proc/self/fd")) {
        while (dirent *e = readdir(d))
            if (e->d_name[0] != '.')
                n++;
        closedir(d);
    }
    return n - 1; // the directory's own fd
}

// What this process's descriptors are ("fd=target "), for a failure message.
inline std::string describeFds()
{
    std::string out;
    if (DIR *d = opendir("/proc/self/fd")) {
        while (dirent *e = readdir(d)) {
            if (e->d_name[0] == '.')
                continue;
            char path[300], target[256];
            std::snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
            ssize_t n = readlink(path, target, sizeof(target) - 1);
            target[n > 0 ? n : 0] = 0;
            out += std::string(e->d_name) + "=" + target + " ";
        }
        closedir(d);
    }
    return out;
}

// Resident memory in KiB.
inline long rssKiB()
{
    long pages = 0, resident = 0;
    if (FILE *f = std::fopen("/proc/self/statm", "r")) {
        if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2)
            resident = 0;
        std::fclose(f);
    }
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

// Resident memory once malloc has given back what it keeps of freed blocks: what was not freed.
inline long trimmedRssKiB()
{
    malloc_trim(0);
    return rssKiB();
}

// User and system CPU time of this process, in seconds.
inline double cpuSeconds()
{
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// The context switches so far (voluntary and involuntary) of this process's thread named
// `name`, such as the progress thread ("rstream-prog"): each sleep of its own is one, so a thread
// that sleeps between rare wake-ups counts few and one that polls one per look. Unlike CPU time,
// it does not move with a shared virtual machine's accounting (on these machines, a thread
// asleep for a whole second was charged 20-40 ms). -1 if no such thread runs.
inline long threadSwitches(const char *name)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    long switches = -1;
    while (dirent *e = readdir(d)) {
        const std::string task = std::string("/proc/self/task/") + e->d_name;
        std::ifstream comm(task + "/comm");
        std::string line;
        if (!std::getline(comm, line) || line != name)
            continue;
        std::ifstream status(task + "/status");
        switches = 0;
        while (std::getline(status, line))
            if (line.rfind("voluntary_ctxt_switches:", 0) == 0 ||
                line.rfind("nonvoluntary_ctxt_switches:", 0) == 0)
                switches += std::stol(line.substr(line.find(':') + 1));
        break;
    }
    closedir(d);
    return switches;
}

} // namespace rstest
