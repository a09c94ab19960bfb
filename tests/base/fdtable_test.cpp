// SPDX-License-Identifier: MIT
// FdTable: the lock-free map from descriptors to objects that the shim's fd tables use.

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "fdtable.h"

using rstream::FdTable;

namespace {

struct Obj
{
    explicit Obj(int v) : value(v) {}
    int value;
};

} // namespace

TEST(FdTable, SetGetHasTake)
{
    static FdTable<Obj> table;
    EXPECT_FALSE(table.has(3));
    EXPECT_EQ(table.get(3), nullptr);
    EXPECT_EQ(table.take(3), nullptr); // nothing there, and no chunk yet
    auto a = std::make_shared<Obj>(1);
    ASSERT_TRUE(table.set(3, a));
    EXPECT_TRUE(table.has(3));
    EXPECT_EQ(table.get(3), a);
    EXPECT_FALSE(table.has(4)); // a neighbour in the same chunk
    EXPECT_EQ(table.get(4), nullptr);
    // Replacing.
    auto b = std::make_shared<Obj>(2);
    ASSERT_TRUE(table.set(3, b));
    EXPECT_EQ(table.get(3), b);
    EXPECT_EQ(a.use_count(), 1); // the table let go of the old one
    // take() removes and hands over; a second take gets nothing.
    EXPECT_EQ(table.take(3), b);
    EXPECT_FALSE(table.has(3));
    EXPECT_EQ(table.get(3), nullptr);
    EXPECT_EQ(table.take(3), nullptr);
    // Setting null is a removal as far as has() is concerned.
    ASSERT_TRUE(table.set(5, a));
    ASSERT_TRUE(table.set(5, nullptr));
    EXPECT_FALSE(table.has(5));
    EXPECT_EQ(table.get(5), nullptr);
}

TEST(FdTable, Bounds)
{
    static FdTable<Obj> table;
    auto a = std::make_shared<Obj>(1);
    EXPECT_FALSE(table.set(-1, a));
    EXPECT_FALSE(table.set(FdTable<Obj>::kMaxFd, a));
    EXPECT_FALSE(table.has(-1));
    EXPECT_FALSE(table.has(FdTable<Obj>::kMaxFd));
    EXPECT_EQ(table.get(-1), nullptr);
    EXPECT_EQ(table.get(FdTable<Obj>::kMaxFd), nullptr);
    EXPECT_EQ(table.take(-1), nullptr);
    EXPECT_EQ(table.take(FdTable<Obj>::kMaxFd), nullptr);
    EXPECT_EQ(a.use_count(), 1); // refused sets keep nothing
    // The first and last tracked descriptors, in different chunks.
    const int last = FdTable<Obj>::kMaxFd - 1;
    ASSERT_TRUE(table.set(0, a));
    ASSERT_TRUE(table.set(last, a));
    EXPECT_EQ(table.get(0), a);
    EXPECT_EQ(table.get(last), a);
    EXPECT_FALSE(table.has(last - 1));
    // Chunk edges: fds either side of a chunk boundary are distinct entries.
    const int edge = 1 << FdTable<Obj>::kChunkBits;
    auto b = std::make_shared<Obj>(2);
    ASSERT_TRUE(table.set(edge, b));
    EXPECT_EQ(table.get(edge), b);
    EXPECT_EQ(table.get(edge - 1), nullptr);
    EXPECT_EQ(table.take(0), a);
    EXPECT_EQ(table.take(last), a);
    EXPECT_EQ(table.take(edge), b);
}

TEST(FdTable, ConcurrentUse)
{
    static FdTable<Obj> table;
    constexpr int kThreads = 4;
    constexpr int kPerThread = 3000; // across several chunks, allocated concurrently
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; t++) {
        threads.emplace_back([t] {
            for (int i = 0; i < kPerThread; i++) {
                const int fd = i * kThreads + t;
                ASSERT_TRUE(table.set(fd, std::make_shared<Obj>(fd)));
            }
        });
    }
    for (auto &th : threads)
        th.join();
    threads.clear();
    for (int fd = 0; fd < kThreads * kPerThread; fd++) {
        auto o = table.get(fd);
        ASSERT_NE(o, nullptr) << fd;
        EXPECT_EQ(o->value, fd);
    }

    // Racing takes of the same fds: each object is handed to exactly one taker, while readers
    // see either the object or nothing.
    std::atomic<int> taken{0};
    std::atomic<bool> readerSawWrong{false};
    for (int t = 0; t < kThreads; t++) {
        threads.emplace_back([&] {
            for (int fd = 0; fd < kThreads * kPerThread; fd++)
                if (auto o = table.take(fd)) {
                    if (o->value != fd)
                        readerSawWrong = true;
                    taken++;
                }
        });
    }
    threads.emplace_back([&] {
        for (int fd = 0; fd < kThreads * kPerThread; fd++)
            if (auto o = table.get(fd); o && o->value != fd)
                readerSawWrong = true;
    });
    for (auto &th : threads)
        th.join();
    EXPECT_EQ(taken.load(), kThreads * kPerThread);
    EXPECT_FALSE(readerSawWrong.load());
    for (int fd = 0; fd < kThreads * kPerThread; fd++)
        EXPECT_FALSE(table.has(fd)) << fd;
}
