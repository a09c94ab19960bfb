/* SPDX-License-Identifier: MIT */
/* An rsocket echo on 127.0.0.1 that tests/e2e/package.sh builds against the installed
 * librstream-dev with pkg-config: a thread accepts and echoes, main sends 16 chunks and checks
 * each one that comes back. Prints the library's version. */
#include <rstream/rsocket.h>
#include <rstream/version.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

enum
{
    kChunk = 16384,
    kChunks = 16
};

static int listener = -1;

/* Sends all of buf; 0 on success. */
static int sendAll(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = rsend(fd, buf, len, 0);
        if (n < 0)
            return -1;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Accepts one connection and echoes it until the client shuts down its side. */
static void *echo(void *arg)
{
    static char buf[kChunk];
    ssize_t n;
    int fd = raccept(listener, NULL, NULL);
    (void)arg;
    if (fd < 0) {
        perror("raccept");
        return (void *)1;
    }
    while ((n = rrecv(fd, buf, sizeof buf, 0)) > 0) {
        if (sendAll(fd, buf, (size_t)n) != 0) {
            perror("rsend (server)");
            break;
        }
    }
    if (n < 0)
        perror("rrecv (server)");
    rclose(fd);
    return n == 0 ? NULL : (void *)1;
}

int main(void)
{
    static char out[kChunk], in[kChunk];
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    pthread_t thread;
    void *serverResult = NULL;
    int fd, i;
    size_t j;
    char c;

    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    listener = rsocket(AF_INET, SOCK_STREAM, 0);
    if (listener < 0 || rbind(listener, (struct sockaddr *)&a, sizeof a) != 0 ||
        rlisten(listener, 1) != 0 || rgetsockname(listener, (struct sockaddr *)&a, &len) != 0) {
        perror("listener");
        return 1;
    }
    if (pthread_create(&thread, NULL, echo, NULL) != 0) {
        fprintf(stderr, "pthread_create failed\n");
        return 1;
    }
    fd = rsocket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || rconnect(fd, (struct sockaddr *)&a, len) != 0) {
        perror("rconnect");
        return 1;
    }
    /* A chunk at a time, so that neither side's send waits for a reader that is sending too. */
    for (i = 0; i < kChunks; i++) {
        for (j = 0; j < sizeof out; j++)
            out[j] = (char)(i * 31 + j * 7);
        if (sendAll(fd, out, sizeof out) != 0) {
            perror("rsend (client)");
            return 1;
        }
        if (rrecv(fd, in, sizeof in, MSG_WAITALL) != (ssize_t)sizeof in) {
            perror("rrecv (client)");
            return 1;
        }
        if (memcmp(in, out, sizeof in) != 0) {
            fprintf(stderr, "chunk %d came back different\n", i);
            return 1;
        }
    }
    /* The server sees the end of the stream, closes, and the client reads its end. */
    if (rshutdown(fd, SHUT_WR) != 0 || rrecv(fd, &c, 1, 0) != 0) {
        fprintf(stderr, "no orderly end of the echo\n");
        return 1;
    }
    pthread_join(thread, &serverResult);
    rclose(fd);
    rclose(listener);
    if (serverResult != NULL)
        return 1;
    printf("echoed %d bytes, librstream %s\n", kChunk * kChunks, rstream_version());
    return 0;
}
