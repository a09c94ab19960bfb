# SPDX-License-Identifier: MIT
# Helpers of scripts/bench: the shim's command prefix, ports, servers, clients with their CPU
# accounting, the check that a shim run used the fabric (or a same run shared memory), and one
# JSON line per run. Sourced by scripts/bench and scripts/bench-workloads.sh; the caller sets
# bench_name, shim_lib, offset, work (with work/stats), runs (the JSON lines file), py, clk,
# round, port_lo, port_hi and the pinning prefixes server_cpu and client_cpu (arrays, empty when
# unpinned).
# shellcheck shell=bash

# The command prefix for one end of a run (in wrap): nothing for kernel TCP, or the shim with
# its statistics in $work/stats/ROLE.<pid>.json. The same-host transport is on by default, and
# both ends here are on one host: shim turns it off so that it keeps measuring the fabric (the
# provider), same turns it on (shared memory between the two processes). env execs, as taskset
# and rstream-run do, so that server_pid stays the program's own pid.
with() {
	local same_host=0
	case $1 in
	shim | same)
		[ "$1" = shim ] || same_host=1
		wrap=(env "RSTREAM_SAME_HOST=$same_host" scripts/rstream-run --lib "$shim_lib"
			--provider "$RSTREAM_PROVIDER" --port-offset "$offset"
			--stats "$work/stats/$2.%p.json" --)
		;;
	*) wrap=() ;;
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

# Sets p to the next port of port_lo..port_hi (round robin) with no socket at all on it nor on
# p + offset: the shim cannot listen on a fabric port that still has a connection in TIME-WAIT
# from an earlier run (it would serve kernel TCP only), so every run takes a fresh pair.
next_port=
take_port() {
	local q
	next_port=${next_port:-$port_lo}
	for _ in $(seq $((port_hi - port_lo + 1))); do
		q=$next_port
		next_port=$((q >= port_hi ? port_lo : q + 1))
		if ! ss -Hatn "( sport = :$q or sport = :$((q + offset)) )" 2>/dev/null | grep -q .; then
			p=$q
			return 0
		fi
	done
	echo "$bench_name: no free port in $port_lo..$port_hi (and +$offset; TIME-WAIT lasts 60 s)" >&2
	return 1
}

ticks() { # utime + stime of process $1 (all its threads), in clock ticks; n/a once it is gone
	awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat" 2>/dev/null || echo n/a
}

# serve NAME SIGNAL COMMAND...: starts a server (pinned and wrapped as set) in the background,
# output in $work/NAME.log; sets server_pid, the program's own pid (taskset and rstream-run
# exec), and the signal that stops it cleanly so that the shim writes its statistics.
server_pid=
serve() {
	local name=$1
	server_sig=$2
	shift 2
	"${server_cpu[@]}" "${wrap[@]}" "$@" >"$work/$name.log" 2>&1 &
	server_pid=$!
}

# Stops the server: its signal, KILL after 5 s, then waits.
halt() {
	[ -n "$server_pid" ] || return 0
	kill "-$server_sig" "$server_pid" 2>/dev/null || true
	for _ in $(seq 50); do
		kill -0 "$server_pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$server_pid" 2>/dev/null || true
	wait "$server_pid" 2>/dev/null || true
	server_pid=
}

# begin MODE NAME SIGNAL COMMAND...: starts a server on port $p (see take_port), as MODE
# (kernel, shim or same) with fresh statistics, and waits until it listens (on its fabric port
# too under the shim: a same-host connection is set up over the fabric before it moves to shared
# memory); sets t0, its CPU ticks then.
begin() {
	local mode=$1 name=$2 sig=$3 fab=()
	shift 3
	rm -f "$work/stats/"*.json
	with "$mode" server
	serve "$name" "$sig" "$@"
	[ "$mode" = kernel ] || fab=($((p + offset)))
	if ! wait_port "$p" "${fab[@]}"; then
		echo "$bench_name: $name: $(tail -n3 "$work/$name.log")" >&2
		halt
		return 1
	fi
	t0=$(ticks "$server_pid")
}

# client MODE SECONDS COMMAND...: runs a client against the server begun (bounded by SECONDS),
# then stops the server; sets cli_s and srv_s (the server's CPU over the client's run; both n/a
# when the client failed).
client() {
	local mode=$1 limit=$2 rc=0
	shift 2
	with "$mode" client
	client_run "$limit" "$@" || rc=$?
	srv_s=$(cpu_s "$t0" "$(ticks "$server_pid")")
	halt
	if [ "$rc" != 0 ]; then
		echo "$bench_name: $1 client failed (exit $rc): $(tail -n3 "$work/err")" >&2
		srv_s=n/a
	fi
	return "$rc"
}

# The client's CPU: its rusage (itself and its children) over its whole life, written to a file.
# shellcheck disable=SC2016 # Python, not shell
cpu_py='import resource, subprocess, sys
rc = subprocess.run(sys.argv[2:]).returncode
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
open(sys.argv[1], "w").write("%.4f\n" % (ru.ru_utime + ru.ru_stime))
sys.exit(rc)'

# client_run SECONDS COMMAND...: runs a client (pinned and wrapped as set) bounded by SECONDS,
# stdout in $work/out, stderr in $work/err; sets cli_s, its CPU seconds (n/a when it failed).
client_run() {
	local limit=$1 rc=0
	shift
	rm -f "$work/client.cpu"
	timeout -k 5 "$limit" "${client_cpu[@]}" "$py" -c "$cpu_py" "$work/client.cpu" \
		"${wrap[@]}" "$@" >"$work/out" 2>"$work/err" || rc=$?
	cli_s=$(cat "$work/client.cpu" 2>/dev/null || echo n/a)
	[ "$rc" = 0 ] || cli_s=n/a
	return "$rc"
}

# The server's CPU seconds between two tick counts.
cpu_s() {
	awk -v a="$1" -v b="$2" -v k="$clk" 'BEGIN {
		if (a == "n/a" || b == "n/a") print "n/a"; else printf "%.4f", (b - a) / k }'
}

# stat_sum ROLE FIELD: FIELD summed over ROLE's statistics files (n/a when there are none).
stat_sum() {
	local f sum=n/a v
	for f in "$work/stats/$1".*.json; do
		[ -f "$f" ] || continue
		v=$(sed -n "s/.*\"$2\": *\([0-9][0-9]*\).*/\1/p" "$f")
		sum=$((${sum/n\/a/0} + ${v:-0}))
	done
	echo "$sum"
}

# fabric_verdict MODE MIN_CONNECTIONS: for a shim run, whether both ends' statistics show at
# least MIN_CONNECTIONS fabric connections each, none of them same-host (the shim's figure must
# not be shared memory's), and most of their bytes (over all connections they list, kernel ones
# included) carried by the fabric; for a same run, whether they show at least MIN_CONNECTIONS
# same-host connections each and most of their bytes carried by them (the statistics count
# same-host connections and bytes among the fabric's too). Sets verdict (ok, or no-fabric or
# no-same-host with the reason on stderr), share (the smaller end's fabric share of its bytes,
# same-host included) and same_share (its same-host share), both null for kernel runs.
fabric_verdict() {
	verdict=ok
	share=null
	same_share=null
	[ "$1" = shim ] || [ "$1" = same ] || return 0
	local out
	out=$("$py" - "$1" "$work/stats" "$2" <<'PY'
import glob, json, sys
mode, d, need = sys.argv[1], sys.argv[2], int(sys.argv[3])
shares, same_shares, why = [], [], []
for role in ("server", "client"):
    files = glob.glob("%s/%s.*.json" % (d, role))
    stats = []
    for f in files:
        try:
            stats.append(json.load(open(f)))
        except ValueError:
            why.append("%s: unreadable %s" % (role, f))
    if not stats:
        why.append("%s wrote no statistics (not under the shim, or killed)" % role)
        continue
    conns = sum(s["fabric_connections"] for s in stats)
    # A shim without the same-host transport writes no such fields: none of it then.
    same = sum(s.get("same_host_connections", 0) for s in stats)
    fab = sum(s["fabric_bytes_sent"] + s["fabric_bytes_received"] for s in stats)
    same_b = sum(s.get("same_host_bytes_sent", 0) + s.get("same_host_bytes_received", 0)
                 for s in stats)
    kern = sum(c["sent"] + c["received"] for s in stats for c in s["connections"]
               if c["path"] == "kernel")
    share = fab / (fab + kern) if fab + kern else 0.0
    same_share = same_b / (fab + kern) if fab + kern else 0.0
    shares.append(share)
    same_shares.append(same_share)
    if conns < need:
        reasons = {k: v for s in stats for k, v in s["fallback_reasons"].items() if v}
        why.append("%s: %d fabric connections, expected %d (fallbacks %s)" % (
            role, conns, need, reasons))
    if mode == "shim":
        if same:
            why.append("%s: %d same-host connections (RSTREAM_SAME_HOST=0 not honoured)" % (
                role, same))
        if share < 0.5:
            why.append("%s: %.0f%% of its bytes over the fabric" % (role, 100 * share))
    else:
        if conns >= need > same:  # otherwise the line above says why
            why.append("%s: %d same-host connections of %d fabric ones, expected %d" % (
                role, same, conns, need))
        if same_share < 0.5:
            why.append("%s: %.0f%% of its bytes through same-host memory" % (
                role, 100 * same_share))
print("%.3f %.3f" % (min(shares), min(same_shares)) if shares else "null null")
for w in why:
    print(w)
PY
) || out=$'null null\nstatistics check failed'
	read -r share same_share <<<"$(head -n1 <<<"$out")"
	if [ "$(wc -l <<<"$out")" -gt 1 ]; then
		if [ "$1" = shim ]; then
			verdict=no-fabric
		else
			verdict=no-same-host
		fi
		echo "$bench_name: $1 run did not use its path: $(tail -n +2 <<<"$out" | paste -sd';')" >&2
	fi
}

# record WORKLOAD CASE X MODE STATUS [KEY=VALUE...]: one run as a JSON line in $runs; values
# that are numbers stay numbers, n/a and empty become null, anything else a string.
record() {
	local line kv k v
	line="{\"workload\": \"$1\", \"case\": \"$2\", \"x\": ${3:-null}, \"mode\": \"$4\""
	line+=", \"round\": $round, \"status\": \"$5\""
	shift 5
	for kv in "$@"; do
		k=${kv%%=*}
		v=${kv#*=}
		if [[ $v =~ ^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]]; then
			line+=", \"$k\": $v"
		elif [ -z "$v" ] || [ "$v" = n/a ] || [ "$v" = null ]; then
			line+=", \"$k\": null"
		else
			v=${v//\\/\\\\}
			line+=", \"$k\": \"${v//\"/\\\"}\""
		fi
	done
	echo "$line}" >>"$runs"
}
