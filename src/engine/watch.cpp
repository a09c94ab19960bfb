// SPDX-License-Identifier: MIT
// ReadyMarks: the keys connections mark for a poller, and the eventfd that wakes it.

#include "watch.h"

#include <cerrno>
#include <sys/eventfd.h>

#include "kernel.h"

namespace rstream {

std::shared_ptr<ReadyMarks> ReadyMarks::create()
{
    const int fd = sys::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0)
        return nullptr;
    return std::shared_ptr<ReadyMarks>(new ReadyMarks(fd));
}

ReadyMarks::~ReadyMarks()
{
    sys::close(fd_);
}

void ReadyMarks::mark(uint64_t key)
{
    std::lock_guard<std::mutex> lock(mutex_);
    keys_.push_back(key);
    if (signaled_)
        return; // the poller has not taken the last marks yet: it wakes for those
    signaled_ = true;
    const uint64_t one = 1;
    (void)sys::write(fd_, &one, sizeof(one)); // -EAGAIN only when already readable
}

void ReadyMarks::take(std::vector<uint64_t> *out)
{
    std::lock_guard<std::mutex> lock(mutex_);
    // Read whenever it woke the poller (the only time this is called): a signal handler may
    // have written it too (sigtrack.h), which mark() does not know of.
    uint64_t v;
    (void)sys::read(fd_, &v, sizeof(v));
    signaled_ = false;
    out->insert(out->end(), keys_.begin(), keys_.end());
    keys_.clear();
}

} // namespace rstream
