#!/bin/sh
# End to end, over IPv6 and IPv4: a dual-stack server is one host (docs/design.md, "How a host
# is identified"). src is the server (10.9.0.1 and fd09::1 on s0, shaped at RATE in shaper's
# default mode, triple-isolate); dst holds three clients, each an address with its own iperf3
# server, and src sends to each over TCP:
#   a: fd0b::a, IPv6, 2 connections;
#   b: 10.9.0.3, IPv4, 6 connections;
#   c: fd0c::c, IPv6, 12 connections
# (each IPv6 client in a /64 of its own, the host prefix: two clients in one /64 are one host).
# Counted by address, the server is two source hosts, and b, alone on IPv4, gets half the rate;
# as one host, each client gets a third, as under CAKE's dual-dsthost.
#
# Phases, each with its promise (a failure with its figures):
#   cake:   CAKE dual-dsthost at RATE, the reference, in the same boot (nothing asserted);
#   shaper: shaper's default mode: the clients' shares of the link are within MIN_MAX of each
#           other (min/max), and their goodputs' sum within TOLERANCE % of CAKE's (of the
#           ceiling where CAKE passed it, as lib.sh's shortfall judges). A share is
#           the goodput over the payload a full frame carries in its family: with 20 bytes more
#           of header an IPv6 frame carries 1428 bytes of TCP payload (with timestamps) where
#           an IPv4 one carries 1448, so an equal share of wire time is 1.4 % less goodput;
#   moved:  shaper still running, the server gains an address in another /64 (fd0a::1) and c's
#           connections come from it: the new address is the server too, within the second
#           the address notifications allow (min/max as before; shaper's hosts show no source
#           of the new address);
#   and every byte the device sent in shaper's phases was stamped by shaper or passed
#   unshaped (lib.sh's accounting_fault).
# Prints one "RESULT ..." line per phase.
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

RATE=${DUALSTACK_RATE_MBIT:-40}
SECS=${E2E_SECONDS:-10}
# The promise this test keeps is the hosts' identity: counted by address, min/max is at most
# 0.5. Client a reads 4-7 % under c in every run (2 or 4 connections, both kernels, not yet
# explained; docs/benchmarks.md), so issue 46's 0.95 is judged in the lab's dual-stack-server
# over repetitions, not in one 10 s run here.
MIN_MAX=0.90
TOLERANCE=3
# The goodput ceiling of equal shares of RATE's wire time: full frames carry 1448 bytes of
# payload for b (IPv4), 1428 for a and c (IPv6). The sum is judged as the other rate tests
# judge theirs (lib.sh's shortfall): against CAKE's, or the ceiling where CAKE went past it.
CEILING=$(awk -v r="$RATE" 'BEGIN { printf "%.2f", r * (1448 + 2 * 1428) / 3 / 1514 }')
# client address, port, connections
CLIENTS="fd0b::a,5302,2 10.9.0.3,5303,6 fd0c::c,5304,12"

pair_up
ip -n "$DST" addr add 10.9.0.3/24 dev d0
ip -n "$DST" -6 addr add fd0b::a/64 dev d0 nodad
ip -n "$DST" -6 addr add fd0c::c/64 dev d0 nodad
ip -n "$SRC" -6 route add fd0b::/64 dev s0
ip -n "$SRC" -6 route add fd0c::/64 dev s0
# The server's later address, in a /64 of its own: another host prefix than fd09::1's.
ip -n "$DST" -6 route add fd0a::/64 dev d0
for c in $CLIENTS; do
	IFS=, read -r addr port _ <<EOF
$c
EOF
	run "$DST" iperf3 -s -D -B "$addr" -p "$port" >/dev/null
done
sleep 0.5

# load [FROM_C]: every client's connections for SECS; prints the three goodputs (Mbit/s), in
# the order of $CLIENTS. With FROM_C, c's connections leave from that address.
load() {
	pids=
	for c in $CLIENTS; do
		IFS=, read -r addr port n <<EOF
$c
EOF
		bind=
		[ "$addr" = fd0c::c ] && [ -n "${1:-}" ] && bind="-B $1"
		# shellcheck disable=SC2086
		run "$SRC" iperf3 -c "$addr" -p "$port" $bind -P "$n" -t "$SECS" -O 1 --format m >"/tmp/ds-$port.out" 2>&1 &
		pids="$pids $!"
	done
	wait $pids
	got=
	for c in $CLIENTS; do
		IFS=, read -r addr port _ <<EOF
$c
EOF
		v=$(receiver_mbit <"/tmp/ds-$port.out")
		[ -n "$v" ] || fail "iperf3 to $addr: $(cat "/tmp/ds-$port.out")"
		got="$got $v"
	done
	echo $got
}

# spread GOODPUTS: min/max of the three clients' shares of the link (see the header; only b,
# the second, is IPv4).
spread() {
	echo "$1" | awk '{ $1 *= 1448 / 1428; $3 *= 1448 / 1428
		lo = hi = $1; for (i = 2; i <= NF; i++) { if ($i < lo) lo = $i; if ($i > hi) hi = $i }
		printf "%.3f", (hi > 0 ? lo / hi : 0) }'
}

total() {
	echo "$1" | awk '{ printf "%.2f", $1 + $2 + $3 }'
}

failed=

# cake: the reference.
run "$SRC" tc qdisc replace dev s0 root cake bandwidth "${RATE}mbit" besteffort raw dual-dsthost ||
	fail "CAKE dual-dsthost on s0"
cake=$(load)
run "$SRC" tc qdisc del dev s0 root
cake_total=$(total "$cake")
log "cake dual-dsthost: a b c =$(printf ' %s' $cake) Mbit/s, min/max $(spread "$cake")"
echo "RESULT kernel=$(uname -r) phase=cake rate_mbit=$RATE clients_mbit=$(echo $cake | tr ' ' ,) min_max=$(spread "$cake") total_mbit=$cake_total"

shaper_start --iface s0 --rate "${RATE}mbit"
counted=$(byte_counters "$SRC" s0)

# judge PHASE GOODPUTS: the promises of a shaper phase.
judge() {
	s=$(spread "$2")
	t=$(total "$2")
	awk -v s="$s" -v m="$MIN_MAX" 'BEGIN { exit !(s >= m) }' ||
		failed="$failed; $1: clients got$(printf ' %s' $2) Mbit/s (a b c), min/max $s below $MIN_MAX"
	failed="$failed$(shortfall "$1: clients together" "$t" "$cake_total" "$CEILING")"
	log "$1: a b c =$(printf ' %s' $2) Mbit/s, min/max $s, together $t (CAKE $cake_total, ceiling $CEILING)"
	echo "RESULT kernel=$(uname -r) phase=$1 rate_mbit=$RATE clients_mbit=$(echo $2 | tr ' ' ,) min_max=$s total_mbit=$t cake_total_mbit=$cake_total ceiling_mbit=$CEILING"
}

judge shaper "$(load)"
hosts=$(run "$SRC" shaper stats --iface s0 --hosts --top 100 --json)
echo "$hosts" | grep -q '"self > fd0c::"' ||
	failed="$failed; shaper's hosts do not show the server as one host (self > fd0c::): $hosts"

# moved: a new address, and c's connections from it.
ip -n "$SRC" -6 addr add fd0a::1/64 dev s0 nodad
sleep 1
judge moved "$(load fd0a::1)"
hosts=$(run "$SRC" shaper stats --iface s0 --hosts --top 100 --json)
case $hosts in *'"fd0a::'*) failed="$failed; the server's new address is a host of its own: $hosts" ;; esac

wrong=$(accounting_fault s0 "$counted" "$(byte_counters "$SRC" s0)" 1)
[ -z "$wrong" ] || failed="$failed; accounting$wrong"
shaper_stop
pair_down
[ -z "$failed" ] || fail "${failed#; }"
echo "e2e-dualstack: ok"
