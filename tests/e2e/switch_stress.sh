#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The mid-stream switch under stress: 40 connections from one shimmed process to a shimmed echo
# server, each with a reader and a writer thread, random write and read sizes and pauses, some
# over before their switch and the others switching at random points of their stream; every
# byte must come back in order, and none may fall back otherwise.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need python3

cat >"$work/stress.py" <<'EOF2'
import hashlib, os, random, socket, sys, threading, time
port, n, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
errors = []
def one(k):
    try:
        rnd = random.Random(k)
        counts = [0, 0]
        sent, got = hashlib.md5(), hashlib.md5()
        s = socket.create_connection(("127.0.0.1", port))
        def reader():
            try:
                while True:
                    b = s.recv(rnd.choice([1, 7, 100, 4096, 65536]))
                    if not b:
                        break
                    got.update(b)
                    counts[1] += len(b)
            except Exception as e:
                errors.append("connection %d: recv after %d bytes: %r" % (k, counts[1], e))
        t = threading.Thread(target=reader)
        t.start()
        end = time.monotonic() + secs * rnd.uniform(0.1, 1.0)
        while time.monotonic() < end:
            d = os.urandom(rnd.choice([1, 13, 500, 3000, 20000, 100000]))
            s.sendall(d)
            sent.update(d)
            counts[0] += len(d)
            time.sleep(rnd.choice([0, 0, 0.001, 0.01, 0.05]))
        s.shutdown(socket.SHUT_WR)
        t.join(30)
        if t.is_alive() or counts[0] != counts[1] or sent.digest() != got.digest():
            errors.append("connection %d: sent %d, got back %d" % (k, counts[0], counts[1]))
        s.close()
    except Exception as e:
        errors.append("connection %d: send after %d bytes: %r" % (k, counts[0], e))
threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
for t in threads:
    t.start()
    time.sleep(0.02)
for t in threads:
    t.join()
for e in errors:
    print(e)
print("errors", len(errors))
EOF2

start_server server 1 shim server 60 python3 "$(dirname "$0")/echo_server.py" 127.0.0.1 @PORT@
out=$(shim client 90 python3 "$work/stress.py" "$port" 40 1.5) || fail "the client failed: $out"
printf "    %s\n" "${out//$'\n'/$'\n    '}"
grep -qx "errors 0" <<<"$out" || fail "bytes lost or out of order"
expect_fabric client 1
expect_no_fallback client
log "40 connections: $(stat_sum client fabric_connections) switched, $(stat_sum client before_switch) over before their switch, every byte back in order"
stop_pid "$server_pid" || true
echo PASS
