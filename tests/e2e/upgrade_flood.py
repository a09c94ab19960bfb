#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Two parts of upgrade_flood.sh (whose server is echo_server.py): a hostile peer that floods the
# server's upgrade listener with fabric connections that send no token (or a wrong one), and a
# shimmed client.
# Usage: upgrade_flood.py hostile PORT SERVER_PID LIBRSTREAM N | client PORT
import ctypes
import errno
import os
import socket
import struct
import sys
import time

role, port = sys.argv[1], int(sys.argv[2])

if role == "client":
    # Requests for 3 s: the connection switches to the fabric on the way (the statistics tell).
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    end = time.time() + 3
    n = 0
    while time.time() < end:
        s.sendall(b"req %d" % n)
        if s.recv(64) != b"req %d" % n:
            sys.exit("client: a wrong echo")
        n += 1
        time.sleep(0.01)
    print("client: %d echoes" % n)
    sys.exit(0)

# hostile: speaks the upgrade's first step by hand over kernel TCP, then opens fabric
# connections to the port it was given through librstream's rsocket API, without the token.
server_pid, lib, count = sys.argv[3], sys.argv[4], int(sys.argv[5])
HELLO = bytes([0xFF]) + b"RSTUPG" + bytes([1, 1]) + bytes(7)
k = socket.create_connection(("127.0.0.1", port), timeout=10)
k.sendall(HELLO + b"ping")
got = b""
while len(got) < 36:
    d = k.recv(64)
    if not d:
        sys.exit("hostile: the server closed before its ACCEPT")
    got += d
if got[:9] != bytes([0xFF]) + b"RSTUPG" + bytes([1, 2]) or got[32:] != b"ping":
    sys.exit("hostile: no ACCEPT before the echo: %r" % got)
fport = struct.unpack(">H", got[16:18])[0]
token = struct.unpack(">Q", got[24:32])[0]
print("hostile: the upgrade listener is on fabric port %d" % fport)

rs = ctypes.CDLL(lib, use_errno=True)
for name, res in (("rsocket", ctypes.c_int), ("rconnect", ctypes.c_int),
                  ("rrecv", ctypes.c_ssize_t), ("rsend", ctypes.c_ssize_t),
                  ("rclose", ctypes.c_int)):
    getattr(rs, name).restype = res
addr = struct.pack("<H", socket.AF_INET) + struct.pack(">H", fport) + \
    socket.inet_aton("127.0.0.1") + bytes(8)


def ping():
    # A call on the server's socket in its switch: its look takes in the listener's arrivals.
    k.sendall(b"p")
    if k.recv(1) != b"p":
        sys.exit("hostile: the server stopped answering")


def fabric_connect():
    fd = rs.rsocket(socket.AF_INET, socket.SOCK_STREAM, 0)
    if fd < 0:
        sys.exit("hostile: rsocket: %s" % os.strerror(ctypes.get_errno()))
    if rs.rconnect(fd, addr, len(addr)) != 0:
        sys.exit("hostile: rconnect: %s" % os.strerror(ctypes.get_errno()))
    return fd


def closed(fd):
    buf = ctypes.create_string_buffer(16)
    r = rs.rrecv(fd, buf, 16, socket.MSG_DONTWAIT)
    if r > 0:
        sys.exit("hostile: the server wrote %r on a connection without a token" % buf.raw[:r])
    return r == 0 or ctypes.get_errno() != errno.EAGAIN


def wait_closed(fds, want, seconds, what):
    deadline = time.time() + seconds
    while True:
        ping()
        shut = [i for i, fd in enumerate(fds) if closed(fd)]
        if len(shut) >= want or time.time() > deadline:
            print("hostile: %s: %d of %d closed (%s)" % (what, len(shut), len(fds), shut))
            return shut
        time.sleep(0.05)


def server_fds():
    return len(os.listdir("/proc/%s/fd" % server_pid))


before = server_fds()
fds = []
for i in range(count):
    fds.append(fabric_connect())
    ping()
pending_max = int(os.environ["FLOOD_PENDING_MAX"])
# Over the limit, the oldest go at once; the newest stay until their token is due.
shut = wait_closed(fds, count - pending_max, 5, "over the limit")
if len(shut) != count - pending_max or shut != list(range(count - pending_max)):
    sys.exit("hostile: not the %d oldest closed at once" % (count - pending_max))
# The connections that wait hold at most 6 fds each (4 here), those closed none once gone.
# (They are closed with a reset, so at once; a graceful close kept each until this peer's
# library acknowledged it, within a fraction of a second here, and would for 30 s for a peer
# that never does, which this one cannot play.)
bound = before + 6 * pending_max
deadline = time.time() + 3
while True:
    ping()
    peak = server_fds()
    if peak <= bound or time.time() > deadline:
        break
    time.sleep(0.05)
print("hostile: server fds %d before, %d while %d connections wait" % (before, peak, pending_max))
if peak > bound:
    sys.exit("hostile: the server holds %d fds for %d connections that wait (over %d)" %
             (peak - before, pending_max, bound - before))
# A wrong token closes its connection at once.
bad = fabric_connect()
if rs.rsend(bad, struct.pack(">Q", token ^ 1), 8, 0) != 8:
    sys.exit("hostile: rsend: %s" % os.strerror(ctypes.get_errno()))
if not wait_closed([bad], 1, 5, "a wrong token"):
    sys.exit("hostile: a connection with a wrong token stayed open")
# The rest go once their token is due.
if len(wait_closed(fds, count, 10, "token due")) != count:
    sys.exit("hostile: connections without a token stayed open past the wait")
for fd in fds + [bad]:
    rs.rclose(fd)
time.sleep(0.3)
ping()
after = server_fds()
print("hostile: server fds %d after" % after)
if after > before + 2:
    sys.exit("hostile: the server holds %d fds more than before the flood" % (after - before))
k.close()
print("hostile: done")
