#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Both ends of samehost_inband.sh, and its hostile third process.
# Usage: samehost_inband.py server PORT CONNECTIONS | client PORT SECONDS | hostile NAME
#   server   echoes CONNECTIONS connections, one after the other, each to its end
#   client   echoes 64 KiB blocks for SECONDS (past the 50 ms after which a connection switches,
#            or libfabric's load), then says whether this process mapped libfabric
#   hostile  connects to the abstract socket NAME three times: 9 bytes of garbage, a token alone
#            without the fds a link brings, and nothing at all
import os
import socket
import sys
import time

role = sys.argv[1]

if role == "server":
    port, count = int(sys.argv[2]), int(sys.argv[3])
    srv = socket.create_server(("127.0.0.1", port))
    for _ in range(count):
        c, _ = srv.accept()
        while True:
            d = c.recv(65536)
            if not d:
                break
            c.sendall(d)
        c.close()
    sys.exit(0)

if role == "hostile":
    name = b"\0" + sys.argv[2].encode()
    for payload in (b"\xff" * 9, os.urandom(8), b""):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(name)
        if payload:
            s.sendall(payload)
        time.sleep(0.05)
        s.close()
    print("hostile: 3 connections to %s" % sys.argv[2])
    sys.exit(0)

port, seconds = int(sys.argv[2]), float(sys.argv[3])
s = socket.create_connection(("127.0.0.1", port), timeout=10)
block = os.urandom(65536)
rounds = 0
end = time.time() + seconds
while time.time() < end:
    s.sendall(block)
    got = b""
    while len(got) < len(block):
        d = s.recv(len(block) - len(got))
        if not d:
            sys.exit("the server ended the connection")
        got += d
    if got != block:
        sys.exit("the echo differs from what was sent (round %d)" % rounds)
    rounds += 1
s.close()
with open("/proc/self/maps") as f:
    loaded = any("libfabric" in line for line in f)
print("client: %d rounds echoed; libfabric %s" % (rounds, "loaded" if loaded else "not loaded"))
