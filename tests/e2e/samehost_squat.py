#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# samehost_inband.sh's squatter case: a fake shim server that answers a shimmed client's offer
# with an ACCEPT naming upgrade port UP (where a plain TCP socket listens, as root), and a process
# of another user (or root) that took the link socket's name for that port first.
# Usage: samehost_squat.py server PORT UP | squatter UP UID
#   server    beacon and listener on PORT: reads the HELLO, answers ACCEPT(UP) and echoes
#   squatter  binds rstream-up/127.0.0.1:UP as UID, says "ready", then counts the descriptors
#             its first visitor sends (10 s at most) and says "fds N" (on its output: the test's
#             folder is not another user's to write)
import os
import socket
import struct
import sys
import time

role = sys.argv[1]
if role == "squatter":
    up, uid = int(sys.argv[2]), int(sys.argv[3])
    if uid:
        os.setgid(uid)
        os.setuid(uid)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(b"\0rstream-up/127.0.0.1:%d" % up)
    s.listen(8)
    s.settimeout(0.2)
    print("ready", flush=True)
    fds = 0
    end = time.time() + 10
    while time.time() < end:
        try:
            c, _ = s.accept()
        except socket.timeout:
            continue
        end = 0  # the client's one try
        c.settimeout(1)
        try:
            _, anc, _, _ = c.recvmsg(16, socket.CMSG_SPACE(4 * 8))
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    got = struct.unpack("%di" % (len(data) // 4), data)
                    fds += len(got)
                    for fd in got:
                        os.close(fd)
        except OSError:
            pass
        c.close()
    print("fds %d" % fds, flush=True)
    sys.exit(0)

port, up = int(sys.argv[2]), int(sys.argv[3])
upl = socket.create_server(("127.0.0.1", up))  # the "upgrade port", a plain socket
beacon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
beacon.bind(b"\0rstream/127.0.0.1:%d" % port)
beacon.listen(8)
srv = socket.create_server(("127.0.0.1", port))
c, _ = srv.accept()
hello = b""
while len(hello) < 16:
    hello += c.recv(16 - len(hello))
if hello[:8] != b"\xffRSTUPG\x01" or hello[8] != 1:
    sys.exit("no HELLO: %r" % hello)
accept = b"\xffRSTUPG\x01" + bytes([2]) + bytes(7) + struct.pack(">H", up) + bytes(6)
accept += struct.pack(">Q", 0x5eed5eed5eed5eed)
c.sendall(accept)
while True:
    d = c.recv(65536)
    if not d:
        break
    c.sendall(d)
print("fake server: echoed to the end")
