#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# A threaded echo server: each connection gets back what it sends, and its end once it half-
# closes. Exits on TERM, so that the shim writes its statistics.
# Usage: echo_server.py HOST PORT
import signal
import socket
import sys
import threading

signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


def serve(c):
    with c:
        while True:
            d = c.recv(65536)
            if not d:
                break
            c.sendall(d)
        try:
            c.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the client closed first


srv = socket.create_server((sys.argv[1], int(sys.argv[2])), backlog=128)
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
