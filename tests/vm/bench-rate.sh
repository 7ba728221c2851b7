#!/bin/sh
# Rate accuracy and ceiling, shaper vs CAKE vs fq alone, in the same boot.
# Usage: bench-rate.sh [PARALLEL] [RATE_MBIT...]   (default: 4 flows; 50 500 1000 2500 5000)
# Prints a Markdown table; goodput in Mbit/s, ratio to the TCP goodput ceiling at that rate
# (rate x 1448/1514, since rates are wire rates).
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

PARALLEL=${1:-4}
[ $# -gt 0 ] && shift
RATES=${*:-50 500 1000 2500 5000}
SECS=${BENCH_SECONDS:-8}

pair_up
ip netns exec "$SRC" tc qdisc replace dev s0 root fq
fq_only=$(goodput_mbit "$SECS" "$PARALLEL") || exit 1
ip netns exec "$SRC" tc qdisc del dev s0 root
echo "kernel $(uname -r), $PARALLEL TCP flows, ${SECS}s per run; fq alone (no rate): $fq_only Mbit/s"
echo
echo "| rate | ceiling | shaper | shaper/ceiling | CAKE | CAKE/ceiling | CAKE no-split-gso | shaper/CAKE |"
echo "|---|---|---|---|---|---|---|---|"
for rate in $RATES; do
	ceiling=$(tcp_ceiling_mbit "$rate")
	ip netns exec "$SRC" tc qdisc replace dev s0 root cake bandwidth "${rate}mbit" besteffort raw
	cake=$(goodput_mbit "$SECS" "$PARALLEL") || exit 1
	ip netns exec "$SRC" tc qdisc replace dev s0 root cake bandwidth "${rate}mbit" besteffort raw no-split-gso
	cake_nosplit=$(goodput_mbit "$SECS" "$PARALLEL") || exit 1
	ip netns exec "$SRC" tc qdisc del dev s0 root
	shaper_start --iface s0 --rate "${rate}mbit"
	shaped=$(goodput_mbit "$SECS" "$PARALLEL") || exit 1
	shaper_stop
	echo "| ${rate} Mbit/s | $ceiling | $shaped | $(ratio "$shaped" "$ceiling") | $cake | $(ratio "$cake" "$ceiling") | $cake_nosplit | $(ratio "$shaped" "$cake") |"
done
pair_down
