# SPDX-License-Identifier: MIT
# Two hosts on one machine: network namespaces joined by a veth pair, each with an address of
# its own (real, separate stacks), removed again by netns_teardown (the caller's EXIT trap).
# netns_setup skips the test (exit 77, with the reason) where namespaces cannot be made.
# shellcheck shell=bash

# netns_setup: sets NS_A, NS_B (namespace names), ADDR_A, ADDR_B (their addresses) and VETH_A,
# VETH_B (the ends of the veth pair in them).
netns_setup() {
	local tag sub
	tag="rs$$"
	sub=$((RANDOM % 200 + 20))
	NS_A="$tag-a"
	NS_B="$tag-b"
	ADDR_A="10.231.$sub.1"
	ADDR_B="10.231.$sub.2"
	VETH_A="$tag-va"
	VETH_B="$tag-vb"
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

# A link that misbehaves, for the fault tests. The kernel here has no netem qdisc: loss comes
# from nftables, rate limits from tbf. Each helper skips the test (exit 77, with the reason)
# where its tool is missing or the kernel refuses it, so that no case passes without its fault.

# netns_loss NS PERCENT: drops PERCENT % of the packets NS sends, at random (PERCENT 0: none);
# netns_dropped NS prints how many the rule dropped so far.
netns_loss() {
	command -v nft >/dev/null 2>&1 || {
		echo "SKIP: nft is not installed (scripts/setup installs nftables)"
		exit 77
	}
	if ! ip netns exec "$1" nft list table inet rsfault >/dev/null 2>&1; then
		if ! ip netns exec "$1" nft add table inet rsfault ||
			! ip netns exec "$1" nft add chain inet rsfault out \
				'{ type filter hook output priority 0; }'; then
			echo "SKIP: nftables does not work in a network namespace here"
			exit 77
		fi
	fi
	ip netns exec "$1" nft flush chain inet rsfault out
	[ "$2" -gt 0 ] || return 0
	ip netns exec "$1" nft add rule inet rsfault out numgen random mod 100 \< "$2" counter drop || {
		echo "SKIP: this kernel's nftables has no numgen or counter"
		exit 77
	}
}

netns_dropped() {
	ip netns exec "$1" nft list chain inet rsfault out 2>/dev/null |
		sed -n 's/.*counter packets \([0-9]*\) .*/\1/p' | awk '{ n += $1 } END { print n + 0 }'
}

# netns_rate NS DEV RATE: shapes what DEV (in NS) sends to RATE (tc's units, e.g. 20mbit) with a
# token bucket; netns_shaped NS DEV prints the qdisc's counters.
netns_rate() {
	ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$3" burst 32kb latency 100ms || {
		echo "SKIP: the tbf qdisc is not available here"
		exit 77
	}
}

netns_shaped() {
	ip netns exec "$1" tc -s qdisc show dev "$2" | tr '\n' ' '
}
