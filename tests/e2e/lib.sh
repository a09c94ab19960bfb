# SPDX-License-Identifier: MIT
# Shared helpers of the e2e tests: ports, processes by recorded PID, the shim and its statistics.
# Sourced by the test scripts, whose arguments are: LIBRSTREAM_PRELOAD_SO RSTREAM_RUN [...].
# shellcheck shell=bash

E2E_LIB=$(realpath "${1:?usage: $0 LIBRSTREAM_PRELOAD_SO RSTREAM_RUN}")
E2E_RUN=$(realpath "${2:?usage: $0 LIBRSTREAM_PRELOAD_SO RSTREAM_RUN}")
E2E_OFFSET=20000 # the shim's default RSTREAM_PORT_OFFSET on tcp
export RSTREAM_PROVIDER=${RSTREAM_PROVIDER:-tcp}
# E2E_SAME_HOST=1: the programs' connections take the same-host transport (meson's default
# test setup turns it off), and expect_fabric also requires that they did.
if [ "${E2E_SAME_HOST:-0}" = 1 ]; then
	export RSTREAM_SAME_HOST=1
fi
unset RSTREAM_PORT_OFFSET RSTREAM_PORTS RSTREAM_EXCLUDE RSTREAM_ENABLE RSTREAM_STATS LD_PRELOAD

work=$(mktemp -d "${TMPDIR:-/tmp}/rstream-e2e.XXXXXX")
mkdir -p "$work/stats"
e2e_pids=()
e2e_t0=$SECONDS

# Stops every process still recorded (TERM, then KILL after 5 s) and removes the work folder
# (kept when E2E_KEEP=1).
e2e_cleanup() {
	local pid
	for pid in "${e2e_pids[@]}"; do
		if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; fi
	done
	for pid in "${e2e_pids[@]}"; do
		[ -n "$pid" ] || continue
		for _ in $(seq 50); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	if [ "${E2E_KEEP:-0}" = 1 ]; then
		echo "work folder kept: $work"
	else
		rm -rf "$work"
	fi
}
trap e2e_cleanup EXIT

log() {
	printf '[%3ds] %s\n' $((SECONDS - e2e_t0)) "$*"
}

# dump_shim_state PID...: each process's shim sockets as the shim sees them, written to that
# process's stderr (its log) by the debugger, for a test that failed on a hang; nothing where
# gdb is missing.
dump_shim_state() {
	local p
	command -v gdb >/dev/null || return 0
	for p in "$@"; do
		timeout 60 gdb -batch -p "$p" -ex 'call (void)rstreamDebugDump()' >/dev/null 2>&1 || true
	done
}

# Prints the last lines of every log (the programs' and rstream's own, *.rs) and of every
# statistics file, then fails the test.
fail() {
	echo "FAIL: $*"
	local f
	for f in "$work"/*.log "$work"/*.rs "$work"/stats/*.json; do
		[ -f "$f" ] || continue
		echo "---- ${f#"$work"/}"
		# Progress lines end in \r: one line each, the last 200 characters of it.
		tr '\r' '\n' <"$f" | tail -n 25 | cut -c 1-200
	done
	exit 1
}

# Skips the test (meson's exit code 77) when a program is missing.
need() {
	local p
	for p in "$@"; do
		if ! command -v "$p" >/dev/null 2>&1; then
			echo "SKIP: $p is not installed (scripts/setup installs it)"
			exit 77
		fi
	done
}

# port_in_use, port_listening and pick_port.
# shellcheck source-path=SCRIPTDIR source=../lib/ports.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/ports.sh"

# Commands are written "shim ROLE SECONDS PROG ARGS..." (PROG under the shim, statistics in
# $work/stats/ROLE.<pid>.json) or "plain SECONDS PROG ARGS...", both bounded by timeout; argv
# turns such a command into E2E_ARGV so that start can run it without a shell in between.
argv() {
	case $1 in
	shim)
		E2E_ARGV=(timeout -k 5 "$3" "$E2E_RUN" --lib "$E2E_LIB"
			--stats "$work/stats/$2.%p.json" -- "${@:4}")
		;;
	plain) E2E_ARGV=(timeout -k 5 "$2" "${@:3}") ;;
	*) fail "argv: $1 is neither shim nor plain" ;;
	esac
}

shim() {
	argv shim "$@"
	"${E2E_ARGV[@]}"
}

plain() {
	argv plain "$@"
	"${E2E_ARGV[@]}"
}

# start NAME COMMAND: runs COMMAND (see argv) in the background, output to $work/NAME.log;
# sets last_pid and records it for the cleanup.
start() {
	local name=$1
	shift
	argv "$@"
	"${E2E_ARGV[@]}" >"$work/$name.log" 2>&1 &
	last_pid=$!
	e2e_pids+=("$last_pid")
}

# Forgets a recorded PID (after it was waited for).
forget() {
	local i
	for i in "${!e2e_pids[@]}"; do
		[ "${e2e_pids[$i]}" = "$1" ] && e2e_pids[i]=
	done
	return 0
}

# finish PID: waits for a recorded process and returns its exit status.
finish() {
	local rc=0
	wait "$1" || rc=$?
	forget "$1"
	return "$rc"
}

# stop_pid PID [SIGNAL]: SIGNAL (default TERM; then KILL after 10 s) and wait; returns the exit
# status.
stop_pid() {
	local p
	# Once to each process of the program: timeout(1) forwards a signal to its child and again
	# to its process group, and a program that has given the signal its default action back by
	# the second (Python does as it exits) dies of it before writing its statistics. timeout
	# made that group for itself; each of its members but timeout gets the signal here.
	if [ "$(ps -o comm= -p "$1" 2>/dev/null)" = timeout ]; then
		for p in $(pgrep -g "$1" 2>/dev/null || true); do
			[ "$p" = "$1" ] || kill -s "${2:-TERM}" "$p" 2>/dev/null || true
		done
	else
		kill -s "${2:-TERM}" "$1" 2>/dev/null || true
	fi
	for _ in $(seq 100); do
		kill -0 "$1" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$1" 2>/dev/null || true
	finish "$1"
}

# wait_listen PORT PID [FABRIC]: waits (10 s at most) until PORT listens (and, when FABRIC is
# 1, its fabric port too) while PID lives.
wait_listen() {
	local port=$1 pid=$2 fabric=${3:-0}
	for _ in $(seq 200); do
		kill -0 "$pid" 2>/dev/null || return 1
		if port_listening "$port" &&
			{ [ "$fabric" = 0 ] || port_listening $((port + E2E_OFFSET)); }; then
			return 0
		fi
		sleep 0.05
	done
	return 1
}

# start_server NAME FABRIC COMMAND: starts a server on a free port (each @PORT@ in COMMAND
# becomes it) and waits until it listens (its fabric port too when FABRIC is 1); tries other ports when
# another process took the port meanwhile. Sets port and server_pid.
start_server() {
	local name=$1 fabric=$2
	shift 2
	local attempt arg args
	# A server whose fabric port nobody may take (fabric 0: a plain server, whose clients' light
	# probe must find nothing there, or a shim server that does not listen on it) takes a port
	# whose fabric port lies past the ephemeral range (up to 60999) and past the fabric ports of
	# other tests' picks (40000..60000): a listener on an ephemeral port elsewhere, or another
	# test's shim server, could otherwise start listening there while this test runs.
	local base=20000 span=20001
	[ "$fabric" = 1 ] || base=41000 span=4536
	for attempt in 1 2 3 4 5; do
		port=$(pick_port "$E2E_OFFSET" "$span" 200 "$base") || fail "no free port"
		args=()
		for arg in "$@"; do
			args+=("${arg//@PORT@/$port}")
		done
		rm -f "$work/stats/$name".*.json
		start "$name" "${args[@]}"
		server_pid=$last_pid
		if wait_listen "$port" "$server_pid" "$fabric"; then
			if [ "$fabric" = 1 ]; then
				log "$name listens on port $port and fabric port $((port + E2E_OFFSET))"
			else
				log "$name listens on port $port"
			fi
			return 0
		fi
		stop_pid "$server_pid" || true
		log "$name did not listen on port $port (attempt $attempt)"
		tail -n 5 "$work/$name.log"
	done
	fail "$name: no port could be used"
}

# stat_sum ROLE FIELD: FIELD summed over the statistics files of ROLE's processes.
stat_sum() {
	local f files=("$work/stats/$1".*.json) sum=0 v
	for f in "${files[@]}"; do
		[ -f "$f" ] || continue
		v=$(sed -n "s/.*\"$2\": *\([0-9][0-9]*\).*/\1/p" "$f")
		[ -n "$v" ] || fail "$f has no $2"
		sum=$((sum + v))
	done
	echo "$sum"
}

# Fails unless ROLE wrote statistics.
have_stats() {
	compgen -G "$work/stats/$1.*.json" >/dev/null || fail "$1 wrote no statistics"
}

show_stats() {
	local f
	for f in "$work/stats/$1".*.json; do
		[ -f "$f" ] && echo "  $1: $(cat "$f")"
	done
	return 0
}

# fallback_reasons ROLE: ROLE's fallbacks by reason, those counted only ("kernel_peer=3
# before_switch=2"), for a failure's last line (CI keeps only the end of a long output).
fallback_reasons() {
	local r v out=""
	for r in refused timeout excluded ports negative_cache provider_error port_busy kernel_peer \
		unsupported fork_child not_upgraded before_switch loading; do
		v=$(stat_sum "$1" "$r")
		[ "$v" -eq 0 ] || out="$out $r=$v"
	done
	echo "${out# }"
}

# expect_no_fallback ROLE: every connection of ROLE used the fabric or ended before its switch
# (a connection too short to switch runs over kernel TCP by design).
expect_no_fallback() {
	local v
	have_stats "$1"
	v=$(($(stat_sum "$1" fallback_connections) - $(stat_sum "$1" before_switch)))
	[ "$v" -eq 0 ] || {
		show_stats "$1"
		fail "$1: $v fallback connections ($(fallback_reasons "$1"))"
	}
}

# expect_fabric ROLE MIN_CONNECTIONS [FALLBACK [DIRECTIONS]]: ROLE made at least MIN_CONNECTIONS
# fabric connections and FALLBACK (default 0; "any": not checked) kernel ones, and moved bytes over the fabric in
# DIRECTIONS: both (the default), sent or received.
expect_fabric() {
	local role=$1 min=$2 fallback=${3:-0} dirs=${4:-both} v
	have_stats "$role"
	show_stats "$role"
	v=$(stat_sum "$role" fabric_connections)
	[ "$v" -ge "$min" ] || fail "$role: $v fabric connections, expected at least $min"
	if [ "${E2E_SAME_HOST:-0}" = 1 ]; then
		v=$(stat_sum "$role" same_host_connections)
		[ "$v" -ge "$min" ] || fail "$role: $v same-host connections, expected at least $min"
	fi
	if [ "$dirs" != received ]; then
		v=$(stat_sum "$role" fabric_bytes_sent)
		[ "$v" -gt 0 ] || fail "$role: sent no bytes over the fabric"
	fi
	if [ "$dirs" != sent ]; then
		v=$(stat_sum "$role" fabric_bytes_received)
		[ "$v" -gt 0 ] || fail "$role: received no bytes over the fabric"
	fi
	# Connections that ended before their switch to the fabric (short ones, or made while the
	# process loaded libfabric) ran over kernel TCP by design: not counted as fallbacks here.
	v=$(($(stat_sum "$role" fallback_connections) - $(stat_sum "$role" before_switch)))
	[ "$fallback" = any ] || [ "$v" -eq "$fallback" ] ||
		fail "$role: $v fallback connections, expected $fallback ($(fallback_reasons "$role"))"
	grep -q '"provider": "tcp"' "$work/stats/$role".*.json || fail "$role: provider is not tcp"
}

# expect_kernel ROLE MIN_FALLBACK: ROLE made no fabric connection and at least MIN_FALLBACK
# kernel ones.
expect_kernel() {
	local role=$1 min=$2 v
	have_stats "$role"
	show_stats "$role"
	v=$(stat_sum "$role" fabric_connections)
	[ "$v" -eq 0 ] || fail "$role: $v fabric connections, expected none"
	v=$(stat_sum "$role" fallback_connections)
	[ "$v" -ge "$min" ] || fail "$role: $v fallback connections, expected at least $min"
}

# start_nginx MODEL: nginx under the shim (role "server") serving $work/nginx/html on a free
# port (sets port and server_pid). MODEL is its process directives, e.g. "master_process off;
# worker_processes 1;" or "worker_processes 2;". It runs as root so that its workers can read
# the work folder; every path it writes is under $work/nginx.
start_nginx() {
	mkdir -p "$work/nginx/html"
	cat >"$work/nginx/nginx.conf.in" <<EOC
daemon off;
user root;
$1
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
}
