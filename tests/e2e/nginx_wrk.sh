#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# nginx in one process (master_process off) and wrk with 200 connections, both under the shim:
# no socket error of any kind (wrk sizes its event loop by its connection count, so the shim's
# own descriptors must not crowd the program's), and every connection on the fabric.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need nginx wrk
connections=${E2E_WRK_CONNECTIONS:-200}

mkdir -p "$work/nginx/html"
printf 'hello over the fabric\n' >"$work/nginx/html/index.html"
start_nginx "master_process off; worker_processes 1;"

shim wrk 60 wrk -t2 -c"$connections" -d2s "http://127.0.0.1:$port/" >"$work/wrk.log" 2>&1 ||
	fail "wrk exited with an error"
sed 's/^/    /' "$work/wrk.log"
grep -q 'Socket errors' "$work/wrk.log" && fail "wrk saw socket errors"
grep -qE '^ +[0-9]+ requests in' "$work/wrk.log" || fail "wrk made no requests"
grep -qE 'Non-2xx' "$work/wrk.log" && fail "wrk got error pages"
expect_fabric wrk "$connections"

stop_pid "$server_pid" QUIT || true
# A connection wrk closes while its upgrade is under way (at the end) counts as not upgraded.
expect_fabric server "$connections" any
echo PASS
