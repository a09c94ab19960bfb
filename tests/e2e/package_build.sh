#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds the Debian packages for e2e_package (package.sh) at the lowest CPU priority, while the
# other tests run (scripts/test starts it): the build is the package test's 95 s, and it only
# needs the CPU time those tests leave idle. e2e_package installs what this leaves in
# $RSTREAM_PACKAGE_OUT, with the fingerprint of the tree it was built from, once the build is
# over (it holds $RSTREAM_PACKAGE_OUT.lock meanwhile), and builds by itself when the fingerprint
# is not its tree's (no build started, a failed one, or other sources).
# Usage: package_build.sh LIBRSTREAM_PRELOAD_SO RSTREAM_RUN [--inline]
# (--inline: package.sh's own build, at the normal priority, under its lock)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${RSTREAM_PACKAGE_OUT:?RSTREAM_PACKAGE_OUT names the folder the packages go to}
niceness=19
[ "${3:-}" != --inline ] || niceness=0

need dpkg-buildpackage dh dpkg-checkbuilddeps flock nice
[ "$(id -u)" -eq 0 ] || { echo "SKIP: e2e_package needs root, and builds by itself"; exit 77; }
unmet=$(cd "$root" && dpkg-checkbuilddeps 2>&1) || { echo "SKIP: $unmet"; exit 77; }

# The fingerprint of what scripts/package packs: the files git lists (tracked, and untracked
# ones it does not ignore), their names and contents.
if [ "${3:-}" != --inline ]; then
	exec 8>"$out.lock"
	flock -n 8 || { echo "SKIP: another build of the packages is under way"; exit 77; }
fi
fingerprint=$("$(dirname "$0")/package_fingerprint.sh" "$root")
rm -rf "$out" "$out.tmp"
mkdir -p "$out.tmp"

# The packaging, not the compiler's output, is under test: no -dbgsym packages, no -g (dh_strip
# would remove it anyway, and it costs a fifth of the compile) and no optimization (noopt:
# dpkg-buildflags' -O0, half the compile of -O2; the build's tests run the optimized code).
# meson test's MALLOC_PERTURB_ would slow the compiler down. No timeout of our own: it would
# move the build out of the process group that meson stops on its timeout.
log "building the packages (nice $niceness)"
env -u MALLOC_PERTURB_ DEB_BUILD_OPTIONS="nocheck noopt parallel=$(nproc) noautodbgsym" \
	DEB_CXXFLAGS_STRIP=-g nice -n "$niceness" "$root/scripts/package" "$out.tmp/debs" \
	>"$work/package.log" 2>&1 || fail "scripts/package failed"
# The tree must not have changed while it was packed and built.
[ "$("$(dirname "$0")/package_fingerprint.sh" "$root")" = "$fingerprint" ] ||
	fail "the tree changed during the build"
echo "$fingerprint" >"$out.tmp/fingerprint"
mv "$out.tmp" "$out"
log "built: $(cd "$out/debs" && echo *.deb)"
echo PASS
