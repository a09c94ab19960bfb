// SPDX-License-Identifier: MIT
// A poll() loop over a busy connection and its listener, as iperf3's server runs one: the
// connection is readable at every call, and a new connection at the listener is still reported
// within a bounded time. Prints the calls made and how long the new connection waited.

#include <algorithm>
#include <arpa/inet.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {
int64_t nowUs()
{
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

bool exchange(int a, int b, int rounds)
{
    // Small exchanges for a while: the connection settles on its path (an upgrade happens at
    // its first bytes).
    char x = 0;
    for (int i = 0; i < rounds; i++) {
        if (write(a, "p", 1) != 1 || read(b, &x, 1) != 1 || write(b, "q", 1) != 1 ||
            read(a, &x, 1) != 1)
            return false;
        usleep(1000);
    }
    return true;
}
} // namespace

int main(int argc, char **argv)
{
    const int before = argc > 1 ? atoi(argv[1]) : 20000; // polls before the second connect
    // A dual-stack listener on every address, as iperf3's; the clients come over IPv4.
    int l = socket(AF_INET6, SOCK_STREAM, 0);
    sockaddr_in6 any{};
    any.sin6_family = AF_INET6;
    any.sin6_addr = in6addr_any;
    // The port the script picked (its fabric port free too); an ephemeral one's may be taken.
    any.sin6_port = htons(argc > 2 ? uint16_t(atoi(argv[2])) : 0);
    socklen_t len = sizeof(any);
    if (bind(l, reinterpret_cast<sockaddr *>(&any), sizeof(any)) < 0 || listen(l, 4) < 0 ||
        getsockname(l, reinterpret_cast<sockaddr *>(&any), &len) < 0) {
        std::perror("listen");
        return 1;
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = any.sin6_port;
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, reinterpret_cast<sockaddr *>(&a), sizeof(a)) < 0) {
        std::perror("connect");
        return 1;
    }
    int s = accept(l, nullptr, nullptr);
    if (s < 0 || !exchange(c, s, 100)) {
        std::perror("exchange");
        return 1;
    }
    // The writer keeps s readable: a counting pattern, checked as it is read.
    const timeval tick{0, 20000};
    if (setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tick, sizeof(tick)) < 0) {
        std::perror("SO_SNDTIMEO");
        return 1;
    }
    std::atomic<bool> stop{false};
    std::thread writer([c, &stop] {
        std::vector<unsigned char> buf(65536);
        uint64_t n = 0;
        while (!stop) {
            for (auto &b : buf)
                b = static_cast<unsigned char>(n++ % 251);
            size_t off = 0;
            while (off < buf.size() && !stop) {
                // A send timeout (below) lets it see stop while the ring stays full.
                const ssize_t r = write(c, buf.data() + off, buf.size() - off);
                if (r < 0 && errno == EAGAIN)
                    continue;
                if (r <= 0)
                    return;
                off += size_t(r);
            }
        }
    });
    std::atomic<int64_t> connectAt{0};
    std::thread connector;
    int c2 = -1, polls = 0, readsSinceConnect = 0;
    int64_t seenAt = 0;
    uint64_t got = 0;
    bool ok = true;
    while (ok && polls < 5000000) {
        if (polls == before)
            connector = std::thread([&] {
                // From the connect's return: the kernel's accept queue holds the connection
                // by then (the call itself waits for CPU beside the busy loop).
                c2 = socket(AF_INET, SOCK_STREAM, 0);
                if (connect(c2, reinterpret_cast<sockaddr *>(&a), sizeof(a)) < 0)
                    std::perror("second connect");
                connectAt = nowUs();
            });
        pollfd p[2] = {{s, POLLIN, 0}, {l, POLLIN, 0}};
        const int r = poll(p, 2, 5000);
        polls++;
        if (r <= 0) {
            std::fprintf(stderr, "poll returned %d at call %d\n", r, polls);
            ok = false;
            break;
        }
        if (p[1].revents & POLLIN) {
            if (polls <= before) {
                std::fprintf(stderr, "the listener was readable before any connect\n");
                ok = false;
                break;
            }
            seenAt = nowUs();
            if (connector.joinable())
                connector.join(); // the listener may be seen before connect() returns
            break;
        }
        if (!(p[0].revents & POLLIN)) {
            std::fprintf(stderr, "the connection was not readable at call %d\n", polls);
            ok = false;
            break;
        }
        unsigned char in[64];
        const ssize_t n = read(s, in, sizeof(in));
        if (n <= 0) {
            std::perror("read");
            ok = false;
            break;
        }
        for (ssize_t i = 0; i < n; i++, got++)
            if (in[i] != got % 251) {
                std::fprintf(stderr, "byte %llu altered\n", (unsigned long long)got);
                ok = false;
                break;
            }
        readsSinceConnect += connectAt.load() != 0;
    }
    stop = true;
    if (connector.joinable())
        connector.join();
    int s2 = ok ? accept(l, nullptr, nullptr) : -1;
    writer.join();
    if (!ok || s2 < 0 || !seenAt)
        return 1;
    if (!exchange(c2, s2, 100)) {
        std::perror("second exchange");
        return 1;
    }
    std::printf("polls=%d bytes=%llu accept_wait_us=%lld reads_meanwhile=%d\n", polls,
                (unsigned long long)got, (long long)std::max<int64_t>(0, seenAt - connectAt.load()),
                readsSinceConnect);
    close(s2);
    close(c2);
    close(s);
    close(c);
    close(l);
    return 0;
}
