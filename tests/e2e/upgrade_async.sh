#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A single-threaded event-loop client (nonblocking sockets, select) offering the upgrade on many
# connections at once to a shimmed server that answers late: no call of the client ever waits
# for the upgrade (the offer goes with the first bytes, the answer comes with the server's), and
# every echo comes back intact.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need python3

# The server accepts everything at once but does the connections' first reads only after a
# second, then echoes what each sent.
cat >"$work/server.py" <<'EOF'
import socket, sys, time
srv = socket.create_server(("127.0.0.1", int(sys.argv[1])), backlog=64)
n = int(sys.argv[2])
while True:
    conns = [srv.accept()[0] for _ in range(n)]
    time.sleep(1.0)
    for c in conns:
        got = b""
        while len(got) < 5:
            chunk = c.recv(5 - len(got))
            if not chunk:
                break
            got += chunk
        c.sendall(got)
        c.close()
EOF

cat >"$work/client.py" <<'EOF'
import select, socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
socks, slowest = [], 0.0
def timed(f, *a):
    global slowest
    t = time.monotonic()
    try:
        return f(*a)
    finally:
        slowest = max(slowest, time.monotonic() - t)
for i in range(n):
    s = socket.socket()
    s.setblocking(False)
    timed(s.connect_ex, ("127.0.0.1", port))
    socks.append(s)
msg = {s: b"p%03d\n" % i for i, s in enumerate(socks)}
unsent, unread, got = set(socks), set(socks), {s: b"" for s in socks}
deadline = time.monotonic() + 30
while unread and time.monotonic() < deadline:
    r, w, _ = select.select(list(unread - unsent), list(unsent), [], 0.5)
    for s in w:
        try:
            if timed(s.send, msg[s]) == 5:
                unsent.discard(s)
        except BlockingIOError:
            pass  # not decided yet: writable again once it is
    for s in r:
        try:
            data = timed(s.recv, 5)
        except BlockingIOError:
            continue
        got[s] += data
        if len(got[s]) >= 5 or not data:
            unread.discard(s)
assert not unread, "%d connections unanswered" % len(unread)
for s in socks:
    assert got[s] == msg[s], (got[s], msg[s])
print("slowest call %.1f ms" % (slowest * 1000))  # connect, send, recv
EOF

n=20
start_server server 1 shim server 60 python3 "$work/server.py" @PORT@ "$n"
out=$(shim client 60 python3 "$work/client.py" "$port" "$n") || fail "the client failed: $out"
echo "    $out"
ms=$(sed -n 's/^slowest call \([0-9]*\).*/\1/p' <<<"$out")
# The server answers after 1 s: a call that waited for an upgrade would take about that long
# (the first connection's libfabric load, about 0.3 s, is not on a call: it runs on a thread).
[ "${ms:-9999}" -lt 300 ] || fail "a call of the client waited $ms ms"
# Each exchange is over (one round trip after the server's late first read) before its switch
# to the fabric could come: none falls back otherwise.
expect_no_fallback client
[ "$(stat_sum client before_switch)" -eq "$n" ] || fail "client: not $n connections offered"
log "$n connections offered the upgrade with no call waiting, echoes intact"
echo PASS
