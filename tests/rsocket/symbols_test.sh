#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# librstream.so exports exactly the intended symbols with librdmacm's versions (and our own).
set -euo pipefail
lib=$1
expected=$(
	for f in rsocket rbind rlisten raccept rconnect rshutdown rclose rrecv rrecvfrom rrecvmsg \
		rsend rsendto rsendmsg rread rreadv rwrite rwritev rpoll rselect rgetpeername \
		rgetsockname rsetsockopt rgetsockopt rfcntl riomap riounmap riowrite; do
		echo "$f@@RDMACM_1.0"
	done
	for f in repoll_create repoll_ctl repoll_wait; do
		echo "$f@@RDMACM_1.5"
	done
	echo "rstream_version@@RSTREAM_0.1"
)
expected=$(echo "$expected" | sort)
actual=$(nm -D --defined-only --with-symbol-versions "$lib" | awk '$2 != "A" {print $3}' | sort)
if [ "$actual" != "$expected" ]; then
	echo "exported symbols differ from the intended set"
	diff <(echo "$expected") <(echo "$actual") || true
	exit 1
fi
echo "librstream.so exports the $(echo "$actual" | wc -l) intended symbols"
# libfabric is loaded on first use (src/engine/fiload.cpp), not with the library.
if readelf -d "$lib" | grep -q 'NEEDED.*libfabric'; then
	echo "librstream.so depends on libfabric: it would be loaded with the program (and its"
	echo "libraries' constructors would run before ours)"
	exit 1
fi
echo "librstream.so does not depend on libfabric"
# Initial-exec TLS marks a library STATIC_TLS: dlopen then needs its whole TLS block (16 KiB
# here) in the little static TLS left after the program started, and failed in Python's ctypes
# ("cannot allocate memory in static TLS block").
if readelf -d "$lib" | grep -q 'FLAGS.*STATIC_TLS'; then
	echo "librstream.so uses static TLS: a program could not dlopen it"
	exit 1
fi
echo "librstream.so uses no static TLS (a program can dlopen it)"
# The shim's own code (preload/: the kernel/fabric socket, its configuration and statistics)
# lives in the shim alone: no strong symbol of its archive may be defined in librstream.so.
if [ $# -ge 2 ]; then
	shim=$(nm --defined-only "$2" 2>/dev/null | awk 'NF == 3 && $2 ~ /^[TDBR]$/ {print $3}' | sort -u)
	[ -n "$shim" ] || { echo "no symbols read from $2"; exit 1; }
	lib_syms=$(nm --defined-only "$lib" | awk 'NF == 3 {print $3}' | sort -u)
	both=$(comm -12 <(echo "$shim") <(echo "$lib_syms"))
	if [ -n "$both" ]; then
		echo "librstream.so contains shim code:"
		echo "$both" | c++filt | head -20
		exit 1
	fi
	echo "librstream.so holds none of the shim's $(echo "$shim" | wc -l) symbols"
fi
# And by name, whatever the archive holds today: the shim's namespace and its classes.
named=$(nm -C --defined-only "$lib" | grep -E 'rstream::shim::|HybridSocket|ShimConfig|ConnRecord|shimStats' || true)
if [ -n "$named" ]; then
	echo "librstream.so contains the shim's code:"
	echo "$named" | head -20
	exit 1
fi
