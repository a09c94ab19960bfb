# SPDX-License-Identifier: MIT
# The workloads of scripts/bench: which cases and paths each has (cases), and one run of one
# case over one path (run_case), recorded by record. Sourced by scripts/bench after
# scripts/bench-lib.sh; the settings (secs_*, sizes, counts, perf, py) come from scripts/bench.
# shellcheck shell=bash

all_workloads=(iperf3 bw lat paced redis memcached nginx rr connect idle)

# cases WORKLOAD: one line per case: its name, its x (the number charts plot it against) and
# the paths it runs over. shim and same are the unmodified programs with both ends under the
# shim, over the fabric (RSTREAM_SAME_HOST=0) and over the same-host transport (shared memory)
# respectively; engine and raw are rstream-perf (the library and plain libfabric, the ceiling),
# where rstream-perf can run the same traffic.
cases() {
	local s c
	case $1 in
	iperf3)
		echo "P1 1 kernel shim same engine raw"
		echo "P4 4 kernel shim same" # rstream-perf has no parallel streams
		;;
	bw) for s in "${bw_sizes[@]}"; do echo "$s $s kernel shim same engine raw"; done ;;
	lat) for s in "${lat_sizes[@]}"; do echo "$s $s kernel shim same engine raw"; done ;;
	paced) echo "64B-${paced_rate}ps $paced_rate kernel shim same raw" ;;
	redis)
		echo "GET 50 kernel shim same"
		echo "SET 50 kernel shim same"
		echo "GET-P16 50 kernel shim same"
		;;
	memcached) echo "memcslap 20 kernel shim same" ;;
	nginx) for c in "${wrk_conns[@]}"; do echo "c$c $c kernel shim same"; done ;;
	rr)
		# raw: one CQ for all the connections; c*-own: raw with a CQ per connection alone.
		for c in "${rr_conns[@]}"; do echo "c$c $c kernel shim same raw"; done
		for c in "${rr_conns[@]}"; do echo "c$c-own $c raw"; done
		;;
	connect) echo "ab-c1 1 kernel shim same" ;;
	idle) echo "$idle_conns $idle_conns kernel shim same" ;;
	esac
}

# run_case WORKLOAD CASE X MODE: one run, recorded.
run_case() {
	case $1,$4 in
	iperf3,engine | iperf3,raw) perf_run "$1" "$2" "$3" "$4" bw 65536 "$secs_stream" ;;
	iperf3,*) iperf3_run "$1" "$2" "$3" "$4" "$3" 65536 "$secs_stream" ;;
	bw,engine | bw,raw) perf_run "$1" "$2" "$3" "$4" bw "$3" "$secs_size" ;;
	bw,*) iperf3_run "$1" "$2" "$3" "$4" 1 "$3" "$secs_size" ;;
	lat,engine | lat,raw) perf_run "$1" "$2" "$3" "$4" lat "$3" "$secs_lat" ;;
	lat,*) sockperf_run "$2" "$3" "$4" ;;
	paced,raw) paced_raw_run "$2" "$3" ;;
	*) "${1}_run" "$2" "$3" "$4" ;;
	esac
}

# done_run WORKLOAD CASE X MODE MIN_CONNECTIONS FIGURE KEY=VALUE...: records a run whose
# figure (its main one) came out (status ok, or no-fabric when a shim run's statistics show
# that the fabric did not carry it, or no-same-host when a same run's show that shared memory
# did not) or did not (failed).
done_run() {
	local status=failed
	if [ "$6" != n/a ] && [ "$srv_s" != n/a ] && [ "$cli_s" != n/a ]; then
		fabric_verdict "$4" "$5"
		status=$verdict
	else
		share=null
		same_share=null
	fi
	record "$1" "$2" "$3" "$4" "$status" "${@:7}" server_cpu_s="$srv_s" client_cpu_s="$cli_s" \
		fabric_share="$share" same_host_share="$same_share"
	[ "$status" = ok ] || failures=$((failures + 1))
}

failed_start() { # WORKLOAD CASE X MODE: the server did not start
	record "$1" "$2" "$3" "$4" failed
	failures=$((failures + 1))
}

# iperf3_run WORKLOAD CASE X MODE STREAMS SIZE SECONDS: iperf3, STREAMS connections writing
# SIZE bytes at a time; MB/s and bytes from what the server received.
iperf3_run() {
	local out mbps=n/a bytes=n/a
	take_port || return 1
	begin "$4" iperf3 INT iperf3 -s -B 127.0.0.1 -p "$p" || { failed_start "$@"; return 0; }
	if client "$4" $(($7 + 30)) iperf3 -c 127.0.0.1 -p "$p" -t "$7" -l "$6" -P "$5" -J; then
		out=$("$py" -c 'import json, sys
e = json.load(sys.stdin)["end"]["sum_received"]
print(e["bytes"], "%.1f" % (e["bytes"] / e["seconds"] / 1e6))' <"$work/out") || true
		bytes=${out% *}
		mbps=${out#* }
	fi
	done_run "$1" "$2" "$3" "$4" "$5" "${mbps:-n/a}" MBps="${mbps:-n/a}" bytes="${bytes:-n/a}"
}

# sockperf_run CASE SIZE MODE: sockperf ping-pong of SIZE bytes; one-way p50 and p99 (RTT/2),
# and the round trips made (warm-up included: the CPU counts it too). Paced at 550,000 round
# trips a second: sockperf sizes its table of sent messages for 600,000 a second at most and
# exits (6, "_seqN > m_maxSequenceNo") past that, which same-host 64 B ping-pong reaches on a
# fast machine (0.8 us a round trip); every other path is far below that pace.
sockperf_run() {
	local out p50=n/a p99=n/a trips=n/a
	take_port || return 1
	begin "$3" sockperf INT sockperf sr --tcp -i 127.0.0.1 -p "$p" ||
		{ failed_start lat "$1" "$2" "$3"; return 0; }
	if client "$3" $((secs_lat + 30)) sockperf pp --tcp -i 127.0.0.1 -p "$p" -m "$2" \
		-t "$secs_lat" --mps=550000; then
		out=$(cat "$work/out" "$work/err")
		p50=$(awk '/percentile 50.000/ { print $NF }' <<<"$out")
		p99=$(awk '/percentile 99.000/ { print $NF }' <<<"$out")
		trips=$(sed -n 's/.*\[Total Run\].*ReceivedMessages=\([0-9]*\).*/\1/p' <<<"$out")
	fi
	done_run lat "$1" "$2" "$3" 1 "${p50:-n/a}" p50_us="${p50:-n/a}" p99_us="${p99:-n/a}" \
		requests="${trips:-n/a}"
}

# paced_run CASE RATE MODE: sockperf ping-pong of 64 B paced at RATE round trips a second
# (--mps), what a mostly idle server pays for a request: its figure is the server's CPU per
# 1,000 requests over the run (its one connection's setup included, a few ms against the
# run's 10,000 requests). sockperf's client spins between messages to keep its pace on every
# path, so its CPU says nothing here.
paced_run() {
	local out p50=n/a trips=n/a ms=n/a
	take_port || return 1
	begin "$3" sockperf INT sockperf sr --tcp -i 127.0.0.1 -p "$p" ||
		{ failed_start paced "$1" "$2" "$3"; return 0; }
	if client "$3" $((secs_paced + 30)) sockperf pp --tcp -i 127.0.0.1 -p "$p" -m 64 \
		--mps "$2" -t "$secs_paced"; then
		out=$(cat "$work/out" "$work/err")
		p50=$(awk '/percentile 50.000/ { print $NF }' <<<"$out")
		trips=$(sed -n 's/.*\[Total Run\].*ReceivedMessages=\([0-9]*\).*/\1/p' <<<"$out")
	fi
	ms=$(awk -v s="$srv_s" -v n="${trips:-0}" 'BEGIN {
		if (s == "n/a" || n !~ /^[0-9]+$/ || n == 0) print "n/a"; else printf "%.4f", s * 1e6 / n }')
	done_run paced "$1" "$2" "$3" 1 "$ms" server_ms_per_1k="$ms" p50_us="${p50:-n/a}" \
		requests="${trips:-n/a}"
}

# paced_raw_run CASE RATE: the same pace over plain libfabric (rstream-perf rr over raw, one
# connection with a CQ of its own, --rate RATE), what the provider alone costs such a server:
# the ceiling for the shim's row. The rr server sleeps in epoll_wait over its CQ's wait fd
# after fi_trywait, where sockperf's server sleeps in a blocking recv.
paced_raw_run() {
	local out p50=n/a trips=n/a ms=n/a
	take_port || return 1
	begin kernel paced INT "$perf" rr-server --bind 127.0.0.1 --port "$p" --transport raw \
		--cq own --size 64 || { failed_start paced "$1" "$2" raw; return 0; }
	if client kernel $((secs_paced + 30)) "$perf" rr-client 127.0.0.1 --port "$p" \
		--transport raw --cq own --conns 1 --size 64 --seconds "$secs_paced" --rate "$2"; then
		out=$(tail -n1 "$work/out")
		# rr's p50 is a whole round trip; sockperf's (the other rows) is half of one.
		p50=$(sed -n 's/.*"p50_us":\([0-9.]*\).*/\1/p' <<<"$out" | awk '{ printf "%.3f", $1 / 2 }')
		trips=$(sed -n 's/.*"requests":\([0-9]*\).*/\1/p' <<<"$out")
	fi
	ms=$(awk -v s="$srv_s" -v n="${trips:-0}" 'BEGIN {
		if (s == "n/a" || n !~ /^[0-9]+$/ || n == 0) print "n/a"; else printf "%.4f", s * 1e6 / n }')
	done_run paced "$1" "$2" raw 1 "$ms" server_ms_per_1k="$ms" p50_us="${p50:-n/a}" \
		requests="${trips:-n/a}"
}

# The rstream-perf server for engine and raw runs, started at the first one: raw on perf_port,
# the engine on perf_port + 1. Its CPU over each client run is its share.
perf_pid=
perf_server() {
	[ -z "$perf_pid" ] || return 0
	"${server_cpu[@]}" "$perf" server --bind 127.0.0.1 --port "$perf_port" >"$work/perf.log" 2>&1 &
	perf_pid=$!
	for _ in $(seq 100); do
		grep -q "engine server" "$work/perf.log" && grep -q "raw server" "$work/perf.log" &&
			return 0
		sleep 0.1
	done
	echo "$bench_name: rstream-perf server did not start: $(tail -n3 "$work/perf.log")" >&2
	return 1
}

# perf_run WORKLOAD CASE X MODE TEST SIZE SECONDS: rstream-perf over the engine or raw.
perf_run() {
	local t0 out mbps=n/a p50=n/a p99=n/a bytes=n/a trips=n/a
	srv_s=n/a
	cli_s=n/a
	if perf_server; then
		t0=$(ticks "$perf_pid")
		wrap=()
		if client_run $(($7 + 30)) "$perf" client 127.0.0.1 --port "$perf_port" --transport "$4" \
			--test "$5" --size "$6" --seconds "$7"; then
			srv_s=$(cpu_s "$t0" "$(ticks "$perf_pid")")
			out=$(tail -n1 "$work/out")
			mbps=$(sed -n 's/.*"MBps":\([0-9.]*\).*/\1/p' <<<"$out")
			p50=$(sed -n 's/.*"p50_us":\([0-9.]*\).*/\1/p' <<<"$out")
			p99=$(sed -n 's/.*"p99_us":\([0-9.]*\).*/\1/p' <<<"$out")
			bytes=$(sed -n 's/.*(\([0-9]*\) bytes in .*/\1/p' "$work/out")
			trips=$(sed -n 's/.* over \([0-9]*\) round trips.*/\1/p' "$work/out")
		else
			echo "$bench_name: rstream-perf $4 $5 $6 failed: $(tail -n3 "$work/err")" >&2
		fi
	fi
	if [ "$5" = bw ]; then
		done_run "$1" "$2" "$3" "$4" 1 "${mbps:-n/a}" MBps="${mbps:-n/a}" bytes="${bytes:-n/a}"
	else
		done_run "$1" "$2" "$3" "$4" 1 "${p50:-n/a}" p50_us="${p50:-n/a}" p99_us="${p99:-n/a}" \
			requests="${trips:-n/a}"
	fi
}

# redis_run CASE CONNECTIONS MODE: redis-benchmark, 50 connections (its first, short one
# stays on kernel TCP under the shim: it ends before its switch). Each run must last well past
# the client's libfabric load (0.3-1.2 s here), when its connections move: at 100,000 requests
# a same-host run was over in 0.7 s, half of it before the switch; 300,000 last 2-4 s. -P 16
# makes 10 times the requests.
redis_run() {
	local n=$redis_requests rps=n/a args=(-t get)
	case $1 in
	SET) args=(-t set) ;;
	GET-P16) n=$((redis_requests * 10)) args=(-t get -P 16) ;;
	esac
	take_port || return 1
	begin "$3" redis INT redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no \
		--daemonize no --dir "$work" || { failed_start redis "$@"; return 0; }
	if client "$3" 300 redis-benchmark -h 127.0.0.1 -p "$p" -q -c "$2" -n "$n" "${args[@]}"; then
		rps=$(tr '\r' '\n' <"$work/out" | awk '/requests per second/ {
			for (i = 1; i <= NF; i++) if ($i == "requests") printf "%.0f\n", $(i - 1) }' |
			tail -n1)
	fi
	done_run redis "$1" "$2" "$3" "$2" "${rps:-n/a}" rps="${rps:-n/a}" requests="$n"
}

# memcached_run CASE CONNECTIONS MODE: memcslap, 20 connections, 15,000 sets each (2-6 s: long
# past the switch, as redis_run's).
memcached_run() {
	local n=$((memcslap_each * $2)) rps=n/a
	take_port || return 1
	begin "$3" memcached INT memcached -u root -l 127.0.0.1 -p "$p" -U 0 -t 2 ||
		{ failed_start memcached "$@"; return 0; }
	if client "$3" 300 memcslap --servers="127.0.0.1:$p" --concurrency="$2" \
		--execute-number="$memcslap_each"; then
		# "Time to set 40000 keys by 20 threads: 0.685 seconds."
		rps=$(awk '/Time to set .* keys by .* threads:/ { printf "%.0f", $4 / $(NF - 1) }' \
			"$work/out" "$work/err")
	fi
	done_run memcached "$1" "$2" "$3" "$2" "${rps:-n/a}" rps="${rps:-n/a}" requests="$n"
}

# nginx in one process (master_process off, as tests/e2e/nginx_wrk.sh runs it) on port $p,
# serving a 1 KiB page. keepalive_requests is raised from nginx's default 1,000: wrk would
# reconnect every 1,000 requests, and each new connection starts on kernel TCP.
nginx_begin() { # MODE
	mkdir -p "$work/html"
	[ -f "$work/html/index.html" ] || head -c 1024 /dev/zero | tr '\0' x >"$work/html/index.html"
	cat >"$work/nginx.conf" <<EOC
daemon off; user root; master_process off; worker_processes 1; worker_rlimit_nofile 8192;
error_log $work/nginx-error.log; pid $work/nginx.pid;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 100000000; client_body_temp_path $work/body;
  proxy_temp_path $work/proxy; fastcgi_temp_path $work/fastcgi; uwsgi_temp_path $work/uwsgi;
  scgi_temp_path $work/scgi; server { listen 127.0.0.1:$p; root $work/html; } }
EOC
	begin "$1" nginx QUIT nginx -e stderr -c "$work/nginx.conf"
}

# nginx_run CASE CONNECTIONS MODE: wrk with 2 threads and CONNECTIONS keep-alive connections.
nginx_run() {
	local rps=n/a n=n/a
	take_port || return 1
	nginx_begin "$3" || { failed_start nginx "$@"; return 0; }
	if client "$3" $((secs_wrk + 30)) wrk -t2 -c"$2" -d"${secs_wrk}s" "http://127.0.0.1:$p/"
	then
		if grep -qE 'Socket errors|Non-2xx' "$work/out"; then
			echo "$bench_name: wrk -c $2 $3: $(grep -E 'Socket errors|Non-2xx' "$work/out")" >&2
		else
			rps=$(awk '/^Requests\/sec:/ { printf "%.0f", $2 }' "$work/out")
			n=$(awk '/ requests in / { print $1 }' "$work/out")
		fi
	fi
	done_run nginx "$1" "$2" "$3" "$2" "${rps:-n/a}" rps="${rps:-n/a}" requests="${n:-n/a}"
}

# rr_run CASE CONNECTIONS MODE: rstream-perf rr, CONNECTIONS connections of one client thread,
# each with one 64 B request outstanding (redis-benchmark -c's closed loop, without a server's
# own work). kernel, shim and same run its kernel-socket transport (epoll, read, write), the
# last two under the shim; raw runs plain libfabric with one CQ shared by all the connections
# of each side, or, in the cN-own cases, a CQ per connection (as the engine has them): the
# ceilings of the two layouts over this provider.
rr_run() {
	local rps=n/a requests=n/a out transport=kernel wm=$3 cq=()
	if [ "$3" = raw ]; then
		# Plain libfabric takes no preload and no fabric port: started as a kernel run is.
		transport=raw wm=kernel cq=(--cq shared)
		[ "${1%-own}" = "$1" ] || cq=(--cq own)
	fi
	take_port || return 1
	begin "$wm" rr INT "$perf" rr-server --bind 127.0.0.1 --port "$p" --transport "$transport" \
		"${cq[@]}" --size 64 || { failed_start rr "$@"; return 0; }
	if client "$wm" $((secs_rr + 30)) "$perf" rr-client 127.0.0.1 --port "$p" \
		--transport "$transport" "${cq[@]}" --conns "$2" --size 64 --seconds "$secs_rr"; then
		out=$(tail -n1 "$work/out")
		rps=$(sed -n 's/.*"rps":\([0-9.]*\).*/\1/p' <<<"$out")
		requests=$(sed -n 's/.*"requests":\([0-9]*\).*/\1/p' <<<"$out")
	fi
	done_run rr "$1" "$2" "$3" "$2" "${rps:-n/a}" rps="${rps:-n/a}" requests="${requests:-n/a}"
}

# connect_run CASE 1 MODE: connection setup rate: ab without keep-alive, one connection at a
# time (connect, one request, close), connect_n of them: a fixed number well under the 28,000
# ephemeral ports, as each leaves a socket in TIME-WAIT for 60 s (a run of 5 s made 60,000,
# and the next runs' rates fell by half). Under the shim these connections
# stay on kernel TCP by design (they end long before the ~50 ms after which one moves to the
# fabric): what this shows is what the shim costs a connection that never moves, so the check
# is only that both ends ran under the shim (and, for shim, that none went through same-host
# memory: a same run's connections stay on kernel TCP too, so same should match shim here).
connect_run() {
	local rps=n/a n=n/a status
	take_port || return 1
	nginx_begin "$3" || { failed_start connect "$@"; return 0; }
	if client "$3" 120 ab -q -n "$connect_n" -c 1 "http://127.0.0.1:$p/"; then
		if awk '/^Failed requests:/ { exit $3 != 0 }' "$work/out"; then
			rps=$(awk '/^Requests per second:/ { printf "%.0f", $4 }' "$work/out")
			n=$(awk '/^Complete requests:/ { print $3 }' "$work/out")
		else
			echo "$bench_name: ab $3: $(grep '^Failed requests' "$work/out")" >&2
		fi
	fi
	status=ok
	local path=kernel fab=() same
	if [ "$3" != kernel ]; then
		path="kernel TCP by design (deferred upgrade)"
		if ! compgen -G "$work/stats/server.*.json" >/dev/null ||
			! compgen -G "$work/stats/client.*.json" >/dev/null; then
			echo "$bench_name: connect $3: an end wrote no statistics (not under the shim)" >&2
			status=no-fabric
		fi
		same=$(stat_sum server same_host_connections)
		if [ "$3" = shim ] && [ "${same/n\/a/0}" != 0 ]; then
			echo "$bench_name: connect shim: $same same-host connections at the server" >&2
			status=no-fabric
		fi
		fab=(server_fabric_conns="$(stat_sum server fabric_connections)"
			server_same_host_conns="$same"
			server_kernel_conns="$(stat_sum server fallback_connections)")
	fi
	[ "${rps:-n/a}" != n/a ] && [ "$srv_s" != n/a ] && [ "$cli_s" != n/a ] || status=failed
	[ "$status" = ok ] || failures=$((failures + 1))
	record connect "$1" "$2" "$3" "$status" rps="${rps:-n/a}" requests="${n:-n/a}" \
		server_cpu_s="$srv_s" client_cpu_s="$cli_s" fabric_share=null same_host_share=null \
		path="$path" "${fab[@]}"
}

# idle_run CASE CONNECTIONS MODE: CONNECTIONS idle connections to redis, held open after one
# request each by scripts/bench-idle.py, which reports both processes' RSS and descriptors
# before and after them, and their CPU while the connections sit idle.
idle_run() {
	local out fig
	take_port || return 1
	begin "$3" redis INT redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no \
		--daemonize no --dir "$work" --maxclients $(($2 + 1000)) ||
		{ failed_start idle "$@"; return 0; }
	local stat=()
	[ "$3" = kernel ] || stat=("$rstream_stat")
	if client "$3" 300 "$py" scripts/bench-idle.py "$p" "$2" "$server_pid" "$idle_settle" \
		"${stat[@]}"; then
		out=$(tail -n1 "$work/out")
	fi
	# bench-idle.py prints KEY=VALUE pairs; the figure is the server's RSS per connection.
	fig=$(sed -n 's/.*server_rss_kib_per_conn=\([0-9.-]*\).*/\1/p' <<<"${out:-}")
	# shellcheck disable=SC2086 # one argument per pair
	done_run idle "$1" "$2" "$3" "$(($2 + 1))" "${fig:-n/a}" ${out:-}
}
