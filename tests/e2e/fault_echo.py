#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# A client of echo_server.py for the fault tests: it warms its connection up (so that a shimmed
# one switches to the fabric), says so, waits for the test to break the link, then either moves
# BYTES through the echo and checks them end to end (sha256), or holds the connection until the
# server goes away and reports how it ended.
# Usage: fault_echo.py HOST PORT MODE BYTES SYNC_DIR
#   MODE echo: after SYNC_DIR/go appears, send BYTES random bytes, half-close, read the echo to
#     EOF; prints "echo intact" (exit 0), "echo DIFFERS" (exit 1) or "error ERRNO" (exit 2).
#   MODE hold: send 4 KiB every 20 ms and read the echo until the connection ends; MODE idle:
#     only block in recv. Both print "ended EOF|ECONNRESET|EPIPE|..." and whether what came back
#     was a prefix of what was sent ("prefix intact"); exit 0 only for a clean end, intact.
# SYNC_DIR/ready gets this process's pid once the warm-up came back, so that the test can look
# at the connection (rstream-stat) before it breaks the link.
import errno
import hashlib
import os
import socket
import sys
import threading
import time

host, port, mode, nbytes, sync = (sys.argv[1], int(sys.argv[2]), sys.argv[3],
                                  int(sys.argv[4]), sys.argv[5])
t0 = time.monotonic()


def say(*a):
    print("[%6.2fs]" % (time.monotonic() - t0), *a, flush=True)


def errname(e):
    return errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__


s = socket.create_connection((host, port))
sent = bytearray()  # everything written, in order (a few MB at most)
got = bytearray()
end = {}  # how the reader's side ended: "EOF" or an errno name


def reader():
    try:
        while True:
            b = s.recv(65536)
            if not b:
                end["r"] = "EOF"
                return
            got.extend(b)
    except OSError as e:
        end["r"] = errname(e)


def send(b):
    s.sendall(b)
    sent.extend(b)


t = threading.Thread(target=reader, daemon=True)
t.start()
# Warm-up: 256 KiB in 32 pieces over about a second. A shimmed client of a shimmed server on
# another host starts on kernel TCP and switches to the fabric on the way (netns_upgrade.sh).
for _ in range(32):
    send(os.urandom(8192))
    time.sleep(1 / 32)
deadline = time.monotonic() + 20
while len(got) < len(sent) and "r" not in end and time.monotonic() < deadline:
    time.sleep(0.01)
if len(got) < len(sent):
    say("warm-up echo incomplete: %d of %d bytes, %s" % (len(got), len(sent), end.get("r")))
    sys.exit(2)
say("warm-up echoed")
with open(os.path.join(sync, "ready.tmp"), "w") as f:
    f.write("%d\n" % os.getpid())
os.rename(os.path.join(sync, "ready.tmp"), os.path.join(sync, "ready"))
deadline = time.monotonic() + 30
while not os.path.exists(os.path.join(sync, "go")):
    if time.monotonic() > deadline:
        say("no go from the test")
        sys.exit(2)
    time.sleep(0.01)
say("go")

if mode == "echo":
    data = os.urandom(nbytes)
    try:
        for i in range(0, len(data), 65536):
            send(data[i:i + 65536])
        s.shutdown(socket.SHUT_WR)
    except OSError as e:
        say("error", errname(e), "after sending %d bytes" % len(sent))
        sys.exit(2)
    say("sent %d bytes" % len(sent))
    t.join()
    say("received %d bytes, %s" % (len(got), end["r"]))
    if end["r"] != "EOF":
        say("error", end["r"])
        sys.exit(2)
    a, b = hashlib.sha256(sent).hexdigest(), hashlib.sha256(got).hexdigest()
    say("sha256 sent %s received %s" % (a, b))
    if a == b and len(sent) == len(got):
        say("echo intact")
        sys.exit(0)
    say("echo DIFFERS")
    sys.exit(1)

how = None
if mode == "hold":
    try:
        while "r" not in end:
            send(os.urandom(4096))
            time.sleep(0.02)
    except OSError as e:
        how = errname(e)
t.join(30)
how = how or end.get("r", "reader still blocked")
say("ended", how, "after sending %d and receiving %d bytes" % (len(sent), len(got)))
intact = bytes(got) == bytes(sent[:len(got)])
say("prefix", "intact" if intact else "DIFFERS")
sys.exit(0 if intact and how in ("EOF", "ECONNRESET", "EPIPE") else 1)
