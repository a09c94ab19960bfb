# SPDX-License-Identifier: MIT
# Helpers shared by scripts/bench and scripts/bench-rr: the shim's command prefix, waiting for
# servers, medians and ratios. Sourced; the caller sets bench_name, shim_lib, offset and work.
# shellcheck shell=bash

# The command prefix for one end of a run (in wrap): nothing for kernel TCP, or the shim with
# its statistics in $work/stats/ROLE.<pid>.json.
with() {
	case $1 in
	kernel) wrap=() ;;
	shim) wrap=(scripts/rstream-run --lib "$shim_lib" --provider "$RSTREAM_PROVIDER"
		--port-offset "$offset" --stats "$work/stats/$2.%p.json" --) ;;
	esac
}

# Waits until something listens on every TCP port given, up to 10 s.
wait_port() {
	local q up
	for _ in $(seq 200); do
		up=1
		for q in "$@"; do
			ss -Hltn "sport = :$q" 2>/dev/null | grep -q . || up=0
		done
		[ "$up" = 1 ] && return 0
		sleep 0.05
	done
	echo "$bench_name: nothing listens on port(s) $*" >&2
	return 1
}

median() { # the median of the numbers given (n/a when any is n/a)
	if [ $# -eq 0 ] || printf '%s\n' "$@" | grep -q 'n/a'; then
		echo n/a
		return
	fi
	printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 }
		END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

ratio() { # $1 / $2 to two places, n/a when either is n/a or $2 is 0
	awk -v a="$1" -v b="$2" 'BEGIN {
		if (a == "n/a" || b == "n/a" || b + 0 == 0) print "n/a"; else printf "%.2f", a / b }'
}
