#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Both ends of signal_track.sh. The server echoes each byte 5 ms after it came, so that each
# of the client's reads sleeps; sched_get_priority_min() calls mark the phases in the client's strace.
# Usage: signal_track.py server PORT | client PORT
import ctypes
import os
import signal
import socket
import sys
import time

role, port = sys.argv[1], int(sys.argv[2])

if role == "server":
    c, _ = socket.create_server(("127.0.0.1", port)).accept()
    while True:
        b = c.recv(1)
        if not b:
            break
        time.sleep(0.005)
        c.sendall(b)
    sys.exit(0)


class SigAction(ctypes.Structure):
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16),
                ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]


libc = ctypes.CDLL(None, use_errno=True)
s = socket.create_connection(("127.0.0.1", port), timeout=10)


def echo():
    s.sendall(b"x")
    if s.recv(1) != b"x":
        sys.exit("no echo")


# The connection moves to the fabric within its first second or so.
t = time.time()
while time.time() - t < 1.5:
    echo()
os.sched_get_priority_min(os.SCHED_OTHER)  # phase: 100 reads that each sleep
for _ in range(100):
    echo()
os.sched_get_priority_min(os.SCHED_OTHER)

# sigaction answers with the program's handler (here libc's getpid, which does nothing with
# its argument), while the kernel's is the shim's trampoline, and the signal is delivered.
getpid = ctypes.cast(libc.getpid, ctypes.c_void_p).value
sa = SigAction()
sa.handler = getpid
if libc.sigaction(signal.SIGUSR2, ctypes.byref(sa), None) != 0:
    sys.exit("sigaction failed")
old = SigAction()
libc.sigaction(signal.SIGUSR2, None, ctypes.byref(old))
if old.handler != getpid:
    sys.exit("sigaction answered %#x, not the handler set (%#x)" % (old.handler or 0, getpid))
os.kill(os.getpid(), signal.SIGUSR2)


# Every way to set a handler puts it behind the shim's trampoline when tracking (the kernel's
# handler, read with the raw system call, is another), and sigaction answers with it all the same.
def kernel_handler(sig):
    k = SigAction()
    if libc.syscall(13, sig, None, ctypes.byref(k), 8) != 0:  # rt_sigaction
        sys.exit("rt_sigaction failed")
    return k.handler


tracked = os.environ.get("RSTREAM_SIGNAL_TRACK", "1") != "0"
getppid = ctypes.cast(libc.getppid, ctypes.c_void_p).value
for i, name in enumerate(["signal", "bsd_signal", "ssignal", "sysv_signal", "__sysv_signal",
                          "sigset", "sigaction"]):
    h = getpid if i % 2 else getppid  # a change each time
    if name == "sigaction":
        sa = SigAction()
        sa.handler = h
        libc.sigaction(signal.SIGUSR2, ctypes.byref(sa), None)
    else:
        fn = getattr(libc, name)
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_int, ctypes.c_void_p]
        fn(signal.SIGUSR2, h)
    old = SigAction()
    libc.sigaction(signal.SIGUSR2, None, ctypes.byref(old))
    if old.handler != h:
        sys.exit("after %s, sigaction answered %#x, not %#x" % (name, old.handler or 0, h))
    if (kernel_handler(signal.SIGUSR2) != h) != tracked:
        sys.exit("after %s, the kernel's handler is %s the one set" %
                 (name, "still" if tracked else "not"))
    os.kill(os.getpid(), signal.SIGUSR2)
if libc.siginterrupt(signal.SIGUSR2, 1) != 0:
    sys.exit("siginterrupt failed")
libc.sigaction(signal.SIGUSR2, None, ctypes.byref(old))
if old.flags & 0x10000000:  # SA_RESTART
    sys.exit("siginterrupt(1) left SA_RESTART in sigaction's answer")


# A handler that raises ends a blocking read that waits for nothing: EINTR, then the exception.
class Alarm(Exception):
    pass


def on_alarm(sig, frame):
    raise Alarm()


signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, 0.3)
t = time.time()
try:
    s.recv(1)
    sys.exit("the read returned")
except Alarm:
    pass
took = time.time() - t
if took > 1.5:
    sys.exit("the read ended %.2f s after the alarm" % took)
s.close()
print("100 sleeping reads; sigaction answered the handler set by each of 7 calls; the read "
      "ended %.2f s in" % took)
