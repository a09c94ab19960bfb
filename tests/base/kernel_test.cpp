// SPDX-License-Identifier: MIT
// The kernel seam (kernel.h): -errno from libc by default, and every call goes to the table it is
// bound to.

#include <cerrno>
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "kernel.h"

using namespace rstream;

TEST(Kernel, ReturnsMinusErrnoFromLibc)
{
    EXPECT_EQ(sys::close(-1), -EBADF);
    EXPECT_EQ(sys::fcntl(-1, F_GETFL), -EBADF);
    char c;
    EXPECT_EQ(sys::read(-1, &c, 1), -EBADF);
    EXPECT_EQ(sys::socket(-1, SOCK_STREAM, 0), -EAFNOSUPPORT);
    EXPECT_EQ(sys::epollWait(-1, nullptr, 1, 0), -EBADF);
}

TEST(Kernel, PassesResultsThrough)
{
    int fd = sys::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    int fl = sys::fcntl(fd, F_GETFL);
    ASSERT_GE(fl, 0);
    EXPECT_EQ(sys::fcntl(fd, F_SETFL, fl | O_NONBLOCK), 0);
    EXPECT_TRUE(sys::fcntl(fd, F_GETFL) & O_NONBLOCK);
    EXPECT_EQ(sys::close(fd), 0);
    EXPECT_EQ(sys::close(fd), -EBADF);
}

namespace {
int gClosed = -1;
int fakeClose(int fd)
{
    gClosed = fd;
    errno = EIO;
    return -1;
}
} // namespace

TEST(Kernel, BindRoutesEveryCallToTheTable)
{
    static sys::Calls table = sys::kLibc;
    table.close = fakeClose;
    sys::bind(&table);
    EXPECT_EQ(sys::close(12345), -EIO);
    EXPECT_EQ(gClosed, 12345);
    sys::bind(&sys::kLibc);
    EXPECT_EQ(sys::close(-1), -EBADF);
    EXPECT_EQ(gClosed, 12345);
}
