#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# scripts/bench's idle-connection client: holds N connections to a redis server idle after one
# request each, and prints what they cost both processes (RSS and descriptors per connection,
# CPU while going idle and then idle) as KEY=VALUE pairs on one line. With RSTREAM_STAT (the path of rstream-stat),
# both processes being under the shim, it waits until rstream-stat shows every connection on
# the fabric at both ends (or on the same-host transport, which the fabric sets up) before it
# measures, and adds their rings' size per connection.
# Usage: bench-idle.py PORT N SERVER_PID SETTLE_SECONDS [RSTREAM_STAT]
# A connection moves to the fabric during its program's own calls on it, and its switch fails
# when they stop for RSTREAM_UPGRADE_TIMEOUT_MS (2 s) once the peer is ready; so connections
# are opened RSTREAM_BENCH_IDLE_BATCH (default 25) at a time, and each batch gets a request
# every ~0.1 s until it has moved.
import json
import os
import socket
import subprocess
import sys
import time

CLK = os.sysconf("SC_CLK_TCK")
RELEASE_S = 4.5  # twice the engine's ring idle time, and a margin


def rss_kib(pid):
    with open("/proc/%s/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS for %s" % pid)


def fds(pid):
    return len(os.listdir("/proc/%s/fd" % pid))


def cpu_s(pid):  # utime + stime of every thread of pid
    with open("/proc/%s/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def ping(s):
    s.sendall(b"PING\r\n")
    got = b""
    while not got.endswith(b"\r\n"):
        chunk = s.recv(64)
        if not chunk:
            raise RuntimeError("server closed a connection")
        got += chunk
    if got != b"+PONG\r\n":
        raise RuntimeError("unexpected reply %r" % got)


def fabric(stat, pid):
    """The established connections of pid off kernel TCP (fabric or same-host: scripts/bench
    checks which from the statistics), as rstream-stat -j lists them."""
    r = subprocess.run([stat, "-j", str(pid)], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return []  # no export yet: libfabric is still loading there
    return [c for c in json.loads(r.stdout.splitlines()[0])["connections"]
            if c["path"] in ("fabric", "same_host") and c["state"] == "established"]


def settle(conns, stat, server, total):
    """Makes requests on CONNS until both ends have TOTAL connections on the fabric, or no more
    moved for 5 s (those failed their switch), or 60 s passed: a connection moves during the
    program's own calls, so the requests come every 0.1 s or so. Returns both ends' fabric
    connections."""
    start = time.monotonic()
    last, moved_at = -1, start
    while True:
        for c in conns:
            ping(c)
        mine, theirs = fabric(stat, os.getpid()), fabric(stat, server)
        now = time.monotonic()
        if len(mine) + len(theirs) > last:
            last, moved_at = len(mine) + len(theirs), now
        if len(mine) >= total and len(theirs) >= total or now - moved_at > 5 or now - start > 60:
            return mine, theirs
        time.sleep(0.05)


def snapshot(server):
    me = os.getpid()
    return {"server_rss": rss_kib(server), "client_rss": rss_kib(me),
            "server_fds": fds(server), "client_fds": fds(me)}


def main():
    port, n, server = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    settle_s = float(sys.argv[4])
    stat = sys.argv[5] if len(sys.argv) > 5 else None
    # One connection first, moved to the fabric: under the shim both processes then have
    # libfabric loaded, so the baseline holds the one-time costs and the difference is what each
    # further connection adds.
    first = socket.create_connection(("127.0.0.1", port), timeout=30)
    ping(first)
    if stat:
        settle([first], stat, server, 1)
    else:
        time.sleep(settle_s)
    before = snapshot(server)
    t = time.monotonic()
    conns = []
    batch = max(1, int(os.environ.get("RSTREAM_BENCH_IDLE_BATCH", 25)))
    mine, theirs = [], []
    while len(conns) < n:
        fresh = []
        for _ in range(min(batch, n - len(conns))):
            c = socket.create_connection(("127.0.0.1", port), timeout=30)
            ping(c)
            fresh.append(c)
        conns += fresh
        if stat:
            mine, theirs = settle(fresh, stat, server, len(conns) + 1)
    opened = time.monotonic() - t
    # Idle for a while, then one more request on each: they still work.
    time.sleep(settle_s)
    for c in conns:
        ping(c)
    after = snapshot(server)
    # Going idle: a connection quiet for the engine's ring idle time (Settings::ringIdleMs,
    # 2 s) gives its send ring's pages back at its next timer, 2 to 4 s after its last byte.
    # That one-time cost is reported on its own; the idle figure is what follows it.
    c0, s0 = os.times(), cpu_s(server)
    time.sleep(RELEASE_S)
    c1, s1, t0 = os.times(), cpu_s(server), time.monotonic()
    time.sleep(settle_s)
    c2, s2, dt = os.times(), cpu_s(server), time.monotonic() - t0
    out = {
        "server_rss_kib_per_conn": (after["server_rss"] - before["server_rss"]) / n,
        "client_rss_kib_per_conn": (after["client_rss"] - before["client_rss"]) / n,
        "server_fds_per_conn": (after["server_fds"] - before["server_fds"]) / n,
        "client_fds_per_conn": (after["client_fds"] - before["client_fds"]) / n,
        "server_base_rss_kib": before["server_rss"],
        "client_base_rss_kib": before["client_rss"],
        "server_base_fds": before["server_fds"],
        "client_base_fds": before["client_fds"],
        "going_idle_server_cpu_ms": (s1 - s0) * 1000,
        "going_idle_client_cpu_ms": (c1.user + c1.system - c0.user - c0.system) * 1000,
        "going_idle_cpu_ms": (s1 - s0 + c1.user + c1.system - c0.user - c0.system) * 1000,
        "idle_server_cpu_ms_per_s": (s2 - s1) * 1000 / dt,
        "idle_client_cpu_ms_per_s": (c2.user + c2.system - c1.user - c1.system) * 1000 / dt,
        "open_s": opened,
        "batch": batch,
    }
    if stat:
        out["client_fabric_conns"] = len(mine)
        out["server_fabric_conns"] = len(theirs)
        out["client_same_host_conns"] = sum(c["path"] == "same_host" for c in mine)
        out["server_same_host_conns"] = sum(c["path"] == "same_host" for c in theirs)
        # What the shim's rings take per connection (send + receive), beside the RSS growth.
        for end, cs in (("client", mine), ("server", theirs)):
            rings = [c["send_ring"] + c["recv_ring"] for c in cs
                     if c.get("send_ring") is not None and c.get("recv_ring") is not None]
            if rings:
                out[end + "_ring_kib_per_conn"] = sum(rings) / len(rings) / 1024
    for c in conns + [first]:
        c.close()
    print(" ".join("%s=%.3f" % kv if isinstance(kv[1], float) else "%s=%d" % kv
                   for kv in out.items()))


if __name__ == "__main__":
    main()
