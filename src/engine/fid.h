// SPDX-License-Identifier: MIT
// FidPtr: sole ownership of a libfabric object (endpoint, EQ, CQ, wait set, memory region),
// closed with fi_close when the handle goes.
#pragma once

#include <utility>

#include <rdma/fabric.h>

namespace rstream {

template <class T>
class FidPtr
{
public:
    FidPtr() = default;
    explicit FidPtr(T *p) : p_(p) {}
    ~FidPtr() { reset(); }
    FidPtr(const FidPtr &) = delete;
    FidPtr &operator=(const FidPtr &) = delete;
    FidPtr(FidPtr &&o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
    FidPtr &operator=(FidPtr &&o) noexcept
    {
        if (this != &o) {
            reset();
            p_ = std::exchange(o.p_, nullptr);
        }
        return *this;
    }

    // Objects depend on each other (an endpoint on its CQ and EQ, a CQ on its wait set): owners
    // close them with reset() in an order of their own rather than rely on member order.
    void reset()
    {
        if (p_)
            fi_close(&std::exchange(p_, nullptr)->fid);
    }
    // For the fi_*_open calls that create the object.
    T **out()
    {
        reset();
        return &p_;
    }
    T *get() const { return p_; }
    T *operator->() const { return p_; }
    // libfabric's calls take the plain pointer.
    operator T *() const { return p_; }

private:
    T *p_ = nullptr;
};

} // namespace rstream
