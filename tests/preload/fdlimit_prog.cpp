// SPDX-License-Identifier: MIT
// A program with many connections in one process that uses select(): it must behave the same
// under the shim with the soft fd limit it was started with (the shim's fds go above it).

#include <arpa/inet.h>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>

int main(int argc, char **argv)
{
    int n = argc > 1 ? std::atoi(argv[1]) : 400;
    rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(l, reinterpret_cast<sockaddr *>(&a), sizeof(a)) < 0 || listen(l, 1024) < 0 ||
        getsockname(l, reinterpret_cast<sockaddr *>(&a), &len) < 0) {
        std::perror("listen");
        return 1;
    }
    std::vector<int> clients, servers;
    for (int i = 0; i < n; i++) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (c < 0 || connect(c, reinterpret_cast<sockaddr *>(&a), sizeof(a)) < 0) {
            std::fprintf(stderr, "connection %d: %s\n", i, std::strerror(errno));
            return 1;
        }
        int s = accept(l, nullptr, nullptr);
        if (s < 0) {
            std::fprintf(stderr, "accept %d: %s\n", i, std::strerror(errno));
            return 1;
        }
        if (c >= FD_SETSIZE || s >= FD_SETSIZE) {
            std::fprintf(stderr, "fd %d/%d beyond FD_SETSIZE\n", c, s);
            return 1;
        }
        clients.push_back(c);
        servers.push_back(s);
    }
    // Every client writes one byte; select() must report every server readable.
    for (int i = 0; i < n; i++) {
        char b = static_cast<char>(i);
        if (write(clients[i], &b, 1) != 1) {
            std::perror("write");
            return 1;
        }
    }
    std::vector<bool> got(n, false);
    int left = n;
    while (left > 0) {
        fd_set rd;
        FD_ZERO(&rd);
        int maxfd = -1;
        for (int i = 0; i < n; i++) {
            if (!got[i]) {
                FD_SET(servers[i], &rd);
                maxfd = servers[i] > maxfd ? servers[i] : maxfd;
            }
        }
        timeval tv{10, 0};
        int r = select(maxfd + 1, &rd, nullptr, nullptr, &tv);
        if (r <= 0) {
            std::fprintf(stderr, "select: %d (%s), %d left\n", r, std::strerror(errno), left);
            return 1;
        }
        for (int i = 0; i < n; i++) {
            if (!got[i] && FD_ISSET(servers[i], &rd)) {
                char b;
                if (read(servers[i], &b, 1) != 1 || b != static_cast<char>(i)) {
                    std::fprintf(stderr, "read %d failed\n", i);
                    return 1;
                }
                got[i] = true;
                left--;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        close(clients[i]);
        close(servers[i]);
    }
    std::printf("%d connections, soft limit %llu, select() saw every one\n", n,
                static_cast<unsigned long long>(rl.rlim_cur));
    return 0;
}
