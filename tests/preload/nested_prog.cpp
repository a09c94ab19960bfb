// SPDX-License-Identifier: MIT
// An epoll fd holding a socket becomes readable, in poll() and in another epoll, when data
// arrives on the socket (under the shim: an engine socket in an emulated epoll set).

#include <arpa/inet.h>
#include <cstdio>
#include <cstdlib>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    // The port the script picked (its fabric port free too); an ephemeral one's may be taken.
    a.sin_port = htons(argc > 1 ? static_cast<uint16_t>(std::atoi(argv[1])) : 0);
    socklen_t len = sizeof(a);
    if (bind(l, reinterpret_cast<sockaddr *>(&a), sizeof(a)) < 0 || listen(l, 4) < 0 ||
        getsockname(l, reinterpret_cast<sockaddr *>(&a), &len) < 0) {
        std::perror("listen");
        return 1;
    }
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, reinterpret_cast<sockaddr *>(&a), sizeof(a)) < 0) {
        std::perror("connect");
        return 1;
    }
    int s = accept(l, nullptr, nullptr);
    int inner = epoll_create1(0);
    int outer = epoll_create1(0);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = 7;
    if (s < 0 || epoll_ctl(inner, EPOLL_CTL_ADD, s, &ev) < 0 ||
        epoll_ctl(outer, EPOLL_CTL_ADD, inner, &ev) < 0) {
        std::perror("setup");
        return 1;
    }
    pollfd p{inner, POLLIN, 0};
    if (poll(&p, 1, 100) != 0) {
        std::fprintf(stderr, "the epoll fd is readable before any data\n");
        return 1;
    }
    if (write(c, "x", 1) != 1) {
        std::perror("write");
        return 1;
    }
    if (poll(&p, 1, 5000) != 1 || !(p.revents & POLLIN)) {
        std::fprintf(stderr, "poll() did not see the epoll fd become readable\n");
        return 1;
    }
    epoll_event out{};
    if (epoll_wait(outer, &out, 1, 5000) != 1 || out.data.u64 != 7) {
        std::fprintf(stderr, "the outer epoll did not report the inner one\n");
        return 1;
    }
    if (epoll_wait(inner, &out, 1, 0) != 1 || out.data.u64 != 7) {
        std::fprintf(stderr, "the inner epoll did not report the socket\n");
        return 1;
    }
    std::printf("nested epoll readiness seen by poll() and by an outer epoll\n");
    return 0;
}
