// SPDX-License-Identifier: MIT
// A process whose very first socket is a nonblocking connect: connect() must return at once,
// before libfabric is loaded, and the socket must then behave as a connecting one.
// Usage: nbconnect_prog server PORT  (echoes "world" for "hello", once; prints "ready")
//        nbconnect_prog client PORT poll|epoll|spin|blocking

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <string>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace {

sockaddr_in loopback(int port)
{
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

int fail(const char *what)
{
    std::fprintf(stderr, "FAIL: %s (errno %d: %s)\n", what, errno, std::strerror(errno));
    return 1;
}

// Reads exactly n bytes from a nonblocking fd, waiting with poll.
bool readAll(int fd, char *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, buf + got, n - got, 0);
        if (r > 0) {
            got += static_cast<size_t>(r);
            continue;
        }
        if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
            return false;
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, 10000) != 1)
            return false;
    }
    return true;
}

int server(int port)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a = loopback(port);
    if (bind(l, reinterpret_cast<sockaddr *>(&a), sizeof(a)) < 0 || listen(l, 4) < 0)
        return fail("listen");
    std::printf("ready\n");
    std::fflush(stdout);
    int s = accept(l, nullptr, nullptr);
    if (s < 0)
        return fail("accept");
    char buf[5];
    if (!readAll(s, buf, sizeof(buf)) || std::memcmp(buf, "hello", 5) != 0)
        return fail("server read");
    if (write(s, "world", 5) != 5)
        return fail("server write");
    // Until the client closes.
    while (read(s, buf, sizeof(buf)) > 0) {
    }
    close(s);
    close(l);
    return 0;
}

// Waits for the connect to complete: POLLOUT, through poll() or an epoll set that sleep until
// it, or through polls that return at once (spin), none of which may block for long.
bool waitWritable(int fd, const std::string &how)
{
    if (how == "spin") {
        double longest = 0;
        for (int i = 0; i < 5000; i++) {
            pollfd p{fd, POLLOUT, 0};
            const auto t0 = std::chrono::steady_clock::now();
            const int r = poll(&p, 1, 0);
            const double ms =
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count();
            longest = std::max(longest, ms);
            if (ms >= 50) {
                std::fprintf(stderr, "FAIL: poll(0) blocked for %.1f ms\n", ms);
                return false;
            }
            if (r < 0 || (p.revents & (POLLERR | POLLHUP)))
                return false;
            if (r == 1) {
                std::printf("writable after %d polls; the longest took %.1f ms\n", i + 1, longest);
                return true;
            }
            usleep(2000);
        }
        return false;
    }
    if (how == "poll") {
        pollfd p{fd, POLLOUT, 0};
        return poll(&p, 1, 10000) == 1 && (p.revents & POLLOUT) &&
               !(p.revents & (POLLERR | POLLHUP));
    }
    int ep = epoll_create1(0);
    epoll_event ev{};
    ev.events = EPOLLOUT;
    ev.data.fd = fd;
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
        return false;
    epoll_event out{};
    const bool ok = epoll_wait(ep, &out, 1, 10000) == 1 && out.data.fd == fd &&
                    (out.events & EPOLLOUT) && !(out.events & (EPOLLERR | EPOLLHUP));
    close(ep);
    return ok;
}

int client(int port, const std::string &how)
{
    int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (c < 0)
        return fail("socket");
    sockaddr_in a = loopback(port);
    const auto t0 = std::chrono::steady_clock::now();
    int r = connect(c, reinterpret_cast<sockaddr *>(&a), sizeof(a));
    const int err = errno;
    const auto t1 = std::chrono::steady_clock::now();
    const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    std::printf("connect() returned %d (%s) after %.1f ms\n", r, r ? std::strerror(err) : "0", ms);
    if (r < 0 && err != EINPROGRESS) {
        errno = err;
        return fail("connect");
    }
    if (ms >= 50) {
        std::fprintf(stderr, "FAIL: a nonblocking connect blocked for %.1f ms\n", ms);
        return 1;
    }
    // In progress: no error, nothing to read, no hang-up or error in poll.
    int soerr = -1;
    socklen_t len = sizeof(soerr);
    if (getsockopt(c, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0 || soerr != 0)
        return fail("SO_ERROR right after connect");
    char buf[5];
    if (recv(c, buf, sizeof(buf), 0) != -1 || (errno != EAGAIN && errno != EWOULDBLOCK))
        return fail("recv right after connect: expected EAGAIN");
    if (how == "spin") {
        // The first poll of the thread comes while libfabric is loading (it used to wait for
        // the loader's lock there).
        usleep(20000);
    } else {
        pollfd p{c, POLLIN | POLLOUT, 0};
        if (poll(&p, 1, 0) < 0 || (p.revents & (POLLERR | POLLHUP | POLLIN)))
            return fail("poll right after connect: error, hang-up or input");
    }
    if (how == "blocking") {
        // No poll: blocking calls wait for the connection (or the fallback) themselves.
        if (fcntl(c, F_SETFL, fcntl(c, F_GETFL) & ~O_NONBLOCK) < 0)
            return fail("fcntl");
    } else if (!waitWritable(c, how)) {
        return fail("waiting for POLLOUT");
    }
    soerr = -1;
    len = sizeof(soerr);
    if (getsockopt(c, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0 || soerr != 0) {
        errno = soerr;
        return fail("SO_ERROR after POLLOUT");
    }
    if (send(c, "hello", 5, 0) != 5)
        return fail("send");
    if (!readAll(c, buf, sizeof(buf)) || std::memcmp(buf, "world", 5) != 0)
        return fail("client read");
    close(c);
    std::printf("exchanged hello/world\n");
    return 0;
}

} // namespace

int main(int argc, char **argv)
{
    if (argc >= 3 && std::string(argv[1]) == "server")
        return server(std::atoi(argv[2]));
    if (argc >= 4 && std::string(argv[1]) == "client")
        return client(std::atoi(argv[2]), argv[3]);
    std::fprintf(stderr, "usage: %s server PORT | client PORT poll|epoll|spin|blocking\n", argv[0]);
    return 2;
}
