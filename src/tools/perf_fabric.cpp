// SPDX-License-Identifier: MIT
// rstream-perf's plain-libfabric pieces that its raw transports share: errors, closing, EQ
// events, listening.

#include <cstdio>
#include <string>

#include <rdma/fi_errno.h>

#include "perf_fabric.h"

namespace rstream::perf {

void logErr(const char *what, int err)
{
    fprintf(stderr, "rstream-perf: raw: %s: %s\n", what, fi_strerror(-err));
}

void closeFid(fid *f)
{
    if (f)
        fi_close(f);
}

int readEvent(fid_eq *eq, void *buf, size_t len, int timeoutMs, ssize_t *bytes)
{
    uint32_t event = 0;
    ssize_t ret = timeoutMs == 0 ? fi_eq_read(eq, &event, buf, len, 0)
                                 : fi_eq_sread(eq, &event, buf, len, timeoutMs, 0);
    if (ret == -FI_EAGAIN)
        return timeoutMs == 0 ? -EAGAIN : -ETIMEDOUT;
    if (ret == -FI_EAVAIL) {
        fi_eq_err_entry err = {};
        if (fi_eq_readerr(eq, &err, 0) >= 0 && err.err)
            return -err.err;
        return -EIO;
    }
    if (ret < 0)
        return int(ret);
    if (bytes)
        *bytes = ret;
    return int(event);
}

int listenOn(const fi_info *info, const char *name, const std::string &host, uint16_t port,
             Listening *out)
{
    fi_eq_attr eqAttr = {};
    eqAttr.wait_obj = FI_WAIT_UNSPEC;
    int ret = fi_fabric(info->fabric_attr, &out->fabric, nullptr);
    if (!ret)
        ret = fi_eq_open(out->fabric, &eqAttr, &out->eq, nullptr);
    if (!ret)
        ret = fi_passive_ep(out->fabric, const_cast<fi_info *>(info), &out->pep, nullptr);
    if (!ret)
        ret = fi_pep_bind(out->pep, &out->eq->fid, 0);
    if (!ret)
        ret = fi_listen(out->pep);
    if (ret) {
        logErr("listen", ret);
        return ret;
    }
    printf("rstream-perf: %s server on %s:%u (provider %s)\n", name, host.c_str(), port,
           info->fabric_attr->prov_name);
    fflush(stdout);
    return 0;
}

void closeListening(Listening *l)
{
    closeFid(l->pep ? &l->pep->fid : nullptr);
    closeFid(l->eq ? &l->eq->fid : nullptr);
    closeFid(l->fabric ? &l->fabric->fid : nullptr);
    *l = Listening{};
}

} // namespace rstream::perf
