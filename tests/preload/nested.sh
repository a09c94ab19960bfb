#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Nested epoll readiness, without and with the shim; with it the socket must be on the fabric.
# Usage: nested.sh PROGRAM PRELOAD_LIB
set -euo pipefail
prog=$1
lib=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "without the shim:"
timeout 30 "$prog"
echo "with the shim:"
timeout 60 env RSTREAM_STATS="$work/stats.json" LD_PRELOAD="$lib" "$prog"
cat "$work/stats.json"
grep -q '"fabric_connections": 2,' "$work/stats.json" || {
	echo "expected 2 fabric connections"
	exit 1
}
