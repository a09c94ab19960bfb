#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fallbacks to kernel TCP are counted and logged with their reason: refused (nothing on the
# fabric port) then negative_cache, excluded (RSTREAM_EXCLUDE; a rule with a bad port is ignored,
# not taken for any port), timeout (a fabric port that never answers), ports (RSTREAM_PORTS),
# kernel_peer (a plain client of a dual listener) and port_busy (a listener whose fabric port is
# taken). rstream-stat shows the kernel connections of a running client with their reasons.
# Usage: fallback.sh LIBRSTREAM_PRELOAD_SO RSTREAM_RUN DIAG_PROG RSTREAM_STAT
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
diag=$(realpath "${3:?usage: $0 LIB RUN DIAG_PROG RSTREAM_STAT}")
rstat=$(realpath "${4:?usage: $0 LIB RUN DIAG_PROG RSTREAM_STAT}")
export RSTREAM_LOG=info RSTREAM_LOG_FILE="$work/rstream.%p.log"

# expect_stat ROLE FIELD N: FIELD of ROLE's statistics (summed over its processes) is N.
expect_stat() {
	local role=$1 field=$2 want=$3 v
	have_stats "$role"
	v=$(stat_sum "$role" "$field")
	[ "$v" -eq "$want" ] || { show_stats "$role"; fail "$role: $field is $v, expected $want"; }
}

# The shim log of the process whose output (NAME.log) says "pid N".
log_of() {
	local pid
	pid=$(sed -n 's/^pid //p' "$work/$1.log" | head -n 1)
	[ -n "$pid" ] || fail "$1 printed no pid"
	echo "$work/rstream.$pid.log"
}

expect_log() {
	local name=$1 re=$2 f
	f=$(log_of "$name")
	grep -Eq -- "$re" "$f" 2>/dev/null || { cat "$f" 2>/dev/null; fail "$name: log lacks /$re/"; }
}

# The shim's constructor logs (at debug): such lines used to be dropped, because the level was
# read only after the constructor ran.
RSTREAM_LOG=debug shim loaded 20 "$diag" noop >"$work/loaded.log" 2>&1 || fail "noop failed"
expect_log loaded "debug: preload: loaded into diag_prog"
log "the constructor's log line is there"

# ---- refused, then negative_cache (and rstream-stat on the running client) --------------------
start_server blackhole 0 plain 60 "$diag" blackhole @PORT@
start refused shim refused 30 "$diag" connect "$port" 2 3000
for _ in $(seq 100); do
	grep -q '^connected' "$work/refused.log" && break
	sleep 0.05
done
grep -q '^connected 2' "$work/refused.log" || fail "refused: the client did not connect"
cpid=$(sed -n 's/^pid //p' "$work/refused.log")
"$rstat" -j "$cpid" >"$work/stat-refused.json" || fail "rstream-stat $cpid failed"
cat "$work/stat-refused.json"
peer="\"peer\": \"127.0.0.1:$port\""
for why in refused negative_cache; do
	grep -Eq "\"path\": \"kernel\", \"direction\": \"connected\", \"state\": \"established\", \"local\": \"127.0.0.1:[0-9]+\", $peer, \"sent\": 5, \"received\": 0, \"send_queued\": 0, \"recv_queued\": 0, \"reason\": \"$why\"" \
		"$work/stat-refused.json" || fail "rstream-stat: no established kernel connection ($why) that sent 5 bytes"
done
grep -q '"fallback_reasons": {"refused": 1, "timeout": 0, "excluded": 0, "ports": 0, "negative_cache": 1,' \
	"$work/stat-refused.json" || fail "rstream-stat: wrong fallback counts"
"$rstat" | grep -q "^pid $cpid (diag_prog)" || fail "rstream-stat without a pid does not list $cpid"
finish "$last_pid" || fail "refused: the client failed"
expect_stat refused fabric_connections 0
expect_stat refused fallback_connections 2
expect_stat refused refused 1
expect_stat refused negative_cache 1
grep -Eq "\"path\": \"kernel\", \"reason\": \"refused\", \"direction\": \"connected\", \"local\": \"127.0.0.1:[0-9]+\", $peer, \"sent\": 5, \"received\": 0, \"open\": false" \
	"$work"/stats/refused.*.json || fail "refused: no record of the connection in the statistics"
expect_log refused "info: fd=[0-9]+ kernel TCP to 127.0.0.1:$port: refused \(nothing listens on 127.0.0.1:$((port + E2E_OFFSET))\)"
expect_log refused "info: fd=[0-9]+ kernel TCP to 127.0.0.1:$port: negative_cache"
[ "$(grep -c 'kernel TCP to' "$(log_of refused)")" -eq 2 ] || fail "refused: expected one line per fallback"
[ -e "/dev/shm/rstream-$cpid" ] && fail "the client's export is still there after it exited"
log "refused and negative_cache counted, logged and shown"

# ---- excluded; a rule with a bad port or prefix is ignored -----------------------------------
RSTREAM_EXCLUDE="127.0.0.1:$port,127.0.0.1:bogus,10.0.0.0/99" shim excluded 20 \
	"$diag" connect "$port" 2 >"$work/excluded.log" 2>&1 || fail "excluded: the client failed"
expect_stat excluded excluded 2
expect_stat excluded fallback_connections 2
expect_stat excluded refused 0
expect_log excluded "warn: RSTREAM_EXCLUDE: ignoring '127.0.0.1:bogus'"
expect_log excluded "warn: RSTREAM_EXCLUDE: ignoring '10.0.0.0/99'"
expect_log excluded "info: fd=[0-9]+ kernel TCP to 127.0.0.1:$port: excluded"
RSTREAM_EXCLUDE="127.0.0.1:bogus" shim badrule 20 \
	"$diag" connect "$port" 1 >"$work/badrule.log" 2>&1 || fail "badrule: the client failed"
expect_stat badrule excluded 0
expect_stat badrule refused 1

# ---- ports --------------------------------------------------------------------------------
RSTREAM_PORTS=1-2 shim ports 20 "$diag" connect "$port" 1 >"$work/ports.log" 2>&1 ||
	fail "ports: the client failed"
expect_stat ports ports 1
expect_log ports "info: fd=[0-9]+ kernel TCP to 127.0.0.1:$port: ports \(port $port is not in RSTREAM_PORTS\)"
stop_pid "$server_pid" || true
log "excluded (bad rules ignored) and ports counted and logged"

# ---- timeout: the fabric port accepts TCP but never answers ---------------------------------
for _ in 1 2 3 4 5; do
	port=$(pick_port "$E2E_OFFSET") || fail "no free port"
	start silent plain 60 "$diag" blackhole "$port" $((port + E2E_OFFSET))
	server_pid=$last_pid
	wait_listen "$port" "$server_pid" 1 && break
	stop_pid "$server_pid" || true
done
# A process without libfabric yet does not wait for it: kernel TCP at once (loading), twice.
shim loading 20 "$diag" connect "$port" 2 >"$work/loading.log" 2>&1 || fail "loading: the client failed"
expect_stat loading loading 2
expect_stat loading fallback_connections 2
ms=$(sed -n 's/^elapsed_ms //p' "$work/loading.log")
[ "$ms" -lt 250 ] || fail "loading: the connects took $ms ms"
log "loading counted ($ms ms)"
# With libfabric loaded, the fabric attempt decides.
DIAG_LOAD_FIRST=1 RSTREAM_CONNECT_TIMEOUT_MS=300 shim timeout 20 "$diag" connect "$port" 2 \
	>"$work/timeout.log" 2>&1 || fail "timeout: the client failed"
expect_stat timeout timeout 1
expect_stat timeout negative_cache 1
expect_stat timeout fallback_connections 2
expect_log timeout "info: fd=[0-9]+ kernel TCP to 127.0.0.1:$port: timeout \(no answer from 127.0.0.1:$((port + E2E_OFFSET)) within 300 ms\)"
ms=$(sed -n 's/^elapsed_ms //p' "$work/timeout.log")
{ [ "$ms" -ge 300 ] && [ "$ms" -lt 2000 ]; } || fail "timeout: the connects took $ms ms (expected 300 once)"
# A nonblocking connect to the same port does not wait for the fabric attempt: connect() returns
# without it (the first call still pays for loading the provider, ~0.2 s) and the connection
# comes up (over kernel TCP) once the attempt timed out.
DIAG_LOAD_FIRST=1 RSTREAM_CONNECT_TIMEOUT_MS=1500 shim timeout_nb 20 "$diag" connect-nb "$port" \
	>"$work/timeout_nb.log" 2>&1 ||
	fail "timeout: the nonblocking client failed: $(tail -n3 "$work/timeout_nb.log")"
call=$(sed -n 's/^call_ms //p' "$work/timeout_nb.log")
ms=$(sed -n 's/^elapsed_ms //p' "$work/timeout_nb.log")
[ "$call" -lt 1000 ] || fail "timeout: the nonblocking connect() call took $call ms (the attempt is 1500)"
{ [ "$ms" -ge 1500 ] && [ "$ms" -lt 4000 ]; } || fail "timeout: the nonblocking connect took $ms ms"
expect_stat timeout_nb timeout 1
expect_stat timeout_nb fallback_connections 1
stop_pid "$server_pid" || true
log "timeout counted and logged ($ms ms)"

# ---- the server side: kernel_peer on a dual listener, port_busy without a fabric side --------
start_server dual 1 shim dual 30 "$diag" serve @PORT@ 1
plain 20 "$diag" connect "$port" 1 >"$work/dual-client.log" 2>&1 || fail "dual: the client failed"
finish "$server_pid" || fail "dual: the server failed"
expect_stat dual kernel_peer 1
expect_stat dual fallback_connections 1
expect_stat dual fabric_listeners 1
grep -Eq "\"path\": \"kernel\", \"reason\": \"kernel_peer\", \"direction\": \"accepted\", \"local\": \"127.0.0.1:$port\", \"peer\": \"127.0.0.1:[0-9]+\", \"sent\": 0, \"received\": 5, \"open\": false" \
	"$work"/stats/dual.*.json || fail "dual: no record of the accepted connection"
expect_log dual "info: fd=[0-9]+ kernel TCP from 127.0.0.1:[0-9]+: kernel_peer"

port=$(pick_port "$E2E_OFFSET") || fail "no free port"
start busy plain 60 "$diag" blackhole $((port + E2E_OFFSET))
wait_listen $((port + E2E_OFFSET)) "$last_pid" || fail "busy: no listener on the fabric port"
busy_pid=$last_pid
start busyserver shim busyserver 30 "$diag" serve "$port" 1
wait_listen "$port" "$last_pid" || fail "busyserver does not listen"
bs_pid=$last_pid
plain 20 "$diag" connect "$port" 1 >"$work/busy-client.log" 2>&1 || fail "busy: the client failed"
finish "$bs_pid" || fail "busyserver failed"
stop_pid "$busy_pid" || true
expect_stat busyserver port_busy 1
expect_stat busyserver kernel_listeners 1
expect_stat busyserver fabric_listeners 0
expect_log busyserver "info: fd=[0-9]+ listener on port $port: kernel TCP only: port_busy"
expect_log busyserver "info: fd=[0-9]+ kernel TCP from 127.0.0.1:[0-9]+: port_busy"
log "kernel_peer and port_busy counted and logged"
echo PASS
