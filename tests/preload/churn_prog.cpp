// SPDX-License-Identifier: MIT
// Connection churn under one epoll loop, as redis-benchmark makes it between its tests: many
// clients, each closed (with or without EPOLL_CTL_DEL, with a reply still in flight or not,
// in the middle of an event batch) and replaced by a new one on the same descriptor number.
//
//   churn_prog server PORT PORTFILE  echo server on 127.0.0.1:PORT (0: any); writes the port
//   churn_prog client PORT SECONDS   clients against it; fails on a wrong reply or a stall
//   churn_prog pause [PORT]          listens on 127.0.0.1 (under the shim this loads libfabric),
//                                    prints "ready", then waits

#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>

namespace {

constexpr int kClients = 48;
constexpr size_t kRequest = 64; // bytes per request; the reply echoes it

double now()
{
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}

void nonblocking(int fd)
{
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

int server(int port, const char *portFile)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    socklen_t len = sizeof(a);
    if (bind(l, reinterpret_cast<sockaddr *>(&a), sizeof(a)) < 0 || listen(l, 511) < 0 ||
        getsockname(l, reinterpret_cast<sockaddr *>(&a), &len) < 0) {
        std::perror("server: listen");
        return 1;
    }
    nonblocking(l);
    int ep = epoll_create1(0);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = l;
    epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev);
    FILE *f = std::fopen(portFile, "w");
    if (!f) {
        std::perror("server: port file");
        return 1;
    }
    std::fprintf(f, "%d\n", ntohs(a.sin_port));
    std::fclose(f);
    std::vector<std::string> in(65536);
    std::vector<epoll_event> events(1024);
    for (;;) {
        int n = epoll_wait(ep, events.data(), static_cast<int>(events.size()), -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            std::perror("server: epoll_wait");
            return 1;
        }
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == l) {
                for (;;) {
                    int c = accept(l, nullptr, nullptr);
                    if (c < 0)
                        break;
                    nonblocking(c);
                    if (c >= static_cast<int>(in.size())) {
                        close(c);
                        continue;
                    }
                    in[c].clear();
                    epoll_event cev{};
                    cev.events = EPOLLIN;
                    cev.data.fd = c;
                    epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
                }
                continue;
            }
            char buf[4096];
            ssize_t r = read(fd, buf, sizeof(buf));
            if (r == 0 || (r < 0 && errno != EAGAIN)) {
                epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
                close(fd);
                continue;
            }
            if (r < 0)
                continue;
            in[fd].append(buf, static_cast<size_t>(r));
            while (in[fd].size() >= kRequest) {
                // The reply is small and the socket nearly empty: a short write closes it.
                if (send(fd, in[fd].data(), kRequest, MSG_NOSIGNAL) != ssize_t(kRequest)) {
                    epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
                    close(fd);
                    break;
                }
                in[fd].erase(0, kRequest);
            }
        }
    }
}

struct Client
{
    int fd = -1;
    bool waiting = false; // a request is out, its reply not read yet
    size_t got = 0;
    unsigned seq = 0;
    char req[kRequest];
    char rep[kRequest];
};

class Clients
{
public:
    Clients(int port) : port_(port)
    {
        ep_ = epoll_create1(0);
        clients_.resize(kClients);
    }

    int open(Client &c)
    {
        c = Client{};
        c.fd = socket(AF_INET, SOCK_STREAM, 0);
        if (c.fd < 0) {
            std::perror("client: socket");
            return -1;
        }
        nonblocking(c.fd);
        int one = 1;
        setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(static_cast<uint16_t>(port_));
        if (connect(c.fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) < 0 &&
            errno != EINPROGRESS) {
            std::perror("client: connect");
            return -1;
        }
        epoll_event ev{};
        ev.events = EPOLLOUT;
        ev.data.ptr = &c;
        if (epoll_ctl(ep_, EPOLL_CTL_ADD, c.fd, &ev) < 0) {
            std::perror("client: epoll_ctl ADD");
            return -1;
        }
        opened_++;
        return 0;
    }

    // Closes in one of the ways programs do: after EPOLL_CTL_DEL or not (the kernel drops a
    // closed fd from its epoll sets), with a reply still on its way or not.
    void drop(Client &c, bool del)
    {
        if (del)
            epoll_ctl(ep_, EPOLL_CTL_DEL, c.fd, nullptr);
        close(c.fd);
        c.fd = -1;
    }

    // Sends the next request; the client then waits for its reply (EPOLLIN only).
    bool request(Client &c)
    {
        c.seq++;
        std::snprintf(c.req, sizeof(c.req), "%d:%u:%0*d", c.fd, c.seq, 40, 0);
        c.req[kRequest - 1] = '\n';
        if (send(c.fd, c.req, kRequest, MSG_NOSIGNAL) != ssize_t(kRequest)) {
            std::fprintf(stderr, "client: send on fd %d: %s\n", c.fd, std::strerror(errno));
            return false;
        }
        c.waiting = true;
        c.got = 0;
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.ptr = &c;
        epoll_ctl(ep_, EPOLL_CTL_MOD, c.fd, &ev);
        return true;
    }

    int run(double seconds)
    {
        for (Client &c : clients_)
            if (open(c) < 0)
                return 1;
        std::vector<epoll_event> events(256);
        const double end = now() + seconds;
        double lastProgress = now();
        unsigned long replies = 0, rounds = 0;
        unsigned rng = 12345;
        auto rand = [&] { return rng = rng * 1103515245u + 12345u, rng >> 16; };
        while (now() < end) {
            int n = epoll_wait(ep_, events.data(), static_cast<int>(events.size()), 1000);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0) {
                std::perror("client: epoll_wait");
                return 1;
            }
            if (now() - lastProgress > 10) {
                std::fprintf(stderr, "client: no reply for 10 s (%lu replies, %lu rounds)\n",
                             replies, rounds);
                return 1;
            }
            bool roundOver = false;
            for (int i = 0; i < n; i++) {
                auto *c = static_cast<Client *>(events[i].data.ptr);
                if (c->fd < 0)
                    continue; // closed earlier in this batch
                if (!c->waiting) {
                    if (!(events[i].events & EPOLLOUT))
                        continue;
                    int err = 0;
                    socklen_t el = sizeof(err);
                    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el);
                    if (err) {
                        std::fprintf(stderr, "client: connect: %s\n", std::strerror(err));
                        return 1;
                    }
                    if (!request(*c))
                        return 1;
                    continue;
                }
                ssize_t r = read(c->fd, c->rep + c->got, kRequest - c->got);
                if (r <= 0) {
                    if (r < 0 && errno == EAGAIN)
                        continue;
                    std::fprintf(stderr, "client: read on fd %d: %s\n", c->fd,
                                 r == 0 ? "EOF" : std::strerror(errno));
                    return 1;
                }
                c->got += static_cast<size_t>(r);
                if (c->got < kRequest)
                    continue;
                if (std::memcmp(c->rep, c->req, kRequest) != 0) {
                    std::fprintf(stderr, "client: fd %d: wrong reply\n", c->fd);
                    return 1;
                }
                c->waiting = false;
                replies++;
                lastProgress = now();
                // Now and then a client is replaced right away, inside the batch (a later
                // event of this batch may name it: it is skipped above).
                if (rand() % 8 == 0) {
                    drop(*c, rand() % 2);
                    if (open(*c) < 0)
                        return 1;
                } else if (!request(*c)) {
                    return 1;
                }
                if (replies % (kClients * 4) == 0)
                    roundOver = true;
            }
            if (!roundOver)
                continue;
            // Between rounds every client goes, most with a reply still on its way, and new
            // ones take their descriptor numbers.
            rounds++;
            for (Client &c : clients_)
                drop(c, rand() % 2);
            for (Client &c : clients_)
                if (open(c) < 0)
                    return 1;
        }
        std::printf("%lu replies, %lu rounds, %lu connections\n", replies, rounds, opened_);
        return replies > 0 && rounds > 0 ? 0 : 1;
    }

private:
    int port_;
    int ep_;
    std::vector<Client> clients_;
    unsigned long opened_ = 0;
};

} // namespace

int main(int argc, char **argv)
{
    if (argc == 4 && std::strcmp(argv[1], "server") == 0)
        return server(std::atoi(argv[2]), argv[3]);
    if ((argc == 2 || argc == 3) && std::strcmp(argv[1], "pause") == 0) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<uint16_t>(argc == 3 ? std::atoi(argv[2]) : 0));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (fd < 0 || bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) < 0 ||
            listen(fd, 1) < 0) {
            std::perror("churn_prog: listen");
            return 1;
        }
        std::printf("ready\n");
        std::fflush(stdout);
        sleep(60);
        return 0;
    }
    if (argc == 4 && std::strcmp(argv[1], "client") == 0)
        return Clients(std::atoi(argv[2])).run(std::atof(argv[3]));
    std::fprintf(stderr, "usage: %s server PORT PORTFILE | client PORT SECONDS | pause [PORT]\n",
                 argv[0]);
    return 2;
}
