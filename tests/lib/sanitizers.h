// SPDX-License-Identifier: MIT
// Which sanitizer a test is built under, for GCC (__SANITIZE_*__) and clang (__has_feature).
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define RSTREAM_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RSTREAM_TEST_ASAN 1
#endif
#endif

#if defined(__SANITIZE_THREAD__)
#define RSTREAM_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RSTREAM_TEST_TSAN 1
#endif
#endif
