// SPDX-License-Identifier: MIT
// The riomap window table of a connection: our windows and their ids in the peer's table, the
// records queued to announce or withdraw them, and the peer's windows as its records said.
// Pure logic: the connection registers and closes the memory regions, and sends the records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include <rdma/fi_domain.h>

#include "wire.h"

namespace rstream {

// A window of ours the peer may write (remote), or a PROT_NONE mapping (mr null).
struct LocalWindow
{
    void *buf;
    size_t len;
    uint64_t offset;
    fid_mr *mr;
    uint32_t id;
};
// A window of the peer's, as its validated IOMAP record announced it (length 0: free).
using PeerWindow = wire::IoMapRecord;
struct PendingRecord
{
    uint32_t id;
    wire::IoMapRecord rec;
};

class WindowTable
{
public:
    // Once the hellos are known: the peer holds peerSize windows of ours (its ioMapSize), we
    // hold ourSize of the peer's (ours).
    void init(uint32_t peerSize, uint32_t ourSize)
    {
        idUsed_.assign(peerSize, false);
        peer_.assign(ourSize, PeerWindow{});
    }

    // Ours.
    bool overlapsLocal(uint64_t offset, uint64_t len) const;
    // The lowest offset, page aligned, above every remote window of ours.
    uint64_t offsetAboveLocal() const;
    // Room for one more window, so that adding it cannot fail after its region is registered.
    void reserveLocal() { local_.reserve(local_.size() + 1); }
    // A free id in the peer's table; false when it is full (its RDMA_IOMAPSIZE).
    bool freeId(uint32_t *id) const;
    // A remote window: its id is taken and its announcement queued.
    void addRemote(const LocalWindow &w, const wire::IoMapRecord &rec);
    // A PROT_NONE mapping: only recorded.
    void addLocal(const LocalWindow &w) { local_.push_back(w); }
    LocalWindow *findLocal(const void *buf, size_t len);
    // Takes w (found by findLocal(), its region closed by the caller) out of the table. A remote
    // window's id is free again; its announcement, if still queued, is dropped unsent, else the
    // peer is told when tell is set. true when a withdrawal was queued (the peer will answer it).
    bool removeLocal(LocalWindow *w, bool tell);
    const std::vector<LocalWindow> &local() const { return local_; }
    // All of ours go, as removeLocal() takes each (their regions closed by the caller); the
    // number of withdrawals queued.
    uint32_t removeAllLocal(bool tell);

    // Records in stream order, not sent yet; at most two per id.
    bool recordsEmpty() const { return records_.empty(); }
    const PendingRecord &nextRecord() const { return records_.front(); }
    void popRecord() { records_.pop_front(); }

    // The peer's. An IOMAP record from it: 0 for an announcement, 1 for a withdrawal (to be
    // answered with UNMAPPED), or -ECONNRESET with *why when it breaks the rules.
    // virtAddr: windows are addressed by virtual address (FI_MR_VIRT_ADDR).
    int onPeerRecord(uint32_t id, const uint8_t *record, bool virtAddr, const char **why);
    // The peer's window that holds [offset, offset + len), or null.
    const PeerWindow *findPeer(uint64_t offset, uint64_t len) const;

    // The heap the tables hold.
    size_t memoryBytes() const
    {
        return local_.capacity() * sizeof(LocalWindow) + idUsed_.capacity() / 8 +
               records_.size() * sizeof(PendingRecord) + peer_.capacity() * sizeof(PeerWindow);
    }

private:
    std::vector<LocalWindow> local_;
    std::vector<bool> idUsed_; // ids below the peer's ioMapSize
    std::deque<PendingRecord> records_;
    std::vector<PeerWindow> peer_; // the peer's, indexed by id (our ioMapSize)
};

} // namespace rstream
