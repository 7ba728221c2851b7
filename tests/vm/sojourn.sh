#!/bin/sh
# What the AQM leaves standing: FLOWS cubic downloads with ECN through shaper, then CAKE, at
# RATE on the same veth, sampled in the middle of the run: each sender's congestion window
# (`ss`), shaper's backlog, scheduled-delay median and marks, CAKE's sojourn averages
# (pk_delay, av_delay, sp_delay) and marks. A diagnostic beside the lab: the lab measures what
# the flows and pings see; this shows why (a queue held by the AQM, or by TCP Small Queues).
#
# Usage: sojourn.sh [RATE_MBIT] [FLOWS] [SECONDS]   (default 100 16 12)
# Prints the samples and one RESULT line per contender.
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

RATE=${1:-100}
FLOWS=${2:-16}
SECS=${3:-12}

pair_up
for ns in "$SRC" "$DST"; do ip netns exec "$ns" sysctl -qw net.ipv4.tcp_ecn=1; done

# cwnds: the senders' congestion windows, space-separated.
cwnds() {
	ip netns exec "$SRC" ss -ti dst 10.9.0.2 | grep -o 'cwnd:[0-9]*' | cut -d: -f2 | tr '\n' ' '
}

for c in shaper cake; do
	case $c in
	shaper) shaper_start --iface s0 --rate "${RATE}mbit" ;;
	cake)
		ip netns exec "$SRC" tc qdisc replace dev s0 root cake bandwidth "${RATE}mbit" besteffort ||
			fail "cake"
		;;
	esac
	ip netns exec "$SRC" iperf3 -c 10.9.0.2 -t "$SECS" -P "$FLOWS" -C cubic --format m \
		>/tmp/sojourn-iperf 2>&1 &
	iperf=$!
	sleep "$((SECS / 2))"
	log "$c: congestion windows: $(cwnds)"
	for i in 1 2 3 4 5; do
		case $c in
		shaper) ip netns exec "$SRC" shaper stats --iface s0 | grep -E 'backlog|ECN marked' ;;
		cake) ip netns exec "$SRC" tc -s qdisc show dev s0 | grep -E '_delay|marks' | tr -s ' ' ;;
		esac
		sleep 0.5
	done
	wait "$iperf" || fail "iperf3: $(cat /tmp/sojourn-iperf)"
	mbit=$(receiver_mbit </tmp/sojourn-iperf)
	case $c in
	shaper)
		marks=$(ip netns exec "$SRC" shaper stats --iface s0 | awk '/ECN marked/ { print $3 }')
		shaper_stop
		;;
	cake)
		marks=$(ip netns exec "$SRC" tc -s qdisc show dev s0 | awk '$1 == "marks" { print $2 }')
		ip netns exec "$SRC" tc qdisc del dev s0 root
		;;
	esac
	echo "RESULT $c rate=${RATE}mbit flows=$FLOWS goodput_mbit=$mbit marks=$marks"
done
pair_down
