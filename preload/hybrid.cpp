// SPDX-License-Identifier: MIT
// The shim's sockets: fabric first, kernel TCP when the peer has no fabric listener.

#include "hybrid.h"
#include "clock.h"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <map>
#include <new>
#include <unistd.h>

#include "fabric.h"
#include "log.h"

namespace rstream {

namespace {
std::atomic<bool> gEngineUsed{false};

int portOf(const sockaddr *addr)
{
    if (addr->sa_family == AF_INET)
        return ntohs(reinterpret_cast<const sockaddr_in *>(addr)->sin_port);
    if (addr->sa_family == AF_INET6)
        return ntohs(reinterpret_cast<const sockaddr_in6 *>(addr)->sin6_port);
    return 0;
}

void setPort(sockaddr_storage *ss, int port)
{
    if (ss->ss_family == AF_INET)
        reinterpret_cast<sockaddr_in *>(ss)->sin_port = htons(static_cast<uint16_t>(port));
    else if (ss->ss_family == AF_INET6)
        reinterpret_cast<sockaddr_in6 *>(ss)->sin6_port = htons(static_cast<uint16_t>(port));
}

// The address bytes of an IPv4 or IPv6 address (v4-mapped addresses as IPv4).
int addressBytes(const sockaddr *addr, uint8_t out[16])
{
    std::memset(out, 0, 16);
    if (addr->sa_family == AF_INET) {
        std::memcpy(out, &reinterpret_cast<const sockaddr_in *>(addr)->sin_addr, 4);
        return AF_INET;
    }
    auto *in6 = reinterpret_cast<const sockaddr_in6 *>(addr);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
        std::memcpy(out, &in6->sin6_addr.s6_addr[12], 4);
        return AF_INET;
    }
    std::memcpy(out, &in6->sin6_addr, 16);
    return AF_INET6;
}

std::string describe(const sockaddr *addr)
{
    char buf[INET6_ADDRSTRLEN] = "?";
    uint8_t bytes[16];
    int fam = addressBytes(addr, bytes);
    inet_ntop(fam, bytes, buf, sizeof(buf));
    return std::string(buf) + ":" + std::to_string(portOf(addr));
}

// Destinations whose fabric connect failed recently: later connects go straight to the kernel.
// Expired entries go when looked up, and all of them whenever the map has doubled since the
// last sweep, so it holds about as many entries as there are live ones.
class NegativeCache
{
public:
    bool has(const std::string &key)
    {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = entries_.find(key);
        if (it == entries_.end())
            return false;
        if (nowMs() >= it->second) {
            entries_.erase(it);
            return false;
        }
        return true;
    }
    void add(const std::string &key, int ttlMs)
    {
        if (ttlMs <= 0)
            return;
        std::lock_guard<std::mutex> lock(mutex_);
        const int64_t now = nowMs();
        entries_[key] = now + ttlMs;
        if (entries_.size() >= sweepAt_) {
            std::erase_if(entries_, [now](const auto &e) { return now >= e.second; });
            sweepAt_ = std::max<size_t>(64, 2 * entries_.size());
        }
    }
    size_t size()
    {
        std::lock_guard<std::mutex> lock(mutex_);
        return entries_.size();
    }

private:
    std::mutex mutex_;
    std::map<std::string, int64_t> entries_;
    size_t sweepAt_ = 64;
};

// What the log says about a fallback (formatted only when the line is written). where: the
// fabric address (connects) or port (listeners) concerned; err: the fabric's errno.
std::string fallbackDetail(Fallback why, int port, const std::string &where, int err,
                           int timeoutMs = 0)
{
    switch (why) {
    case Fallback::Refused:
        return "nothing listens on " + where;
    case Fallback::Timeout:
        return "no answer from " + where + " within " + std::to_string(timeoutMs) + " ms";
    case Fallback::Excluded:
        return "RSTREAM_EXCLUDE";
    case Fallback::Ports:
        return "port " + std::to_string(port) + " is not in RSTREAM_PORTS";
    case Fallback::NegativeCache:
        return "the fabric at " + where + " failed less than RSTREAM_NEGATIVE_CACHE_MS ago";
    case Fallback::ProviderError:
    case Fallback::PortBusy:
        return where + ": " + strerror(err);
    case Fallback::Unsupported:
        return port ? "no fabric port for port " + std::to_string(port) : "address family";
    case Fallback::ForkChild:
        return "a socket inherited in a fork child";
    default:
        return "";
    }
}

NegativeCache &negativeCache()
{
    static auto *cache = new NegativeCache();
    return *cache;
}

// Sockets inherited across fork keep their engine objects alive, untouched, for good: the
// parent owns the connections, and destroying them here would disconnect the parent.
std::vector<std::shared_ptr<Socket>> &inheritedSockets()
{
    static auto *v = new std::vector<std::shared_ptr<Socket>>();
    return *v;
}

// A decimal number in lo..hi (digits only), or -1.
int parseNumber(const std::string &s, int lo, int hi)
{
    if (s.empty() || s.size() > 9 || !std::all_of(s.begin(), s.end(), ::isdigit))
        return -1;
    const int n = std::stoi(s);
    return n >= lo && n <= hi ? n : -1;
}

int envInt(const char *name, int def, int lo, int hi)
{
    const char *v = std::getenv(name);
    if (!v || !*v)
        return def;
    char *end;
    long n = std::strtol(v, &end, 10);
    if (*end || n < lo || n > hi) {
        RS_LOG(Warn, "%s=%s is not a number in %d..%d; using %d", name, v, lo, hi, def);
        return def;
    }
    return static_cast<int>(n);
}

} // namespace

bool engineUsed()
{
    return gEngineUsed.load(std::memory_order_relaxed);
}

ShimConfig ShimConfig::fromEnv()
{
    ShimConfig c;
    c.enabled = envInt("RSTREAM_ENABLE", 1, 0, 1) != 0;
    // verbs on IB/RoCE has a port space of its own: the fabric listener takes the app's port.
    // tcp (and iWarp) share the kernel's, so the fabric listener needs another one.
    const std::string &prov = chooseProvider(Settings::fromEnv());
    int defOffset = prov == "verbs" ? 0 : 20000;
    c.portOffset = envInt("RSTREAM_PORT_OFFSET", defOffset, 0, 65535);
    c.connectTimeoutMs = Settings::fromEnv().connectTimeoutMs;
    c.negativeCacheMs = envInt("RSTREAM_NEGATIVE_CACHE_MS", 30000, 0, 86400000);
    if (const char *ports = std::getenv("RSTREAM_PORTS")) {
        // "5201,6379,7000-7100"
        std::string s(ports);
        size_t pos = 0;
        while (pos < s.size()) {
            size_t end = s.find(',', pos);
            std::string item =
                s.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
            int lo = 0, hi = 0;
            char dash;
            if (std::sscanf(item.c_str(), "%d%c%d", &lo, &dash, &hi) == 3 && dash == '-')
                c.ports.emplace_back(lo, hi);
            else if (std::sscanf(item.c_str(), "%d", &lo) == 1)
                c.ports.emplace_back(lo, lo);
            else if (!item.empty())
                RS_LOG(Warn, "RSTREAM_PORTS: ignoring '%s'", item.c_str());
            if (end == std::string::npos)
                break;
            pos = end + 1;
        }
    }
    if (const char *ex = std::getenv("RSTREAM_EXCLUDE")) {
        // "10.0.0.0/8,192.168.1.5,::1,:22,127.0.0.1:6379"
        std::string s(ex);
        size_t pos = 0;
        while (pos <= s.size()) {
            size_t end = s.find(',', pos);
            std::string item =
                s.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
            if (!item.empty()) {
                Net n{};
                std::string addr = item;
                // A trailing :port (for IPv6 write [addr]:port).
                size_t colon = std::string::npos;
                bool ok = true;
                if (addr[0] == '[') {
                    const size_t close = addr.find(']');
                    if (close == std::string::npos)
                        ok = false;
                    else if (close + 1 < addr.size() && addr[close + 1] == ':')
                        colon = close + 1;
                    else if (close + 1 != addr.size())
                        ok = false;
                } else if (std::count(addr.begin(), addr.end(), ':') == 1) {
                    colon = addr.find(':');
                }
                if (colon != std::string::npos) {
                    // A port that does not parse must not become "any port".
                    n.port = parseNumber(addr.substr(colon + 1), 1, 65535);
                    ok = n.port > 0;
                    addr = addr.substr(0, colon);
                }
                if (!addr.empty() && addr.front() == '[' && addr.back() == ']')
                    addr = addr.substr(1, addr.size() - 2);
                size_t slash = addr.find('/');
                std::string host = addr.substr(0, slash);
                if (!ok) {
                } else if (host.empty()) {
                    n.family = 0; // any address
                } else if (inet_pton(AF_INET, host.c_str(), n.addr) == 1) {
                    n.family = AF_INET;
                    n.prefix = 32;
                } else if (inet_pton(AF_INET6, host.c_str(), n.addr) == 1) {
                    n.family = AF_INET6;
                    n.prefix = 128;
                } else {
                    ok = false;
                }
                if (ok && slash != std::string::npos) {
                    n.prefix =
                        parseNumber(addr.substr(slash + 1), 0, n.family == AF_INET ? 32 : 128);
                    ok = n.family != 0 && n.prefix >= 0;
                }
                if (ok)
                    c.exclude.push_back(n);
                else
                    RS_LOG(Warn, "RSTREAM_EXCLUDE: ignoring '%s'", item.c_str());
            }
            if (end == std::string::npos)
                break;
            pos = end + 1;
        }
    }
    return c;
}

int ShimConfig::fabricPort(int port) const
{
    if (port <= 0 || port > 65535)
        return 0;
    int p = port + portOffset;
    if (p > 65535)
        p = p - 65536 + 1024; // wrap above the privileged ports
    return p == port && portOffset ? 0 : p;
}

bool ShimConfig::portAllowed(int port) const
{
    if (ports.empty())
        return true;
    for (auto &r : ports)
        if (port >= r.first && port <= r.second)
            return true;
    return false;
}

bool ShimConfig::excluded(const sockaddr *addr) const
{
    uint8_t bytes[16];
    int fam = addressBytes(addr, bytes);
    int port = portOf(addr);
    for (auto &n : exclude) {
        if (n.port && n.port != port)
            continue;
        if (n.family == 0)
            return true;
        if (n.family != fam)
            continue;
        int bits = n.prefix, i = 0;
        bool match = true;
        for (; bits >= 8; bits -= 8, i++)
            if (bytes[i] != n.addr[i])
                match = false;
        if (match && bits > 0) {
            uint8_t mask = static_cast<uint8_t>(0xff << (8 - bits));
            match = (bytes[i] & mask) == (n.addr[i] & mask);
        }
        if (match)
            return true;
    }
    return false;
}

HybridSocket::HybridSocket(int fd, int family, bool nonblocking, const KernelOps &kops,
                           const ShimConfig &config)
    : fd_(fd), family_(family), k_(kops), config_(config)
{
    nonblock_.store(nonblocking, std::memory_order_relaxed);
}

std::pair<std::shared_ptr<Socket>, HybridSocket::Mode> HybridSocket::snapshot()
{
    std::lock_guard<std::mutex> lock(mutex_);
    return {sock_, mode_.load()};
}

std::shared_ptr<Socket> HybridSocket::socket()
{
    std::lock_guard<std::mutex> lock(mutex_);
    return sock_;
}

// The connection's record (and what it moved) goes with record_.
HybridSocket::~HybridSocket() = default;

void HybridSocket::setNonblocking(bool on)
{
    nonblock_.store(on, std::memory_order_relaxed);
    auto [s, m] = snapshot();
    if (m == Mode::Fabric && s)
        s->setNonblocking(on);
    if (m != Mode::Listener) {
        // The kernel fd follows, so forwarding to it (after a fallback) behaves the same.
        int fl = k_.fcntl(fd_, F_GETFL);
        if (fl >= 0)
            k_.fcntl(fd_, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
    }
}

int HybridSocket::getFlags()
{
    int fl = k_.fcntl(fd_, F_GETFL);
    if (fl < 0)
        return -errno;
    return nonblocking() ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
}

int HybridSocket::setFlags(int flags)
{
    setNonblocking(flags & O_NONBLOCK);
    int fl = flags;
    if (mode() == Mode::Listener)
        fl |= O_NONBLOCK; // the listener's kernel fd stays nonblocking; accept() emulates
    else
        fl = nonblocking() ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
    return k_.fcntl(fd_, F_SETFL, fl) < 0 ? -errno : 0;
}

int HybridSocket::applyOptions(Socket &s)
{
    for (auto &o : options_)
        s.setsockopt(o.level, o.name, o.value.data(), static_cast<socklen_t>(o.value.size()));
    return 0;
}

int HybridSocket::bind(const sockaddr *addr, socklen_t len)
{
    Mode m = mode();
    if (m == Mode::Fabric || m == Mode::Listener)
        return -EINVAL;
    if (k_.bind(fd_, addr, len) < 0)
        return -errno;
    std::lock_guard<std::mutex> lock(mutex_);
    boundLen_ = std::min<socklen_t>(len, sizeof(bound_));
    std::memcpy(&bound_, addr, boundLen_);
    return 0;
}

int HybridSocket::listen(int backlog)
{
    std::lock_guard<std::mutex> lock(mutex_);
    Mode m = mode_.load();
    if (m == Mode::Fabric)
        return -EINVAL;
    if (m == Mode::Inherited)
        return -EIO;
    if (k_.listen(fd_, backlog) < 0)
        return -errno;
    if (m == Mode::Listener || m == Mode::Kernel)
        return 0; // a new backlog for the kernel; the fabric listener keeps its own
    // The kernel picked the port if the application did not bind one.
    sockaddr_storage local{};
    socklen_t llen = sizeof(local);
    if (k_.getsockname(fd_, reinterpret_cast<sockaddr *>(&local), &llen) < 0)
        return -errno;
    int port = portOf(reinterpret_cast<sockaddr *>(&local));
    int fport = config_.fabricPort(port);
    std::shared_ptr<Socket> s;
    Fallback why = Fallback::None;
    int err = 0;
    if (noFabric_) {
        why = Fallback::ForkChild;
    } else if (!fport) {
        why = Fallback::Unsupported;
    } else if (!config_.portAllowed(port)) {
        why = Fallback::Ports;
    } else {
        gEngineUsed.store(true, std::memory_order_relaxed);
        s = std::make_shared<Socket>(family_);
        applyOptions(*s);
        s->setNonblocking(true);
        sockaddr_storage faddr = local;
        setPort(&faddr, fport);
        int r = s->bind(reinterpret_cast<sockaddr *>(&faddr), llen);
        if (r == 0)
            r = s->listen(backlog);
        if (r < 0) {
            why = r == -EADDRINUSE ? Fallback::PortBusy : Fallback::ProviderError;
            err = -r;
            s.reset();
        }
    }
    if (!s) {
        fallback_ = why;
        kernelListener_ = true;
        countListener(false);
        RS_LOG_FD(Info, fd_, "listener on port %d: kernel TCP only: %s (%s)", port,
                  fallbackName(why),
                  fallbackDetail(why, port, "fabric port " + std::to_string(fport), err).c_str());
        mode_.store(Mode::Kernel, std::memory_order_release);
        kernelGen_++;
        return 0;
    }
    // accept() waits on both; the kernel side must never block it.
    int fl = k_.fcntl(fd_, F_GETFL);
    if (fl >= 0)
        k_.fcntl(fd_, F_SETFL, fl | O_NONBLOCK);
    sock_ = std::move(s);
    appPort_ = port;
    countListener(true);
    mode_.store(Mode::Listener, std::memory_order_release);
    RS_LOG_FD(Debug, fd_, "listening on port %d: kernel TCP and fabric port %d", port, fport);
    return 0;
}

int HybridSocket::accept(sockaddr *addr, socklen_t *len, int flags,
                         std::shared_ptr<HybridSocket> *newSock)
{
    if (flags & ~(SOCK_NONBLOCK | SOCK_CLOEXEC))
        return -EINVAL;
    std::shared_ptr<Socket> listener;
    int timeout;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (mode_.load() != Mode::Listener)
            return -EINVAL;
        listener = sock_;
        timeout = rcvTimeoutMs_;
    }
    const int64_t deadline = timeout > 0 ? nowMs() + timeout : -1;
    for (;;) {
        // Alternate which side goes first, so neither starves the other.
        bool fabricFirst = acceptFabricFirst_.exchange(!acceptFabricFirst_.load());
        for (int pass = 0; pass < 2; pass++) {
            bool fabric = (pass == 0) == fabricFirst;
            if (fabric && listener) {
                std::shared_ptr<Socket> ns;
                int r = listener->accept(&ns, addr, len);
                if (r == 0) {
                    int nfd = k_.socket(family_, SOCK_STREAM | (flags & SOCK_CLOEXEC), 0);
                    if (nfd < 0)
                        return -errno; // the connection closes with ns
                    auto hs = std::make_shared<HybridSocket>(nfd, family_, flags & SOCK_NONBLOCK,
                                                             k_, config_);
                    ns->setNonblocking(flags & SOCK_NONBLOCK);
                    // The addresses as the application sees them: the peer's, and the port it
                    // listened on.
                    sockaddr_storage local{}, peer{};
                    socklen_t llen = sizeof(local), plen = sizeof(peer);
                    if (ns->localAddress(reinterpret_cast<sockaddr *>(&local), &llen) == 0)
                        setPort(&local, appPort_);
                    else
                        llen = 0;
                    if (ns->peerAddress(reinterpret_cast<sockaddr *>(&peer), &plen) != 0)
                        plen = 0;
                    auto record = std::make_unique<ConnRecord>(
                        nfd, true, Fallback::None, true, reinterpret_cast<sockaddr *>(&local), llen,
                        reinterpret_cast<sockaddr *>(&peer), plen);
                    record->setConnection(ns->connection());
                    hs->bytes_ = &record->bytes();
                    hs->record_ = std::move(record);
                    hs->sock_ = std::move(ns);
                    hs->appPort_ = appPort_;
                    hs->accepted_ = true;
                    hs->mode_.store(Mode::Fabric, std::memory_order_release);
                    if (addr && len) {
                        std::memcpy(addr, &peer, std::min(*len, plen));
                        *len = plen;
                    }
                    countFabricConnection();
                    RS_LOG_FD(Debug, nfd, "fabric connection accepted from %s",
                              plen ? describe(reinterpret_cast<sockaddr *>(&peer)).c_str() : "?");
                    *newSock = std::move(hs);
                    return nfd;
                }
                if (r != -EAGAIN)
                    RS_LOG_FD(Debug, fd_, "fabric accept: %s", strerror(-r));
            } else if (!fabric) {
                int r = k_.accept4(fd_, addr, len, flags);
                if (r >= 0)
                    return r; // the caller records it (kernel_peer)
                if (errno != EAGAIN && errno != EWOULDBLOCK)
                    return -errno;
            }
        }
        if (nonblocking())
            return -EAGAIN;
        int wait = -1;
        if (deadline >= 0) {
            wait = static_cast<int>(deadline - nowMs());
            if (wait <= 0)
                return -EAGAIN;
        }
        std::vector<pollfd> fds{{fd_, POLLIN, 0}};
        if (listener && listener->prepareWait(&fds, POLLIN) == -EAGAIN)
            continue;
        timespec ts{wait / 1000, (wait % 1000) * 1000000L};
        int r = k_.poll.ppoll(fds.data(), fds.size(), wait >= 0 ? &ts : nullptr, nullptr);
        if (r < 0 && errno == EINTR)
            return -EINTR;
    }
}

int HybridSocket::connectFabric(const sockaddr *addr, socklen_t len, std::shared_ptr<Socket> *out)
{
    std::shared_ptr<Socket> s;
    int r = startFabric(addr, len, &s);
    if (r != 0 && r != -EINPROGRESS)
        return r;
    // Bounded: a peer without a fabric listener refuses at once; one that does not answer
    // costs connectTimeoutMs, once per destination thanks to the negative cache.
    const int64_t deadline = nowMs() + config_.connectTimeoutMs;
    for (;;) {
        if (s->pollEvents(POLLOUT))
            break;
        int64_t left = deadline - nowMs();
        if (left <= 0)
            return -ETIMEDOUT;
        std::vector<pollfd> fds;
        if (s->prepareWait(&fds, POLLOUT) == -EAGAIN)
            continue;
        int wait = static_cast<int>(std::min<int64_t>(left, 100));
        timespec ts{0, wait * 1000000L};
        k_.poll.ppoll(fds.data(), fds.size(), &ts, nullptr);
    }
    int err = 0;
    socklen_t elen = sizeof(err);
    s->getsockopt(SOL_SOCKET, SO_ERROR, &err, &elen);
    if (err)
        return -err;
    *out = std::move(s);
    return 0;
}

int HybridSocket::connect(const sockaddr *addr, socklen_t len)
{
    settle();
    Mode m = mode();
    if (m == Mode::Fabric) {
        std::shared_ptr<Socket> s;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            s = sock_;
        }
        return s->connect(addr, len);
    }
    if (m == Mode::Listener)
        return -EISCONN;
    if (m == Mode::Inherited)
        return -EIO;
    if (m == Mode::Kernel) {
        {
            // A fabric attempt that fell back to a kernel connect which failed at once.
            std::lock_guard<std::mutex> lock(mutex_);
            if (deferredError_) {
                int e = deferredError_;
                deferredError_ = 0;
                return -e;
            }
        }
        // Again, after a kernel connect that failed or is in progress.
        if (k_.connect(fd_, addr, len) < 0) {
            const int err = errno;
            if (err == EINPROGRESS && addr) {
                std::lock_guard<std::mutex> lock(mutex_);
                recordKernelLocked(addr, len);
            }
            return -err;
        }
        if (addr) {
            std::lock_guard<std::mutex> lock(mutex_);
            recordKernelLocked(addr, len);
        }
        countFallbackIfEstablished();
        return 0;
    }
    if (!addr)
        return -EFAULT;
    if (len < sizeof(sa_family_t))
        return -EINVAL;

    // Undecided: the fabric when the destination may have a fabric listener.
    const bool inet = addr->sa_family == AF_INET || addr->sa_family == AF_INET6;
    const bool usable =
        addr->sa_family == family_ && len >= (family_ == AF_INET ? sizeof(sockaddr_in) : 24);
    const int port = usable ? portOf(addr) : 0;
    const int fport = config_.fabricPort(port);
    Fallback why = Fallback::None;
    std::string key; // the fabric destination
    int fabricErr = 0;
    if (noFabric_) {
        why = Fallback::ForkChild;
    } else if (!usable || !fport) {
        why = Fallback::Unsupported;
    } else if (!config_.portAllowed(port)) {
        why = Fallback::Ports;
    } else if (config_.excluded(addr)) {
        why = Fallback::Excluded;
    } else {
        sockaddr_storage dest{};
        std::memcpy(&dest, addr, std::min<socklen_t>(len, sizeof(dest)));
        setPort(&dest, fport);
        key = describe(reinterpret_cast<sockaddr *>(&dest));
        if (negativeCache().has(key)) {
            why = Fallback::NegativeCache;
        } else {
            std::shared_ptr<Socket> s;
            int r;
            if (nonblocking()) {
                // A nonblocking connect returns at once; the attempt settles later (settle()).
                r = startFabric(reinterpret_cast<sockaddr *>(&dest), len, &s);
                if (r == -EINPROGRESS) {
                    std::lock_guard<std::mutex> lock(mutex_);
                    pending_ = std::make_unique<Pending>();
                    std::memcpy(&pending_->addr, addr, std::min<socklen_t>(len, sizeof(dest)));
                    pending_->len = len;
                    pending_->key = key;
                    pending_->port = port;
                    pending_->fport = fport;
                    sock_ = std::move(s);
                    mode_.store(Mode::Fabric, std::memory_order_release);
                    tentative_.store(true, std::memory_order_release);
                    return -EINPROGRESS;
                }
            } else {
                r = connectFabric(reinterpret_cast<sockaddr *>(&dest), len, &s);
            }
            if (r == 0) {
                std::lock_guard<std::mutex> lock(mutex_);
                s->setNonblocking(nonblocking());
                if (!nonblocking())
                    s->confirmConnected();
                sock_ = std::move(s);
                adoptFabricLocked(addr, len, fport);
                // A nonblocking connect reports progress the way TCP does; POLLOUT is ready.
                return nonblocking() ? -EINPROGRESS : 0;
            }
            negativeCache().add(key, config_.negativeCacheMs);
            why = r == -ECONNREFUSED ? Fallback::Refused
                  : r == -ETIMEDOUT  ? Fallback::Timeout
                                     : Fallback::ProviderError;
            fabricErr = -r;
        }
    }
    return connectKernel(addr, len, inet, why, port, key, fabricErr);
}

void HybridSocket::adoptFabricLocked(const sockaddr *addr, socklen_t len, int fport)
{
    sockaddr_storage local{};
    socklen_t llen = sizeof(local);
    if (sock_->localAddress(reinterpret_cast<sockaddr *>(&local), &llen) != 0)
        llen = 0;
    auto record = std::make_unique<ConnRecord>(
        fd_, true, Fallback::None, false, reinterpret_cast<sockaddr *>(&local), llen, addr, len);
    record->setConnection(sock_->connection());
    bytes_ = &record->bytes();
    record_ = std::move(record);
    peerLen_ = std::min<socklen_t>(len, sizeof(peer_));
    std::memcpy(&peer_, addr, peerLen_);
    mode_.store(Mode::Fabric, std::memory_order_release);
    countFabricConnection();
    RS_LOG_FD(Debug, fd_, "fabric connection to %s (fabric port %d)", describe(addr).c_str(),
              fport);
}

int HybridSocket::connectKernel(const sockaddr *addr, socklen_t len, bool inet, Fallback why,
                                int port, const std::string &key, int fabricErr)
{
    // Kernel TCP on the application's own fd, with the options it set already applied.
    {
        std::lock_guard<std::mutex> lock(mutex_);
        fallback_ = why;
    }
    if (inet)
        RS_LOG_FD(Info, fd_, "kernel TCP to %s: %s (%s)", describe(addr).c_str(), fallbackName(why),
                  fallbackDetail(why, port, key, fabricErr, config_.connectTimeoutMs).c_str());
    mode_.store(Mode::Kernel, std::memory_order_release);
    kernelGen_++;
    if (k_.connect(fd_, addr, len) < 0) {
        const int err = errno;
        if (err == EINPROGRESS) {
            std::lock_guard<std::mutex> lock(mutex_);
            recordKernelLocked(addr, len);
        }
        return -err;
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        recordKernelLocked(addr, len);
    }
    countFallbackIfEstablished();
    return 0;
}

int HybridSocket::startFabric(const sockaddr *addr, socklen_t len, std::shared_ptr<Socket> *out)
{
    gEngineUsed.store(true, std::memory_order_relaxed);
    auto s = std::make_shared<Socket>(family_);
    applyOptions(*s);
    s->setNonblocking(true);
    int r = s->connect(addr, len);
    if (r != 0 && r != -EINPROGRESS)
        return r;
    *out = std::move(s);
    return r;
}

void HybridSocket::settleSlow()
{
    // One thread settles; the others see the outcome.
    std::lock_guard<std::mutex> settleLock(settleMutex_);
    if (!tentative_.load(std::memory_order_acquire))
        return;
    std::shared_ptr<Socket> s;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        s = sock_;
    }
    const int st = s ? s->connectStatus() : -ENOTCONN;
    if (st == -EINPROGRESS)
        return; // the engine's connect deadline bounds it
    std::unique_ptr<Pending> p;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        p = std::move(pending_);
        if (!p) {
            tentative_.store(false, std::memory_order_release);
            return;
        }
        if (st == 0) {
            adoptFabricLocked(reinterpret_cast<sockaddr *>(&p->addr), p->len, p->fport);
            tentative_.store(false, std::memory_order_release);
            return;
        }
        // The fabric attempt failed: kernel TCP on the same fd, as a blocking connect would
        // have done at once.
        sock_.reset();
    }
    negativeCache().add(p->key, config_.negativeCacheMs);
    const Fallback why = st == -ECONNREFUSED ? Fallback::Refused
                         : st == -ETIMEDOUT  ? Fallback::Timeout
                                             : Fallback::ProviderError;
    int r = connectKernel(reinterpret_cast<sockaddr *>(&p->addr), p->len, true, why, p->port,
                          p->key, -st);
    if (r < 0 && r != -EINPROGRESS) {
        // Failed at once (nothing listens on kernel TCP either): reported by SO_ERROR and
        // connect() as the kernel would have after a nonblocking connect.
        std::lock_guard<std::mutex> lock(mutex_);
        deferredError_ = -r;
    }
    tentative_.store(false, std::memory_order_release);
}

void HybridSocket::recordKernelLocked(const sockaddr *peer, socklen_t peerLen)
{
    if (record_ || (peer->sa_family != AF_INET && peer->sa_family != AF_INET6))
        return;
    sockaddr_storage local{};
    socklen_t llen = sizeof(local);
    if (k_.getsockname(fd_, reinterpret_cast<sockaddr *>(&local), &llen) != 0)
        llen = 0;
    record_ = std::make_unique<ConnRecord>(
        fd_, false, fallback_, false, reinterpret_cast<sockaddr *>(&local), llen, peer, peerLen);
}

ssize_t HybridSocket::send(const iovec *iov, int iovcnt, int flags)
{
    Mode m = mode();
    if (m == Mode::Inherited)
        return -EIO;
    if (m != Mode::Fabric)
        return -ENOTSOCK; // the shim forwards other modes to the kernel
    std::shared_ptr<Socket> s = socket();
    ssize_t r = s->send(iov, iovcnt, flags);
    if (r > 0)
        bytes_->sent.fetch_add(static_cast<uint64_t>(r), std::memory_order_relaxed);
    return r;
}

ssize_t HybridSocket::recv(const iovec *iov, int iovcnt, int flags)
{
    Mode m = mode();
    if (m == Mode::Inherited)
        return -EIO;
    if (m != Mode::Fabric)
        return -ENOTSOCK;
    std::shared_ptr<Socket> s = socket();
    ssize_t r = s->recv(iov, iovcnt, flags);
    if (r > 0 && !(flags & MSG_PEEK))
        bytes_->received.fetch_add(static_cast<uint64_t>(r), std::memory_order_relaxed);
    return r;
}

int HybridSocket::shutdown(int how)
{
    auto [s, m] = snapshot();
    switch (m) {
    case Mode::Fabric:
        return s->shutdown(how);
    case Mode::Inherited:
        return -EIO;
    case Mode::Listener:
        if (s)
            s->shutdown(how);
        [[fallthrough]];
    default:
        return k_.shutdown(fd_, how) < 0 ? -errno : 0;
    }
}

int HybridSocket::setsockopt(int level, int name, const void *val, socklen_t len)
{
    settle();
    std::lock_guard<std::mutex> lock(mutex_);
    Mode m = mode_.load();
    // While a fabric attempt is in progress the kernel fd keeps the option too: a fallback
    // connects it.
    const bool tentative = tentative_.load(std::memory_order_acquire);
    if (m == Mode::Fabric && !tentative)
        return sock_->setsockopt(level, name, val, len);
    if (m == Mode::Inherited)
        return -EIO;
    // The kernel validates and keeps it (a fallback needs it); the engine gets it too.
    if (k_.setsockopt(fd_, level, name, val, len) < 0)
        return -errno;
    if (level == SOL_SOCKET && name == SO_RCVTIMEO && val && len >= sizeof(timeval)) {
        timeval tv;
        std::memcpy(&tv, val, sizeof(tv));
        rcvTimeoutMs_ = static_cast<int>(tv.tv_sec * 1000 + tv.tv_usec / 1000);
    }
    if ((m == Mode::Listener || m == Mode::Fabric) && sock_) {
        sock_->setsockopt(level, name, val, len);
        return 0;
    }
    auto it = std::find_if(options_.begin(), options_.end(),
                           [&](const Option &o) { return o.level == level && o.name == name; });
    Option o{level, name,
             std::vector<uint8_t>(static_cast<const uint8_t *>(val),
                                  static_cast<const uint8_t *>(val) + len)};
    if (it != options_.end())
        *it = std::move(o);
    else
        options_.push_back(std::move(o));
    return 0;
}

int HybridSocket::getsockopt(int level, int name, void *val, socklen_t *len)
{
    settle();
    auto [s, m] = snapshot();
    if (m == Mode::Kernel && level == SOL_SOCKET && name == SO_ERROR && val && len &&
        *len >= sizeof(int)) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (deferredError_) {
            std::memcpy(val, &deferredError_, sizeof(int));
            *len = sizeof(int);
            deferredError_ = 0;
            return 0;
        }
    }
    if (m == Mode::Fabric)
        return s->getsockopt(level, name, val, len);
    if (m == Mode::Inherited)
        return -EIO;
    return k_.getsockopt(fd_, level, name, val, len) < 0 ? -errno : 0;
}

int HybridSocket::getsockname(sockaddr *addr, socklen_t *len)
{
    auto [s, m] = snapshot();
    if (m != Mode::Fabric)
        return k_.getsockname(fd_, addr, len) < 0 ? -errno : 0;
    int r = s->localAddress(addr, len);
    if (r == 0 && accepted_ && appPort_ && addr)
        setPort(reinterpret_cast<sockaddr_storage *>(addr), appPort_); // the port it listened on
    return r;
}

int HybridSocket::getpeername(sockaddr *addr, socklen_t *len)
{
    std::shared_ptr<Socket> s;
    Mode m;
    sockaddr_storage peer;
    socklen_t plen;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        s = sock_;
        m = mode_.load();
        peer = peer_;
        plen = peerLen_;
    }
    if (m != Mode::Fabric)
        return k_.getpeername(fd_, addr, len) < 0 ? -errno : 0;
    if (!accepted_) {
        // The address the application connected to, not the fabric listener's port.
        int r = s->peerAddress(addr, len);
        if (r < 0)
            return r;
        if (!addr || !len)
            return -EFAULT;
        std::memcpy(addr, &peer, std::min(*len, plen));
        *len = plen;
        return 0;
    }
    return s->peerAddress(addr, len);
}

int HybridSocket::fionread(int *bytes)
{
    std::shared_ptr<Socket> s = socket();
    if (mode() != Mode::Fabric || !s)
        return -ENOTTY;
    return s->readable(bytes);
}

void HybridSocket::onFdClosed(int fd)
{
    if (mode() != Mode::Kernel)
        return;
    if (fd == fd_)
        countFallbackIfEstablished();
    // What the kernel moved, while a descriptor of it is still open.
    std::lock_guard<std::mutex> lock(mutex_);
    if (record_)
        record_->readKernelBytes(k_.getsockopt, fd);
}

void HybridSocket::noteExit()
{
    if (mode() == Mode::Kernel)
        countFallbackIfEstablished();
}

bool HybridSocket::kernelListener(Fallback *why)
{
    std::lock_guard<std::mutex> lock(mutex_);
    *why = fallback_;
    return kernelListener_;
}

void HybridSocket::countFallbackIfEstablished()
{
    std::lock_guard<std::mutex> lock(mutex_);
    if (fallbackCounted_ || kernelListener_)
        return;
    sockaddr_storage peer;
    socklen_t plen = sizeof(peer);
    if (k_.getpeername(fd_, reinterpret_cast<sockaddr *>(&peer), &plen) == 0) {
        fallbackCounted_ = true;
        countFallback(fallback_);
        if (record_)
            record_->markEstablished();
    }
}

void HybridSocket::markInherited()
{
    // Runs in a fork child, where only the forking thread exists: a lock another parent thread
    // held at the fork would never be released, so the mutex starts over.
    new (&mutex_) std::mutex();
    std::lock_guard<std::mutex> lock(mutex_);
    noFabric_ = true;
    // A fabric attempt in progress stays the parent's: the child's copy is inherited.
    tentative_.store(false, std::memory_order_relaxed);
    pending_.reset();
    if (sock_)
        inheritedSockets().push_back(std::move(sock_));
    Mode m = mode_.load();
    if (m == Mode::Fabric)
        mode_.store(Mode::Inherited, std::memory_order_release);
    // A listener keeps accepting over kernel TCP (its fabric side stays with the parent).
}

void HybridSocket::onForkParent()
{
    std::shared_ptr<Socket> s;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (mode_.load() != Mode::Listener)
            return;
        s = sock_;
    }
    if (s)
        s->setBackgroundAccept(false);
}

int HybridSocket::kernelPollNow(int events)
{
    pollfd p{fd_, static_cast<short>(events), 0};
    const timespec zero{0, 0};
    int r = k_.poll.ppoll(&p, 1, &zero, nullptr);
    return r > 0 ? p.revents : 0;
}

int HybridSocket::pollEvents(int events)
{
    settle();
    auto [s, m] = snapshot();
    switch (m) {
    case Mode::Fabric:
        return s->pollEvents(events);
    case Mode::Listener: {
        int rev = kernelPollNow(POLLIN);
        if (s)
            rev |= s->pollEvents(POLLIN);
        return rev & (events | POLLERR | POLLHUP);
    }
    case Mode::Inherited:
        return POLLERR | POLLHUP;
    default:
        return kernelPollNow(events);
    }
}

int HybridSocket::prepareWait(std::vector<pollfd> *fds, int events)
{
    settle();
    auto [s, m] = snapshot();
    switch (m) {
    case Mode::Fabric:
        return s->prepareWait(fds, events);
    case Mode::Listener:
        fds->push_back({fd_, POLLIN, 0});
        return s ? s->prepareWait(fds, POLLIN) : 0;
    case Mode::Inherited:
        return 0;
    default:
        fds->push_back({fd_, static_cast<short>(events), 0});
        return 0;
    }
}

void HybridSocket::addWaiter(int eventFd, std::vector<std::shared_ptr<Connection>> *registered)
{
    settle();
    std::shared_ptr<Socket> s = socket();
    Mode m = mode();
    if (s && (m == Mode::Fabric || m == Mode::Listener))
        s->addWaiter(eventFd, registered);
}

uint64_t HybridSocket::generation(int events)
{
    std::shared_ptr<Socket> s = socket();
    if (mode() == Mode::Fabric && s)
        return s->generation(events);
    // Kernel-backed readiness has no event count: every look counts as new (EPOLLET acts as
    // level-triggered there, which costs a spurious wake-up, never a lost one).
    return kernelGen_.fetch_add(1, std::memory_order_relaxed);
}

int HybridSocket::kernelFd()
{
    return mode() == Mode::Kernel ? fd_ : -1;
}

std::string HybridSocket::debugState()
{
    std::shared_ptr<Socket> s = socket();
    std::string r = "fd=" + std::to_string(fd_) + " mode=" + std::to_string(int(mode()));
    if (mode() == Mode::Kernel) {
        std::lock_guard<std::mutex> lock(mutex_);
        r += std::string(" fallback=") + fallbackName(fallback_);
    }
    if (s)
        r += " " + s->debugState();
    return r;
}

} // namespace rstream
