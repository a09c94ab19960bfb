#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# redis-server, redis-benchmark and redis-cli all under the shim on 127.0.0.1: a benchmark with
# 50 clients (on the fabric once switched), one with 16-deep pipelines and a 1 MiB value
# written and read back intact by short-lived redis-cli processes.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need redis-server redis-cli redis-benchmark sha256sum base64
requests=${E2E_REDIS_REQUESTS:-20000}
tests=${E2E_REDIS_TESTS:-set,get,lpush,incr}

mkdir -p "$work/redis"
start_server server 1 shim server 150 redis-server --port @PORT@ --bind 127.0.0.1 \
	--save "" --appendonly no --daemonize no --dir "$work/redis"

# bench NAME ARGS...: a benchmark under the shim; fails on errors or a missing result.
bench() {
	local name=$1 rc=0
	shift
	shim "$name" 45 redis-benchmark -h 127.0.0.1 -p "$port" -q -c 50 -n "$requests" \
		-t "$tests" "$@" >"$work/$name.log" 2>&1 || rc=$?
	[ "$rc" -eq 0 ] || fail "$name: redis-benchmark exited with $rc"
	# -q prints progress lines ending in \r and one result line per test.
	tr '\r' '\n' <"$work/$name.log" | grep -E 'requests per second' | sed 's/^/    /' \
		>"$work/$name.results"
	grep -qiE 'error|reset|refused' "$work/$name.log" && fail "$name: redis-benchmark reported errors"
	[ "$(wc -l <"$work/$name.results")" -eq "$(tr ',' '\n' <<<"$tests" | wc -l)" ] ||
		fail "$name: not one result per test"
	log "$name:"
	cat "$work/$name.results"
	# 50 clients per test: those of the tests after the first switch to the fabric (the first
	# test's run while the benchmark loads libfabric), unless they are over before their
	# switch (-P 16 is over in a few round trips); none falls back.
	if [ "$name" = bench ]; then
		expect_fabric "$name" 50
	else
		expect_no_fallback "$name"
	fi
}

bench bench
bench bench-pipelined -P 16

# A 1 MiB value (base64, so it survives the shell) written with -x and read back.
head -c 786432 /dev/urandom | base64 -w 0 >"$work/value"
[ "$(wc -c <"$work/value")" -eq 1048576 ] || fail "the value is not 1 MiB"
out=$(shim cli-set 30 redis-cli -h 127.0.0.1 -p "$port" -x SET big <"$work/value") ||
	fail "redis-cli SET failed"
[ "$out" = OK ] || fail "SET answered '$out'"
shim cli-get 30 redis-cli -h 127.0.0.1 -p "$port" --raw GET big >"$work/read" ||
	fail "redis-cli GET failed"
# --raw ends the value with a newline.
printf '\n' >>"$work/value"
want=$(sha256sum <"$work/value")
got=$(sha256sum <"$work/read")
[ "$want" = "$got" ] || fail "the value read back differs ($(wc -c <"$work/read") bytes)"
log "1 MiB value read back intact (sha256 ${want%% *})"
# redis-cli is a short-lived client: done before its switch to the fabric, by design (it does
# not wait for libfabric to load), with nothing falling back.
expect_no_fallback cli-set
expect_no_fallback cli-get

out=$(shim cli-shutdown 30 redis-cli -h 127.0.0.1 -p "$port" SHUTDOWN NOSAVE 2>&1) || true
rc=0
finish "$server_pid" || rc=$?
[ "$rc" -eq 0 ] || fail "redis-server exited with $rc after SHUTDOWN ($out)"
# The benchmarks' clients that switched to the fabric.
expect_fabric server 50
echo PASS
