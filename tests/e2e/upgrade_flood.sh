#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A hostile peer at a shimmed server's upgrade listener (upgrade_flood.py): after the upgrade's
# first step by hand, it opens fabric connections to the port it was given and sends no token.
# The listener keeps at most RSTREAM_UPGRADE_PENDING_MAX of them (the oldest are closed at once),
# closes each when RSTREAM_TOKEN_WAIT_MS passes and one with a wrong token at once, holds at
# most a few fds for each that waits and none after them, and a shimmed client still moves to
# the fabric.
# Usage: upgrade_flood.sh LIBRSTREAM_PRELOAD_SO RSTREAM_RUN LIBRSTREAM_SO
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need python3
prog="$(dirname "$0")/upgrade_flood.py"
librstream=$(realpath "${3:?usage: $0 LIBRSTREAM_PRELOAD_SO RSTREAM_RUN LIBRSTREAM_SO}")
export FLOOD_PENDING_MAX=8
flood=20
# The token wait leaves the 20 connects (a few ms each here) room before the first of the 8
# newest is due: the check that only the 12 oldest went at once counts on it.

start_server server 1 shim server 60 env RSTREAM_UPGRADE_PENDING_MAX=$FLOOD_PENDING_MAX \
	RSTREAM_TOKEN_WAIT_MS=3000 RSTREAM_LOG=info RSTREAM_LOG_FILE="$work/server.rs" \
	python3 "$(dirname "$0")/echo_server.py" 127.0.0.1 @PORT@
# timeout's child: the server's Python (rstream-run execs it), whose fds the hostile peer counts.
python_pid=$(pgrep -P "$server_pid" python3) || fail "no server process under $server_pid"
out=$(plain 60 python3 "$prog" hostile "$port" "$python_pid" "$librstream" "$flood" 2>&1) ||
	fail "the hostile peer's checks failed: $(tail -n 3 <<<"$out")"
log "$out"
for line in "over $FLOOD_PENDING_MAX connections without a token: the oldest closed" \
	"a fabric connection sent no token in time: closed" \
	"a fabric connection with a token nobody waits for: closed"; do
	grep -qF "$line" "$work/server.rs" || fail "the server never logged: $line"
done

out=$(shim client 60 python3 "$prog" client "$port" 2>&1) ||
	fail "the client failed: $(tail -n 3 <<<"$out")"
log "$out"
expect_fabric client 1
stop_pid "$server_pid" || true
# The hostile peer's kernel connection never brought its token, and ended first.
expect_fabric server 1
[ "$(stat_sum server before_switch)" -eq 1 ] || fail "server: the hostile connection not counted"
echo PASS
