// SPDX-License-Identifier: MIT
// The riomap window table: ids, overlaps, record queue and the peer's windows.

#include "window_table.h"

#include <algorithm>
#include <cerrno>
#include <iterator>

namespace rstream {

bool WindowTable::overlapsLocal(uint64_t offset, uint64_t len) const
{
    for (const LocalWindow &w : local_)
        if (w.mr && offset < w.offset + w.len && w.offset < offset + len)
            return true;
    return false;
}

uint64_t WindowTable::offsetAboveLocal() const
{
    uint64_t off = 0;
    for (const LocalWindow &w : local_)
        if (w.mr)
            off = std::max<uint64_t>(off, (w.offset + w.len + 4095) & ~uint64_t(4095));
    return off;
}

bool WindowTable::freeId(uint32_t *id) const
{
    auto it = std::find(idUsed_.begin(), idUsed_.end(), false);
    if (it == idUsed_.end())
        return false;
    *id = static_cast<uint32_t>(it - idUsed_.begin());
    return true;
}

void WindowTable::addRemote(const LocalWindow &w, const wire::IoMapRecord &rec)
{
    records_.push_back({w.id, rec});
    idUsed_[w.id] = true;
    local_.push_back(w);
}

LocalWindow *WindowTable::findLocal(const void *buf, size_t len)
{
    auto it = std::find_if(local_.begin(), local_.end(),
                           [&](const LocalWindow &w) { return w.buf == buf && w.len == len; });
    return it == local_.end() ? nullptr : &*it;
}

bool WindowTable::removeLocal(LocalWindow *w, bool tell)
{
    bool told = false;
    if (w->mr) {
        const uint32_t id = w->id;
        idUsed_[id] = false;
        // An announcement still queued is dropped unsent; otherwise the peer is told. The
        // latest queued record of an id in use is its announcement, if any is queued.
        auto last = std::find_if(records_.rbegin(), records_.rend(),
                                 [&](const PendingRecord &p) { return p.id == id; });
        if (last != records_.rend() && last->rec.length != 0)
            records_.erase(std::next(last).base());
        else if (tell) {
            records_.push_back({id, wire::IoMapRecord{}});
            told = true;
        }
    }
    local_.erase(local_.begin() + (w - local_.data()));
    return told;
}

uint32_t WindowTable::removeAllLocal(bool tell)
{
    uint32_t told = 0;
    while (!local_.empty())
        told += removeLocal(&local_.back(), tell) ? 1 : 0;
    return told;
}

int WindowTable::onPeerRecord(uint32_t id, const uint8_t *record, bool virtAddr, const char **why)
{
    // The peer is not trusted: ids, ranges and the table's state are checked, and a peer that
    // breaks the rules is reset. Keys and addresses are the peer's own business (its provider
    // checks them); only their shape is.
    wire::IoMapRecord rec;
    if (id >= peer_.size() || wire::decodeIoMapRecord(record, wire::kIoMapRecordSize, &rec) < 0) {
        *why = "malformed window record";
        return -ECONNRESET;
    }
    PeerWindow &w = peer_[id];
    if (rec.length == 0) {
        if (w.length == 0) {
            *why = "peer withdrew a window it never announced";
            w = PeerWindow{};
            return -ECONNRESET;
        }
        w = PeerWindow{};
        return 1;
    }
    if (w.length != 0) {
        *why = "peer announced a window id twice";
        return -ECONNRESET;
    }
    if (!virtAddr && rec.addr != 0) {
        *why = "window address without FI_MR_VIRT_ADDR";
        return -ECONNRESET;
    }
    // Overlapping windows would make an offset ambiguous.
    for (const PeerWindow &o : peer_) {
        if (o.length && rec.offset < o.offset + o.length && o.offset < rec.offset + rec.length) {
            *why = "peer announced overlapping windows";
            return -ECONNRESET;
        }
    }
    w = rec;
    return 0;
}

const PeerWindow *WindowTable::findPeer(uint64_t offset, uint64_t len) const
{
    for (const PeerWindow &w : peer_)
        if (w.length && offset >= w.offset && offset - w.offset < w.length &&
            len <= w.length - (offset - w.offset))
            return &w;
    return nullptr;
}

} // namespace rstream
