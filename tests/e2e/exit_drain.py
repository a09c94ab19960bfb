#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Both ends of exit_stats.sh. server: echoes until "stop", then fills the connection (the client
# reads no more) and waits for SIGTERM, on which it exits (Python gives its signals their
# default actions back as it exits). client: talks for SECONDS (so that a shimmed connection
# switches to the fabric), sends "stop" and then sleeps without reading.
# Usage: exit_drain.py server HOST PORT | exit_drain.py client HOST PORT SECONDS
import signal
import socket
import sys
import time

role, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if role == "server":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    srv = socket.create_server((host, port))
    c, _ = srv.accept()
    buf = b""
    while not buf.endswith(b"stop\n"):
        d = c.recv(65536)
        if not d:
            sys.exit("the client went early")
        if not d.endswith(b"stop\n"):
            c.sendall(d)
        buf = buf[-8:] + d
    c.setblocking(False)
    sent, quiet_since = 0, None
    while quiet_since is None or time.monotonic() - quiet_since < 0.5:
        try:
            sent += c.send(b"x" * 65536)
            quiet_since = None
        except BlockingIOError:
            quiet_since = quiet_since or time.monotonic()
            time.sleep(0.02)
    print("full after %d bytes" % sent, flush=True)
    while True:
        time.sleep(1)
else:
    s = socket.create_connection((host, port))
    end = time.monotonic() + float(sys.argv[4])
    while time.monotonic() < end:
        s.sendall(b"ping\n")
        got = b""
        while len(got) < 5:
            got += s.recv(5 - len(got))
        time.sleep(0.01)
    s.sendall(b"stop\n")
    print("stopped reading", flush=True)
    time.sleep(60)
