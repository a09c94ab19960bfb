#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Nested epoll readiness, without and with the shim; with it the socket must be on the fabric.
# Usage: nested.sh PROGRAM PRELOAD_LIB
set -euo pipefail
prog=$1
lib=$2
unset RSTREAM_PORT_OFFSET RSTREAM_STATS LD_PRELOAD
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
timeout 30 "$prog" "$port"
echo "with the shim:"
port=$(pick_port "$offset" 20001) || fail "no free port"
timeout 60 env RSTREAM_STATS="$work/stats.json" LD_PRELOAD="$lib" "$prog" "$port"
cat "$work/stats.json"
grep -q '"fabric_connections": 2,' "$work/stats.json" || {
	echo "expected 2 fabric connections"
	exit 1
}
