#!/bin/sh
# End to end: a router shaping what it forwards. A server's TSO super-packets reach the router
# whole (veth passes them on as they are); stamped whole, each would leave as one burst of up to
# 64 KB, 52 ms at 10 Mbit/s, into the modem behind the router, where a ping's reply waits
# behind it. The segmenter splits them into frames before they are stamped, as CAKE's
# split-gso does. Measured in one boot: CAKE, shaper with --no-split-gso (before), shaper
# (after); then exit, a crash and a restart, each leaving the router's interface as it was.
#
#   srv (10.7.0.1) --- rtr [r1: shaped] --- mdm [m1: tbf, the modem] --- cli (10.9.0.2)
#
# Usage: e2e-forward.sh [RATE_MBIT]   (default: 10)
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

RATE=${1:-10}
# The modem: 5 % over the shaped rate, with a buffer that holds bursts (a bloated one). Its token
# bucket is 10 ms deep, as the lab's (lab/sanity/modem.toml): the bucket refills only when its
# watchdog fires, late under an emulated CPU, and keeps no more than its depth. Two frames deep,
# a 10.5 Mbit/s modem carried 9.70 Mbit/s of goodput on 6.1 (ceiling 10.04): less than 2 % over
# a shaper at 10, so the queue a start left in it took seconds to drain and every ping waited
# behind it. Four frames deep it carried 9.98, 10 ms deep all of it.
MODEM_KBIT=$((RATE * 1050))
MODEM_BURST=$((MODEM_KBIT * 10 / 8))
[ "$MODEM_BURST" -ge 3028 ] || MODEM_BURST=3028
SECONDS_PER_RUN=${E2E_SECONDS:-8}
# The target of the GSO-burst work: ping p99 under load through the shaped direction, 5 ms, or
# (an emulated machine's timers are coarse: CAKE itself measures 2.6-5.8 ms there) no more than
# twice CAKE's in the same boot; and the segmenter takes at least a fifth off the p99 of whole
# super-packets. (It halved it in most runs, but a p99 of 200 pings is their second-worst: on
# 6.12 one run measured 4.49 against 8.48 ms, 47 % off, and its repeat 3.70 against 5.80, 36 %.)
PING_P99_MAX_MS=5
TOLERANCE=3
NSES="srv rtr mdm cli"

topology_up() {
	namespaces_up
	ip link add s0 netns srv type veth peer name r0 netns rtr
	ip link add r1 netns rtr type veth peer name m0 netns mdm
	ip link add m1 netns mdm type veth peer name c0 netns cli
	ip -n srv addr add 10.7.0.1/24 dev s0
	ip -n rtr addr add 10.7.0.254/24 dev r0
	ip -n rtr addr add 10.8.0.1/24 dev r1
	ip -n mdm addr add 10.8.0.2/24 dev m0
	ip -n mdm addr add 10.9.0.254/24 dev m1
	ip -n cli addr add 10.9.0.2/24 dev c0
	for link in srv:s0 rtr:r0 rtr:r1 mdm:m0 mdm:m1 cli:c0; do
		ip -n "${link%%:*}" link set "${link#*:}" up
	done
	ip -n srv route add default via 10.7.0.254
	ip -n rtr route add 10.9.0.0/24 via 10.8.0.2
	ip -n mdm route add 10.7.0.0/24 via 10.8.0.1
	ip -n cli route add default via 10.9.0.254
	for ns in rtr mdm; do run "$ns" sysctl -qw net.ipv4.ip_forward=1; done
	run mdm tc qdisc add dev m1 root tbf rate "${MODEM_KBIT}kbit" burst "$MODEM_BURST" latency 200ms
	run cli iperf3 -s -D >/dev/null
	sleep 0.3
}

# r1_state: everything of the router's r1 that shaper may touch, and whether its IFBs exist.
r1_state() {
	run rtr tc qdisc show dev r1 | sed 's/ refcnt [0-9]*//' | sort
	run rtr tc filter show dev r1 egress 2>/dev/null
	run rtr tc filter show dev r1 ingress 2>/dev/null
	ip -n rtr -d link show r1 | grep -o 'g[rs]o_max_s[a-z]* [0-9]*'
	ip -n rtr link show seg4r1 2>/dev/null | head -1 | cut -d' ' -f2
	ip -n rtr link show ifb4r1 2>/dev/null | head -1 | cut -d' ' -f2
}

router_start() {
	shaper_start_in rtr r1 --iface r1 "$@"
}

# wait_segmenter: until the segmenter's filter is in place (it is set up after the shaping).
wait_segmenter() {
	i=0
	while ! run rtr tc filter show dev r1 egress | grep -q shaper_segment; do
		i=$((i + 1))
		[ $i -gt 100 ] && { cat /tmp/shaper.log >&2; fail "no segmenter filter on r1"; }
		sleep 0.1
	done
}

# measure: a 4-flow download from srv to cli (forwarded by rtr) into $goodput, then cli's ping
# of srv (its reply shares the shaped direction) under the same download into $pings.
measure() {
	out=$(run srv iperf3 -c 10.9.0.2 -t "$SECONDS_PER_RUN" -O 1 -P 4 --format m 2>&1) ||
		fail "iperf3: $out"
	goodput=$(echo "$out" | receiver_mbit)
	run srv iperf3 -c 10.9.0.2 -t 6 -P 4 >/dev/null 2>&1 &
	load=$!
	sleep 1
	pings=$(run cli ping -c 200 -i 0.02 10.7.0.1 | sed -n 's/.*time=\([0-9.]*\) ms.*/\1/p' | sort -n |
		awk '{ v[NR] = $1 } END { if (NR == 0) { print "none"; exit 1 }
			i50 = int(NR * 0.50 + 0.5); i99 = int(NR * 0.99 + 0.5); if (i50 < 1) i50 = 1
			printf "%.2f %.2f\n", v[i50], v[i99] }') || fail "ping under load"
	wait $load
}

# frames_per_packet: frames stamped (the delay histogram counts frames) per packet stamped.
frames_per_packet() {
	run rtr shaper stats --iface r1 --json | tr -d ' \n' |
		sed 's/.*"packets":\([0-9]*\).*"delay_hist":\[\([^]]*\)\].*/\1 \2/' |
		awk '{ n = split($2, b, "\"frames\":"); f = 0; for (i = 2; i <= n; i++) f += b[i] + 0
			printf "%.2f", f / $1 }'
}

json_field() {
	run rtr shaper stats --iface r1 --json | tr -d ' \n' | sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p"
}

topology_up
original=$(r1_state)
ceiling=$(tcp_ceiling_mbit "$RATE")

measure_all() {
	run rtr tc qdisc replace dev r1 root cake bandwidth "${RATE}mbit" besteffort raw
	measure
	cake=$goodput cake_ping=$pings
	run rtr tc qdisc del dev r1 root
	log "CAKE at ${RATE}mbit (split-gso): $cake Mbit/s, ping p50/p99 $cake_ping ms"

	router_start --rate "${RATE}mbit" --no-split-gso
	counted=$(byte_counters rtr r1)
	measure
	check_accounting rtr r1 "$counted" "forwarded, --no-split-gso"
	whole=$goodput whole_ping=$pings whole_fpp=$(frames_per_packet)
	shaper_stop
	log "shaper --no-split-gso: $whole Mbit/s, ping p50/p99 $whole_ping ms, $whole_fpp frames per stamped packet"

	router_start --rate "${RATE}mbit"
	wait_segmenter
	ip -n rtr link show seg4r1 >/dev/null 2>&1 || fail "no segmenter (seg4r1): $(cat /tmp/shaper.log)"
	counted=$(byte_counters rtr r1)
	measure
	check_accounting rtr r1 "$counted" "forwarded, segmented"
	shaped=$goodput shaper_ping=$pings fpp=$(frames_per_packet) segmented=$(json_field segmented)
	run rtr shaper stats --iface r1 | grep -q "segmented: .* on seg4r1" || fail "stats does not show the segmenter"
	shaper_stop
	log "shaper: $shaped Mbit/s, ping p50/p99 $shaper_ping ms, $fpp frames per stamped packet, $segmented super-packets segmented"
	[ "$(r1_state)" = "$original" ] || fail "not restored after exit:
	before: $original
	after:  $(r1_state)"
}

# latency_ok: shaper's ping p99 within the target (see PING_P99_MAX_MS).
latency_ok() {
	awk -v p="${shaper_ping#* }" -v c="${cake_ping#* }" -v m="$PING_P99_MAX_MS" \
		'BEGIN { if (c * 2 > m) m = c * 2; exit !(p <= m) }'
}

# segmenter_ok: the segmenter takes at least a fifth off the ping p99 of whole super-packets.
segmenter_ok() {
	awk -v p="${shaper_ping#* }" -v w="${whole_ping#* }" 'BEGIN { exit !(p * 5 <= w * 4) }'
}

measure_all
if ! { within "$shaped" "$ceiling" "$TOLERANCE" && within "$shaped" "$cake" "$TOLERANCE" && latency_ok && segmenter_ok; }; then
	# An emulated machine shares its host: one set of runs can be starved by something else.
	log "shaper $shaped, CAKE $cake, ping $shaper_ping: outside the targets, measuring again"
	measure_all
fi
echo "RESULT kernel=$(uname -r) forward_rate_mbit=$RATE shaper_mbit=$shaped cake_mbit=$cake no_split_mbit=$whole ceiling_mbit=$ceiling shaper_ping_p50_p99_ms=\"$shaper_ping\" no_split_ping_p50_p99_ms=\"$whole_ping\" cake_ping_p50_p99_ms=\"$cake_ping\" frames_per_packet=$fpp no_split_frames_per_packet=$whole_fpp segmented=$segmented"
[ "${segmented:-0}" -gt 0 ] || fail "nothing went through the segmenter"
awk -v f="$fpp" 'BEGIN { exit !(f <= 1.05) }' || fail "$fpp frames per stamped packet with the segmenter (want 1)"
awk -v f="$whole_fpp" 'BEGIN { exit !(f > 1.3) }' ||
	fail "without the segmenter only $whole_fpp frames per packet: the test did not forward super-packets"
within "$shaped" "$ceiling" "$TOLERANCE" || fail "forwarding at ${RATE}mbit: $shaped Mbit/s is not within ${TOLERANCE}% of $ceiling"
within "$shaped" "$cake" "$TOLERANCE" || fail "forwarding at ${RATE}mbit: $shaped Mbit/s is not within ${TOLERANCE}% of CAKE's $cake"
latency_ok || fail "ping p99 through the shaped router is ${shaper_ping#* } ms (target $PING_P99_MAX_MS, or twice CAKE's ${cake_ping#* })"
segmenter_ok || fail "ping p99 ${shaper_ping#* } ms with the segmenter is not a fifth under the p99 without it (${whole_ping#* } ms)"

# A crash leaves the segmenter; the next shaper removes it and puts its own in place, and a
# restart with --no-split-gso leaves none.
router_start --rate "${RATE}mbit"
wait_segmenter
kill -KILL "$SHAPER_PID"
wait "$SHAPER_PID" 2>/dev/null
ip -n rtr link show seg4r1 >/dev/null 2>&1 || fail "expected the crashed shaper's seg4r1 to remain"
router_start --rate "${RATE}mbit"
wait_segmenter
grep -q "did not exit cleanly" /tmp/shaper.log || fail "the successor did not notice the crash"
[ "$(run rtr tc filter show dev r1 egress | grep -c 'shaper_segment')" = 1 ] ||
	fail "after a crash: not exactly one segmenter filter: $(run rtr tc filter show dev r1 egress)"
kill -KILL "$SHAPER_PID"
wait "$SHAPER_PID" 2>/dev/null
router_start --rate "${RATE}mbit" --no-split-gso
ip -n rtr link show seg4r1 >/dev/null 2>&1 && fail "a restart with --no-split-gso kept seg4r1"
shaper_stop
[ "$(r1_state)" = "$original" ] || fail "after crashes and restarts: not restored:
before: $original
after:  $(r1_state)"
log "crash recovery: restored"

# A crash at any point of a start (egress, segmenter, ingress IFB and redirect, each recorded
# before it is set up) is undone by the next shaper: kills spread over the start.
for delay in 0 0.01 0.03 0.06 0.1 0.15 0.2 0.3 0.4 0.6 0.9; do
	ip netns exec rtr shaper run --iface r1 --rate "${RATE}mbit" --ingress-rate "${RATE}mbit" >/tmp/shaper.log 2>&1 &
	SHAPER_PID=$!
	sleep "$delay"
	kill -KILL "$SHAPER_PID"
	wait "$SHAPER_PID" 2>/dev/null
	router_start --rate "${RATE}mbit" --ingress-rate "${RATE}mbit"
	wait_segmenter
	shaper_stop
	[ "$(r1_state)" = "$original" ] || fail "after a crash ${delay}s into a start: not restored:
before: $original
after:  $(r1_state)
$(cat /tmp/shaper.log)"
done
log "crashes during a start: restored"

topology_down
echo "e2e-forward: ok"
