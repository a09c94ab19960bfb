#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A GoogleTest binary's kernel-backend tests (plain socket calls) run with the shim preloaded:
# they must pass as they do on kernel TCP, and their connections must use the fabric.
# Usage: gtest_shim.sh LIBRSTREAM_PRELOAD_SO RSTREAM_RUN TEST_BINARY FILTER MIN_FABRIC_CONNECTIONS
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
binary=${3:?usage: $0 LIB RUN TEST_BINARY FILTER MIN_FABRIC_CONNECTIONS}
filter=${4:?usage: $0 LIB RUN TEST_BINARY FILTER MIN_FABRIC_CONNECTIONS}
min=${5:?usage: $0 LIB RUN TEST_BINARY FILTER MIN_FABRIC_CONNECTIONS}

rc=0
shim tests 240 "$binary" --gtest_filter="$filter" --gtest_brief=1 >"$work/tests.log" 2>&1 ||
	rc=$?
grep -E '^\[  (PASSED|FAILED) ' "$work/tests.log" || true
if [ "$rc" -ne 0 ]; then
	grep -E '^\[  FAILED  \]' "$work/tests.log" | sort -u || true
	fail "$(basename "$binary") exited with $rc under the shim"
fi
# Some tests connect where nothing listens (kernel fallbacks): those are not counted here.
expect_fabric tests "$min" any
echo PASS
