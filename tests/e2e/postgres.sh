#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# PostgreSQL under the shim (a postmaster that accepts and forks a backend per connection) and
# shimmed psql and pgbench over TCP on 127.0.0.1: query results arrive intact both ways, pgbench
# runs without a failed transaction, short sessions never wait for the fabric, and the
# statistics show that the lasting connections switched to it (the backends' too).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need setpriv md5sum base64
# The newest server installed (Debian keeps each major version's programs apart) and its own
# clients: those in PATH are a Perl wrapper that picks a version and cluster of its own.
pgbin=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
for p in postgres initdb pg_isready psql pgbench; do
	if [ ! -x "$pgbin/$p" ]; then
		echo "SKIP: no PostgreSQL in /usr/lib/postgresql (scripts/setup installs it)"
		exit 77
	fi
done

# initdb and postgres refuse to run as root: as root (CI), run them as the postgres user. setpriv
# execs where runuser forks a watching parent, which SIGKILLs the server 2 s after passing it
# a TERM: a slower shutdown would lose the statistics its processes write at exit.
as_pg=()
if [ "$(id -u)" -eq 0 ]; then
	if ! id postgres >/dev/null 2>&1; then
		echo "SKIP: no postgres user (the postgresql package makes it)"
		exit 77
	fi
	as_pg=(setpriv --reuid=postgres --regid=postgres --init-groups --)
	# The server's processes write their statistics into $work/stats and keep their data
	# and socket under $work/pg.
	chmod 755 "$work"
	chmod 1777 "$work/stats"
	mkdir "$work/pg"
	chown postgres: "$work/pg"
	# Else the loader skips the shim in the server with a mere warning.
	"${as_pg[@]}" test -r "$E2E_LIB" ||
		fail "the postgres user cannot read $E2E_LIB"
else
	mkdir "$work/pg"
fi

# initdb runs the server in single-user mode (no TCP): no shim. trust: no passwords on loopback.
plain 60 "${as_pg[@]}" "$pgbin/initdb" -D "$work/pg/data" -U postgres --auth=trust --no-sync \
	-E UTF8 --locale=C >"$work/initdb.log" 2>&1 || fail "initdb failed"

# Durability off and no autovacuum: quick, and nothing runs but what the test asks.
# Dynamic shared memory in files under the data folder, where a killed server leaves nothing.
start_server server 1 shim server 100 "${as_pg[@]}" "$pgbin/postgres" -D "$work/pg/data" \
	-c listen_addresses=127.0.0.1 -c port=@PORT@ -c unix_socket_directories="$work/pg" \
	-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c autovacuum=off \
	-c max_connections=30 -c shared_buffers=32MB -c dynamic_shared_memory_type=mmap
# The postmaster listens before it has started up; pg_isready on the unix socket (which the
# shim leaves alone) says when it accepts.
for _ in $(seq 100); do
	plain 10 "$pgbin/pg_isready" -q -h "$work/pg" -p "$port" -U postgres && break
	kill -0 "$server_pid" 2>/dev/null || fail "postgres exited"
	sleep 0.1
done
plain 10 "$pgbin/pg_isready" -q -h "$work/pg" -p "$port" -U postgres ||
	fail "postgres does not accept connections"
log "postgres accepts connections"

# sql ROLE KIND: psql runs standard input over TCP, under the shim (KIND shim) or not (plain).
sql() {
	local -a run=(plain 30)
	[ "$2" = shim ] && run=(shim "$1" 30)
	"${run[@]}" "$pgbin/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres \
		-d postgres -f -
}

out=$(sql psql shim <<<'select sum(g) from generate_series(1, 100000) g;') ||
	fail "psql: the sum failed"
[ "$out" = 5000050000 ] || fail "psql: the sum is '$out'"
log "psql: sum of 1..100000 correct"

# 100 KB each way, checked against md5 on the other side: a literal the server hashes, and
# text the server makes and hashes itself.
head -c 75000 /dev/urandom | base64 -w 0 >"$work/blob"
out=$(printf "select md5('%s');\n" "$(cat "$work/blob")" | sql psql shim) ||
	fail "psql: the upload failed"
want=$(md5sum <"$work/blob")
[ "$out" = "${want%% *}" ] || fail "psql: the server's md5 of the 100 KB literal differs"
# This session lasts: its connection switches to the fabric during the sleep (psql loads
# libfabric in the background meanwhile), so the 100 KB come over the fabric. Its shim logs at
# info level, so that a switch that did not happen says why in a failure's output. Twice in
# clean-clone runs the client's fabric connect to the backend's upgrade port timed out at the
# default 2 s while the backend slept ("not upgraded: Connection timed out"), its cause not
# found yet: the connect may take until the backend's next look, after the sleep.
RSTREAM_CONNECT_TIMEOUT_MS=6000 RSTREAM_LOG=info RSTREAM_LOG_FILE="$work/shim-psql-long.%p.log" \
	sql psql-long shim >"$work/download" <<'EOS' || fail "psql: the download failed"
select pg_sleep(2.5) \g /dev/null
select md5(s) || ' ' || s from (select string_agg(md5(g::text), '') s
	from generate_series(1, 3125) g) t;
EOS
read -r sum text <"$work/download" || true
[ "${#text}" -eq 100000 ] || fail "psql: downloaded ${#text} characters, expected 100000"
want=$(printf '%s' "$text" | md5sum)
[ "$sum" = "${want%% *}" ] || fail "psql: the downloaded text differs from the server's"
log "psql: 100 KB uploaded and 100 KB downloaded intact"

# pgbench's default data (100000 accounts) goes to the server by COPY from the client.
shim pgbench-init 60 "$pgbin/pgbench" -i -q -s 1 -h 127.0.0.1 -p "$port" -U postgres postgres \
	>"$work/pgbench-init.log" 2>&1 || fail "pgbench -i failed"
# 8 clients: 8 backends, each forked for an accepted connection, at once.
shim pgbench 60 "$pgbin/pgbench" -c 8 -j 2 -T 5 -h 127.0.0.1 -p "$port" -U postgres postgres \
	>"$work/pgbench.log" 2>&1 || fail "pgbench failed"
grep -E '^(number of (transactions actually processed|failed transactions)|tps)' \
	"$work/pgbench.log" | sed 's/^/    /' || true
grep -qE '^number of failed transactions: 0 ' "$work/pgbench.log" ||
	fail "pgbench: failed transactions"
n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$work/pgbench.log")
[ "${n:-0}" -gt 0 ] || fail "pgbench processed no transaction"

# For information: a trivial query's wall time (program start and connection included), from
# a client under the shim and from one without it.
for kind in shim plain; do
	t0=$(date +%s%N)
	out=$(sql psql-time "$kind" <<<'select 1;') || fail "psql ($kind): select 1 failed"
	[ "$out" = 1 ] || fail "psql ($kind): select 1 answered '$out'"
	ms=$((($(date +%s%N) - t0) / 1000000))
	log "psql ($kind): select 1 in $ms ms"
	# Generous: the shim's first socket loads libfabric (0.3 s, over 1.5 s on a loaded machine).
	[ "$ms" -lt 5000 ] || fail "psql ($kind): select 1 took $ms ms"
done

# A smart shutdown: the statistics of the postmaster and of its last processes are written.
rc=0
stop_pid "$server_pid" || rc=$?
[ "$rc" -eq 0 ] || fail "postgres exited with $rc"
log "postgres stopped"

# Short psql sessions are over before their switch to the fabric (they never wait for it);
# the long one switched and downloaded over the fabric; pgbench's 8 clients switched early in
# their 5 s (its first connection, which only reads the scale, is a short one).
expect_no_fallback psql
expect_no_fallback psql-time
expect_no_fallback pgbench-init
expect_fabric psql-long 1
[ "$(stat_sum psql-long fabric_bytes_received)" -ge 100000 ] ||
	fail "psql: the download was not on the fabric"
expect_fabric pgbench 8

# The server's processes (the postmaster accepts, the backend it forks does the I/O; each
# writes its own statistics): at least the clients' connections. Its fallback count is not
# checked: the plain psql came over kernel TCP (today the postmaster counts it once; a backend
# that takes a connection over may count it too), and the clients' checks (no fallback) already
# show that every shimmed connection used the fabric.
conns=0 sent=0 received=0
for role in psql psql-long pgbench-init pgbench psql-time; do
	conns=$((conns + $(stat_sum "$role" fabric_connections)))
	sent=$((sent + $(stat_sum "$role" fabric_bytes_sent)))
	received=$((received + $(stat_sum "$role" fabric_bytes_received)))
done
expect_fabric server "$conns" any
# Every byte went whole over the fabric: the protocol ends with the client's Terminate, so each
# side reads all that the other sent.
v=$(stat_sum server fabric_bytes_received)
[ "$v" -eq "$sent" ] || fail "server: received $v bytes over the fabric, the clients sent $sent"
v=$(stat_sum server fabric_bytes_sent)
[ "$v" -eq "$received" ] ||
	fail "server: sent $v bytes over the fabric, the clients received $received"
echo PASS
