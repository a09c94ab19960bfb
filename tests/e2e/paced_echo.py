#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# An echo client that lasts: "ping" and its answer first (the first reply's milliseconds are
# printed), then 1 MiB sent in 96 pieces over SECONDS while a thread reads it back, so that a
# shimmed connection switches to the fabric on the way. Prints whether the echo came back
# intact and whether libfabric got loaded into this process.
# Usage: paced_echo.py HOST PORT SECONDS
import hashlib
import os
import socket
import sys
import threading
import time

host, port, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
data = os.urandom(1 << 20)
t0 = time.monotonic()
s = socket.create_connection((host, port))
s.sendall(b"ping\n")
first = b""
while len(first) < 5:
    first += s.recv(5 - len(first))
print("first reply %.1f ms" % ((time.monotonic() - t0) * 1000))
got = []


def reader():
    while True:
        b = s.recv(65536)
        if not b:
            break
        got.append(b)


t = threading.Thread(target=reader)
t.start()
pieces = 96
step = len(data) // pieces
for i in range(0, len(data), step):
    s.sendall(data[i:i + step])
    time.sleep(secs / pieces)
s.shutdown(socket.SHUT_WR)
t.join()
ok = hashlib.md5(b"".join(got)).digest() == hashlib.md5(data).digest()
print("echo", "intact" if ok else "DIFFERS")
with open("/proc/self/maps") as m:
    print("libfabric", "mapped" if "libfabric" in m.read() else "absent")
