#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# nginx with its default process model (a master that listens and forks 2 workers that accept)
# under the shim, and shimmed clients: the master's fabric listener defers every connect to
# kernel TCP at once and the worker that serves it upgrades it in-band, switching to the fabric
# mid-stream, so short-lived clients are never held up and keep-alive connections move to the
# fabric, as both ends' statistics show.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need nginx curl ab

# What kind of failures ab counted (connect, receive, length, exceptions), and what the workers
# logged above notice level: the failure says what went wrong.
ab_failures() {
	grep -A1 '^Failed requests' "$1" | tr -s ' \n' ' '
	grep -vE '\[(notice|info)\]' "$work/nginx/error.log" 2>/dev/null | tail -n 5 || true
}

mkdir -p "$work/nginx/html"
head -c 4096 /dev/urandom | base64 -w 0 >"$work/nginx/html/index.html"
start_nginx "worker_processes 2;"
# The master forks its workers after it listens.
sleep 0.5

# A fresh process each time: a short-lived client, done before its connection could switch to
# the fabric (it never waits for libfabric to load): intact and quick, nothing falling back.
for i in 1 2 3; do
	out=$(shim "curl$i" 30 curl -s -o "$work/page$i" -w '%{time_connect} %{time_total}' \
		"http://127.0.0.1:$port/") || fail "curl $i failed"
	cmp -s "$work/page$i" "$work/nginx/html/index.html" || fail "curl $i got another page"
	log "curl $i: connected, done in $out s"
	awk -v t="${out#* }" 'BEGIN { exit !(t < 1.0) }' || fail "curl $i took $out s"
	expect_no_fallback "curl$i"
done

# A connect storm from one process, a connection per request: every request answered, no
# connection falling back (each is over before its switch, or switched).
shim ab 60 ab -q -n 2000 -c 50 "http://127.0.0.1:$port/" >"$work/ab.log" 2>&1 ||
	fail "ab exited with an error"
grep -E 'Failed requests|Complete requests|Requests per second|Time taken' "$work/ab.log" |
	sed 's/^/    /'
grep -qE '^Complete requests: +2000$' "$work/ab.log" || fail "ab: not 2000 complete requests"
grep -qE '^Failed requests: +0$' "$work/ab.log" || fail "ab: $(ab_failures "$work/ab.log")"
expect_no_fallback ab

# Keep-alive connections, each serving many requests for 3 s: every one switches to the fabric
# (as soon as ab has loaded libfabric, in the background).
shim abk 60 ab -q -k -t 3 -n 10000000 -c 10 "http://127.0.0.1:$port/" >"$work/abk.log" 2>&1 ||
	fail "ab -k exited with an error"
grep -qE '^Complete requests: +[1-9][0-9]{4,}$' "$work/abk.log" || fail "ab -k: few requests"
grep -qE '^Failed requests: +0$' "$work/abk.log" || fail "ab -k: $(ab_failures "$work/abk.log")"
expect_fabric abk 10

# The workers (the master serves none): the keep-alive connections, switched.
stop_pid "$server_pid" QUIT || true
v=$(stat_sum server fabric_connections)
[ "$v" -ge 10 ] || fail "nginx: $v fabric connections, expected 10"
v=$(stat_sum server fabric_bytes_sent)
[ "$v" -ge $((10000 * 4096)) ] || fail "nginx: sent only $v bytes over the fabric"
echo PASS
