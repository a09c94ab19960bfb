// SPDX-License-Identifier: MIT
// TCP_INFO: the kernel's struct tcp_info (all of its fields, not glibc's shorter copy).

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <linux/tcp.h>

#include "socket.h"

namespace rstream {

int fillTcpInfo(const TcpInfoFields &f, void *val, socklen_t *len)
{
    if (!val || !len)
        return -EFAULT;
    struct tcp_info ti;
    std::memset(&ti, 0, sizeof(ti));
    ti.tcpi_state = f.state;
    // The fabric does its own reliability: nothing is ever retransmitted at this level.
    ti.tcpi_retransmits = 0;
    ti.tcpi_total_retrans = 0;
    ti.tcpi_snd_mss = f.mss;
    ti.tcpi_rcv_mss = f.mss;
    ti.tcpi_advmss = f.mss;
    ti.tcpi_pmtu = 65536;
    ti.tcpi_rtt = f.rttUs;
    ti.tcpi_rttvar = f.rttUs / 2;
    ti.tcpi_min_rtt = f.rttUs;
    ti.tcpi_rto = std::max<uint32_t>(200000, f.rttUs * 4);
    ti.tcpi_snd_cwnd = f.mss ? std::max<uint32_t>(1, f.sendBuf / f.mss) : 0;
    ti.tcpi_snd_ssthresh = 0x7fffffff;
    ti.tcpi_rcv_space = f.recvBuf;
    ti.tcpi_unacked = f.mss ? (f.unackedBytes + f.mss - 1) / f.mss : 0;
    ti.tcpi_notsent_bytes = 0;
    ti.tcpi_bytes_sent = f.bytesSent;
    ti.tcpi_bytes_acked = f.bytesSent >= f.unackedBytes ? f.bytesSent - f.unackedBytes : 0;
    ti.tcpi_bytes_received = f.bytesReceived;
    socklen_t n = std::min<socklen_t>(*len, sizeof(ti));
    std::memcpy(val, &ti, n);
    *len = n;
    return 0;
}

} // namespace rstream
