#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# nginx with its default process model (a master that listens and forks 2 workers that accept)
# under the shim, and shimmed clients: no connection waits for the shim's connect timeout (the
# master, which holds the fabric listener, refuses at once what it will never accept), curl
# and ab get every page, and the clients' statistics show why they used kernel TCP. The
# workers serving connections over the fabric is not done yet (README, Limitations).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need nginx curl ab

mkdir -p "$work/nginx/html"
head -c 4096 /dev/urandom | base64 -w 0 >"$work/nginx/html/index.html"
start_nginx "worker_processes 2;"
# The master forks its workers after it listens.
sleep 0.5

# A fresh process each time: the negative cache does not carry over, so each curl meets the
# fabric listener and must be refused at once (the connect timeout is 2 s).
for i in 1 2 3; do
	out=$(shim "curl$i" 30 curl -s -o "$work/page$i" -w '%{time_connect}' \
		"http://127.0.0.1:$port/") || fail "curl $i failed"
	cmp -s "$work/page$i" "$work/nginx/html/index.html" || fail "curl $i got another page"
	log "curl $i: connected in $out s"
	awk -v t="$out" 'BEGIN { exit !(t < 1.0) }' || fail "curl $i took $out s to connect"
	v=$(stat_sum "curl$i" fallback_connections)
	[ "$v" -eq 1 ] || fail "curl $i: $v fallback connections, expected 1"
	grep -q '"refused": 1,' "$work/stats/curl$i".*.json || fail "curl $i: the fallback was not 'refused'"
done

# A connect storm from one process: every request answered.
shim ab 60 ab -q -n 2000 -c 50 "http://127.0.0.1:$port/" >"$work/ab.log" 2>&1 ||
	fail "ab exited with an error"
grep -E 'Failed requests|Complete requests|Requests per second|Time taken' "$work/ab.log" |
	sed 's/^/    /'
grep -qE '^Complete requests: +2000$' "$work/ab.log" || fail "ab: not 2000 complete requests"
grep -qE '^Failed requests: +0$' "$work/ab.log" || fail "ab: failed requests"
v=$(stat_sum ab fallback_connections)
[ "$v" -ge 2000 ] || fail "ab: $v fallback connections, expected 2000"
grep -q '"timeout": 0,' "$work/stats/ab".*.json || fail "ab: a connection waited for the timeout"
echo PASS
