#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A program that fits `ulimit -Sn 1024` without the shim still fits with it, select() included,
# and its connections use the fabric; also where the soft limit is the hard one (nothing can be
# raised: the shim's descriptors go to the upper half). Usage: fdlimit.sh PROGRAM PRELOAD_LIB
set -euo pipefail
prog=$1
lib=$2
n=400 # 800 connection fds + a listener: fits 1024 without the shim
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -lt $((1024 + 8 * n + 64)) ]; then
	echo "hard fd limit $hard is too low for the shim's fds above 1024; skipping"
	exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# shim_run FLAG LIMIT STATS COUNT: the program under the shim after `ulimit FLAG LIMIT`. Its
# listener's fabric port is derived from the port the kernel picked; when another process holds
# it (the tests beside this one take ephemeral ports all the time), the listener stays on kernel
# TCP by design (port_busy), and the run is made again with a new port, up to three times.
shim_run() {
	local try
	for try in 1 2 3; do
		(ulimit "$1" "$2" && timeout 120 env RSTREAM_STATS="$3" LD_PRELOAD="$lib" "$prog" "$4")
		grep -q '"port_busy": 0' "$3" && return 0
		echo "run $try: the fabric port was taken (port_busy); again"
	done
}

echo "without the shim:"
(ulimit -Sn 1024 && timeout 60 "$prog" $n)
echo "with the shim:"
shim_run -Sn 1024 "$work/stats.json" $n
cat "$work/stats.json"
# Both ends in one process: every connection counts twice.
grep -q "\"fabric_connections\": $((2 * n))," "$work/stats.json" || {
	echo "expected $((2 * n)) fabric connections"
	exit 1
}

# Soft limit = hard limit = 4096: 400 descriptors of the program's below FD_SETSIZE, 1,600 or
# so of the shim's (four per fabric connection end) above 2048.
m=200
echo "soft = hard = 4096, with the shim:"
shim_run -n 4096 "$work/stats2.json" $m
cat "$work/stats2.json"
grep -q "\"fabric_connections\": $((2 * m))," "$work/stats2.json" || {
	echo "soft = hard: expected $((2 * m)) fabric connections"
	exit 1
}
