#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Programs whose two ends run on this host, both under the shim: the same-host transport carries
# their connections (RSTREAM_SAME_HOST=1, the default outside the test setup), and the
# statistics and rstream-stat must show it: iperf3 one stream, redis-benchmark's 50 clients and a
# 1 MiB value through redis-cli.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need iperf3 redis-server redis-cli redis-benchmark sha256sum base64
export RSTREAM_SAME_HOST=1

# expect_same_host ROLE MIN: at least MIN of ROLE's connections, and bytes both ways, went
# through same-host memory.
expect_same_host() {
	local role=$1 min=$2 v
	have_stats "$role"
	v=$(stat_sum "$role" same_host_connections)
	[ "$v" -ge "$min" ] || {
		show_stats "$role"
		fail "$role: $v same-host connections, expected at least $min"
	}
	v=$(stat_sum "$role" same_host_bytes_sent)
	[ "$v" -gt 0 ] || fail "$role: sent nothing through same-host memory"
	v=$(stat_sum "$role" same_host_bytes_received)
	[ "$v" -gt 0 ] || fail "$role: received nothing through same-host memory"
	log "$role: $(stat_sum "$role" same_host_connections) same-host connections"
}

rstat=$(realpath "${3:?usage: $0 LIB RUN RSTREAM_STAT}")

# iperf3: the control connection and the stream; rstream-stat shows them as same-host while
# the test runs.
start_server iperf-server 1 shim iperf-server 40 iperf3 -s -1 -p @PORT@
start iperf-client shim iperf-client 40 iperf3 -c 127.0.0.1 -p "$port" -t 2 -f m
client_pid=$last_pid
spid=$(pgrep -P "$server_pid" | head -n 1)
[ -n "$spid" ] || fail "no iperf3 server process"
n=0
for _ in $(seq 40); do
	"$rstat" -j "$spid" >"$work/stat.json" 2>/dev/null &&
		n=$(grep -o '"path": "same_host"' "$work/stat.json" | wc -l)
	[ "$n" -ge 2 ] && break
	sleep 0.05
done
[ "$n" -ge 2 ] || { cat "$work/stat.json"; fail "rstream-stat shows $n same-host connections"; }
grep -q '"same_host_connections": 2' "$work/stat.json" || fail "rstream-stat: wrong same-host total"
"$rstat" "$spid" | grep -Eq "^[0-9]+ +same +established " || fail "rstream-stat's table shows no same row"
log "rstream-stat: 2 same-host connections"
finish "$client_pid" || fail "iperf3 client failed"
finish "$server_pid" || fail "iperf3 server failed"
log "iperf3: $(grep -E 'receiver$' "$work/iperf-client.log" | tail -n 1)"
expect_same_host iperf-client 2
expect_same_host iperf-server 2

# redis: 50 clients, then a 1 MiB value written and read back intact.
mkdir -p "$work/redis"
start_server redis 1 shim redis 60 redis-server --port @PORT@ --bind 127.0.0.1 \
	--save "" --appendonly no --daemonize no --dir "$work/redis"
shim bench 40 redis-benchmark -h 127.0.0.1 -p "$port" -q -c 50 -n 20000 -t set,get \
	>"$work/bench.log" 2>&1 || fail "redis-benchmark failed"
tr '\r' '\n' <"$work/bench.log" | grep -E 'requests per second' | sed 's/^/    /'
grep -qiE 'error|reset|refused' "$work/bench.log" && fail "redis-benchmark reported errors"
expect_same_host bench 50
head -c 786432 /dev/urandom | base64 -w 0 >"$work/value"
out=$(shim cli-set 30 redis-cli -h 127.0.0.1 -p "$port" -x SET big <"$work/value") ||
	fail "redis-cli SET failed"
[ "$out" = OK ] || fail "SET answered '$out'"
# Into a file first: a reader that stops at 1 MiB would make the final newline a SIGPIPE.
shim cli-get 30 redis-cli -h 127.0.0.1 -p "$port" --raw GET big >"$work/got.raw" ||
	fail "redis-cli GET failed"
head -c 1048576 "$work/got.raw" >"$work/got"
[ "$(sha256sum <"$work/got")" = "$(sha256sum <"$work/value")" ] || fail "the value came back changed"
log "1 MiB value intact"
stop_pid "$server_pid"
expect_same_host redis 50
echo PASS
