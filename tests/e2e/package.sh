#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The Debian packages: scripts/package builds them from the tree (package_build.sh, which
# scripts/test starts beside the other tests, or this test itself), dpkg installs them, and the
# installed files alone must work: the installed rstream-run preloads the installed shim into an
# iperf3 server and client whose statistics show the fabric, and an rsocket echo program builds
# with "pkg-config --cflags --libs rstream" and runs. The packages are purged on every way out.
# Skips when the packaging tools are missing, when not root, and when rstream is installed
# already (packages this test did not install, or a meson install in /usr/local, whose headers
# and library the compiler and the loader would take first).
# Usage: package.sh LIBRSTREAM_PRELOAD_SO RSTREAM_RUN (the build's, which must not be used)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
packages=(librstream0 librstream-dev rstream-preload rstream-tools)
installed=0

skip() {
	echo "SKIP: $*"
	exit 77
}

# dpkg ARGS..., retried for a minute while apt or another dpkg holds dpkg's lock.
dpkg_locked() {
	local out rc
	for _ in $(seq 30); do
		rc=0
		out=$(dpkg "$@" 2>&1) || rc=$?
		if [ "$rc" -eq 0 ] || ! grep -q 'locked by another process' <<<"$out"; then
			echo "$out"
			return "$rc"
		fi
		sleep 2
	done
	echo "$out"
	return 1
}

# Purges the packages and checks that none is left; returns non-zero otherwise.
purge() {
	local left
	if ! dpkg_locked --purge "${packages[@]}" >"$work/purge.log" 2>&1; then
		echo "dpkg --purge failed:"
		cat "$work/purge.log"
		return 1
	fi
	left=$(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' "${packages[@]}" 2>/dev/null |
		grep -v '^un ' || true)
	[ -z "$left" ] || { echo "still installed after the purge: $left"; return 1; }
}

# On a way out before the purge at the end: purges the packages once installed (even partly),
# then cleans up as lib.sh does. On SIGTERM (a meson timeout) meson kills the whole process group
# half a second later: the purge then runs in a session of its own, retried while the killed
# dpkg still holds the lock.
package_cleanup() {
	local rc=$?
	trap - EXIT
	if [ "$installed" = 1 ]; then
		if [ "${signalled:-0}" = 1 ]; then
			# shellcheck disable=SC2016 # the inner bash expands it
			setsid -f bash -c 'for _ in $(seq 30); do dpkg --purge "$@" && exit; sleep 2; done' \
				purge "${packages[@]}" >/dev/null 2>&1 </dev/null
		else
			purge || rc=1
		fi
	fi
	e2e_cleanup
	exit "$rc"
}
trap package_cleanup EXIT
trap 'signalled=1; exit 143' TERM
trap 'signalled=1; exit 130' INT

need dpkg-buildpackage dh dpkg-checkbuilddeps iperf3 cc pkg-config pgrep flock setsid
[ "$(id -u)" -eq 0 ] || skip "installing packages needs root"
# Another run of this test (another checkout's suite) would install the same packages.
exec 9>/run/lock/rstream-package-test.lock
flock -n 9 || skip "another package test is running"
# Their -dbgsym packages too: they depend on the exact version, which the purge would break.
present=$(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' "${packages[@]}" \
	"${packages[@]/%/-dbgsym}" 2>/dev/null | grep -v '^un ' || true)
[ -z "$present" ] || skip "rstream packages are installed already, this test would purge them:" \
	"$(echo "$present" | awk '{print $2}' | xargs) (dpkg --purge them to run it)"
for f in /usr/local/include/rstream /usr/local/lib/*/librstream.so* /usr/local/lib/*/rstream \
	/usr/local/lib/*/pkgconfig/rstream.pc /usr/local/bin/rstream-run; do
	[ ! -e "$f" ] || skip "$f (a meson install) would shadow the packages' files"
done
unmet=$(cd "$root" && dpkg-checkbuilddeps 2>&1) || skip "$unmet"
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
libdir=/usr/lib/$multiarch

# The packages package_build.sh built beside the other tests, when they are this tree's; built
# here otherwise.
out=${RSTREAM_PACKAGE_OUT:?RSTREAM_PACKAGE_OUT names the folder package_build.sh fills}
# A build under way (scripts/test's) ends first.
exec 8>"$out.lock"
flock -w 300 8 || fail "the build of the packages under way did not end in 300 s"
if [ -f "$out/fingerprint" ] &&
	[ "$(cat "$out/fingerprint")" = "$("$(dirname "$0")/package_fingerprint.sh" "$root")" ]; then
	log "the packages built beside the other tests, from this tree"
else
	log "no packages of this tree built beside the other tests: building them"
	"$(dirname "$0")/package_build.sh" "$E2E_LIB" "$E2E_RUN" --inline >"$work/build.log" 2>&1 ||
		fail "package_build.sh failed"
fi
# Used once: a later run installs only what was built for it.
mv "$out" "$work/out"
mapfile -t debs < <(printf '%s\n' "$work"/out/debs/*.deb)
[ "${#debs[@]}" -eq "${#packages[@]}" ] || fail "expected ${#packages[@]} packages: ${debs[*]}"
log "packages: $(cd "$work/out/debs" && echo *.deb)"
# dpkg would overwrite files that no package owns, and the purge remove them.
for deb in "${debs[@]}"; do
	while read -r f; do
		f=${f#.}
		[ -d "$f" ] || [ ! -e "$f" ] || skip "$f exists already; installing $(basename "$deb") would replace it"
	done < <(dpkg-deb -c "$deb" | awk '{print $6}')
done

installed=1
dpkg_locked -i "${debs[@]}" >"$work/install.log" 2>&1 || fail "dpkg -i failed"
log "installed ${packages[*]}"

# From here on, only what the packages installed: no build folder or /usr/local on the PATH, no
# library or pkg-config path of our own.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
unset LD_LIBRARY_PATH PKG_CONFIG_PATH RSTREAM_PRELOAD_LIB
[ "$(command -v rstream-run)" = /usr/bin/rstream-run ] ||
	fail "rstream-run is $(command -v rstream-run), not /usr/bin/rstream-run"
shim=$libdir/rstream/librstream_preload.so
dpkg -L rstream-preload | grep -qx "$shim" || fail "rstream-preload does not hold $shim"
[ "$(realpath "$shim")" != "$E2E_LIB" ] || fail "the installed shim is the build's"
for tool in rstream-stat rstream-perf; do
	[ "$(command -v "$tool")" = "/usr/bin/$tool" ] || fail "$tool is not installed in /usr/bin"
	"$tool" --help >/dev/null || fail "$tool --help failed"
done

# The shim rstream-run chose by itself, mapped into a program: the installed one.
maps=$(rstream-run -- cat /proc/self/maps | awk '/librstream_preload/ {print $6}' | sort -u)
[ "$maps" = "$shim" ] || fail "rstream-run preloaded '$maps', not $shim"
log "rstream-run preloads $shim"

# iperf3 under the installed rstream-run on both ends; the server's own mappings, then both
# ends' statistics prove the shim and the fabric.
secs=2
limit=$((secs + 30))
start_server server 1 plain "$limit" rstream-run --stats "$work/stats/server.%p.json" -- \
	iperf3 -s -1 -p @PORT@
server=$(pgrep -P "$server_pid" iperf3 | head -n 1)
[ -n "$server" ] || fail "no iperf3 server process under pid $server_pid"
grep -q " $shim\$" "/proc/$server/maps" || fail "the iperf3 server has not mapped $shim"
rc=0
plain "$limit" rstream-run --stats "$work/stats/client.%p.json" -- \
	iperf3 -c 127.0.0.1 -p "$port" -t "$secs" -f m >"$work/client.log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || fail "iperf3 client exited with $rc"
finish "$server_pid" || rc=$?
[ "$rc" -eq 0 ] || fail "iperf3 server exited with $rc"
sum=$(grep -E 'receiver$' "$work/client.log" | tail -n 1)
[ -n "$sum" ] || fail "no receiver summary"
log "iperf3: $sum"
expect_fabric client 2
expect_fabric server 2

# An rsocket program built against the installed development files.
pc=$(pkg-config --variable=pcfiledir rstream) || fail "pkg-config does not know rstream"
[ "$pc" = "$libdir/pkgconfig" ] || fail "rstream.pc is in $pc, not $libdir/pkgconfig"
flags=$(pkg-config --cflags --libs rstream)
log "pkg-config --cflags --libs rstream: $flags"
# shellcheck disable=SC2086 # the flags are words
cc -Wall -Wextra -Werror -pthread -o "$work/echo" "$(dirname "$0")/package_echo.c" $flags \
	>"$work/cc.log" 2>&1 || fail "the rsocket program does not build"
lib=$(ldd "$work/echo" | awk '$1 == "librstream.so.0" {print $3}')
[ "$(realpath "$lib")" = "$(realpath "$libdir/librstream.so.0")" ] ||
	fail "the rsocket program loads '$lib', not $libdir/librstream.so.0"
plain 30 "$work/echo" >"$work/echo.log" 2>&1 || fail "the rsocket program failed"
version=$(dpkg-query -W -f='${Version}' librstream0)
grep -qx "echoed 262144 bytes, librstream ${version%%-*}" "$work/echo.log" ||
	fail "the rsocket program did not echo: $(cat "$work/echo.log")"
log "$(cat "$work/echo.log")"

installed=0
purge || fail "the packages could not be purged"
log "packages purged"
echo PASS
