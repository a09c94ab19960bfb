#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Readiness as strict programs (wrk, event loops that count EAGAIN as an error) need it: a socket
# reported readable gives bytes, its end or an error on the next read, never EAGAIN; FIONREAD > 0
# means the same. Both ends are nonblocking event loops (epoll level-triggered, or poll).
# Usage: strict_readiness.py server HOST PORT MODE
#        strict_readiness.py client HOST PORT MODE CONNECTIONS SECONDS
import array
import fcntl
import os
import random
import select
import signal
import socket
import sys
import termios
import time

signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
errors = []


class Loop:
    """One event loop over either epoll (level-triggered) or poll."""

    def __init__(self, mode):
        self.p = select.epoll() if mode == "epoll" else select.poll()
        self.mode = mode

    def add(self, fd, ev):
        self.p.register(fd, ev)

    def mod(self, fd, ev):
        self.p.modify(fd, ev)

    def remove(self, fd):
        self.p.unregister(fd)

    def wait(self, ms):
        return self.p.poll(ms / 1000 if self.mode == "epoll" else ms)


IN = select.POLLIN
OUT = select.POLLOUT


def fionread(s):
    n = array.array("i", [0])
    fcntl.ioctl(s.fileno(), termios.FIONREAD, n, True)
    return n[0]


def strict_read(s, what):
    """A read after readiness: EAGAIN here is the defect this test exists for."""
    try:
        return s.recv(65536)
    except BlockingIOError:
        errors.append("%s: reported readable, the read said EAGAIN" % what)
        return None
    except ConnectionError as e:
        errors.append("%s: %r" % (what, e))
        return None


def drain(s, what):
    """Reads as readiness and FIONREAD promise; returns the bytes, or None at the end."""
    # FIONREAD counts the program's bytes only: the read that follows gets at least as many
    # (more may come meanwhile). A peer's upgrade message left unread by the shim at the head
    # of the stream was counted once, and a read of exactly that many with MSG_WAITALL hangs.
    try:
        promised = fionread(s)
    except OSError:
        promised = 0
    data = strict_read(s, what)
    if data is not None and promised <= 65536 and len(data) < promised:
        errors.append("%s: FIONREAD said %d, the read got %d" % (what, promised, len(data)))
    if not data:
        return None
    out = bytearray(data)
    while fionread(s) > 0:
        more = strict_read(s, what + " (after FIONREAD > 0)")
        if not more:
            break
        out += more
    return bytes(out)


def server(host, port, mode):
    srv = socket.create_server((host, port), backlog=256)
    srv.setblocking(False)
    loop = Loop(mode)
    loop.add(srv.fileno(), IN)
    conns = {}  # fd -> [socket, bytes to send back]
    while True:
        for fd, ev in loop.wait(1000):
            if fd == srv.fileno():
                try:
                    c, _ = srv.accept()
                except BlockingIOError:
                    continue
                c.setblocking(False)
                conns[c.fileno()] = [c, b""]
                loop.add(c.fileno(), IN)
                continue
            c, pending = conns[fd]
            if ev & IN:
                d = drain(c, "server")
                if d is None:
                    loop.remove(fd)
                    del conns[fd]
                    c.close()
                    continue
                pending += d
            if pending:
                try:
                    n = c.send(pending)
                    pending = pending[n:]
                except BlockingIOError:
                    pass
            conns[fd][1] = pending
            loop.mod(fd, IN | OUT if pending else IN)
        if errors:
            for e in errors:
                print(e, flush=True)
            errors.clear()


def client(host, port, mode, count, secs):
    loop = Loop(mode)
    rnd = random.Random(7)
    state = {}  # fd -> dict
    opened = 0
    start = time.monotonic()
    deadline = start + secs
    exchanges = 0

    def open_one():
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect((host, port))
        except BlockingIOError:
            pass
        st = {"s": s, "out": b"", "want": 0, "got": b"", "sent": b"", "end": 0,
              "next": time.monotonic()}
        state[s.fileno()] = st
        loop.add(s.fileno(), OUT)

    while time.monotonic() < deadline + 10:
        now = time.monotonic()
        # New connections over the whole run, so that their switch comes at any point.
        while opened < count and now >= start + secs * 0.6 * opened / count:
            open_one()
            opened += 1
        if not state and opened >= count:
            break
        for fd, st in list(state.items()):
            if not st["out"] and not st["want"] and now >= st["next"]:
                if now >= deadline or (st["end"] and now >= st["end"]):
                    loop.remove(fd)
                    st["s"].close()
                    del state[fd]
                    continue
                if not st["end"]:
                    st["end"] = now + secs * rnd.uniform(0.05, 0.6)
                msg = os.urandom(rnd.choice([1, 16, 100, 1500, 9000, 70000]))
                st["out"], st["sent"], st["want"], st["got"] = msg, msg, len(msg), b""
                loop.mod(fd, IN | OUT)
        for fd, ev in loop.wait(5):
            st = state.get(fd)
            if st is None:
                continue
            s = st["s"]
            if ev & IN:
                d = drain(s, "client")
                if d is None:
                    errors.append("client: the connection ended with %d bytes owed" % st["want"])
                    loop.remove(fd)
                    s.close()
                    del state[fd]
                    continue
                st["got"] += d
                st["want"] -= len(d)
                if st["want"] < 0:
                    errors.append("client: more bytes than were sent")
                if st["want"] <= 0:
                    if st["got"] != st["sent"]:
                        errors.append("client: the reply differs from what was sent")
                    exchanges += 1
                    st["want"] = 0
                    st["next"] = time.monotonic() + rnd.choice([0, 0, 0.001, 0.01, 0.03])
            if ev & OUT and st["out"]:
                try:
                    n = s.send(st["out"])
                    st["out"] = st["out"][n:]
                except BlockingIOError:
                    pass
            loop.mod(fd, (IN | OUT) if st["out"] else (IN if st["want"] else 0))
    if state:
        errors.append("client: %d connections not finished" % len(state))
    for e in errors[:20]:
        print(e)
    print("exchanges", exchanges)
    print("errors", len(errors))


if sys.argv[1] == "server":
    server(sys.argv[2], int(sys.argv[3]), sys.argv[4])
else:
    client(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), float(sys.argv[6]))
