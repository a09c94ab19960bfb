#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The same-host link set up on the kernel TCP connection itself (preload/hybrid_link.cpp): a
# client whose server is on this host switches to same-host memory without loading libfabric,
# and a hostile process that writes garbage to the name where the server takes links changes
# nothing for the next client. A server that takes no links (RSTREAM_SAME_HOST=0) gets its
# client over the fabric, as before. A process of another user that took that name first gets
# nothing (samehost_squat.py). A server asleep on the connection is woken by the link. The
# SO_RCVBUF a client set before connecting sizes the link's rings.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need python3
prog="$(dirname "$0")/samehost_inband.py"

# client NAME SECONDS: one client run under the shim with same-host links allowed, echoing for
# SECONDS; its output logged.
client() {
	local out
	out=$(shim "$1" 30 env RSTREAM_SAME_HOST=1 python3 "$prog" client "$port" "$2" 2>&1) ||
		fail "$1 failed: $out"
	log "$1: $out"
	last_out=$out
}

# Both ends allow same-host links: the clients switch without libfabric; between them, the
# hostile process.
start_server server 1 shim server 60 env RSTREAM_SAME_HOST=1 RSTREAM_LOG=debug \
	RSTREAM_LOG_FILE="$work/server.rs" python3 "$prog" server @PORT@ 3
client client1 0.4
grep -q "libfabric not loaded" <<<"$last_out" || fail "client1 loaded libfabric"
[ "$(stat_sum client1 same_host_connections)" -eq 1 ] || fail "client1: not same-host"
ulport=$(sed -n 's/.*upgrade: fabric listener on 127\.0\.0\.1:0 port \([0-9]*\).*/\1/p' \
	"$work/server.rs" | head -n 1)
[ -n "$ulport" ] || fail "the server's log names no upgrade listener"
grep -q "switch: the client's same-host link claimed" "$work/server.rs" ||
	fail "the server did not claim a same-host link"
plain 10 python3 "$prog" hostile "rstream-up/127.0.0.1:$ulport" >"$work/hostile.log" 2>&1 ||
	fail "the hostile process could not reach rstream-up/127.0.0.1:$ulport"
log "$(cat "$work/hostile.log")"
client client2 0.4
grep -q "libfabric not loaded" <<<"$last_out" || fail "client2 loaded libfabric"
[ "$(stat_sum client2 same_host_connections)" -eq 1 ] || fail "client2: not same-host"
# The client makes the link's region: the SO_RCVBUF it set before connecting sizes the rings,
# as it sizes a fabric connection's (the environment's 256 KiB before).
out=$(shim bufs 30 env RSTREAM_SAME_HOST=1 RSTREAM_LOG=debug RSTREAM_LOG_FILE="$work/bufs.rs" \
	python3 "$prog" bufs "$port" 2>&1) || {
	dump_shim_state $(pgrep -P "$server_pid")
	fail "the bufs client failed: $out"
}
log "bufs: $out"
[ "$(stat_sum bufs same_host_connections)" -eq 1 ] || fail "bufs: not same-host"
[ "$out" = "rcv_space 1048576" ] || fail "bufs: SO_RCVBUF 1 MiB, but $out"
finish "$server_pid" || fail "the server failed: $(tail -n 3 "$work/server.log")"
[ "$(stat_sum server same_host_connections)" -eq 3 ] || fail "server: not 3 same-host connections"
[ "$(stat_sum server fallback_connections)" -eq 0 ] || fail "server: a connection fell back"

# A server asleep on the connection when the link comes is woken to claim it: its client, whose
# blocking read sent the link, has its switch done at once, not when the server next writes
# (its push, 1 s later).
start_server server-push 1 shim server-push 30 env RSTREAM_SAME_HOST=1 RSTREAM_LOG=debug \
	RSTREAM_LOG_FILE="$work/server-push.rs" python3 "$prog" push @PORT@
out=$(shim pushed 30 env RSTREAM_SAME_HOST=1 python3 "$prog" pushed "$port" 2>&1) ||
	fail "the pushed client failed: $out"
finish "$server_pid" || fail "the push server failed: $(tail -n 3 "$work/server-push.log")"
[ "$(stat_sum pushed same_host_connections)" -eq 1 ] || fail "pushed: not same-host"
early=$(python3 "$(dirname "$0")/samehost_inband.py" claimed "$work/server-push.rs" \
	"$work/server-push.log")
log "push server: the link claimed $early s before the push"
[ "$early" != none ] || fail "push server: no claim or no push logged"
python3 -c "import sys; sys.exit(0 if float('$early') > 0.5 else 1)" ||
	fail "the sleeping server claimed the link only $early s before its push (not woken)"

# A server that takes no links: its client goes over the fabric, once libfabric has loaded
# (0.3-1.2 s here).
start_server server-nolink 1 shim server-nolink 60 env RSTREAM_SAME_HOST=0 python3 "$prog" \
	server @PORT@ 1
client client3 2
grep -q "libfabric loaded" <<<"$last_out" || fail "client3 did not load libfabric"
[ "$(stat_sum client3 fabric_connections)" -eq 1 ] || fail "client3: not switched"
[ "$(stat_sum client3 same_host_connections)" -eq 0 ] || fail "client3: same-host"
finish "$server_pid" || fail "the server failed: $(tail -n 3 "$work/server-nolink.log")"
# Abstract names are anybody's: a process of another user took the link socket's name for the
# server's upgrade port before the server (a fake shim server here, root's, whose ACCEPT names
# that port). The client sends it nothing, since the name's owner is not the upgrade port's, and
# stays on kernel TCP. The same squatter as root, the upgrade port's owner, does get the link,
# which shows that the first client tried.
squat="$(dirname "$0")/samehost_squat.py"
for who in 65534 0; do
	up=$(pick_port) || fail "no free port"
	start squatter-$who plain 20 python3 "$squat" squatter "$up" "$who"
	squatter=$last_pid
	for _ in $(seq 100); do
		grep -q ready "$work/squatter-$who.log" && break
		sleep 0.05
	done
	grep -q ready "$work/squatter-$who.log" || fail "the squatter did not bind its name"
	start_server fake-$who 0 plain 30 python3 "$squat" server @PORT@ "$up"
	out=$(shim "client-squat-$who" 30 env RSTREAM_SAME_HOST=1 RSTREAM_LOG=info \
		RSTREAM_LOG_FILE="$work/client-squat-$who.rs" python3 "$prog" client "$port" 0.3 2>&1) ||
		fail "the client of the fake server failed: $out"
	finish "$server_pid" || fail "the fake server failed: $(tail -n 3 "$work/fake-$who.log")"
	finish "$squatter" || fail "the squatter failed: $(tail -n 3 "$work/squatter-$who.log")"
	fds=$(sed -n 's/^fds //p' "$work/squatter-$who.log")
	log "squatter uid $who: received $fds descriptors; client: $out"
	if [ "$who" = 0 ]; then
		[ "$fds" -eq 3 ] || fail "the squatter with the upgrade port's owner got no link"
	else
		[ "$fds" -eq 0 ] || fail "a squatter of another user got the client's link"
		grep -q "belongs to uid $who, not 0" "$work/client-squat-$who.rs" ||
			fail "the client did not refuse the squatter: $(cat "$work/client-squat-$who.rs")"
	fi
done
echo PASS
