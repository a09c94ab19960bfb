#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A program crashing under the shim: the log gets a backtrace naming the crashing function, and
# the process still dies of the signal (or its own handler runs). Usage:
# crash.sh CASE PROGRAM PRELOAD_LIB [EARLY_PROGRAM]
set -uo pipefail
case=$1
# Absolute: the programs run in the scratch folder (libinfinipath's handler, if it ran, would
# leave its PROGRAM.80s-PID,vm.btr trace file there).
prog=$(realpath "$2")
lib=$(realpath "$3")
early=$(realpath "${4:-$2}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ulimit -c 0 # no core files from the deliberate crashes

fail() {
	echo "FAIL ($case): $*"
	echo "--- stdout"; cat "$work/out"
	echo "--- stderr"; cat "$work/err"
	echo "--- log"; cat "$work/log"
	exit 1
}

# run PROGRAM MODE [VAR=VALUE...]: sets $status; the log (RSTREAM_LOG_FILE, %p is the pid) is
# collected in $work/log.
run() {
	local p=$1 mode=$2
	shift 2
	(cd "$work" && timeout 30 env "$@" RSTREAM_LOG_FILE="$work/log.%p" LD_PRELOAD="$lib" \
		"$p" "$mode" >"$work/out" 2>"$work/err")
	status=$?
	cat "$work"/log.* >"$work/log" 2>/dev/null
	echo "exit status $status"
	cat "$work/log"
}

expect_status() { [ "$status" -eq "$1" ] || fail "exit status $status, expected $1"; }
expect_log() { grep -Eq -- "$1" "$work/log" || fail "log lacks /$1/"; }
expect_out() { grep -q -- "$1" "$work/out" || fail "stdout lacks '$1'"; }
no_fabric_handler() {
	! grep -q "terminated with signal" "$work/err" || fail "a fabric library's handler ran"
	! ls "$work"/*.btr >/dev/null 2>&1 || fail "a fabric library's handler wrote a trace file"
}
# Exactly one report, and not libinfinipath's own (it exits 1 instead of dying of the signal).
expect_one_report() {
	[ "$(grep -c '^rstream crash: signal' "$work/log")" -eq 1 ] || fail "expected one report"
	no_fabric_handler
}
frame() { echo "^#[0-9]+ 0x[0-9a-f]+ $1\+0x[0-9a-f]+ \(.*\+0x[0-9a-f]+\)$"; }

case $case in
segv)
	run "$prog" segv
	expect_status 139
	expect_one_report
	expect_log '^rstream crash: signal 11 \(SIGSEGV\) at 0x0 in thread [0-9]+$'
	expect_log "^#0 0x[0-9a-f]+ rstream_test_crash_here\+0x[0-9a-f]+ \(.*crash_prog\+0x"
	expect_log "$(frame main)"
	;;
abort)
	run "$prog" abort
	expect_status 134
	expect_one_report
	expect_log '^rstream crash: signal 6 \(SIGABRT\) at 0x[0-9a-f]+ in thread [0-9]+$'
	expect_log "$(frame abort)"
	expect_log "$(frame rstream_test_abort_here)"
	;;
fpe)
	run "$prog" fpe
	expect_status 136
	expect_one_report
	expect_log '^rstream crash: signal 8 \(SIGFPE\)'
	expect_log "^#0 .* rstream_test_divide_here\+"
	;;
overflow)
	# Reported from the alternate stack: the main thread's own stack is exhausted.
	run "$prog" overflow
	expect_status 139
	expect_one_report
	expect_log '^rstream crash: signal 11 \(SIGSEGV\)'
	expect_log "^#0 .* rstream_test_recurse_here\+"
	expect_log '^#64 \.\.\. \(more frames not shown\)$'
	;;
thread)
	run "$prog" thread
	expect_status 139
	expect_one_report
	tid=$(sed -n 's/^tid //p' "$work/out")
	[ -n "$tid" ] || fail "no thread id"
	expect_log "^rstream crash: signal 11 \(SIGSEGV\) at 0x0 in thread $tid\$"
	expect_log "^#0 .* rstream_test_crash_here\+"
	expect_log "$(frame crashThread)|$(frame _ZN12_GLOBAL__N_111crashThreadEPv)"
	;;
logged)
	# The logger opened the file first (a warning at the engine's start, after a socket): the
	# report goes to the same file, after that line.
	run "$prog" socket RSTREAM_PROVIDER=tcp RSTREAM_SEND_BUF=bogus
	expect_status 139
	expect_one_report
	expect_log "warn: ignoring RSTREAM_SEND_BUF=bogus"
	expect_log "^#0 .* rstream_test_crash_here\+"
	[ "$(ls "$work"/log.* | wc -l)" -eq 1 ] || fail "expected one log file"
	;;
off)
	run "$prog" segv RSTREAM_BACKTRACE=0
	expect_status 139
	! grep -q "rstream crash" "$work/log" "$work/err" || fail "a report despite RSTREAM_BACKTRACE=0"
	no_fabric_handler
	;;
handler_after)
	# The program's handler, installed in main after the shim loaded, replaces the shim's.
	run "$prog" handler
	expect_status 42
	expect_out "program handler ran"
	! grep -q "rstream crash" "$work/log" || fail "the shim's handler ran"
	;;
early_exit)
	# A handler installed before the shim loaded: the report, then that handler.
	run "$early" segv CRASH_TEST_EARLY=exit
	expect_status 42
	expect_out "early handler ran"
	expect_one_report
	expect_log "^#0 .* rstream_test_crash_here\+"
	;;
early_return)
	# That handler restores the default action and returns: the fault recurs and kills.
	run "$early" segv CRASH_TEST_EARLY=return
	expect_status 139
	expect_out "early handler ran"
	expect_one_report
	;;
*)
	echo "unknown case $case"
	exit 2
	;;
esac
echo "PASS ($case)"
