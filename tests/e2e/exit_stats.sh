#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The statistics survive a signal during the exit drain. A shimmed Python server exits on SIGTERM
# with data still queued for a fabric peer that reads no more, so the progress thread's drain
# keeps the process up to 2 s after the program is done; Python has given SIGTERM its default
# action back by then, and a second SIGTERM (timeout(1) and service managers send more than one)
# ends it there. Its statistics file must already be written.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need python3
export RSTREAM_SAME_HOST=0

prog=$(dirname "$0")/exit_drain.py
start_server server 1 shim server 60 python3 "$prog" server 127.0.0.1 @PORT@
server_wrapper=$server_pid
start client shim client 60 python3 "$prog" client 127.0.0.1 "$port" 2
for _ in $(seq 200); do
	grep -q "full after" "$work/server.log" 2>/dev/null && break
	sleep 0.05
done
grep -q "full after" "$work/server.log" || fail "the server never filled the connection"
log "$(cat "$work/server.log")"
# timeout(1)'s child: rstream-run (and a python3 wrapper script, if any) exec the program.
py=$(pgrep -P "$server_wrapper" | head -n1 || true)
[ -n "$py" ] || fail "no server process"
kill -TERM "$py"
sleep 0.5
kill -0 "$py" 2>/dev/null || fail "the server was gone before its drain could be seen"
kill -TERM "$py"
rc=0
finish "$server_wrapper" || rc=$?
log "server exit status $rc (143: ended by the second SIGTERM, in the drain)"
[ "$rc" = 143 ] || fail "the server did not end in its drain (status $rc)"
have_stats server
show_stats server
[ "$(stat_sum server fabric_connections)" -ge 1 ] ||
	fail "server: no fabric connection counted (the Python process wrote no statistics)"
[ "$(stat_sum server fabric_bytes_sent)" -gt 0 ] || fail "server: no bytes counted"
echo PASS
