// SPDX-License-Identifier: MIT
// A map from file descriptor numbers to objects: lock-free lookups, sized by use, not by rlimit.
#pragma once

#include <array>
#include <atomic>
#include <memory>

namespace rstream {

// Two levels: a fixed array of chunk pointers, each chunk allocated on first use and never
// freed, so a lookup is two loads and never takes a lock of ours. Entries are
// std::atomic<std::shared_ptr<T>>, so a close racing with a lookup leaves the looker with a
// reference that keeps the object alive until it is done.
template <class T>
class FdTable
{
public:
    static constexpr int kChunkBits = 10;
    static constexpr int kChunks = 4096; // descriptors below 4M are tracked
    static constexpr int kMaxFd = kChunks << kChunkBits;

    FdTable() = default;
    FdTable(const FdTable &) = delete;
    FdTable &operator=(const FdTable &) = delete;
    // Leaked on purpose: lookups may run from other static destructors and atexit handlers.
    ~FdTable() = default;

    std::shared_ptr<T> get(int fd) const
    {
        if (fd < 0 || fd >= kMaxFd)
            return nullptr;
        Chunk *c = chunks_[fd >> kChunkBits].load(std::memory_order_acquire);
        if (!c)
            return nullptr;
        return c->entries[fd & kMask].load(std::memory_order_acquire);
    }

    // Whether fd has an object, without taking a reference.
    bool has(int fd) const
    {
        if (fd < 0 || fd >= kMaxFd)
            return false;
        Chunk *c = chunks_[fd >> kChunkBits].load(std::memory_order_acquire);
        return c && c->used[fd & kMask].load(std::memory_order_acquire);
    }

    // Returns false when fd is out of range or memory is short.
    bool set(int fd, std::shared_ptr<T> obj)
    {
        if (fd < 0 || fd >= kMaxFd)
            return false;
        Chunk *c = chunk(fd >> kChunkBits);
        if (!c)
            return false;
        c->used[fd & kMask].store(obj != nullptr, std::memory_order_release);
        c->entries[fd & kMask].store(std::move(obj), std::memory_order_release);
        return true;
    }

    // Removes and returns the object, atomically: of two racing closes one gets it.
    std::shared_ptr<T> take(int fd)
    {
        if (fd < 0 || fd >= kMaxFd)
            return nullptr;
        Chunk *c = chunks_[fd >> kChunkBits].load(std::memory_order_acquire);
        if (!c)
            return nullptr;
        c->used[fd & kMask].store(false, std::memory_order_release);
        return c->entries[fd & kMask].exchange(nullptr, std::memory_order_acq_rel);
    }

private:
    static constexpr int kMask = (1 << kChunkBits) - 1;
    struct Chunk
    {
        std::array<std::atomic<std::shared_ptr<T>>, 1 << kChunkBits> entries{};
        std::array<std::atomic<bool>, 1 << kChunkBits> used{};
    };

    Chunk *chunk(int index)
    {
        Chunk *c = chunks_[index].load(std::memory_order_acquire);
        if (c)
            return c;
        auto *fresh = new (std::nothrow) Chunk();
        if (!fresh)
            return nullptr;
        if (chunks_[index].compare_exchange_strong(c, fresh, std::memory_order_acq_rel))
            return fresh;
        delete fresh; // another thread installed one first
        return c;
    }

    std::array<std::atomic<Chunk *>, kChunks> chunks_{};
};

} // namespace rstream
