// SPDX-License-Identifier: MIT
// The epoll ready list tests' fixture: a listener, connected pairs in an EpollSet, each mode.
#pragma once

#include <chrono>
#include <memory>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernel.h"
#include "poller.h"
#include "settings.h"
#include "socket.h"

namespace rstream::rstest_epoll {

struct Mode
{
    const char *name;
    bool sameHost;
};
const Mode kModes[] = {{"fabric", false}, {"samehost", true}};

class EpollReady : public ::testing::TestWithParam<Mode>
{
protected:
    void SetUp() override
    {
        settings_ = Settings::fromEnv();
        settings_.sameHost = GetParam().sameHost;
        listener_ = std::make_shared<Socket>(AF_INET, settings_);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ASSERT_EQ(listener_->bind(reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0);
        ASSERT_EQ(listener_->listen(128), 0);
        socklen_t len = sizeof(addr_);
        ASSERT_EQ(listener_->localAddress(reinterpret_cast<sockaddr *>(&addr_), &len), 0);
        epfd_ = sys::epollCreate1(EPOLL_CLOEXEC);
        ASSERT_GE(epfd_, 0);
        set_ = std::make_unique<EpollSet>(epfd_);
    }
    void TearDown() override
    {
        set_.reset();
        if (epfd_ >= 0)
            sys::close(epfd_);
        for (auto &p : pairs_) {
            p.first->close();
            p.second->close();
        }
        if (listener_)
            listener_->close();
    }

    // The listener in the set for EPOLLIN, under fd number and data 999.
    void addListener()
    {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = 999;
        ASSERT_EQ(set_->ctl(EPOLL_CTL_ADD, 999, &ev, listener_), 0);
    }

    // n connected pairs (client, server), the server ends in the set for EPOLLIN | events,
    // under fd numbers 1000 + i (the set only keys entries by them).
    void connectPairs(int n, uint32_t events = 0)
    {
        for (int i = 0; i < n; i++) {
            auto c = std::make_shared<Socket>(AF_INET, settings_);
            std::shared_ptr<Socket> s;
            std::thread t([&] { ASSERT_EQ(listener_->accept(&s, nullptr, nullptr), 0); });
            ASSERT_EQ(c->connect(reinterpret_cast<sockaddr *>(&addr_), sizeof(addr_)), 0);
            t.join();
            ASSERT_TRUE(s);
            ASSERT_EQ(s->connection()->sameHost(), GetParam().sameHost);
            s->setNonblocking(true);
            epoll_event ev{};
            ev.events = EPOLLIN | events;
            ev.data.u64 = static_cast<uint64_t>(i);
            ASSERT_EQ(set_->ctl(EPOLL_CTL_ADD, 1000 + i, &ev, s), 0);
            pairs_.emplace_back(c, s);
        }
    }

    // Waits (timeout 0, with short pauses) until n members are parked: true if they were.
    bool parked(size_t n)
    {
        epoll_event out[8];
        for (int i = 0; i < 200 && set_->parkedCount() < n; i++) {
            EXPECT_EQ(set_->wait(out, 8, 0, nullptr, 0), 0);
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        return set_->parkedCount() == n;
    }

    void sendByte(Socket &s)
    {
        char b = 'x';
        iovec v{&b, 1};
        ASSERT_EQ(s.send(&v, 1, 0), 1);
    }

    Settings settings_;
    std::shared_ptr<Socket> listener_;
    sockaddr_in addr_{};
    int epfd_ = -1;
    std::unique_ptr<EpollSet> set_;
    std::vector<std::pair<std::shared_ptr<Socket>, std::shared_ptr<Socket>>> pairs_;
};

} // namespace rstream::rstest_epoll
