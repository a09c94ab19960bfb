#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# librstream.so exports exactly the intended symbols with their versions.
set -euo pipefail
lib=$1
expected="rstream_version@@RSTREAM_0.1"
actual=$(nm -D --defined-only --with-symbol-versions "$lib" | awk '$2 != "A" {print $3}' | sort)
if [ "$actual" != "$expected" ]; then
	echo "exported symbols differ from the intended set"
	diff <(echo "$expected") <(echo "$actual") || true
	exit 1
fi
