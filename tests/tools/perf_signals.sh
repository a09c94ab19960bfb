#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# rstream-perf's engine runs its blocking calls with signal tracking, as the shim does: a
# latency run makes no rt_sigprocmask call, and RSTREAM_SIGNAL_TRACK=0 brings back the hold of
# signals (two calls a sleep after a spin), so the engine's figure beside plain libfabric's in
# scripts/bench is not one of the mask.
# Usage: perf_signals.sh RSTREAM_PERF
set -euo pipefail
perf=${1:?usage: $0 RSTREAM_PERF}
command -v strace >/dev/null || { echo "SKIP: strace missing"; exit 77; }
work=$(mktemp -d)
server=
cleanup() {
	if [ -n "$server" ]; then
		kill "$server" 2>/dev/null || true
		wait "$server" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT
export RSTREAM_PROVIDER=${RSTREAM_PROVIDER:-tcp} RSTREAM_SAME_HOST=0

port=
for _ in $(seq 50); do
	p=$((21000 + RANDOM % 20000))
	"$perf" server --port "$p" --bind 127.0.0.1 >"$work/server.log" 2>&1 &
	server=$!
	for _ in $(seq 100); do
		ss -Hltn "sport = :$((p + 1))" | grep -q . && { port=$p; break; }
		kill -0 "$server" 2>/dev/null || break
		sleep 0.05
	done
	[ -n "$port" ] && break
	kill "$server" 2>/dev/null || true
	wait "$server" 2>/dev/null || true
	server=
done
[ -n "$port" ] || { echo "FAIL: the server did not listen"; exit 1; }

# calls TRACK: the client's rt_sigprocmask calls over a 1 s latency run (strace -c, stopping
# the process at those calls only), after checking that the run measured.
calls() {
	RSTREAM_SIGNAL_TRACK=$1 strace -f -qq -c --seccomp-bpf -e trace=rt_sigprocmask -o "$work/strace.$1" \
		"$perf" client 127.0.0.1 --port "$port" --test lat --size 64 --seconds 1 \
		--transport engine >"$work/client.$1" 2>&1 ||
		{ echo "FAIL: the client failed"; cat "$work/client.$1"; exit 1; }
	grep -q '"p50_us":[0-9]' "$work/client.$1" ||
		{ echo "FAIL: no latency figure"; cat "$work/client.$1"; exit 1; }
	awk '$NF == "rt_sigprocmask" { n = $4 } END { print n + 0 }' "$work/strace.$1"
}
tracked=$(calls 1)
held=$(calls 0)
echo "rt_sigprocmask calls over 1 s: $tracked tracked, $held held"
# A run makes tens of thousands of round trips (fewer traced), each with a spin that misses
# before the answer comes; the process's start and its threads' set-up make a few calls.
[ "$tracked" -le 20 ] || { echo "FAIL: $tracked rt_sigprocmask calls with tracking"; exit 1; }
[ "$held" -ge 200 ] || { echo "FAIL: only $held rt_sigprocmask calls without tracking"; exit 1; }
echo PASS
