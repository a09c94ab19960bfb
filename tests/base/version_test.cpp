// SPDX-License-Identifier: MIT
// The build's version and the libfabric found at run time.

#include <cstdlib>
#include <cstring>
#include <string>

#include <gtest/gtest.h>
#include <rdma/fabric.h>

#include <rstream/version.h>

TEST(Version, MatchesBuild)
{
    const char *expected = std::getenv("RSTREAM_BUILD_VERSION");
    ASSERT_NE(expected, nullptr) << "meson test sets RSTREAM_BUILD_VERSION";
    EXPECT_STREQ(rstream_version(), expected);
}

TEST(Version, LibfabricAtRunTimeIsNewEnough)
{
    uint32_t v = fi_version();
    EXPECT_GE(v, FI_VERSION(1, 17)) << "libfabric " << FI_MAJOR(v) << "." << FI_MINOR(v);
    // The library loaded must be at least as new as the headers we were built with.
    EXPECT_GE(v, FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION));
}

TEST(Version, TcpProviderOffersMsgRma)
{
    fi_info *hints = fi_allocinfo();
    ASSERT_NE(hints, nullptr);
    hints->ep_attr->type = FI_EP_MSG;
    hints->caps = FI_MSG | FI_RMA;
    hints->fabric_attr->prov_name = strdup("tcp");
    fi_info *info = nullptr;
    int ret = fi_getinfo(FI_VERSION(1, 17), "127.0.0.1", nullptr, 0, hints, &info);
    fi_freeinfo(hints);
    ASSERT_EQ(ret, 0) << fi_strerror(-ret);
    ASSERT_NE(info, nullptr);
    EXPECT_STREQ(info->fabric_attr->prov_name, "tcp");
    fi_freeinfo(info);
}
