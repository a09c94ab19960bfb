# SPDX-License-Identifier: MIT
# fail MESSAGE: what the standalone test scripts print when they fail: the message and the last
# lines of every log in $work (*.log), then exit 1. Sourced; the script sets work.
# shellcheck shell=bash

fail() {
	echo "FAIL: $*"
	local f
	# shellcheck disable=SC2154 # work: set by the script that sources this
	for f in "$work"/*.log; do
		[ -f "$f" ] || continue
		echo "---- ${f#"$work"/}"
		tail -n 30 "$f"
	done
	exit 1
}
