#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# listen_port_churn.py in a network namespace of its own with a 10-port ephemeral range, over
# the fabric. Skips (77) where namespaces cannot be made. Usage: listen_port_churn.sh LIBRSTREAM_SO
set -euo pipefail
lib=$(realpath "${1:?usage: $0 LIBRSTREAM_SO}")
here=$(dirname "$(realpath "$0")")
if ! unshare -n true 2>/dev/null; then
	echo "SKIP: cannot create a network namespace (needs root and unshare)"
	exit 77
fi
exec unshare -n bash -c '
	set -e
	ip link set lo up
	sysctl -qw net.ipv4.ip_local_port_range="40000 40009"
	RSTREAM_PROVIDER=tcp RSTREAM_SAME_HOST=0 exec python3 "$1" "$2" 300' _ \
	"$here/listen_port_churn.py" "$lib"
