#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# redis-server under the shim forks for BGSAVE while a shimmed redis-benchmark runs: the
# benchmark completes without errors, the snapshot is written and the server still answers.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need redis-server redis-cli redis-benchmark
# Enough that the benchmark still runs when BGSAVE comes (20,000 took under 1 s at 90,000/s).
requests=${E2E_REDIS_REQUESTS:-60000}

mkdir -p "$work/redis"
start_server server 1 shim server 150 redis-server --port @PORT@ --bind 127.0.0.1 \
	--save "3600 1" --appendonly no --daemonize no --dir "$work/redis" --dbfilename dump.rdb \
	--enable-debug-command local

cli() {
	local name=$1
	shift
	shim "$name" 30 redis-cli -h 127.0.0.1 -p "$port" "$@"
}

# Some data, so that the snapshot has something to write (DEBUG is allowed to local clients
# only: the shim must show the server a loopback peer address).
out=$(cli cli-fill DEBUG POPULATE 100000 key 64) || fail "DEBUG POPULATE failed"
[ "$out" = OK ] || fail "DEBUG POPULATE answered '$out'"

start bench shim bench 45 redis-benchmark -h 127.0.0.1 -p "$port" -q -c 50 -n "$requests" \
	-t set,get,lpush,incr
bench_pid=$last_pid
sleep 0.5
kill -0 "$bench_pid" 2>/dev/null || fail "the benchmark ended before BGSAVE"
out=$(cli cli-bgsave BGSAVE) || fail "BGSAVE failed"
case $out in
"Background saving started") ;;
*) fail "BGSAVE answered '$out'" ;;
esac
log "BGSAVE started while the benchmark runs"
rc=0
finish "$bench_pid" || rc=$?
[ "$rc" -eq 0 ] || fail "redis-benchmark exited with $rc"
tr '\r' '\n' <"$work/bench.log" | grep -E 'requests per second' >"$work/bench.results" || true
grep -qiE 'error|reset|refused' "$work/bench.log" && fail "redis-benchmark reported errors"
[ "$(wc -l <"$work/bench.results")" -eq 4 ] || fail "not one result per test"
sed 's/^/    /' "$work/bench.results"

# The snapshot finished (the fork child is done) and succeeded.
for _ in $(seq 100); do
	info=$(cli cli-info INFO persistence) || fail "INFO failed"
	grep -q '^rdb_bgsave_in_progress:0' <<<"$info" && break
	sleep 0.1
done
grep -q '^rdb_bgsave_in_progress:0' <<<"$info" || fail "BGSAVE did not finish"
grep -q '^rdb_last_bgsave_status:ok' <<<"$info" || fail "BGSAVE failed: $info"
[ -s "$work/redis/dump.rdb" ] || fail "no dump.rdb"
log "snapshot: $(stat -c %s "$work/redis/dump.rdb") bytes"
out=$(cli cli-ping PING) || fail "PING failed after BGSAVE"
[ "$out" = PONG ] || fail "PING answered '$out' after BGSAVE"
out=$(cli cli-dbsize DBSIZE) || fail "DBSIZE failed"
[ "$out" -ge 100000 ] || fail "DBSIZE is $out after BGSAVE"

cli cli-shutdown SHUTDOWN NOSAVE >/dev/null 2>&1 || true
rc=0
finish "$server_pid" || rc=$?
[ "$rc" -eq 0 ] || fail "redis-server exited with $rc after SHUTDOWN"
# The benchmark's clients once it has loaded libfabric (its first test's may end before
# their switch); redis-cli processes are over before theirs.
expect_fabric bench 50
expect_no_fallback cli-ping
expect_fabric server 50
echo PASS
