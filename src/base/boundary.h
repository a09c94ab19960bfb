// SPDX-License-Identifier: MIT
// The C boundary of the exported APIs: -errno becomes -1 with errno set, exactly once.
#pragma once

#include <cerrno>
#include <cxxabi.h>
#include <new>

namespace rstream {

// Runs f (which returns a count or -errno) and converts -errno to -1/errno. Nothing but a
// thread cancellation's forced unwind leaves as an exception; anything else is reported through
// internalError (once is enough) and becomes EIO. errno is left as the caller had it on success,
// as a syscall leaves it.
// Without UBSan's checks (f keeps its own): libsupc++ binds catch (abi::__forced_unwind &) to a
// null object, a cancellation being no C++ exception, which UBSan takes for a null reference.
// GCC 12 ignores no_sanitize("null") on a template, hence all of UBSan.
#if defined(__clang__)
#define RSTREAM_NO_UBSAN __attribute__((no_sanitize("undefined")))
#else
#define RSTREAM_NO_UBSAN __attribute__((no_sanitize_undefined))
#endif
template <class F, class E>
RSTREAM_NO_UBSAN auto cBoundary(F &&f, E &&internalError) -> decltype(f())
{
    const int saved = errno;
    try {
        auto r = f();
        if (r < 0) {
            errno = static_cast<int>(-r);
            return -1;
        }
        errno = saved;
        return r;
    } catch (abi::__forced_unwind &) {
        throw;
    } catch (const std::bad_alloc &) {
        errno = ENOMEM;
        return -1;
    } catch (...) {
        internalError();
        errno = EIO;
        return -1;
    }
}

} // namespace rstream
