// SPDX-License-Identifier: MIT
// Provider selection and the shared fabric/domain cache.

#include "fabric.h"

#include <arpa/inet.h>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <map>
#include <mutex>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/random.h>

#include "address.h"
#include "log.h"

namespace rstream {

namespace {

constexpr uint32_t kApiVersion = FI_VERSION(1, 17);

std::mutex gDomainsMutex;
std::map<std::string, std::weak_ptr<Domain>> gDomains;
std::map<std::string, fid_fabric *> gFabrics; // fabrics live for the process

// A fork child opens a fabric and domain of its own: the parent's share its provider state (fds,
// progress sets) with the parent, and the parent's connections, inherited, keep them alive
// untouched. So the child forgets them here (they are never closed there).
std::atomic<uint32_t> gNonce{0};

void forgetDomainsInChild()
{
    gNonce.store(0, std::memory_order_relaxed);
    // Leaked on purpose: destroying the entries would close nothing, but keep it obvious.
    new std::map<std::string, std::weak_ptr<Domain>>(std::move(gDomains));
    new std::map<std::string, fid_fabric *>(std::move(gFabrics));
    gDomains.clear();
    gFabrics.clear();
    // Taken before the fork by this same thread: unlocked, not constructed anew over the held
    // lock (which TSan, and any checking mutex, still sees held).
    gDomainsMutex.unlock();
}

[[maybe_unused]] const int gForkHandlers = pthread_atfork(
    [] { gDomainsMutex.lock(); }, [] { gDomainsMutex.unlock(); }, forgetDomainsInChild);

fi_info *baseHints(const Settings &settings, const std::string &prov)
{
    fi_info *hints = fi_allocinfo();
    if (!hints)
        return nullptr;
    hints->ep_attr->type = FI_EP_MSG;
    hints->caps = FI_MSG | FI_RMA | FI_SEND | FI_RECV | FI_WRITE | FI_REMOTE_WRITE;
    hints->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
    hints->domain_attr->threading = FI_THREAD_SAFE;
    hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
    if (settings.strict)
        hints->domain_attr->mr_mode = FI_MR_BASIC;
    else
        hints->domain_attr->mr_mode =
            FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    hints->fabric_attr->prov_name = strdup(prov.c_str());
    return hints;
}

bool providerUsable(const std::string &prov)
{
    Settings s;
    fi_info *hints = baseHints(s, prov);
    if (!hints)
        return false;
    fi_info *info = nullptr;
    int ret = fi_getinfo(kApiVersion, nullptr, nullptr, 0, hints, &info);
    fi_freeinfo(hints);
    if (info)
        fi_freeinfo(info);
    return ret == 0;
}

// Whether the kernel has an RDMA device for verbs to open (libibverbs finds them the same way).
// Without one verbs cannot be had, and choosing tcp needs no libfabric, whose load (~0.3 s)
// then waits until a fabric socket is really made.
bool rdmaDevicePresent()
{
    DIR *d = opendir("/sys/class/infiniband_verbs");
    if (!d)
        return false;
    bool found = false;
    while (const dirent *e = readdir(d)) {
        if (std::strncmp(e->d_name, "uverbs", 6) == 0) {
            found = true;
            break;
        }
    }
    closedir(d);
    return found;
}

} // namespace

int fiErr(int ret)
{
    if (ret >= 0)
        return ret;
    int e = -ret;
    switch (e) {
    case FI_EAGAIN:
        return -EAGAIN;
    case FI_ECONNREFUSED:
        return -ECONNREFUSED;
    case FI_ETIMEDOUT:
        return -ETIMEDOUT;
    case FI_ENOKEY:
        return -ENOKEY;
    case FI_ENODATA:
        return -ENODATA;
    default:
        return e < FI_ERRNO_OFFSET ? -e : -EIO;
    }
}

uint64_t randomKey()
{
    uint64_t v = 0;
    while (getrandom(&v, sizeof(v), 0) != sizeof(v)) {
    }
    return v;
}

uint32_t processNonce()
{
    uint32_t n = gNonce.load(std::memory_order_relaxed);
    while (n == 0) {
        n = static_cast<uint32_t>(randomKey());
        uint32_t expected = 0;
        if (!gNonce.compare_exchange_strong(expected, n, std::memory_order_relaxed))
            n = expected;
    }
    return n;
}

const std::string &chooseProvider(const Settings &settings)
{
    static std::once_flag once;
    static std::string chosen;
    if (!settings.provider.empty())
        return settings.provider;
    std::call_once(once, [] {
        chosen = rdmaDevicePresent() && providerUsable("verbs") ? "verbs" : "tcp";
        RS_LOG(Debug, "provider %s chosen", chosen.c_str());
    });
    return chosen;
}

void loadFabric(const Settings &settings)
{
    // The first fi_getinfo sets up libfabric's providers: part of the cost of the load.
    providerUsable(chooseProvider(settings));
}

int getInfo(const Settings &settings, const sockaddr *src, socklen_t srcLen, const sockaddr *dst,
            socklen_t dstLen, fi_info **out)
{
    const std::string &prov = chooseProvider(settings);
    fi_info *hints = baseHints(settings, prov);
    if (!hints)
        return -ENOMEM;
    const sockaddr *any = dst ? dst : src;
    if (any)
        hints->addr_format = any->sa_family == AF_INET6 ? FI_SOCKADDR_IN6 : FI_SOCKADDR_IN;
    uint64_t flags = 0;
    std::string node;
    char service[8] = {};
    bool byName = false;
    if (dst) {
        if (src) {
            hints->src_addr = malloc(srcLen);
            memcpy(hints->src_addr, src, srcLen);
            hints->src_addrlen = srcLen;
        }
        hints->dest_addr = malloc(dstLen);
        memcpy(hints->dest_addr, dst, dstLen);
        hints->dest_addrlen = dstLen;
    } else if (src) {
        // A passive endpoint: by node and service with FI_SOURCE, since the provider drops the
        // port of a wildcard source address.
        bool wildcard;
        if (src->sa_family == AF_INET6) {
            auto *a = reinterpret_cast<const sockaddr_in6 *>(src);
            wildcard = IN6_IS_ADDR_UNSPECIFIED(&a->sin6_addr);
        } else {
            auto *a = reinterpret_cast<const sockaddr_in *>(src);
            wildcard = a->sin_addr.s_addr == htonl(INADDR_ANY);
        }
        snprintf(service, sizeof(service), "%d", addressPort(src));
        if (!wildcard)
            node = hostText(src);
        flags |= FI_SOURCE;
        byName = true;
    }
    fi_info *info = nullptr;
    int ret = fi_getinfo(kApiVersion, byName && !node.empty() ? node.c_str() : nullptr,
                         byName ? service : nullptr, flags, hints, &info);
    fi_freeinfo(hints);
    if (ret) {
        RS_LOG(Debug, "fi_getinfo(%s): %s", prov.c_str(), fi_strerror(-ret));
        return ret == -FI_ENODATA ? -EADDRNOTAVAIL : fiErr(ret);
    }
    // Keep the first match only.
    if (info->next) {
        fi_freeinfo(info->next);
        info->next = nullptr;
    }
    info->tx_attr->size = std::min<size_t>(info->tx_attr->size, settings.txSize);
    info->rx_attr->size = std::min<size_t>(info->rx_attr->size, settings.rxSize);
    *out = info;
    return 0;
}

Domain::~Domain()
{
    if (domain_)
        fi_close(&domain_->fid);
}

bool Domain::privateFor(const fi_info *info, bool strict)
{
    const uint64_t mr = info->domain_attr->mr_mode;
    const bool provKey = (mr & FI_MR_PROV_KEY) || (mr & FI_MR_BASIC) || strict;
    return provKey && !(mr & FI_MR_ENDPOINT);
}

int Domain::get(const fi_info *info, bool strict, std::shared_ptr<Domain> *out, bool forConnection)
{
    std::string key = std::string(info->fabric_attr->prov_name) + "/" + info->fabric_attr->name +
                      "/" + info->domain_attr->name + (strict ? "/strict" : "");
    const bool own = forConnection && privateFor(info, strict);
    std::lock_guard<std::mutex> lock(gDomainsMutex);
    if (auto d = own ? nullptr : gDomains[key].lock()) {
        *out = d;
        return 0;
    }
    fid_fabric *&fabric = gFabrics[key];
    if (!fabric) {
        int ret = fi_fabric(info->fabric_attr, &fabric, nullptr);
        if (ret) {
            fabric = nullptr;
            return fiErr(ret);
        }
    }
    auto d = std::make_shared<Domain>();
    d->fabric_ = fabric;
    int ret = fi_domain(fabric, const_cast<fi_info *>(info), &d->domain_, nullptr);
    if (ret) {
        d->domain_ = nullptr;
        return fiErr(ret);
    }
    ProviderCaps &c = d->caps_;
    uint64_t mr = info->domain_attr->mr_mode;
    if (mr & FI_MR_BASIC)
        mr |= FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED;
    c.name = info->fabric_attr->prov_name;
    // Strict mode registers local buffers and passes descriptors as verbs requires.
    c.mrLocal = (mr & FI_MR_LOCAL) || strict;
    c.virtAddr = mr & FI_MR_VIRT_ADDR;
    c.provKey = mr & FI_MR_PROV_KEY;
    c.mrEndpoint = mr & FI_MR_ENDPOINT;
    c.mrAllocated = mr & FI_MR_ALLOCATED;
    c.rxCqData = info->mode & FI_RX_CQ_DATA;
    c.cqDataSize = info->domain_attr->cq_data_size;
    c.keySize = info->domain_attr->mr_key_size ? info->domain_attr->mr_key_size : 8;
    c.injectSize = info->tx_attr->inject_size;
    c.maxTx = static_cast<uint32_t>(info->tx_attr->size);
    c.maxRx = static_cast<uint32_t>(info->rx_attr->size);
    c.iwarp = info->ep_attr->protocol == FI_PROTO_IWARP || c.cqDataSize < 4;
    c.placesInCalls = c.name == "tcp" && info->domain_attr->data_progress == FI_PROGRESS_MANUAL;
    c.waitSets = !strict;
    if (c.waitSets) {
        // Asked once a domain, not assumed from the provider's name.
        fid_wait *probe = nullptr;
        fi_wait_attr wattr{};
        wattr.wait_obj = FI_WAIT_FD;
        if (fi_wait_open(fabric, &wattr, &probe) == 0)
            fi_close(&probe->fid);
        else
            c.waitSets = false;
    }
    // The library in use, not the headers built against: tcp was rewritten in 1.18.
    const uint32_t lib = fabricLibraryVersion();
    c.levelWait = c.placesInCalls && c.waitSets && FI_MAJOR(lib) == 1 && FI_MINOR(lib) <= 17;
    c.quietSignal = c.levelWait && FI_MINOR(lib) >= 16;
    RS_LOG(Debug,
           "domain %s: mr_local=%d virt_addr=%d prov_key=%d mr_ep=%d rx_cq_data=%d "
           "cq_data=%zu inject=%zu tx=%u rx=%u iwarp=%d wait_sets=%d level_wait=%d quiet=%d",
           key.c_str(), c.mrLocal, c.virtAddr, c.provKey, c.mrEndpoint, c.rxCqData, c.cqDataSize,
           c.injectSize, c.maxTx, c.maxRx, c.iwarp, c.waitSets, c.levelWait, c.quietSignal);
    if (!own)
        gDomains[key] = d;
    *out = d;
    return 0;
}

} // namespace rstream
