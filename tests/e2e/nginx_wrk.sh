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
cat >"$work/nginx/nginx.conf.in" <<EOC
daemon off;
master_process off;
user root;
worker_processes 1;
error_log $work/nginx/error.log info;
pid $work/nginx/nginx.pid;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $work/nginx/body;
    proxy_temp_path $work/nginx/proxy;
    fastcgi_temp_path $work/nginx/fastcgi;
    uwsgi_temp_path $work/nginx/uwsgi;
    scgi_temp_path $work/nginx/scgi;
    server { listen 127.0.0.1:NGINX_PORT; root $work/nginx/html; }
}
EOC
start_server server 1 shim server 60 bash -c \
	"sed 's/NGINX_PORT/@PORT@/' '$work/nginx/nginx.conf.in' >'$work/nginx/nginx.conf' && \
	exec nginx -e stderr -c '$work/nginx/nginx.conf'"

shim wrk 60 wrk -t2 -c"$connections" -d2s "http://127.0.0.1:$port/" >"$work/wrk.log" 2>&1 ||
	fail "wrk exited with an error"
sed 's/^/    /' "$work/wrk.log"
grep -q 'Socket errors' "$work/wrk.log" && fail "wrk saw socket errors"
grep -qE '^ +[0-9]+ requests in' "$work/wrk.log" || fail "wrk made no requests"
grep -qE 'Non-2xx' "$work/wrk.log" && fail "wrk got error pages"
expect_fabric wrk "$connections"

stop_pid "$server_pid" QUIT || true
expect_fabric server "$connections"
echo PASS
