// SPDX-License-Identifier: MIT
// The log line format, the sink (RSTREAM_LOG, RSTREAM_LOG_FILE with %p, fork children) and
// RS_CHECK's report with a backtrace.

#include <gtest/gtest.h>

#include <cstdarg>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "crash.h"
#include "log.h"

using namespace rstream;

namespace {

std::string format(size_t cap, LogLevel level, int fd, const char *fmt, ...)
{
    std::string buf(cap, '\0');
    const timespec ts{1700000000, 123456789}; // 2023-11-14T22:13:20.123456789Z
    va_list ap;
    va_start(ap, fmt);
    const size_t n = formatLogLine(buf.data(), cap, level, fd, ts, 4242, 4243, fmt, ap);
    va_end(ap);
    buf.resize(n);
    return buf;
}

std::string readFile(const std::string &path)
{
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// A temporary folder for the log files, named in RSTREAM_LOG_FILE before the first line.
std::string logDir()
{
    static std::string dir = [] {
        char tmpl[] = "/tmp/rstream-log-test.XXXXXX";
        const char *d = mkdtemp(tmpl);
        return std::string(d ? d : "/tmp");
    }();
    return dir;
}

// Removes the folder when the tests are done.
class LogDirCleanup : public ::testing::Environment
{
public:
    void TearDown() override { std::filesystem::remove_all(logDir()); }
};
const auto *gCleanup = ::testing::AddGlobalTestEnvironment(new LogDirCleanup());

std::string logPath(pid_t pid)
{
    return logDir() + "/log." + std::to_string(pid);
}

int gChecksFailed = 0;

// As the engine uses it (a tail call would leave this frame out of the backtrace).
__attribute__((noinline)) bool rstreamTestCheckHere(int v)
{
    if (!RS_CHECK(v == 1)) {
        gChecksFailed++;
        return false;
    }
    return true;
}

} // namespace

TEST(LogFormat, TimePidTidLevelFdMessage)
{
    EXPECT_EQ(format(1024, LogLevel::Info, 7, "hello %d", 5),
              "rstream 2023-11-14T22:13:20.123456Z pid=4242 tid=4243 info: fd=7 hello 5\n");
    EXPECT_EQ(format(1024, LogLevel::Warn, -1, "no socket"),
              "rstream 2023-11-14T22:13:20.123456Z pid=4242 tid=4243 warn: no socket\n");
    EXPECT_EQ(format(1024, LogLevel::Error, 0, "%s", "x"),
              "rstream 2023-11-14T22:13:20.123456Z pid=4242 tid=4243 error: fd=0 x\n");
    EXPECT_EQ(format(1024, LogLevel::Trace, -1, "t"),
              "rstream 2023-11-14T22:13:20.123456Z pid=4242 tid=4243 trace: t\n");
}

TEST(LogFormat, LongLinesAreCutAndStillEndTheLine)
{
    const std::string big(5000, 'a');
    const std::string line = format(128, LogLevel::Debug, 3, "%s", big.c_str());
    EXPECT_EQ(line.size(), 128u);
    EXPECT_EQ(line.back(), '\n');
    EXPECT_EQ(line.find('\n'), line.size() - 1);
    EXPECT_EQ(
        line.rfind("rstream 2023-11-14T22:13:20.123456Z pid=4242 tid=4243 debug: fd=3 aaa", 0), 0u);
    // Even a buffer too small for the prefix gets a line.
    EXPECT_EQ(format(16, LogLevel::Info, -1, "x"), "rstream 2023-11\n");
}

TEST(LogSink, LevelFileAndForkChildren)
{
    // Nothing has logged yet: the level is still unread, so the first line (even one from a
    // constructor that runs before any initializer) reaches the sink, which reads it.
    EXPECT_EQ(gLogLevel.load(), kLogLevelUnread);
    setenv("RSTREAM_LOG", "info", 1);
    setenv("RSTREAM_LOG_FILE", (logDir() + "/log.%p").c_str(), 1);
    RS_LOG(Info, "first line %d", 1);
    EXPECT_EQ(gLogLevel.load(), static_cast<int>(LogLevel::Info));
    RS_LOG(Debug, "not at info level");
    RS_LOG_FD(Warn, 9, "about a socket");

    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        RS_LOG(Info, "from the child");
        _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    RS_LOG(Info, "parent again");

    const std::string mine = readFile(logPath(getpid()));
    const std::string pid = std::to_string(getpid());
    const std::string tid = std::to_string(syscall(SYS_gettid));
    const std::string prefix =
        "rstream [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{6}Z pid=" + pid +
        " tid=" + tid;
    EXPECT_TRUE(std::regex_search(mine, std::regex(prefix + " info: first line 1\n"))) << mine;
    EXPECT_TRUE(std::regex_search(mine, std::regex(prefix + " warn: fd=9 about a socket\n")))
        << mine;
    EXPECT_TRUE(std::regex_search(mine, std::regex(prefix + " info: parent again\n"))) << mine;
    EXPECT_EQ(mine.find("not at info level"), std::string::npos);
    EXPECT_EQ(mine.find("from the child"), std::string::npos);
    // The child's %p is its own pid.
    const std::string theirs = readFile(logPath(child));
    EXPECT_TRUE(std::regex_search(
        theirs, std::regex("pid=" + std::to_string(child) + " tid=[0-9]+ info: from the child\n")))
        << theirs;
}

TEST(LogSink, CheckFailureLogsABacktraceAndReturnsFalse)
{
    setenv("RSTREAM_LOG_FILE", (logDir() + "/log.%p").c_str(), 1);
    EXPECT_TRUE(rstreamTestCheckHere(1));
    EXPECT_FALSE(rstreamTestCheckHere(2));
    EXPECT_EQ(gChecksFailed, 1);
    const std::string log = readFile(logPath(getpid()));
    EXPECT_TRUE(std::regex_search(
        log, std::regex("error: internal invariant failed: v == 1 \\(log_test.cpp:[0-9]+\\); "
                        "resetting the connection\n")))
        << log;
    // The first frame is the function whose check failed, named, with its object and offset.
    EXPECT_TRUE(std::regex_search(
        log,
        std::regex("\n#0 0x[0-9a-f]+ [^ ]*rstreamTestCheckHere[^ ]*\\+0x[0-9a-f]+ \\(.*\\+0x")))
        << log;
    EXPECT_TRUE(std::regex_search(log, std::regex("\n#[0-9]+ 0x[0-9a-f]+ main\\+"))) << log;
}
