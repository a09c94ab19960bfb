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
# libfabric is loaded on first use (src/fiload.cpp), not with the library.
if readelf -d "$lib" | grep -q 'NEEDED.*libfabric'; then
	echo "librstream.so depends on libfabric: it would be loaded with the program (and its"
	echo "libraries' constructors would run before ours)"
	exit 1
fi
echo "librstream.so does not depend on libfabric"
