// SPDX-License-Identifier: MIT
// rstream-stat: the connections of running preloaded processes, like ss for rstream sockets.
//
// Reads the live export each process keeps in /dev/shm/rstream-<pid> (see src/statexport.h):
// asks the process's refresher for fresh queues and credits, reads the slots under their
// seqlock, and completes kernel TCP connections with what the kernel reports for them
// (sock_diag: state, queues, bytes). Exports of processes that are gone are removed.

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/tcp.h>
#include <map>
#include <netinet/in.h>
#include <signal.h>
#include <string>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <vector>

#include "address.h"
#include "statexport.h"

using namespace rstream;
using namespace rstream::exportfile;

namespace {

constexpr int kRefreshWaitMs = 500;

struct Options
{
    bool json = false;
    std::vector<int> pids;
};

void usage(FILE *out)
{
    std::fprintf(out, "usage: rstream-stat [-j|--json] [PID...]\n"
                      "Shows the connections of running programs under the rstream preload shim\n"
                      "(all of them without PID): path (fabric or kernel TCP), state, bytes,\n"
                      "queues and flow-control credits, and why kernel connections fell back.\n"
                      "  -j, --json   one JSON object per process\n"
                      "  -h, --help\n");
}

// ---- Addresses --------------------------------------------------------------------------------

struct Address
{
    int family = 0; // AF_INET or AF_INET6; IPv4-mapped IPv6 addresses count as AF_INET
    uint8_t addr[16] = {};
    int port = 0;
};

Address fromSockaddr(const uint8_t *raw)
{
    Address a;
    sa_family_t fam;
    std::memcpy(&fam, raw, sizeof(fam));
    if (fam == AF_INET) {
        sockaddr_in in;
        std::memcpy(&in, raw, sizeof(in));
        a.family = AF_INET;
        std::memcpy(a.addr, &in.sin_addr, 4);
        a.port = ntohs(in.sin_port);
    } else if (fam == AF_INET6) {
        sockaddr_in6 in6;
        std::memcpy(&in6, raw, sizeof(in6));
        a.port = ntohs(in6.sin6_port);
        if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) {
            a.family = AF_INET;
            std::memcpy(a.addr, &in6.sin6_addr.s6_addr[12], 4);
        } else {
            a.family = AF_INET6;
            std::memcpy(a.addr, &in6.sin6_addr, 16);
        }
    }
    return a;
}

std::string text(const Address &a)
{
    sockaddr_storage ss{};
    if (a.family == AF_INET) {
        auto *in = reinterpret_cast<sockaddr_in *>(&ss);
        in->sin_family = AF_INET;
        in->sin_port = htons(a.port);
        std::memcpy(&in->sin_addr, a.addr, 4);
    } else if (a.family == AF_INET6) {
        auto *in6 = reinterpret_cast<sockaddr_in6 *>(&ss);
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons(a.port);
        std::memcpy(&in6->sin6_addr, a.addr, 16);
    }
    return addressText(reinterpret_cast<const sockaddr *>(&ss));
}

std::string jsonString(const std::string &s)
{
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\')
            out += '\\';
        if (static_cast<unsigned char>(c) < 0x20)
            continue;
        out += c;
    }
    return out + "\"";
}

// ---- What the kernel says about its TCP sockets (sock_diag) -----------------------------------

struct KernelInfo
{
    int state = 0;
    uint32_t recvQ = 0;
    uint32_t sendQ = 0;
    bool haveBytes = false;
    uint64_t sent = 0; // payload bytes sent (retransmissions not counted again)
    uint64_t received = 0;
};

const char *tcpStateName(int s)
{
    static const char *names[] = {"-",          "established", "syn-sent",  "syn-recv",
                                  "fin-wait1",  "fin-wait2",   "time-wait", "closed",
                                  "close-wait", "last-ack",    "listen",    "closing"};
    return s >= 0 && s < 12 ? names[s] : "?";
}

std::string tupleKey(const Address &local, const Address &peer)
{
    return text(local) + " " + text(peer);
}

// Every TCP socket of the machine's network namespace, by local and peer address.
std::map<std::string, KernelInfo> kernelSockets()
{
    std::map<std::string, KernelInfo> out;
    int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (fd < 0)
        return out;
    for (int family : {AF_INET, AF_INET6}) {
        struct
        {
            nlmsghdr nlh;
            inet_diag_req_v2 req;
        } msg{};
        msg.nlh.nlmsg_len = sizeof(msg);
        msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
        msg.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
        msg.req.sdiag_family = static_cast<uint8_t>(family);
        msg.req.sdiag_protocol = IPPROTO_TCP;
        msg.req.idiag_states = ~0u;
        msg.req.idiag_ext = 1 << (INET_DIAG_INFO - 1);
        if (send(fd, &msg, sizeof(msg), 0) < 0)
            break;
        bool done = false;
        while (!done) {
            alignas(nlmsghdr) char buf[32768];
            const ssize_t n = recv(fd, buf, sizeof(buf), 0);
            if (n <= 0)
                break;
            int len = static_cast<int>(n);
            for (auto *h = reinterpret_cast<nlmsghdr *>(buf); NLMSG_OK(h, len);
                 h = NLMSG_NEXT(h, len)) {
                if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) {
                    done = true;
                    break;
                }
                auto *m = static_cast<inet_diag_msg *>(NLMSG_DATA(h));
                Address local, peer;
                local.family = peer.family = m->idiag_family;
                std::memcpy(local.addr, m->id.idiag_src, 16);
                std::memcpy(peer.addr, m->id.idiag_dst, 16);
                local.port = ntohs(m->id.idiag_sport);
                peer.port = ntohs(m->id.idiag_dport);
                for (Address *a : {&local, &peer}) {
                    in6_addr v6;
                    std::memcpy(&v6, a->addr, 16);
                    if (a->family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&v6)) {
                        a->family = AF_INET;
                        std::memmove(a->addr, a->addr + 12, 4);
                    }
                }
                KernelInfo k;
                k.state = m->idiag_state;
                k.recvQ = m->idiag_rqueue;
                k.sendQ = m->idiag_wqueue;
                int alen = static_cast<int>(h->nlmsg_len - NLMSG_LENGTH(sizeof(*m)));
                for (auto *rta = reinterpret_cast<rtattr *>(m + 1); RTA_OK(rta, alen);
                     rta = RTA_NEXT(rta, alen)) {
                    if (rta->rta_type != INET_DIAG_INFO)
                        continue;
                    tcp_info ti{};
                    const size_t have = std::min<size_t>(RTA_PAYLOAD(rta), sizeof(ti));
                    std::memcpy(&ti, RTA_DATA(rta), have);
                    // Payload bytes sent once (bytes_acked would count the SYN too).
                    if (have >=
                        offsetof(tcp_info, tcpi_bytes_received) + sizeof(ti.tcpi_bytes_received)) {
                        k.haveBytes = true;
                        k.sent = have >= offsetof(tcp_info, tcpi_bytes_retrans) +
                                             sizeof(ti.tcpi_bytes_retrans)
                                     ? ti.tcpi_bytes_sent - ti.tcpi_bytes_retrans
                                     : ti.tcpi_bytes_acked;
                        k.received = ti.tcpi_bytes_received -
                                     tcpFinCounted(m->idiag_state, ti.tcpi_bytes_received);
                    }
                }
                out[tupleKey(local, peer)] = k;
            }
        }
    }
    close(fd);
    return out;
}

// ---- The export ---------------------------------------------------------------------------------

struct Row
{
    int fd;
    uint32_t path;
    Fallback why;
    bool accepted;
    uint64_t openedNs;
    Address local;
    Address peer;
    uint64_t sent;
    uint64_t received;
    bool refreshed;
    uint32_t engineState;
    int32_t engineError;
    uint32_t rttUs;
    uint64_t sendQueued;
    uint64_t recvQueued;
    uint64_t creditBytes;
    uint32_t creditSlots;
    uint64_t owedBytes;
    uint32_t owedSlots;
    uint32_t sendBuf; // ring sizes now (they grow for bulk transfers)
    uint32_t recvBuf;
    uint32_t ringResidentKib;
    // Kernel connections, from sock_diag.
    bool kernelKnown = false;
    KernelInfo kernel;
};

struct Process
{
    int pid;
    std::string program;
    std::string provider;
    bool refreshed = false; // the refresher answered
    bool refresher = false;
    uint32_t dropped = 0;
    uint64_t fabricConnections = 0;
    uint64_t sameHostConnections = 0; // of fabricConnections
    uint64_t fallbackConnections = 0;
    uint64_t fabricListeners = 0;
    uint64_t kernelListeners = 0;
    uint64_t fallbacks[kFallbackCount] = {};
    std::vector<Row> rows;
};

std::string exportPath(int pid)
{
    return std::string(kDir) + "/" + kPrefix + std::to_string(pid);
}

// Whether pid still runs the program that made its export (it maps the file); a process that
// died, or exec'd into something else, leaves a stale file.
bool live(int pid, const std::string &path)
{
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return false;
    FILE *maps = std::fopen(("/proc/" + std::to_string(pid) + "/maps").c_str(), "re");
    if (!maps)
        return true; // cannot tell (another user's process): believe the file
    char line[4096];
    bool found = false;
    while (!found && std::fgets(line, sizeof(line), maps)) {
        char *nl = std::strchr(line, '\n');
        if (nl)
            *nl = '\0';
        const size_t n = std::strlen(line);
        found = n >= path.size() && !std::strcmp(line + n - path.size(), path.c_str());
    }
    std::fclose(maps);
    return found;
}

int futexWait(std::atomic<uint32_t> *word, uint32_t expected, int ms)
{
    timespec ts{ms / 1000, (ms % 1000) * 1000000L};
    return static_cast<int>(syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAIT,
                                    expected, &ts, nullptr, 0));
}

int64_t monoMs()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// Asks the process's refresher for fresh engine fields; true once it answered. Returns the
// request number (0: none made).
uint32_t requestRefresh(Header *h, bool *answered)
{
    *answered = false;
    if (!h->refresher.load(std::memory_order_acquire))
        return 0;
    const uint32_t req = h->refreshRequest.fetch_add(1, std::memory_order_acq_rel) + 1;
    syscall(SYS_futex, reinterpret_cast<uint32_t *>(&h->refreshRequest), FUTEX_WAKE, INT_MAX,
            nullptr, nullptr, 0);
    const int64_t deadline = monoMs() + kRefreshWaitMs;
    for (;;) {
        const uint32_t done = h->refreshDone.load(std::memory_order_acquire);
        if (static_cast<int32_t>(done - req) >= 0) {
            *answered = true;
            return req;
        }
        const int64_t left = deadline - monoMs();
        if (left <= 0)
            return req;
        futexWait(&h->refreshDone, done, static_cast<int>(std::min<int64_t>(left, 50)));
    }
}

void readAddress(const std::atomic<uint64_t> (&words)[4], uint8_t out[32])
{
    uint64_t w[4];
    for (int i = 0; i < 4; i++)
        w[i] = words[i].load(std::memory_order_relaxed);
    std::memcpy(out, w, sizeof(w));
}

// Reads the export of pid; false when there is none (or it is stale, and then removed).
bool readProcess(int pid, Process *p, bool explicitPid)
{
    const std::string path = exportPath(pid);
    if (!live(pid, path)) {
        if (unlink(path.c_str()) == 0 && explicitPid)
            std::fprintf(stderr, "rstream-stat: removed the stale export of pid %d\n", pid);
        return false;
    }
    bool writable = true;
    int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && (errno == EACCES || errno == EPERM)) {
        writable = false;
        fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    }
    if (fd < 0) {
        if (explicitPid)
            std::fprintf(stderr, "rstream-stat: %s: %s\n", path.c_str(), strerror(errno));
        return false;
    }
    struct stat st;
    void *mem = MAP_FAILED;
    if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= kFileSize)
        mem = mmap(nullptr, kFileSize, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED,
                   fd, 0);
    close(fd);
    if (mem == MAP_FAILED) {
        if (explicitPid)
            std::fprintf(stderr, "rstream-stat: %s: not an rstream export\n", path.c_str());
        return false;
    }
    auto *h = static_cast<Header *>(mem);
    if (std::memcmp(h->magic, kMagic, sizeof(kMagic)) != 0 || h->version != kVersion ||
        h->slotSize != sizeof(Slot) || h->slotCount != kSlots || h->headerSize != kHeaderSize ||
        h->pid != pid) {
        if (explicitPid)
            std::fprintf(stderr, "rstream-stat: %s: unknown format\n", path.c_str());
        munmap(mem, kFileSize);
        return false;
    }
    p->pid = pid;
    p->program.assign(h->program, strnlen(h->program, sizeof(h->program)));
    p->provider.assign(h->provider, strnlen(h->provider, sizeof(h->provider)));
    p->refresher = h->refresher.load(std::memory_order_acquire) != 0;
    uint32_t request = 0;
    if (writable)
        request = requestRefresh(h, &p->refreshed);
    p->dropped = h->dropped.load(std::memory_order_relaxed);
    p->fabricConnections = h->fabricConnections.load(std::memory_order_relaxed);
    p->sameHostConnections = h->sameHostConnections.load(std::memory_order_relaxed);
    p->fallbackConnections = h->fallbackConnections.load(std::memory_order_relaxed);
    p->fabricListeners = h->fabricListeners.load(std::memory_order_relaxed);
    p->kernelListeners = h->kernelListeners.load(std::memory_order_relaxed);
    for (int i = 0; i < kFallbackCount; i++)
        p->fallbacks[i] = h->fallbacks[i].load(std::memory_order_relaxed);
    const uint32_t used = std::min(h->used.load(std::memory_order_acquire), kSlots);
    Slot *all = slots(h);
    for (uint32_t i = 0; i < used; i++) {
        Slot &s = all[i];
        for (int attempt = 0; attempt < 1000; attempt++) {
            const uint32_t q1 = s.seq.load(std::memory_order_acquire);
            if (q1 & 1)
                continue;
            if (s.state.load(std::memory_order_relaxed) != kOpen)
                break;
            Row r{};
            r.fd = s.fd.load(std::memory_order_relaxed);
            r.path = s.path.load(std::memory_order_relaxed);
            r.why = static_cast<Fallback>(s.fallback.load(std::memory_order_relaxed));
            r.accepted = s.accepted.load(std::memory_order_relaxed) != 0;
            r.openedNs = s.openedNs.load(std::memory_order_relaxed);
            uint8_t raw[32];
            readAddress(s.local, raw);
            r.local = fromSockaddr(raw);
            readAddress(s.peer, raw);
            r.peer = fromSockaddr(raw);
            r.sent = s.bytes.sent.load(std::memory_order_relaxed);
            r.received = s.bytes.received.load(std::memory_order_relaxed);
            const uint32_t refreshed = s.refreshed.load(std::memory_order_acquire);
            r.refreshed = request != 0 && refreshed == request;
            r.engineState = s.engineState.load(std::memory_order_relaxed);
            r.engineError = s.engineError.load(std::memory_order_relaxed);
            r.rttUs = s.rttUs.load(std::memory_order_relaxed);
            r.sendQueued = s.sendQueued.load(std::memory_order_relaxed);
            r.recvQueued = s.recvQueued.load(std::memory_order_relaxed);
            r.creditBytes = s.peerCreditBytes.load(std::memory_order_relaxed);
            r.creditSlots = s.peerCreditSlots.load(std::memory_order_relaxed);
            r.owedBytes = s.owedBytes.load(std::memory_order_relaxed);
            r.owedSlots = s.owedSlots.load(std::memory_order_relaxed);
            r.sendBuf = s.sendBuf.load(std::memory_order_relaxed);
            r.recvBuf = s.recvBuf.load(std::memory_order_relaxed);
            r.ringResidentKib = s.ringResidentKib.load(std::memory_order_relaxed);
            std::atomic_thread_fence(std::memory_order_acquire);
            if (s.seq.load(std::memory_order_relaxed) != q1)
                continue; // changed while we read it
            p->rows.push_back(r);
            break;
        }
    }
    munmap(mem, kFileSize);
    std::sort(p->rows.begin(), p->rows.end(),
              [](const Row &a, const Row &b) { return a.fd < b.fd; });
    return true;
}

// ---- Output -------------------------------------------------------------------------------------

std::string stateOf(const Row &r)
{
    if (r.path == kPathKernel)
        return r.kernelKnown ? tcpStateName(r.kernel.state) : "-";
    if (r.engineState < sizeof(kEngineStateNames) / sizeof(kEngineStateNames[0]))
        return kEngineStateNames[r.engineState];
    return "?";
}

std::string reasonsText(const Process &p)
{
    std::string s;
    for (int i = 1; i < kFallbackCount; i++) {
        if (!p.fallbacks[i])
            continue;
        s += (s.empty() ? "" : ", ") + std::string(kFallbackNames[i]) + " " +
             std::to_string(p.fallbacks[i]);
    }
    return s;
}

const char *pathName(uint32_t path)
{
    return path == kPathSameHost ? "same" : path == kPathFabric ? "fabric" : "kernel";
}

void printText(const Process &p)
{
    size_t fabric = 0, same = 0;
    for (const Row &r : p.rows) {
        fabric += r.path == kPathFabric;
        same += r.path == kPathSameHost;
    }
    // Same-host counts only where there are some: the line reads as before otherwise.
    char openSame[48] = "", sinceSame[48] = "";
    if (same)
        std::snprintf(openSame, sizeof(openSame), ", %zu same-host", same);
    if (p.sameHostConnections)
        std::snprintf(sinceSame, sizeof(sinceSame), " (%" PRIu64 " same-host)",
                      p.sameHostConnections);
    std::printf("pid %d (%s), provider %s: %zu open connection%s (%zu fabric%s, %zu kernel); "
                "since start %" PRIu64 " fabric%s, %" PRIu64 " kernel%s%s%s\n",
                p.pid, p.program.c_str(), p.provider.c_str(), p.rows.size(),
                p.rows.size() == 1 ? "" : "s", fabric, openSame, p.rows.size() - fabric - same,
                p.fabricConnections, sinceSame, p.fallbackConnections,
                p.fallbackConnections ? " (" : "", reasonsText(p).c_str(),
                p.fallbackConnections ? ")" : "");
    if (p.dropped)
        std::printf("  (%u connections not shown: the export's table was full)\n", p.dropped);
    if ((fabric || same) && !p.refreshed)
        std::printf("  (queues and credits not refreshed: the process did not answer)\n");
    if (p.rows.empty())
        return;
    std::printf("%-6s %-6s %-11s %-25s %-25s %12s %12s %8s %8s %12s %10s %15s %s\n", "FD", "PATH",
                "STATE", "LOCAL", "PEER", "SENT", "RECEIVED", "SEND-Q", "RECV-Q", "CREDIT", "OWED",
                "RINGS", "REASON");
    for (const Row &r : p.rows) {
        const bool fab = r.path == kPathFabric || r.path == kPathSameHost;
        std::string sent, received, sendQ, recvQ, credit = "-", owed = "-", rings = "-";
        if (fab) {
            sent = std::to_string(r.sent);
            received = std::to_string(r.received);
            sendQ = r.refreshed ? std::to_string(r.sendQueued) : "-";
            recvQ = r.refreshed ? std::to_string(r.recvQueued) : "-";
            if (r.refreshed) {
                credit = std::to_string(r.creditBytes) + "/" + std::to_string(r.creditSlots);
                owed = std::to_string(r.owedBytes) + "/" + std::to_string(r.owedSlots);
                rings = std::to_string(r.sendBuf) + "/" + std::to_string(r.recvBuf);
            }
        } else if (r.kernelKnown) {
            sent = r.kernel.haveBytes ? std::to_string(r.kernel.sent) : "-";
            received = r.kernel.haveBytes ? std::to_string(r.kernel.received) : "-";
            sendQ = std::to_string(r.kernel.sendQ);
            recvQ = std::to_string(r.kernel.recvQ);
        } else {
            sent = received = sendQ = recvQ = "-";
        }
        std::printf("%-6d %-6s %-11s %-25s %-25s %12s %12s %8s %8s %12s %10s %15s %s\n", r.fd,
                    pathName(r.path), stateOf(r).c_str(), text(r.local).c_str(),
                    text(r.peer).c_str(), sent.c_str(), received.c_str(), sendQ.c_str(),
                    recvQ.c_str(), credit.c_str(), owed.c_str(), rings.c_str(),
                    fab ? "-" : fallbackName(r.why));
    }
}

void printJson(const Process &p)
{
    std::string s = "{\"pid\": " + std::to_string(p.pid) +
                    ", \"program\": " + jsonString(p.program) +
                    ", \"provider\": " + jsonString(p.provider) +
                    ", \"fabric_connections\": " + std::to_string(p.fabricConnections) +
                    ", \"fallback_connections\": " + std::to_string(p.fallbackConnections) +
                    ", \"fabric_listeners\": " + std::to_string(p.fabricListeners) +
                    ", \"kernel_listeners\": " + std::to_string(p.kernelListeners) +
                    ", \"same_host_connections\": " + std::to_string(p.sameHostConnections) +
                    ", \"fallback_reasons\": {";
    for (int i = 1; i < kFallbackCount; i++)
        s += (i > 1 ? ", " : "") + jsonString(kFallbackNames[i]) + ": " +
             std::to_string(p.fallbacks[i]);
    s += "}, \"refreshed\": " + std::string(p.refreshed ? "true" : "false") +
         ", \"not_shown\": " + std::to_string(p.dropped) + ", \"connections\": [";
    bool first = true;
    for (const Row &r : p.rows) {
        const bool fab = r.path == kPathFabric || r.path == kPathSameHost;
        s += first ? "" : ", ";
        first = false;
        s += "{\"fd\": " + std::to_string(r.fd) + ", \"path\": \"" +
             (r.path == kPathSameHost ? "same_host"
              : fab                   ? "fabric"
                                      : "kernel") +
             "\", \"direction\": \"" + (r.accepted ? "accepted" : "connected") +
             "\", \"state\": " + jsonString(stateOf(r)) +
             ", \"local\": " + jsonString(text(r.local)) +
             ", \"peer\": " + jsonString(text(r.peer));
        auto num = [&](const char *name, uint64_t v, bool known) {
            s += std::string(", \"") + name + "\": " + (known ? std::to_string(v) : "null");
        };
        if (fab) {
            num("sent", r.sent, true);
            num("received", r.received, true);
            num("send_queued", r.sendQueued, r.refreshed);
            num("recv_queued", r.recvQueued, r.refreshed);
            num("peer_credit_bytes", r.creditBytes, r.refreshed);
            num("peer_credit_slots", r.creditSlots, r.refreshed);
            num("owed_bytes", r.owedBytes, r.refreshed);
            num("owed_slots", r.owedSlots, r.refreshed);
            num("rtt_us", r.rttUs, r.refreshed);
            num("send_ring", r.sendBuf, r.refreshed);
            num("recv_ring", r.recvBuf, r.refreshed);
            num("ring_resident", uint64_t(r.ringResidentKib) * 1024, r.refreshed);
        } else {
            num("sent", r.kernel.sent, r.kernelKnown && r.kernel.haveBytes);
            num("received", r.kernel.received, r.kernelKnown && r.kernel.haveBytes);
            num("send_queued", r.kernel.sendQ, r.kernelKnown);
            num("recv_queued", r.kernel.recvQ, r.kernelKnown);
            s += ", \"reason\": " + jsonString(fallbackName(r.why));
        }
        s += "}";
    }
    s += "]}";
    std::printf("%s\n", s.c_str());
}

// The pids with an export, in order.
std::vector<int> exportedPids()
{
    std::vector<int> pids;
    DIR *d = opendir(kDir);
    if (!d)
        return pids;
    const size_t plen = std::strlen(kPrefix);
    while (dirent *e = readdir(d)) {
        if (std::strncmp(e->d_name, kPrefix, plen) != 0)
            continue;
        const char *num = e->d_name + plen;
        char *end = nullptr;
        const long pid = std::strtol(num, &end, 10);
        if (*num && !*end && pid > 0 && pid <= INT_MAX)
            pids.push_back(static_cast<int>(pid));
    }
    closedir(d);
    std::sort(pids.begin(), pids.end());
    return pids;
}

} // namespace

int main(int argc, char **argv)
{
    Options o;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "-j" || a == "--json") {
            o.json = true;
        } else if (a == "-h" || a == "--help") {
            usage(stdout);
            return 0;
        } else {
            char *end = nullptr;
            const long pid = std::strtol(a.c_str(), &end, 10);
            if (a.empty() || *end || pid <= 0 || pid > INT_MAX) {
                usage(stderr);
                return 2;
            }
            o.pids.push_back(static_cast<int>(pid));
        }
    }
    const bool explicitPids = !o.pids.empty();
    const std::vector<int> pids = explicitPids ? o.pids : exportedPids();
    std::vector<Process> procs;
    int missing = 0;
    for (int pid : pids) {
        Process p;
        if (readProcess(pid, &p, explicitPids))
            procs.push_back(std::move(p));
        else if (explicitPids) {
            std::fprintf(stderr,
                         "rstream-stat: pid %d has no rstream connections to show (not under "
                         "the shim, no connection yet, or RSTREAM_EXPORT=0)\n",
                         pid);
            missing++;
        }
    }
    // Kernel connections: what the kernel says about them.
    bool anyKernel = false;
    for (const Process &p : procs)
        for (const Row &r : p.rows)
            anyKernel |= r.path == kPathKernel;
    if (anyKernel) {
        const auto kernel = kernelSockets();
        for (Process &p : procs)
            for (Row &r : p.rows) {
                if (r.path != kPathKernel)
                    continue;
                auto it = kernel.find(tupleKey(r.local, r.peer));
                if (it != kernel.end()) {
                    r.kernelKnown = true;
                    r.kernel = it->second;
                }
            }
    }
    for (size_t i = 0; i < procs.size(); i++) {
        if (o.json) {
            printJson(procs[i]);
        } else {
            if (i)
                std::printf("\n");
            printText(procs[i]);
        }
    }
    if (!explicitPids && procs.empty() && !o.json)
        std::printf("no process under the rstream shim has connections\n");
    return missing ? 1 : 0;
}
