#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A shimmed short-lived client: towards a server without the shim its connects (blocking and
# nonblocking) go to kernel TCP after the light probe, towards a shimmed one they offer the
# upgrade in-band (also to one on the wildcard address); either way it never loads libfabric and
# its first reply comes as soon as without the shim; a server restarted without the shim is
# never offered an upgrade.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need python3 strace

echo_server=$(dirname "$0")/echo_server.py

# client.py PORT MODE...: per MODE (blocking or nonblocking) a connection that sends a line and
# reads it back, or (wait:PATH) a pause until PATH exists; prints each connection's
# milliseconds, then whether libfabric is mapped.
cat >"$work/client.py" <<'EOF'
import os, select, socket, sys, time
port = int(sys.argv[1])
for mode in sys.argv[2:]:
    if mode.startswith("wait:"):
        # Says so in PATH.ready, then waits until PATH exists.
        path = mode[5:]
        open(path + ".ready", "w").close()
        for _ in range(400):
            if os.path.exists(path):
                break
            time.sleep(0.05)
        continue
    t0 = time.monotonic()
    s = socket.socket()
    if mode == "nonblocking":
        s.setblocking(False)
        r = s.connect_ex(("127.0.0.1", port))
        if r != 0:
            _, w, _ = select.select([], [s], [], 10)
            assert w, "connect: no POLLOUT within 10 s"
            err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            assert err == 0, "connect: SO_ERROR %d" % err
        s.setblocking(True)
    else:
        s.connect(("127.0.0.1", port))
    s.sendall(b"ping\n")
    got = b""
    while len(got) < 5:
        chunk = s.recv(5 - len(got))
        assert chunk, "EOF before the echo"
        got += chunk
    assert got == b"ping\n", got
    print("%s %.1f" % (mode, (time.monotonic() - t0) * 1000))
    s.close()
with open("/proc/self/maps") as m:
    print("libfabric", "mapped" if "libfabric" in m.read() else "absent")
EOF

start_server plain 0 plain 60 python3 "$echo_server" 127.0.0.1 @PORT@
out=$(shim client 30 python3 "$work/client.py" "$port" blocking nonblocking nonblocking) ||
	fail "the client failed: $out"
printf "    %s\n" "${out//$'\n'/$'\n    '}"
grep -qx "libfabric absent" <<<"$out" || fail "the client loaded libfabric for a plain server"
# Generous against a loaded machine: libfabric's load alone takes 0.3 s (over 1 s loaded).
while read -r mode ms; do
	case "$mode" in blocking | nonblocking) ;; *) continue ;; esac
	[ "${ms%.*}" -lt 200 ] || fail "$mode: connect and first reply took $ms ms"
done <<<"$out"
[ "$(stat_sum client fabric_connections)" -eq 0 ] || fail "client: fabric connections"
[ "$(stat_sum client fallback_connections)" -eq 3 ] || fail "client: not 3 fallbacks"
grep -q '"refused": 1' "$work"/stats/client.*.json || fail "client: the first was not 'refused'"
grep -q '"negative_cache": 2' "$work"/stats/client.*.json ||
	fail "client: the others were not 'negative_cache'"
log "plain server: no libfabric, refused then negative_cache, first replies in time"
stop_pid "$server_pid" || true

# A shimmed server: its beacon says so, the offer goes with the first bytes and the answer with
# the server's; a short-lived client is done before any switch to the fabric, so it never loads
# libfabric and its first reply is as quick.
start_server shimmed 1 shim server 60 python3 "$echo_server" 127.0.0.1 @PORT@
out=$(shim client2 30 python3 "$work/client.py" "$port" blocking nonblocking) ||
	fail "the client of the shimmed server failed: $out"
printf "    %s\n" "${out//$'\n'/$'\n    '}"
grep -qx "libfabric absent" <<<"$out" || fail "the short-lived client loaded libfabric"
while read -r mode ms; do
	case "$mode" in blocking | nonblocking) ;; *) continue ;; esac
	[ "${ms%.*}" -lt 200 ] || fail "shimmed server, $mode: connect and first reply took $ms ms"
done <<<"$out"
expect_no_fallback client2
[ "$(stat_sum client2 before_switch)" -eq 2 ] || fail "client2: the upgrade was not offered twice"
log "shimmed server: offered, no libfabric, first replies in time"

# The same with the server on the wildcard address: the client finds its beacon under the
# second name it looks for (0.0.0.0:PORT, after 127.0.0.1:PORT is refused), else the light probe
# would find the fabric listener and the client would load libfabric for the attempt. Every
# look of the process goes through one UNIX socket, kept from connect to connect (a refused
# connect, or one that finds the beacon's backlog full, leaves it unconnected): strace finds, in
# the process that made the looks, the socket calls whose descriptors the looks used (the
# process may open UNIX sockets of its own, for name service lookups, and python3 may be a
# wrapper whose helpers do too).
stop_pid "$server_pid" || true
start_server wildcard 1 shim wildcard 60 python3 "$echo_server" 0.0.0.0 @PORT@
out=$(shim client4 30 strace -f -qq -e trace=socket,connect,fcntl -o "$work/client4.strace" \
	python3 "$work/client.py" "$port" blocking nonblocking) ||
	fail "the client of the wildcard server failed: $out"
printf "    %s\n" "${out//$'\n'/$'\n    '}"
grep -qx "libfabric absent" <<<"$out" || fail "the wildcard server's client loaded libfabric"
expect_no_fallback client4
[ "$(stat_sum client4 before_switch)" -eq 2 ] || fail "client4: the upgrade was not offered twice"
looks=$(grep -E '^[0-9]+ +connect\([0-9]+, \{sa_family=AF_UNIX, sun_path=@"rstream/' \
	"$work/client4.strace" || true)
lookers=$(awk '{print $1}' <<<"$looks" | sort -u | tr '\n' ' ')
[ "$(grep -c . <<<"$looks")" -eq 4 ] && [ "$(wc -w <<<"$lookers")" -eq 1 ] ||
	fail "client4: not 4 beacon looks (2 names for each of 2 connects) by one process: $looks"
# Each look's descriptor leads back to the socket call that made it, the last one to return that
# descriptor before the look (or to the descriptor it was moved from, above the program's
# range, by F_DUPFD_CLOEXEC); the looks must come from one such call, an AF_UNIX socket.
sockets=$(awk -v pid="${lookers% }" '
	$1 != pid { next }
	/ socket\(/ && match($0, /= [0-9]+$/) {
		fd = substr($0, RSTART + 2); made[fd] = NR; unix[NR] = /socket\(AF_UNIX/
	}
	/ fcntl\([0-9]+, F_DUPFD_CLOEXEC/ && match($0, /= [0-9]+$/) {
		from = $2; sub(/^fcntl\(/, "", from); sub(/,$/, "", from)
		fd = substr($0, RSTART + 2)
		if (from in made) made[fd] = made[from]; else delete made[fd]
	}
	/ connect\([0-9]+, \{sa_family=AF_UNIX, sun_path=@"rstream\// {
		fd = $2; sub(/^connect\(/, "", fd); sub(/,$/, "", fd)
		if (!(fd in made)) { print "none"; next }
		if (!unix[made[fd]]) print "not-unix"; else print made[fd]
	}' "$work/client4.strace" | sort -u)
[ "$(grep -c . <<<"$sockets")" -eq 1 ] && ! grep -qE 'none|not-unix' <<<"$sockets" ||
	fail "client4: 2 connects' beacon looks came from these socket calls, not 1 UNIX socket:" \
		"$(tr '\n' ' ' <<<"$sockets")"
log "shimmed server on 0.0.0.0: offered, no libfabric, the UNIX socket kept across connects"

# The same port served without the shim: the client's next connects get no upgrade offer (no
# beacon, and the light probe finds no fabric listener), so the plain server reads the client's
# bytes alone (else the echo check fails).
start client3 shim client3 60 python3 "$work/client.py" "$port" blocking "wait:$work/go" \
	blocking nonblocking
client_pid=$last_pid
for _ in $(seq 200); do
	[ -e "$work/go.ready" ] && break
	sleep 0.05
done
[ -e "$work/go.ready" ] || fail "client3 did not make its first connection"
stop_pid "$server_pid" || true
start plain2 plain 60 python3 "$echo_server" 127.0.0.1 "$port"
server_pid=$last_pid
wait_listen "$port" "$server_pid" || fail "the plain server does not listen on $port"
touch "$work/go"
finish "$client_pid" || fail "client3 failed"
out=$(cat "$work/client3.log")
printf "    %s\n" "${out//$'\n'/$'\n    '}"
[ "$(stat_sum client3 before_switch)" -eq 1 ] || fail "client3: the first was not offered"
grep -q '"refused": 1' "$work"/stats/client3.*.json || fail "client3: no 'refused'"
grep -q '"negative_cache": 1' "$work"/stats/client3.*.json || fail "client3: no 'negative_cache'"
log "a server restarted without the shim: no offer, its bytes intact"
echo PASS
