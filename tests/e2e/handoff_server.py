#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# A server that hands each accepted connection to another process before any I/O, as
# fork-per-connection and socket-activated servers do: "fork" serves it in a fork child,
# "exec" in a fork child that execs this script again with the connection on descriptor 3.
# Each connection is an echo until the client half-closes.
import os
import socket
import sys


def echo(conn):
    while True:
        data = conn.recv(65536)
        if not data:
            break
        conn.sendall(data)
    try:
        conn.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the client closed first
    conn.close()


def main():
    if sys.argv[1] == "child":
        echo(socket.socket(fileno=3))
        return
    mode, port = sys.argv[1], int(sys.argv[2])
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(64)
    while True:
        conn, _ = srv.accept()
        pid = os.fork()
        if pid == 0:
            srv.close()
            if mode == "fork":
                echo(conn)
                sys.exit(0)  # exit handlers run: the shim writes its statistics
            os.dup2(conn.fileno(), 3)  # inheritable, as socket activation passes it
            os.execvp(sys.executable, [sys.executable, __file__, "child"])
        conn.close()
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass


if __name__ == "__main__":
    main()
