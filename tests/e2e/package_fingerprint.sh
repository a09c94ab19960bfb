#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Prints a fingerprint of the tree scripts/package packs (the files git lists: tracked, and
# untracked ones it does not ignore; their names and contents), or "none" outside a git
# checkout, which matches no build. Usage: package_fingerprint.sh ROOT
set -euo pipefail
root=${1:?usage: $0 ROOT}
if ! git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	echo none
	exit 0
fi
cd "$root"
git ls-files -z --cached --others --exclude-standard |
	while IFS= read -r -d '' f; do
		if [ -f "$f" ]; then printf '%s\0' "$f"; fi
	done |
	xargs -0 -r sha256sum | sha256sum | cut -d ' ' -f 1
