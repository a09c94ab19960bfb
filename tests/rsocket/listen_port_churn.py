#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# A listen after a bind to port 0 must not fail while other sockets connect from the same port
# range. Run in a namespace of its own (listen_port_churn.sh) whose ephemeral range is 10 ports:
# connections hold all but one, and a thread keeps connecting, so any moment the port the bind
# chose is free it becomes a connection's local port. The kernel's listen never fails there.
# Usage: listen_port_churn.py LIBRSTREAM_SO [LISTENS] (listens made after a successful bind)
import ctypes
import os
import socket
import struct
import sys
import threading
import time

lib = ctypes.CDLL(sys.argv[1], use_errno=True)
listens = int(sys.argv[2]) if len(sys.argv) > 2 else 300
linger0 = struct.pack('ii', 1, 0)  # closed with a reset: the port is free again at once

srv = socket.socket()
srv.bind(('127.0.0.1', 5000))
srv.listen(1024)
held = []
while True:
    c = socket.socket()
    try:
        c.connect(('127.0.0.1', 5000))
    except OSError:
        c.close()
        break
    held.append(c)
    held.append(srv.accept()[0])
if len(held) < 4:
    print('FAIL: only %d connections fit the port range' % (len(held) // 2))
    sys.exit(1)
held.pop().close()
last = held.pop()
last.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger0)
last.close()
srv.setblocking(False)

stop = False
taken = 0


def churn():
    global taken
    while not stop:
        c = socket.socket()
        try:
            c.connect(('127.0.0.1', 5000))
            taken += 1
        except OSError:
            pass
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger0)
        c.close()
        try:
            while True:
                srv.accept()[0].close()
        except OSError:
            pass


t = threading.Thread(target=churn)
t.start()
failed = refused = 0
errors = {}
addr = ctypes.create_string_buffer(
    struct.pack('H', socket.AF_INET) + struct.pack('!H4s8x', 0, socket.inet_aton('127.0.0.1')), 16)
# Attempts go on until `listens` of them bound and the connecting thread took a port 50 times,
# so that neither a run where that thread held the free port most of the time (one bound 68 of
# 300 in CI) nor one where it hardly ran (a loaded machine: 1 port taken in 300) tests less.
attempts = 0
deadline = time.monotonic() + 20
try:
    while ((attempts - refused < listens or taken < 50) and attempts < 50 * listens
           and time.monotonic() < deadline):
        attempts += 1
        fd = lib.rsocket(socket.AF_INET, socket.SOCK_STREAM, 0)
        if fd < 0:
            print('FAIL: rsocket:', os.strerror(ctypes.get_errno()))
            sys.exit(1)
        # No port free at the bind (the connecting thread has it): refused, as the kernel does.
        if lib.rbind(fd, addr, 16) != 0:
            refused += 1
        elif lib.rlisten(fd, 16) != 0:
            failed += 1
            e = os.strerror(ctypes.get_errno())
            errors[e] = errors.get(e, 0) + 1
        lib.rclose(fd)
finally:
    stop = True
    t.join()
bound = attempts - refused
print('%d listens after a bind, %d failed %s; %d binds found no free port; %d connections '
      'took a port meanwhile' % (bound, failed, errors or '', refused, taken))
if bound < listens // 2 or taken == 0:
    print('FAIL: the race was not exercised')
    sys.exit(1)
sys.exit(1 if failed else 0)
