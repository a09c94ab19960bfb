#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Both ends of samehost_inband.sh, and its hostile third process.
# Usage: samehost_inband.py server PORT CONNECTIONS | client PORT SECONDS | hostile NAME |
#        push PORT | pushed PORT | claimed RSTREAM_LOG PUSH_LOG
#   server   echoes CONNECTIONS connections, one after the other, each to its end
#   push     answers a connection's "hi", sleeps in poll() on it for 1 s, then writes "push"
#            (printing when) and reads it to its end
#   pushed   says "hi", reads the answer, waits 0.2 s and reads the push in one blocking recv
#   claimed  prints how many seconds before the push the push server's shim claimed the link
#   client   echoes 64 KiB blocks for SECONDS (past the 50 ms after which a connection switches,
#            or libfabric's load), then says whether this process mapped libfabric
#   hostile  connects to the abstract socket NAME three times: 9 bytes of garbage, a token alone
#            without the fds a link brings, and nothing at all
#   bufs     sets SO_RCVBUF to 1 MiB before it connects, echoes 1 KiB pieces for 0.4 s (past
#            its switch), then prints TCP_INFO's tcpi_rcv_space (over the engine: the size of
#            the ring it reads from)
import datetime
import os
import re
import select
import socket
import struct
import sys
import time

role = sys.argv[1]


def dump_state(pid):
    """The shim's sockets of process pid, as it sees them, on that process's stderr (the
    debugger's rstreamDebugDump); nothing where gdb is missing."""
    import shutil
    import subprocess
    if shutil.which("gdb"):
        subprocess.run(["gdb", "-batch", "-p", str(pid), "-ex", "call (void)rstreamDebugDump()"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)


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

if role == "push":
    srv = socket.create_server(("127.0.0.1", int(sys.argv[2])))
    c, _ = srv.accept()
    if c.recv(2) != b"hi":
        sys.exit("push: no hi")
    c.sendall(b"hi")
    p = select.poll()
    p.register(c, select.POLLIN)
    if p.poll(1000):
        sys.exit("push: the connection turned readable while the client waited")
    print("push at %.6f" % time.time(), flush=True)
    c.sendall(b"push")
    if c.recv(16) != b"":
        sys.exit("push: bytes after the push")
    sys.exit(0)

if role == "pushed":
    s = socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=10)
    s.sendall(b"hi")
    if s.recv(2) != b"hi":
        sys.exit("pushed: no answer")
    time.sleep(0.2)
    got = s.recv(16)
    if got != b"push":
        sys.exit("pushed: read %r" % got)
    s.close()
    print("pushed: got the push")
    sys.exit(0)

if role == "claimed":
    claimed = pushed = None
    for line in open(sys.argv[2]):
        m = re.search(r"(\d{4}-\d\d-\d\dT[\d:.]+)Z .*same-host link claimed", line)
        if m:
            claimed = datetime.datetime.fromisoformat(m.group(1)).replace(
                tzinfo=datetime.timezone.utc).timestamp()
    for line in open(sys.argv[3]):
        if line.startswith("push at "):
            pushed = float(line.split()[2])
    print("none" if claimed is None or pushed is None else "%.3f" % (pushed - claimed))
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

if role == "bufs":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    s.settimeout(10)
    s.connect(("127.0.0.1", int(sys.argv[2])))
    start = time.time()
    end = start + 0.4
    rounds = 0
    while time.time() < end:
        s.sendall(b"b" * 1024)
        got = b""
        while len(got) < 1024:
            try:
                d = s.recv(1024 - len(got))
            except TimeoutError:
                print("no echo for 10 s: round %d, %d of 1024 bytes back, %.3f s in"
                      % (rounds, len(got), time.time() - start), flush=True)
                dump_state(os.getpid())
                sys.exit(1)
            if not d:
                sys.exit("the server ended the connection")
            got += d
        rounds += 1
    info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    print("rcv_space %d" % struct.unpack_from("I", info, 96)[0])
    s.close()
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
