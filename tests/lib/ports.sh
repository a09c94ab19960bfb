# SPDX-License-Identifier: MIT
# Local TCP ports for test scripts: which are in use or listening, and picking a free one.
# shellcheck shell=bash

# Whether anything uses local TCP port $1 (any state, IPv4 or IPv6).
port_in_use() {
	local hex
	hex=$(printf ':%04X' "$1")
	awk -v p="$hex" 'NR > 1 && substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' \
		/proc/net/tcp /proc/net/tcp6
}

# Whether a socket listens on local TCP port $1.
port_listening() {
	local hex
	hex=$(printf ':%04X' "$1")
	awk -v p="$hex" 'NR > 1 && $4 == "0A" && substr($2, length($2) - 4) == p { f = 1 }
		END { exit !f }' /proc/net/tcp /proc/net/tcp6
}

# pick_port [OFFSET [SPAN [TRIES [BASE]]]]: a port in BASE..BASE+SPAN-1 (BASE default 20000,
# SPAN default 20001) that nothing uses, nor the port OFFSET above it (the shim's fabric port;
# OFFSET default 0: only the port itself), out of TRIES random ones (default 200). Fails when
# none is free.
pick_port() {
	local offset=${1:-0} span=${2:-20001} tries=${3:-200} base=${4:-20000} p
	for _ in $(seq "$tries"); do
		p=$((base + RANDOM % span))
		if ! port_in_use "$p" && ! port_in_use $((p + offset)); then
			echo "$p"
			return 0
		fi
	done
	return 1
}
