#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A poll() loop over a same-host connection that is always readable and its listener (iperf3's
# server loop): a new connection is still reported at once, the bytes arrive in order, and the
# listener's kernel side is not asked at every call (a look that found nothing a moment ago
# stands while the call returns anyway; it was an epoll_wait per 64 B read).
# Usage: listen_look.sh PROGRAM PRELOAD_LIB
set -euo pipefail
prog=$1
lib=$2
export RSTREAM_PROVIDER=${RSTREAM_PROVIDER:-tcp}
unset RSTREAM_SAME_HOST RSTREAM_STATS RSTREAM_PORT_OFFSET LD_PRELOAD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck source-path=SCRIPTDIR source=../lib/fail.sh
. "$(dirname "$0")/../lib/fail.sh"
# shellcheck source-path=SCRIPTDIR source=../lib/ports.sh
. "$(dirname "$0")/../lib/ports.sh"
# Ports whose fabric port (20000 above, the shim's default on tcp) is free as well: with an
# ephemeral port, the fabric port was sometimes taken beside other tests, and the listener
# stayed on kernel TCP (port_busy).
offset=20000

echo "without the shim:"
port=$(pick_port "$offset" 20001) || fail "no free port"
timeout 60 "$prog" 20000 "$port"
echo "with the shim, traced:"
port=$(pick_port "$offset" 20001) || fail "no free port"
timeout 120 strace -f -qq -e trace=epoll_wait -o "$work/trace" -E LD_PRELOAD="$lib" \
	-E RSTREAM_STATS="$work/stats.json" "$prog" 20000 "$port" >"$work/out"
cat "$work/out"
grep -q '"same_host_connections": 4,' "$work/stats.json" ||
	fail "expected 4 same-host connection ends: $(cat "$work/stats.json")"
main=$(sed -n 's/^{"pid": \([0-9]*\),.*/\1/p' "$work/stats.json")
polls=$(sed -n 's/.*polls=\([0-9]*\).*/\1/p' "$work/out")
wait_us=$(sed -n 's/.*accept_wait_us=\([0-9]*\).*/\1/p' "$work/out")
# Zero-timeout calls of the main thread's (the progress thread has its own).
looks=$(grep -c "^$main epoll_wait(.*, 0) " "$work/trace" || true)
echo "polls $polls, listener looks $looks, the new connection waited ${wait_us} us"
[ "$wait_us" -lt 50000 ] || fail "the new connection waited ${wait_us} us beside a busy one"
[ $((looks * 4)) -lt "$polls" ] || fail "$looks looks at the listener in $polls polls"
echo PASS
