#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# nginx with its default process model (a master that listens and forks 2 workers that accept)
# under the shim, and shimmed clients: the master's fabric listener defers every connect to
# kernel TCP at once, the worker that serves it upgrades it in-band, so curl and ab get every
# page over the fabric without waiting for any timeout, as both ends' statistics show.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need nginx curl ab

mkdir -p "$work/nginx/html"
head -c 4096 /dev/urandom | base64 -w 0 >"$work/nginx/html/index.html"
start_nginx "worker_processes 2;"
# The master forks its workers after it listens.
sleep 0.5

# A fresh process each time: each curl's one connection is upgraded by a worker.
for i in 1 2 3; do
	out=$(shim "curl$i" 30 curl -s -o "$work/page$i" -w '%{time_connect} %{time_total}' \
		"http://127.0.0.1:$port/") || fail "curl $i failed"
	cmp -s "$work/page$i" "$work/nginx/html/index.html" || fail "curl $i got another page"
	log "curl $i: connected, done in $out s"
	awk -v t="${out% *}" 'BEGIN { exit !(t < 1.0) }' || fail "curl $i took $out s to connect"
	expect_fabric "curl$i" 1 0
done

# A connect storm from one process: every request answered, every connection on the fabric.
shim ab 60 ab -q -n 2000 -c 50 "http://127.0.0.1:$port/" >"$work/ab.log" 2>&1 ||
	fail "ab exited with an error"
grep -E 'Failed requests|Complete requests|Requests per second|Time taken' "$work/ab.log" |
	sed 's/^/    /'
grep -qE '^Complete requests: +2000$' "$work/ab.log" || fail "ab: not 2000 complete requests"
grep -qE '^Failed requests: +0$' "$work/ab.log" || fail "ab: failed requests"
v=$(stat_sum ab fabric_connections)
[ "$v" -ge 2000 ] || fail "ab: $v fabric connections, expected 2000"
v=$(stat_sum ab fallback_connections)
[ "$v" -eq 0 ] || fail "ab: $v connections on kernel TCP"

# The workers (the master serves none): the 2003 connections, upgraded.
stop_pid "$server_pid" QUIT || true
v=$(stat_sum server fabric_connections)
[ "$v" -ge 2003 ] || fail "nginx: $v fabric connections, expected 2003"
v=$(stat_sum server fabric_bytes_sent)
[ "$v" -ge $((2003 * 4096)) ] || fail "nginx: sent only $v bytes over the fabric"
echo PASS
