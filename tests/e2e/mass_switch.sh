#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Many connections switching at once: a shimmed client opens 500 connections to a shimmed redis
# in one go (one PING each as it opens), stays idle for 3 s, then pings them all for a while.
# Every reply must be right and redis must live through it (its epoll_wait failed with EINVAL
# when every switching socket listed the switch's shared descriptors again: with 1,000
# connections a million entries, past RLIMIT_NOFILE). While the client is idle, most
# connections are still in their switch, and redis must be idle too: it spun a CPU there,
# because its sleep listed each such socket's kernel fd for POLLOUT.
# With E2E_MASS_SWITCH_BURST=1 (mass_switch_burst.sh), the client connects all 500 first and
# then pings them all every 0.1 s for 6 s, and 95 % of them must switch meanwhile: every wait
# of redis looked at each switching socket with two system calls, and registered its wake-up
# with each connection waiting for a token once per such socket (a million registrations a
# wait with 1,000 of each), and only 33 of 500 switched; the rest timed out. (3 s were enough
# on an idle machine; on one that had run benchmarks for an hour the first rounds, over kernel
# TCP, took 1 s each, and 50-370 of 500 had switched by 3 s, at the code of that time too.)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need redis-server python3
n=${E2E_MASS_SWITCH_CONNECTIONS:-500}

cat >"$work/mass.py" <<'EOF2'
import os, socket, sys, time
port, n, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
server = sys.argv[4]
def ping(s):
    s.sendall(b"PING\r\n")
    got = b""
    while not got.endswith(b"\r\n"):
        b = s.recv(64)
        if not b:
            raise RuntimeError("the server closed a connection")
        got += b
    if got != b"+PONG\r\n":
        raise RuntimeError("unexpected reply %r" % got)
def cpu(pid):
    with open("/proc/%s/stat" % pid) as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")
conns = []
burst = os.environ.get("E2E_MASS_SWITCH_BURST") == "1"
idle = 0
if burst:
    # All connected first, then a request on each every 0.1 s: all of them switch at once.
    # Blocking sockets (no timeout): each call sleeps in the call itself, not in a poll.
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
else:
    for _ in range(n):
        conns.append(socket.create_connection(("127.0.0.1", port), timeout=30))
        ping(conns[-1])
    # Idle, most connections still in their switch (it moves on during the program's calls):
    # what the server spends then.
    time.sleep(1)
    c0, t0 = cpu(server), time.monotonic()
    time.sleep(2)
    idle = (cpu(server) - c0) * 1000 / (time.monotonic() - t0)
end = time.monotonic() + secs
rounds = 0
while time.monotonic() < end:
    for c in conns:
        ping(c)
    rounds += 1
    time.sleep(0.1)
print("rounds %d idle_server_cpu_ms_per_s %.0f" % (rounds, idle))
EOF2

mkdir -p "$work/redis"
start_server server 1 shim server 150 bash -c "ulimit -n 4096 && exec redis-server --port @PORT@ \
--bind 127.0.0.1 --save '' --appendonly no --daemonize no --maxclients 2000 --dir $work/redis"
# The redis process itself (server_pid is its timeout's).
redis_pid=
for p in $(pgrep -x redis-server); do
	grep -q ":$port" "/proc/$p/cmdline" 2>/dev/null && redis_pid=$p
done
[ -n "$redis_pid" ] || fail "no redis-server process on port $port"
secs=5
[ "${E2E_MASS_SWITCH_BURST:-0}" = 1 ] && secs=6
out=$(ulimit -n 4096 && shim client 120 python3 "$work/mass.py" "$port" "$n" $secs "$redis_pid" 2>&1) ||
	fail "the client failed: $(tail -n 5 <<<"$out")"
log "$out"
kill -0 "$redis_pid" 2>/dev/null || fail "redis died: $(grep -m1 -E 'Guru|epoll' "$work/server.log")"
idle=$(sed -n 's/.*idle_server_cpu_ms_per_s \([0-9]*\).*/\1/p' <<<"$out")
stop_pid "$server_pid" || true
have_stats server
moved=$(stat_sum client fabric_connections)
log "$n connections at once: $moved on the fabric, $(stat_sum client before_switch) over before their switch, $(stat_sum client not_upgraded) not upgraded"
if [ "${E2E_MASS_SWITCH_BURST:-0}" = 1 ]; then
	[ "$moved" -ge $((n * 95 / 100)) ] || fail "only $moved of $n connections moved to the fabric"
	echo PASS
	exit 0
fi
log "redis idle with them in their switch: ${idle} ms of CPU a second"
[ "$moved" -gt 0 ] || fail "no connection moved to the fabric"
[ "$idle" -le 100 ] || fail "redis spent ${idle} ms of CPU a second with its clients idle"
echo PASS
