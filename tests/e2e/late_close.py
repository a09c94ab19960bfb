#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Both ends of late_close.sh: one connection whose end closes in the middle of its switch to the
# fabric, after the client's token and around the server's ack. Files in WORK order the steps.
# Usage: late_close.py server PORT WORK MODE | client PORT WORK MODE CLIENT_LOG
#   MODE client-closes: the client closes after its token, before the server looks at it.
#   MODE server-closes: the server acks, writes "bye" and closes before the client's count.
import os
import select
import socket
import sys
import time

role, port, work, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]


def wait_file(name, what):
    deadline = time.time() + 20
    while not os.path.exists(os.path.join(work, name)):
        if time.time() > deadline:
            sys.exit(what)
        time.sleep(0.02)


def touch(name):
    open(os.path.join(work, name), "w").close()


def read_to_end(s):
    got = b""
    while True:
        d = s.recv(64)
        if not d:
            return got
        got += d


if role == "server":
    c, _ = socket.create_server(("127.0.0.1", port)).accept()
    c.sendall(c.recv(64))  # the ACCEPT goes with this
    wait_file("token-sent", "the client's token never went")
    # No call on the connection meanwhile: the progress thread takes in whatever the client's
    # fabric connection brings (its token, and its end in client-closes).
    time.sleep(0.5)
    if mode == "client-closes":
        got = read_to_end(c)
        print("server read %r to the end" % got)
        if got != b"tail":
            sys.exit("the server read %r, not b'tail'" % got)
    else:
        c.sendall(b"bye")  # claims the token and acks first: "bye" goes over the fabric
        c.close()
        touch("server-closed")
        print("server wrote bye and closed")
    sys.exit(0)

client_log = sys.argv[5]
s = socket.create_connection(("127.0.0.1", port), timeout=10)
s.sendall(b"hello")
if s.recv(64) != b"hello":
    sys.exit("no echo")
# The switch moves on during the program's calls on the connection: polls, until the token.
deadline = time.time() + 15
while b"token sent" not in open(client_log, "rb").read():
    if time.time() > deadline:
        sys.exit("the token never went")
    p = select.poll()
    p.register(s, select.POLLIN)
    p.poll(20)
if mode == "client-closes":
    s.sendall(b"tail")
    s.close()
    touch("token-sent")
    print("client wrote tail and closed after its token")
else:
    touch("token-sent")
    wait_file("server-closed", "the server did not close")
    got = read_to_end(s)
    print("client read %r" % got)
    if got != b"bye":
        sys.exit("the client lost the server's last bytes: read %r" % got)
