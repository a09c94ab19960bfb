/* SPDX-License-Identifier: MIT */
/* rstream library version query. */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the rstream library in use, "MAJOR.MINOR.PATCH". */
const char *rstream_version(void)
#ifdef __cplusplus
    noexcept
#endif
    ;

#ifdef __cplusplus
}
#endif
