# SPDX-License-Identifier: MIT
# Two hosts on one machine: network namespaces joined by a veth pair, each with an address of
# its own (real, separate stacks), removed again by netns_teardown (the caller's EXIT trap).
# netns_setup skips the test (exit 77, with the reason) where namespaces cannot be made.
# shellcheck shell=bash

# netns_setup: sets NS_A, NS_B (namespace names) and ADDR_A, ADDR_B (their addresses).
netns_setup() {
	local tag sub
	tag="rs$$"
	sub=$((RANDOM % 200 + 20))
	NS_A="$tag-a"
	NS_B="$tag-b"
	ADDR_A="10.231.$sub.1"
	ADDR_B="10.231.$sub.2"
	if ! ip netns add "$NS_A" 2>/dev/null; then
		echo "SKIP: cannot create network namespaces (needs root and ip netns)"
		exit 77
	fi
	netns_made=1
	ip netns add "$NS_B" || fail "ip netns add $NS_B failed"
	ip link add "$tag-va" type veth peer name "$tag-vb" || fail "no veth pair"
	ip link set "$tag-va" netns "$NS_A"
	ip link set "$tag-vb" netns "$NS_B"
	ip -n "$NS_A" addr add "$ADDR_A/24" dev "$tag-va"
	ip -n "$NS_B" addr add "$ADDR_B/24" dev "$tag-vb"
	local ns
	for ns in "$NS_A" "$NS_B"; do
		ip -n "$ns" link set lo up
	done
	ip -n "$NS_A" link set "$tag-va" up
	ip -n "$NS_B" link set "$tag-vb" up
	# The link comes up asynchronously: until one host reaches the other (a refused connect to
	# a port nothing listens on is an answer from it).
	local out
	for _ in $(seq 50); do
		out=$(ip netns exec "$NS_B" timeout 1 bash -c "exec 3<>/dev/tcp/$ADDR_A/9" 2>&1) || true
		grep -qi refused <<<"$out" && return 0
		sleep 0.1
	done
	fail "the namespaces do not reach each other"
}

# netns_teardown: kills what still runs in the namespaces and removes them (the veth pair goes
# with them).
netns_teardown() {
	[ "${netns_made:-0}" = 1 ] || return 0
	local ns pid
	for ns in "$NS_A" "$NS_B"; do
		for pid in $(ip netns pids "$ns" 2>/dev/null); do
			kill -KILL "$pid" 2>/dev/null || true
		done
		ip netns del "$ns" 2>/dev/null || true
	done
}
