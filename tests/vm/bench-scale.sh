#!/bin/sh
# Scale: host fairness with many hosts and many flows, and a new-flow flood from one host.
#
# HOSTS local addresses in src each send UDP over PORTS flows (one per destination port) to
# dst through shaper at RATE (its default mode, triple-isolate: with one destination, fair
# between the sources). Hosts offer 1.1, 1.3, 1.6 and 2 times an equal share in turn, so a FIFO
# (or a shaper that is not host-fair) would split the link in proportion to what they offer
# (Jain over hosts 0.95) and a host-fair one evenly (1.0). `lab-probe sink` counts what
# arrives per source after a warm-up. Then the same with one more host flooding new 5-tuples
# (FLOOD per second, each from one of 32 source ports to one of 60,000 destination ports, so a
# tuple recurs only after 1.9 million packets): every other host must keep 95 % of its share.
#
# Frames are 9000 bytes (the veth's MTU raised): at 1 Gbit/s that is 14k packets/s, which the
# emulated VM carries; at 1500 bytes it would be the VM's packet rate that is measured.
#
# Usage: bench-scale.sh [HOSTS] [PORTS] [RATE_MBIT] [FLOOD]   (default 1000 100 1000 100000)
# Prints the results and one RESULT line per phase; fails if a phase misses its bound.
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

HOSTS=${1:-1000}
PORTS=${2:-100}
RATE=${3:-1000}
FLOOD=${4:-100000}
SECS=${BENCH_SECONDS:-20}
WARMUP=${BENCH_WARMUP:-6}
SIZE=8900
PORT=6000

[ "$HOSTS" -ge 2 ] && [ "$HOSTS" -le 60000 ] || fail "HOSTS must be 2-60000"

pair_up
ip -n "$SRC" link set s0 mtu 9000
ip -n "$DST" link set d0 mtu 9000
for ns in "$SRC" "$DST"; do
	ip netns exec "$ns" sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
done
# Socket buffers (global, not per namespace) deep enough for a flow's packets waiting in fq
# up to the AQM's hard limit, so that the load is what blast offers, not what the sockets let
# out, and for the sink's queues between its threads' turns.
sysctl -qw net.core.rmem_default=4194304 net.core.wmem_default=4194304
# The hosts: consecutive addresses from 10.20.0.1 (as blast numbers them), and the flooder
# 10.21.0.1.
awk -v n="$HOSTS" 'BEGIN { for (i = 1; i <= n; i++) printf "addr add 10.20.%d.%d/32 dev s0\n", int(i / 256), i % 256 }' |
	ip -n "$SRC" -batch - || fail "adding $HOSTS addresses"
ip -n "$SRC" addr add 10.21.0.1/32 dev s0
ulimit -n 65536

shaper_start --iface s0 --rate "${RATE}mbit"

# phase NAME FLOOD_PER_SECOND: one run; prints the sink's counts into /tmp/sink-NAME.
phase() {
	ip netns exec "$DST" lab-probe sink --port $PORT --ports "$PORTS" --warmup "$WARMUP" \
		--duration "$((SECS + 1))" >"/tmp/sink-$1" &
	sink=$!
	sleep 0.5
	# Offered: 1.5 times the rate on average, at the weights below.
	ip netns exec "$SRC" lab-probe blast --from 10.20.0.1 --hosts "$HOSTS" --port $PORT \
		--ports "$PORTS" --rate "$((RATE * 1500000))" --size $SIZE --duration "$SECS" \
		--weights 1.1,1.3,1.6,2.0 10.9.0.2 >"/tmp/blast-$1" 2>&1 &
	blast=$!
	flood=
	if [ "$2" -gt 0 ]; then
		# 18-byte payloads: 60-byte frames, FLOOD of them a second.
		ip netns exec "$SRC" lab-probe blast --from 10.21.0.1 --hosts 1 --sockets 32 \
			--port 2000 --ports 60000 --rate "$(($2 * 60 * 8))" --size 18 --duration "$SECS" \
			10.9.0.2 >"/tmp/flood-$1" 2>&1 &
		flood=$!
	fi
	wait $blast || fail "blast: $(cat "/tmp/blast-$1")"
	[ -z "$flood" ] || wait $flood || fail "flood: $(cat "/tmp/flood-$1")"
	wait $sink || fail "sink failed"
	cat "/tmp/blast-$1"
	[ -z "$flood" ] || cat "/tmp/flood-$1"
}

# judge NAME: Jain's index over the hosts (not the flooder), the smallest host's share of an
# equal split of everything received (the flooder counts as one host), and the goodput.
judge() {
	awk -v hosts="$HOSTS" -v secs="$((SECS + 1 - WARMUP))" -v name="$1" '
		/^#/ { next }
		$1 ~ /^10\.20\./ { n++; b[n] = $3; sum += $3; sq += $3 * $3; total += $3; next }
		$1 == "10.21.0.1" { flood = $3; total += $3; others = 1; next }
		END {
			if (n < hosts) missing = hosts - n
			# Hosts that received nothing count as zeros.
			jain = sum * sum / (hosts * sq)
			share = total / (hosts + others)
			min = -1
			for (i = 1; i <= n; i++) if (min < 0 || b[i] < min) min = b[i]
			if (missing) min = 0
			printf "RESULT %s hosts=%d received_mbit=%.1f jain_hosts=%.4f min_host_over_share=%.3f flood_mbit=%.2f\n",
				name, hosts, total * 8 / secs / 1e6, jain, min / share, flood * 8 / secs / 1e6
		}' "/tmp/sink-$1"
}

log "$HOSTS hosts x $PORTS flows at ${RATE} Mbit/s, ${SECS} s per phase (${WARMUP} s warm-up)"
phase fair 0
judge fair | tee /tmp/result-fair
ip netns exec "$SRC" shaper stats --iface s0 | head -40
log "the same with a flood of $FLOOD new 5-tuples/s from 10.21.0.1"
phase flood "$FLOOD"
judge flood | tee /tmp/result-flood
ip netns exec "$SRC" shaper stats --iface s0 | head -40
shaper_stop
pair_down

# at_least FILE KEY BOUND: true when the RESULT line in FILE has KEY >= BOUND.
at_least() {
	awk -v key="$2" -v bound="$3" '{ for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } }
		END { exit !(v[key] >= bound) }' "$1"
}
at_least /tmp/result-fair jain_hosts 0.98 || fail "Jain over hosts below 0.98"
at_least /tmp/result-flood min_host_over_share 0.95 ||
	fail "under the flood a host got less than 95 % of its share"
echo "PASS"
