// SPDX-License-Identifier: MIT
// The libfabric core provider: choice, fi_getinfo, and shared fabric/domain objects.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <sys/socket.h>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include "settings.h"

namespace rstream {

// What the provider told fi_getinfo it needs; the engine follows these, never tcp's habits.
struct ProviderCaps
{
    std::string name;
    bool mrLocal = false;     // FI_MR_LOCAL: local buffers registered, descriptors passed
    bool virtAddr = false;    // FI_MR_VIRT_ADDR: targets are virtual addresses, else offsets
    bool provKey = false;     // FI_MR_PROV_KEY: the provider chooses keys
    bool mrEndpoint = false;  // FI_MR_ENDPOINT: MRs are bound to the endpoint
    bool mrAllocated = false; // FI_MR_ALLOCATED: registered memory must be backed (pinned)
    bool rxCqData = false;    // FI_RX_CQ_DATA: writes with data consume posted receives
    size_t cqDataSize = 0;    // bytes of immediate data; 0 means none (iWarp mode)
    size_t keySize = 8;       // bytes of a requested key
    size_t injectSize = 0;
    uint32_t maxTx = 0;
    uint32_t maxRx = 0;
    bool iwarp = false; // the provider's protocol has no write with immediate
    // The fabric opens wait sets (fi_wait_open): a connection's CQ and EQ then share one. verbs
    // has none (fi_no_wait_open); strict mode does without, as verbs must.
    bool waitSets = true;
    // The provider touches our memory only inside our own calls into it (tcp, whose data
    // progress is manual) and registration pins nothing: a send ring whose writes all completed
    // can give its pages back under the connection's lock.
    bool placesInCalls = false;
    // The wait set's fd tells by itself when progress is due (tcp up to libfabric 1.17: an epoll
    // fd over the endpoint's socket and a signal the provider sets with every completion it
    // queues and with every send it could not finish), so that an arm made right after a read
    // that emptied the CQ needs no fi_trywait (see Connection::armLocked()).
    bool levelWait = false;
    // And every CQ read makes a progress pass (libfabric 1.16 and 1.17; before, only a read of
    // an empty CQ did): the wait set's signal can be taken out of the wait fd once connected
    // (quiet_signal.cpp).
    bool quietSignal = false;
};

// A fabric and domain pair shared by every endpoint on it.
class Domain
{
public:
    ~Domain();
    fid_fabric *fabric() const { return fabric_; }
    fid_domain *domain() const { return domain_; }
    const ProviderCaps &caps() const { return caps_; }

    // Finds or opens the domain that info names. A connection's endpoint gets a domain of its
    // own where remote keys would otherwise be valid across connections (forConnection and
    // privateFor()): with FI_MR_PROV_KEY and without FI_MR_ENDPOINT (verbs, strict mode), a key
    // is the provider's choice and valid from every endpoint of the protection domain, and
    // mlx5's keys are an index plus an 8-bit counter: a peer could guess another connection's.
    static int get(const fi_info *info, bool strict, std::shared_ptr<Domain> *out,
                   bool forConnection = false);
    static bool privateFor(const fi_info *info, bool strict);

private:
    fid_fabric *fabric_ = nullptr;
    fid_domain *domain_ = nullptr;
    ProviderCaps caps_;
};

// libfabric is loaded on first use (fiload.cpp), which takes a while (~0.3 s with its
// providers). Whether that is over, loaded or not: calls into libfabric no longer wait for it.
bool fabricLoadDone();
// Whether a file libfabric opens now, on this thread, is one it does better without: the
// preload shim's fopen() then says it does not exist. Only /proc/kallsyms, only inside the
// engine's own calls into libfabric, and only when the program had not loaded libfabric itself
// (fiload.cpp says why).
bool fabricHidesFile(const char *path);
// The loaded libfabric's fi_version() (it loads it if not yet); 0 if it could not be loaded.
uint32_t fabricLibraryVersion();
// Loads libfabric and sets up its providers now, on the calling thread, as the first fabric
// socket would (for callers that must not wait for it: they call this on another thread).
void loadFabric(const Settings &settings);
// The same on a thread of its own, for callers that must not wait (a nonblocking connect): true
// while it loads there (started by this call or an earlier one); false when libfabric is usable
// now, or when no thread could be had (the caller then loads it, as a blocking call does).
bool loadFabricInBackground(const Settings &settings);
// Whether the background load is over; an fd that becomes readable, for good, once it is (-1
// when none was started); and a wait for it (at most the load's ~0.3 s).
bool fabricLoadReady();
int fabricLoadFd();
void waitFabricLoad();
// Whether a fabric socket can be made now without waiting for the load (loaded here, or in
// the background and done).
bool fabricReady();

// The provider to use: Settings::provider, else verbs when the kernel has an RDMA device and
// verbs reports it, else tcp (chosen without loading libfabric when there is no device).
const std::string &chooseProvider(const Settings &settings);

// fi_getinfo for an endpoint that connects to dst (from src when given), or, with dst null,
// for a passive endpoint on src. Queue sizes are clamped to what the provider offers.
int getInfo(const Settings &settings, const sockaddr *src, socklen_t srcLen, const sockaddr *dst,
            socklen_t dstLen, fi_info **out);

// Converts a libfabric return code to -errno.
int fiErr(int ret);

// A random 64-bit value from the kernel (for MR keys).
uint64_t randomKey();

// A random nonzero id of this process (a fork child gets its own), which tells a listener that
// a connect comes from its own process.
uint32_t processNonce();

} // namespace rstream
