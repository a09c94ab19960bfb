// SPDX-License-Identifier: MIT
// What a test measures of its own process: open descriptors, resident memory, CPU time.
#pragma once

#include <cstdio>
#include <dirent.h>
#include <malloc.h>
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

} // namespace rstest
