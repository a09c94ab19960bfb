#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The shim's signal tracking (RSTREAM_SIGNAL_TRACK) under a real program: a client whose reads
# over the fabric each sleep calls no rt_sigprocmask in 100 of them (the handlers count
# themselves through the shim's trampoline), where holding signals off around each sleep
# called it twice a sleep (RSTREAM_SIGNAL_TRACK=0, run too: the count counts). sigaction
# still answers with the program's handler, and an alarm ends a blocking read (signal_track.py).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need python3 strace
prog="$(dirname "$0")/signal_track.py"

for track in 1 0; do
	start_server "server-$track" 1 shim "server-$track" 60 python3 "$prog" server @PORT@
	out=$(shim "client-$track" 60 env RSTREAM_SIGNAL_TRACK=$track strace -f -o "$work/strace-$track" \
		-e trace=sched_get_priority_min,rt_sigprocmask python3 "$prog" client "$port" 2>&1) ||
		fail "track=$track: the client failed: $(tail -n 3 <<<"$out")"
	finish "$server_pid" || fail "track=$track: the server failed"
	expect_fabric "client-$track" 1
	# The calls between the two marks (sched_get_priority_min, see signal_track.py).
	n=$(awk '/sched_get_priority_min\(/ { m++; next } m == 1 && /rt_sigprocmask\(/ { n++ } END { print n + 0 }' \
		"$work/strace-$track")
	log "track=$track: $(tail -n 1 <<<"$out"); rt_sigprocmask in 100 reads: $n"
	if [ "$track" = 1 ]; then
		[ "$n" -le 10 ] || fail "tracked: $n rt_sigprocmask calls in 100 sleeping reads"
	else
		[ "$n" -ge 100 ] || fail "held: only $n rt_sigprocmask calls in 100 sleeping reads"
	fi
done
echo PASS
