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
# shellcheck source-path=SCRIPTDIR source=../lib/fail.sh
. "$(dirname "$0")/../lib/fail.sh"
# shellcheck source-path=SCRIPTDIR source=../lib/ports.sh
. "$(dirname "$0")/../lib/ports.sh"
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

# The server: raw libfabric on the port, the engine one above it.
port=$(pick_port 1) || fail "no free port"
"$perf" server --port "$port" --bind 127.0.0.1 >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 200); do
	port_listening $((port + 1)) && break
	kill -0 "$server" 2>/dev/null || fail "the server exited"
	sleep 0.05
done
port_listening $((port + 1)) || fail "the server did not listen on $((port + 1))"

# calls TRACK: the client's rt_sigprocmask calls over a 1 s latency run (strace -c, stopping
# the process at those calls only) into $work/calls.TRACK, after checking that the run measured.
calls() {
	RSTREAM_SIGNAL_TRACK=$1 strace -f -qq -c --seccomp-bpf -e trace=rt_sigprocmask \
		-o "$work/strace.$1" "$perf" client 127.0.0.1 --port "$port" --test lat --size 64 \
		--seconds 1 --transport engine >"$work/client.$1.log" 2>&1 ||
		fail "the client failed (RSTREAM_SIGNAL_TRACK=$1)"
	grep -q '"p50_us":[0-9]' "$work/client.$1.log" ||
		fail "no latency figure (RSTREAM_SIGNAL_TRACK=$1)"
	awk '$NF == "rt_sigprocmask" { n = $4 } END { print n + 0 }' "$work/strace.$1" \
		>"$work/calls.$1"
}
calls 1
calls 0
tracked=$(cat "$work/calls.1")
held=$(cat "$work/calls.0")
echo "rt_sigprocmask calls over 1 s: $tracked tracked, $held held"
# A run makes tens of thousands of round trips (fewer traced), each with a spin that misses
# before the answer comes; the process's start and its threads' set-up make a few calls.
[ "$tracked" -le 20 ] || fail "$tracked rt_sigprocmask calls with tracking"
[ "$held" -ge 200 ] || fail "only $held rt_sigprocmask calls without tracking"
echo PASS
