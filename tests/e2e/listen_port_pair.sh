#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A server on port 0 gets its fabric listener when the kernel's pick has its fabric port taken:
# in a network namespace of its own whose ephemeral range is 40000-40001, with 40001's fabric
# port (60001) held by a plain listener, servers that bind port 0 and ones that listen unbound
# must each listen on 40000 with a fabric listener. The kernel picks 40001 first (odd ports
# first): before, every one of them fell back to a kernel-only listener (port_busy). A client
# with IP_BIND_ADDRESS_NO_PORT still gets no port at bind. Skips (77) where namespaces cannot
# be made.
set -euo pipefail
if [ "${E2E_LISTEN_PAIR_NETNS:-}" != 1 ]; then
	if ! unshare -n true 2>/dev/null; then
		echo "SKIP: cannot create a network namespace (needs root and unshare)"
		exit 77
	fi
	exec unshare -n env E2E_LISTEN_PAIR_NETNS=1 bash "$0" "$@"
fi
ip link set lo up
sysctl -qw net.ipv4.ip_local_port_range="40000 40001"
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need python3

# The holder: a plain listener on 40001's fabric port.
start holder plain 60 python3 -c '
import socket, time
s = socket.create_server(("127.0.0.1", 60001))
time.sleep(60)'
for _ in $(seq 100); do
	port_listening 60001 && break
	sleep 0.05
done
port_listening 60001 || fail "the holder does not listen on 60001"

# server NAME HOW: a shim server that binds port 0 (HOW bind) or listens unbound (HOW unbound),
# prints its port, and ends.
server() {
	shim "$1" 30 python3 -c '
import socket, sys
s = socket.socket()
if sys.argv[1] == "bind":
    s.bind(("127.0.0.1", 0))
s.listen(8)
print(s.getsockname()[1])' "$2"
}

for how in bind unbound; do
	for i in 1 2 3; do
		out=$(server "$how$i" "$how" 2>&1) || fail "$how $i: $out"
		[ "$out" = 40000 ] || fail "$how $i: listened on $out, not 40000"
		[ "$(stat_sum "$how$i" fabric_listeners)" -eq 1 ] || fail "$how $i: no fabric listener"
		[ "$(stat_sum "$how$i" kernel_listeners)" -eq 0 ] || fail "$how $i: a kernel-only listener"
	done
	log "$how: 3 servers on port 40000 with their fabric listeners (40001's fabric port held)"
done

# A client that defers its port to connect() (IP_BIND_ADDRESS_NO_PORT) gets no port at bind.
out=$(shim noport 30 python3 -c '
import socket
s = socket.socket()
s.setsockopt(socket.IPPROTO_IP, 24, 1)  # IP_BIND_ADDRESS_NO_PORT
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])' 2>&1) || fail "noport: $out"
[ "$out" = 0 ] || fail "IP_BIND_ADDRESS_NO_PORT: bind took port $out"
log "IP_BIND_ADDRESS_NO_PORT: no port taken at bind"
echo PASS
