// SPDX-License-Identifier: MIT
// Small TCP programs for the diagnostics tests (fallback.sh, stat.sh), run with and without the
// shim. Each prints "pid N" first.
//   blackhole PORT...            listen on 127.0.0.1:PORT (each), never accept; until killed
//   connect PORT COUNT [HOLD_MS] COUNT connections to 127.0.0.1:PORT, one after another, each
//                                sending "hello"; all held open HOLD_MS, then closed. Prints
//                                "connected N" and "elapsed_ms T"; exit 1 unless all connected
//   serve PORT COUNT             listen on 127.0.0.1:PORT, accept COUNT connections and read
//                                each to EOF
//   noop                         nothing (the shim still loads)

#include <arpa/inet.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <netinet/in.h>
#include <poll.h>
#include <string>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

sockaddr_in loopback(int port)
{
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

int listenOn(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a = loopback(port);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0 ||
        listen(fd, 128) != 0) {
        std::perror("listen");
        std::exit(1);
    }
    return fd;
}

int blackhole(int argc, char **argv)
{
    for (int i = 0; i < argc; i++)
        listenOn(std::atoi(argv[i]));
    std::printf("ready\n");
    std::fflush(stdout);
    for (;;)
        pause();
}

int connectMany(int port, int count, int holdMs)
{
    const auto start = std::chrono::steady_clock::now();
    std::vector<int> fds;
    for (int i = 0; i < count; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a = loopback(port);
        if (fd < 0 || connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0) {
            std::perror("connect");
            return 1;
        }
        if (write(fd, "hello", 5) != 5) {
            std::perror("write");
            return 1;
        }
        fds.push_back(fd);
    }
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    std::printf("connected %d\nelapsed_ms %lld\n", count, static_cast<long long>(ms));
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(holdMs));
    for (int fd : fds)
        close(fd);
    return 0;
}

// A nonblocking connect, as event loops make it: connect() must return at once (EINPROGRESS),
// poll() reports POLLOUT when the connection is up (over whichever path), SO_ERROR is 0 and data
// goes through.
int connectNonblocking(int port)
{
    const auto start = std::chrono::steady_clock::now();
    auto since = [&] {
        return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::steady_clock::now() - start)
                                          .count());
    };
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    sockaddr_in a = loopback(port);
    const long long before = since();
    if (fd < 0 ||
        (connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0 && errno != EINPROGRESS)) {
        std::perror("connect");
        return 1;
    }
    std::printf("call_ms %lld\n", since() - before);
    // Set while the connect is in progress: kept whichever path the connection takes.
    const int one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)) != 0) {
        std::perror("setsockopt");
        return 1;
    }
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, 10000) != 1 || !(p.revents & POLLOUT)) {
        std::fprintf(stderr, "poll: revents %#x\n", p.revents);
        return 1;
    }
    int err = -1;
    socklen_t len = sizeof(err);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        std::fprintf(stderr, "SO_ERROR %d\n", err);
        return 1;
    }
    int keep = 0;
    len = sizeof(keep);
    if (getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &keep, &len) != 0 || keep != 1) {
        std::fprintf(stderr, "SO_KEEPALIVE %d after the connect\n", keep);
        return 1;
    }
    if (write(fd, "hello", 5) != 5) {
        std::perror("write");
        return 1;
    }
    std::printf("elapsed_ms %lld\n", since());
    std::fflush(stdout);
    close(fd);
    return 0;
}

int serve(int port, int count)
{
    int l = listenOn(port);
    std::printf("ready\n");
    std::fflush(stdout);
    for (int i = 0; i < count; i++) {
        int fd = accept(l, nullptr, nullptr);
        if (fd < 0) {
            std::perror("accept");
            return 1;
        }
        char buf[4096];
        while (read(fd, buf, sizeof(buf)) > 0) {
        }
        close(fd);
    }
    close(l);
    return 0;
}

} // namespace

int main(int argc, char **argv)
{
    std::printf("pid %d\n", static_cast<int>(getpid()));
    std::fflush(stdout);
    const std::string mode = argc > 1 ? argv[1] : "";
    // DIAG_LOAD_FIRST=1: a listener first (under the shim, that loads libfabric before main goes
    // on), so that the connects meet a loaded fabric.
    const char *loadFirst = std::getenv("DIAG_LOAD_FIRST");
    if (loadFirst && std::strcmp(loadFirst, "1") == 0 && listenOn(0) < 0)
        return 1;
    if (mode == "blackhole" && argc > 2)
        return blackhole(argc - 2, argv + 2);
    if (mode == "connect" && argc > 3)
        return connectMany(std::atoi(argv[2]), std::atoi(argv[3]),
                           argc > 4 ? std::atoi(argv[4]) : 0);
    if (mode == "connect-nb" && argc > 2)
        return connectNonblocking(std::atoi(argv[2]));
    if (mode == "serve" && argc > 3)
        return serve(std::atoi(argv[2]), std::atoi(argv[3]));
    if (mode == "noop")
        return 0;
    std::fprintf(stderr, "usage: diag_prog blackhole PORT... | connect PORT COUNT [HOLD_MS] | "
                         "serve PORT COUNT | noop\n");
    return 2;
}
