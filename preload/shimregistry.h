// SPDX-License-Identifier: MIT
// What the shim's statistics (shimstats.cpp) and their live export (shimexport.cpp) share.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <netinet/in.h>
#include <string>
#include <vector>

#include "shimstats.h"
#include "statexport.h"

namespace rstream::shim {

// Incremented in every fork child: records of an older generation are the parent's.
extern std::atomic<uint32_t> gGeneration;

// The connections that closed, for RSTREAM_STATS (the most recent kMaxClosed).
constexpr size_t kMaxClosed = 4096;
struct ClosedRecord
{
    int fd;
    bool fabric;
    bool sameHost;
    Fallback why;
    bool accepted;
    sockaddr_in6 local; // or a sockaddr_in
    sockaddr_in6 peer;
    uint64_t sent;
    uint64_t received;
};

// An address stored as sockaddr_in6-sized words, as text (address.h).
std::string storedAddressText(const void *addr);

// The open records, the closed ones and the export; one lock, taken when a connection opens
// or closes, by the refresher when asked, and at exit.
struct Registry
{
    std::mutex mutex;
    std::vector<ConnRecord *> live;
    std::vector<ClosedRecord> closed; // a ring once full
    size_t closedNext = 0;
    uint64_t unlisted = 0;
    std::atomic<exportfile::Header *> header{nullptr};
    bool exportTried = false;
    std::vector<uint32_t> freeSlots;
    uint32_t nextSlot = 0;
    bool refresherStarted = false;

    Registry();
    static Registry &instance();

    exportfile::Header *ensureExportLocked();
    exportfile::Slot *claimLocked(ConnRecord &rec);
    void releaseLocked(ConnRecord &rec);
    void startRefresherLocked(exportfile::Header *h);
    void refresh(exportfile::Header *h, uint32_t request);
    void closedLocked(const ConnRecord &rec, uint64_t sent, uint64_t received);
};

// Copies the process counters into the export's header, when there is one.
void publishTotals();

} // namespace rstream::shim
