#!/bin/sh
# End to end: the rate holds on a busy host. CPU hogs at normal priority run on every CPU
# while CAKE, then shaper, shape the same egress in the same boot: one TCP flow, and three
# destination hosts with eight flows each. shaper's goodput must be within TOLERANCE % of
# CAKE's under the same load, never above the TCP ceiling at the rate, and within TOLERANCE %
# of that ceiling wherever CAKE reaches it (where CAKE does not, the busy machine cannot drive
# the rate and only the comparison with CAKE says anything about the shaper).
#
# Usage: e2e-busy.sh [RATE_MBIT...]   (default: 7 73 220)
# Prints one "RESULT ..." line per rate and load for the record.
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

RATES=${*:-7 73 220}
SECONDS_PER_RUN=${E2E_SECONDS:-8}
TOLERANCE=3
# Above the ceiling by more than iperf3's own window allows is overshoot: it counts what TCP
# had queued before its measured window began (CAKE measures up to 1 % over at 7 Mbit/s).
OVER=1
HOSTS="10.9.0.2 10.9.0.3 10.9.0.4"

pair_up
for a in 10.9.0.3 10.9.0.4; do ip -n "$DST" addr add "$a/24" dev d0; done
for a in $HOSTS; do ip netns exec "$DST" iperf3 -s -D -B "$a" -p 5301 >/dev/null; done
sleep 0.3

HOG_PIDS=
hogs_start() {
	for _ in $(seq "$(nproc)"); do
		sh -c 'while :; do :; done' &
		HOG_PIDS="$HOG_PIDS $!"
	done
}
hogs_stop() {
	[ -n "$HOG_PIDS" ] && kill $HOG_PIDS 2>/dev/null
	wait $HOG_PIDS 2>/dev/null
	HOG_PIDS=
}
trap hogs_stop EXIT

# load_mbit LOAD: goodput of LOAD ("1x1": one flow; "3x8": three hosts of eight flows).
load_mbit() {
	case $1 in
	1x1) goodput_mbit "$SECONDS_PER_RUN" 1 ;;
	3x8)
		for a in $HOSTS; do
			ip netns exec "$SRC" iperf3 -c "$a" -p 5301 -t "$SECONDS_PER_RUN" -O 1 -P 8 --format m >"/tmp/busy-$a.out" 2>&1 &
		done
		wait
		for a in $HOSTS; do receiver_mbit <"/tmp/busy-$a.out"; done | awk '{ s += $1 } END { printf "%.2f\n", s }'
		;;
	esac
}

# above CEILING VALUE: VALUE exceeds CEILING by more than OVER %.
above() {
	awk -v c="$1" -v v="$2" -v o="$OVER" 'BEGIN { exit !(v > c * (1 + o / 100)) }'
}

hogs_start
log "hogs: $(nproc) busy loops at normal priority"
failed=
for rate in $RATES; do
	ceiling=$(tcp_ceiling_mbit "$rate")
	for load in 1x1 3x8; do
		ip netns exec "$SRC" tc qdisc replace dev s0 root cake bandwidth "${rate}mbit" besteffort raw
		cake=$(load_mbit "$load")
		ip netns exec "$SRC" tc qdisc del dev s0 root
		shaper_start --iface s0 --rate "${rate}mbit"
		shaped=$(load_mbit "$load")
		late=$(ip netns exec "$SRC" shaper stats --iface s0 --json | tr -d ' \n' | sed -n 's/.*"overrun_packets":\([0-9]*\).*/\1/p')
		shaper_stop
		log "rate ${rate}mbit $load: shaper $shaped, cake $cake, ceiling $ceiling Mbit/s (overrun packets: $late)"
		echo "RESULT kernel=$(uname -r) rate_mbit=$rate load=$load shaper_mbit=$shaped cake_mbit=$cake ceiling_mbit=$ceiling shaper_vs_ceiling=$(ratio "$shaped" "$ceiling") shaper_vs_cake=$(ratio "$shaped" "$cake")"
		if within "$cake" "$ceiling" "$TOLERANCE"; then
			within "$shaped" "$ceiling" "$TOLERANCE" || failed="$failed; ${rate}mbit $load: $shaped not within ${TOLERANCE}% of the ceiling $ceiling"
		else
			log "rate ${rate}mbit $load: CAKE does not reach the ceiling either: judged against CAKE only"
		fi
		above "$ceiling" "$shaped" && failed="$failed; ${rate}mbit $load: $shaped above the ceiling $ceiling"
		within "$shaped" "$cake" "$TOLERANCE" || failed="$failed; ${rate}mbit $load: $shaped not within ${TOLERANCE}% of CAKE's $cake"
	done
done
hogs_stop
pair_down
[ -z "$failed" ] || fail "${failed#; }"
echo "e2e-busy: ok"
