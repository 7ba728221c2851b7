#!/bin/sh
# End to end: `--nat` on a router that masquerades (CAKE's `nat`). Two LAN machines, each a
# namespace of its own, reach a server through a router namespace that masquerades them out of
# its WAN device w0, where the upload is shaped at RATE:
#   a: 10.77.1.2, 1 TCP connection;
#   b: 10.77.2.2, 8 TCP connections;
#   the router: 10.78.0.1 on w0; the server 10.78.0.2.
# On w0 every packet carries the router's address: told apart by the packets' own addresses,
# the LAN is one host and b's 8 connections take 8/9 of the rate; by their addresses before
# NAT, a and b are two hosts and share it.
#
# Phases, each with its promise (a failure with its figures):
#   cake:    CAKE `nat dual-srchost` at RATE on w0, the reference, in the same boot;
#   shaper:  shaper --nat (its default mode, triple-isolate): a's and b's goodputs within MIN_MAX
#            of each other (min/max), their sum within TOLERANCE % of CAKE's (of the ceiling
#            where CAKE passed it: lib.sh's shortfall; see TOLERANCE), shaper's hosts are a and b (not the
#            router), and every byte w0 sent was stamped or passed unshaped;
#   without: shaper without --nat: a gets under half of b (the hosts are what --nat changes);
#   down:    a's and b's downloads, CAKE `nat dual-dsthost` on an IFB for w0's ingress, then
#            shaper --nat --ingress-rate: the same promises (min/max at MIN_MAX_DOWN), its
#            ingress hosts a and b.
# Prints one "RESULT ..." line per phase.
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

RATE=${NAT_RATE_MBIT:-20}
SECS=${E2E_SECONDS:-10}
MIN_MAX=0.90
# Downloads: CAKE's nat dual-dsthost on the IFB gives 0.81-0.83 here; shaper's lone connection
# carries 90-95 % of its half (the same work conservation as below).
MIN_MAX_DOWN=0.85
# The hosts' identity is what this test promises. Two hosts, one of them a lone flow, carry
# less than CAKE whether the router masquerades or only routes them: the host layer's work
# conservation (issue 46; docs/benchmarks.md, "Behind a masquerading router"), not NAT. The
# sum is judged with that margin until it is fixed.
TOLERANCE=5
CEILING=$(tcp_ceiling_mbit "$RATE")
ROUTER=router

command -v nft >/dev/null || fail "nft is not in the VM (cargo xtask bootstrap installs nftables)"
lan_router_up
run "$ROUTER" nft -f - <<'EOF' || fail "masquerading out of w0 (nf_tables, nft_chain_nat, nft_masq)"
table ip nat {
	chain post {
		type nat hook postrouting priority srcnat;
		oifname "w0" masquerade
	}
}
EOF
run server iperf3 -s -D -p 5301 >/dev/null
run server iperf3 -s -D -p 5302 >/dev/null
sleep 0.5

# load [-R]: a's and b's uploads (downloads with -R) for SECS; prints their goodputs
# (Mbit/s), a's then b's.
load() {
	run lana iperf3 -c 10.78.0.2 -p 5301 -P 1 -t "$SECS" -O 1 --format m "$@" >/tmp/nat-a.out 2>&1 &
	pa=$!
	run lanb iperf3 -c 10.78.0.2 -p 5302 -P 8 -t "$SECS" -O 1 --format m "$@" >/tmp/nat-b.out 2>&1 &
	pb=$!
	wait $pa $pb
	a=$(receiver_mbit </tmp/nat-a.out)
	b=$(receiver_mbit </tmp/nat-b.out)
	[ -n "$a" ] && [ -n "$b" ] || fail "iperf3 through the router: $(cat /tmp/nat-a.out /tmp/nat-b.out)"
	echo "$a $b"
}

spread() {
	echo "$1" | awk '{ lo = $1 < $2 ? $1 : $2; hi = $1 < $2 ? $2 : $1; printf "%.3f", (hi > 0 ? lo / hi : 0) }'
}

total() {
	echo "$1" | awk '{ printf "%.2f", $1 + $2 }'
}

result() {
	echo "RESULT kernel=$(uname -r) phase=$1 rate_mbit=$RATE a_mbit=$(echo $2 | cut -d' ' -f1) b_mbit=$(echo $2 | cut -d' ' -f2) min_max=$(spread "$2") total_mbit=$(total "$2") ceiling_mbit=$CEILING"
}

failed=

run "$ROUTER" tc qdisc replace dev w0 root cake bandwidth "${RATE}mbit" besteffort raw nat dual-srchost ||
	fail "CAKE nat dual-srchost on w0"
cake=$(load)
run "$ROUTER" tc qdisc del dev w0 root
cake_total=$(total "$cake")
log "cake nat dual-srchost: a $(echo $cake | cut -d' ' -f1), b $(echo $cake | cut -d' ' -f2) Mbit/s, min/max $(spread "$cake")"
result cake "$cake"

shaper_start_in "$ROUTER" w0 --iface w0 --rate "${RATE}mbit" --nat
counted=$(byte_counters "$ROUTER" w0)
got=$(load)
s=$(spread "$got")
t=$(total "$got")
awk -v s="$s" -v m="$MIN_MAX" 'BEGIN { exit !(s >= m) }' ||
	failed="$failed; shaper --nat: a and b got $got Mbit/s, min/max $s below $MIN_MAX (CAKE: $cake)"
failed="$failed$(shortfall "shaper --nat: a and b together" "$t" "$cake_total" "$CEILING")"
hosts=$(run "$ROUTER" shaper stats --iface w0 --hosts --top 100 --json)
for h in 10.77.1.2 10.77.2.2; do
	echo "$hosts" | grep -q "\"$h" || failed="$failed; shaper --nat: $h is not among its hosts: $hosts"
done
case $hosts in *'"10.78.0.1'*) failed="$failed; shaper --nat: the router's address is a host: $hosts" ;; esac
wrong=$(accounting_fault w0 "$counted" "$(byte_counters "$ROUTER" w0)" 1)
[ -z "$wrong" ] || failed="$failed; accounting$wrong"
shaper_stop
log "shaper --nat: a b = $got Mbit/s, min/max $s, together $t (CAKE $cake_total, ceiling $CEILING)"
result shaper "$got"

shaper_start_in "$ROUTER" w0 --iface w0 --rate "${RATE}mbit"
without=$(load)
shaper_stop
awk -v s="$(spread "$without")" 'BEGIN { exit !(s < 0.5) }' ||
	failed="$failed; without --nat a and b still shared ($without Mbit/s): the test does not tell NAT apart"
log "shaper without --nat: a b = $without Mbit/s, min/max $(spread "$without")"
result without "$without"

# Downloads: the ingress direction, on an IFB that w0's ingress is redirected to, before
# conntrack has seen the packets (their destination is still the router's).
run "$ROUTER" ip link add ifb4cake type ifb && run "$ROUTER" ip link set ifb4cake up &&
	run "$ROUTER" tc qdisc add dev w0 handle ffff: ingress &&
	run "$ROUTER" tc filter add dev w0 parent ffff: matchall action mirred egress redirect dev ifb4cake &&
	run "$ROUTER" tc qdisc replace dev ifb4cake root cake bandwidth "${RATE}mbit" besteffort raw nat dual-dsthost ingress ||
	fail "CAKE nat dual-dsthost on an IFB for w0's ingress"
cake_down=$(load -R)
run "$ROUTER" tc qdisc del dev w0 ingress
run "$ROUTER" ip link del ifb4cake
cake_down_total=$(total "$cake_down")
log "download, cake nat dual-dsthost: a b = $cake_down Mbit/s, min/max $(spread "$cake_down")"
result cake-down "$cake_down"

# The ingress direction finds the LAN hosts in the flows the egress direction records, a map
# handed to it through bpffs, as a host or a DaemonSet mounting the host's /sys/fs/bpf has it.
grep -q ' /sys/fs/bpf bpf ' /proc/mounts || mount -t bpf bpf /sys/fs/bpf || fail "mounting bpffs"
SHAPER_NET_ONLY=1 shaper_start_in "$ROUTER" w0 --iface w0 --rate 1gbit --ingress-rate "${RATE}mbit" --nat
got=$(load -R)
s=$(spread "$got")
t=$(total "$got")
awk -v s="$s" -v m="$MIN_MAX_DOWN" 'BEGIN { exit !(s >= m) }' ||
	failed="$failed; shaper --nat, download: a and b got $got Mbit/s, min/max $s below $MIN_MAX_DOWN (CAKE: $cake_down)"
failed="$failed$(shortfall "shaper --nat, download: a and b together" "$t" "$cake_down_total" "$CEILING")"
hosts=$(run "$ROUTER" shaper stats --iface w0 --ingress --hosts --top 100 --json)
for h in 10.77.1.2 10.77.2.2; do
	echo "$hosts" | grep -q "$h" || failed="$failed; shaper --nat, download: $h is not among its hosts: $hosts"
done
shaper_stop
log "shaper --nat, download: a b = $got Mbit/s, min/max $s, together $t (CAKE $cake_down_total)"
result shaper-down "$got"

topology_down
[ -z "$failed" ] || fail "${failed#; }"
echo "e2e-nat: ok"
