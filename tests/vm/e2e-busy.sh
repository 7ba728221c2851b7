#!/bin/sh
# End to end: the rate holds on a busy host. While the CPU is contended, CAKE, then shaper, shape
# the same traffic in the same boot: one TCP flow, and three hosts with eight flows each; on the
# interface's egress, and on its ingress (CAKE on an IFB as sqm-scripts sets it up, shaper with
# --ingress-rate). shaper's goodput must be within TOLERANCE % of CAKE's under the same load (or
# above it, where CAKE falls short of the ceiling and shaper does not), never above the TCP
# ceiling at the rate, and within TOLERANCE % of that ceiling wherever CAKE reaches it (where
# CAKE does not, the busy machine cannot drive the rate and only the comparison with CAKE says
# anything about the shaper).
#
# The contention (CONTENTION, any of):
#   hogs     a busy loop at normal priority on every CPU
#   softirq  an unshaped flood between two other namespaces, whose packets the same CPUs
#            process in softirq
#   stop     shaper's control loop stopped (SIGSTOP) for 2 s in the middle of each run
#
# Usage: [CONTENTION="hogs softirq stop"] [DIRECTIONS="egress ingress"] e2e-busy.sh [RATE_MBIT...]
#        (defaults: hogs; egress and ingress; rates 7 73 220)
# Prints one "RESULT ..." line per rate, direction and load for the record.
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

RATES=${*:-7 73 220}
SECONDS_PER_RUN=${E2E_SECONDS:-8}
TOLERANCE=3
# The device's counters read a few milliseconds apart from the clock: 1 % over the rate is
# their timing, not the shaper's.
OVER=1
HOSTS="10.9.0.2 10.9.0.3 10.9.0.4"
CONTENTION=${CONTENTION:-hogs}
DIRECTIONS=${DIRECTIONS:-egress ingress}

pair_up
for a in 10.9.0.3 10.9.0.4; do ip -n "$DST" addr add "$a/24" dev d0; done
for a in $HOSTS; do ip netns exec "$DST" iperf3 -s -D -B "$a" -p 5301 >/dev/null; done
sleep 0.3

# softirq_start: an unshaped flood, as fast as the machine goes, between two namespaces of its
# own (another interface's receive and transmit work in softirq on the same CPUs).
softirq_start() {
	ip netns add flood-a
	ip netns add flood-b
	ip link add f0 netns flood-a type veth peer name f1 netns flood-b
	ip -n flood-a addr add 10.77.0.1/24 dev f0
	ip -n flood-b addr add 10.77.0.2/24 dev f1
	ip -n flood-a link set f0 up
	ip -n flood-b link set f1 up
	ip netns exec flood-b iperf3 -s -D >/dev/null
	sleep 0.3
	ip netns exec flood-a iperf3 -c 10.77.0.2 -t 100000 -P 4 >/dev/null 2>&1 &
	HOG_PIDS="$HOG_PIDS $!"
}
hogs_stop() {
	[ -n "$HOG_PIDS" ] && kill $HOG_PIDS 2>/dev/null
	wait $HOG_PIDS 2>/dev/null
	HOG_PIDS=
	for ns in flood-a flood-b; do
		pids=$(ip netns pids "$ns" 2>/dev/null) && [ -n "$pids" ] && kill $pids 2>/dev/null
		ip netns del "$ns" 2>/dev/null
	done
	true
}
trap hogs_stop EXIT

# load_mbit DIRECTION LOAD: goodput of LOAD ("1x1": one flow; "3x8": three hosts of eight
# flows) sent out of s0 (egress) or into it (ingress).
load_mbit() {
	reverse=
	[ "$1" = ingress ] && reverse=-R
	case $2 in
	1x1) goodput_mbit "$SECONDS_PER_RUN" 1 $reverse ;;
	3x8)
		for a in $HOSTS; do
			ip netns exec "$SRC" iperf3 -c "$a" -p 5301 -t "$SECONDS_PER_RUN" -O 1 -P 8 $reverse --format m >"/tmp/busy-$a.out" 2>&1 &
		done
		wait
		for a in $HOSTS; do receiver_mbit <"/tmp/busy-$a.out"; done | awk '{ s += $1 } END { printf "%.2f\n", s }'
		;;
	esac
}

# cake_on DIRECTION RATE / cake_off DIRECTION: CAKE where shaper would shape.
cake_on() {
	if [ "$1" = egress ]; then
		ip netns exec "$SRC" tc qdisc replace dev s0 root cake bandwidth "${2}mbit" besteffort raw
	else
		ip -n "$SRC" link add ifb0 type ifb
		ip -n "$SRC" link set ifb0 up
		ip netns exec "$SRC" tc qdisc add dev s0 handle ffff: ingress
		ip netns exec "$SRC" tc filter add dev s0 parent ffff: matchall action mirred egress redirect dev ifb0
		ip netns exec "$SRC" tc qdisc add dev ifb0 root cake bandwidth "${2}mbit" besteffort raw
	fi
}
cake_off() {
	if [ "$1" = egress ]; then
		ip netns exec "$SRC" tc qdisc del dev s0 root
	else
		ip netns exec "$SRC" tc qdisc del dev s0 ingress
		ip -n "$SRC" link del ifb0
	fi
}

# shaper_on DIRECTION RATE: shaper where CAKE was (the other direction left at line rate).
shaper_on() {
	if [ "$1" = egress ]; then
		shaper_start --iface s0 --rate "${2}mbit"
	else
		shaper_start --iface s0 --rate 10gbit --ingress-rate "${2}mbit"
	fi
}

# stopped_control: with "stop" contention, shaper's control loop stops for 2 s mid-run.
stopped_control() {
	case " $CONTENTION " in *" stop "*) ;; *) return ;; esac
	sleep $((SECONDS_PER_RUN / 2))
	kill -STOP "$SHAPER_PID"
	sleep 2
	kill -CONT "$SHAPER_PID"
}

# wire_mbit DEV: the rate DEV (in src) sends at over the run's middle, from its own counters: from
# 2 s in to 1 s before the end. A goodput above the ceiling can be queued data arriving after the
# sender stopped (iperf3 counts it in its window); the device's bytes are the rate itself.
wire_mbit() {
	sleep 2
	b0=$(tx_bytes "$SRC" "$1")
	t0=$(now_ms)
	sleep $((SECONDS_PER_RUN - 3))
	b1=$(tx_bytes "$SRC" "$1")
	t1=$(now_ms)
	awk -v b="$((b1 - b0))" -v t="$((t1 - t0))" 'BEGIN { printf "%.2f\n", b * 8 / t / 1000 }'
}

# above CEILING VALUE: VALUE exceeds CEILING by more than OVER %.
above() {
	awk -v c="$1" -v v="$2" -v o="$OVER" 'BEGIN { exit !(v > c * (1 + o / 100)) }'
}

# measure_pair DIRECTION RATE LOAD: CAKE, then shaper, under the same contention; sets $cake,
# $shaped and prints their RESULT line.
measure_pair() {
	cake_on "$1" "$2"
	cake_dev=s0
	[ "$1" = ingress ] && cake_dev=ifb0
	wire_mbit "$cake_dev" >/tmp/busy-wire &
	sampler=$!
	cake=$(load_mbit "$1" "$3")
	wait "$sampler"
	cake_wire=$(cat /tmp/busy-wire)
	cake_off "$1"
	shaper_on "$1" "$2"
	shaped_dev=s0
	[ "$1" = ingress ] && shaped_dev=ifb4s0
	counted=$(byte_counters "$SRC" "$shaped_dev")
	stopped_control &
	stopper=$!
	wire_mbit "$shaped_dev" >/tmp/busy-wire &
	sampler=$!
	shaped=$(load_mbit "$1" "$3")
	wait "$stopper" "$sampler"
	shaped_wire=$(cat /tmp/busy-wire)
	check_accounting "$SRC" "$shaped_dev" "$counted" "$1 ${2}mbit $3"
	stats_iface=
	[ "$1" = ingress ] && stats_iface=--ingress
	json=$(ip netns exec "$SRC" shaper stats --iface s0 $stats_iface --json | tr -d ' \n')
	late=$(echo "$json" | sed -n 's/.*"overrun_packets":\([0-9]*\).*/\1/p')
	late_ms=$(echo "$json" | sed -n 's/.*"overrun_ns":\([0-9]*\).*/\1/p' | awk '{ printf "%.1f", $1 / 1e6 }')
	shaper_stop
	log "$1 ${2}mbit $3: shaper $shaped, cake $cake, ceiling $ceiling Mbit/s (overrun: $late packets, $late_ms ms of wire time charged)"
	echo "RESULT kernel=$(uname -r) contention=$(echo $CONTENTION | tr ' ' +) direction=$1 rate_mbit=$2 load=$3 shaper_mbit=$shaped cake_mbit=$cake ceiling_mbit=$ceiling shaper_wire_mbit=$shaped_wire cake_wire_mbit=$cake_wire overrun_ms=$late_ms shaper_vs_ceiling=$(ratio "$shaped" "$ceiling") shaper_vs_cake=$(ratio "$shaped" "$cake")"
}

# judge WHAT CEILING RATE: "; what is wrong" with $shaped, $shaped_wire against $cake, the
# goodput CEILING and the RATE (nothing when all holds): `shortfall`, and its device may never
# send faster than the rate (OVER % for the counters' timing).
judge() {
	shortfall "$1" "$shaped" "$cake" "$2"
	above "$3" "$shaped_wire" && printf '; %s: the device sent at %s Mbit/s, above the rate %s' "$1" "$shaped_wire" "$3"
	true
}

case " $CONTENTION " in *" hogs "*) hogs_start ;; esac
case " $CONTENTION " in *" softirq "*) softirq_start ;; esac
log "contention: $CONTENTION ($(nproc) CPUs); directions: $DIRECTIONS"
failed=
for direction in $DIRECTIONS; do
	for rate in $RATES; do
		ceiling=$(tcp_ceiling_mbit "$rate")
		for load in 1x1 3x8; do
			what="$direction ${rate}mbit $load"
			# An emulated machine shares its host: a pair of runs can be starved by something
			# else on it. A pair that fails is measured again, up to three pairs, and the last
			# judged.
			for attempt in 1 2 3; do
				measure_pair "$direction" "$rate" "$load"
				wrong=$(judge "$what" "$ceiling" "$rate")
				[ -z "$wrong" ] && break
				log "$what, attempt $attempt:$wrong"
			done
			failed="$failed$wrong"
		done
	done
done
hogs_stop
pair_down
[ -z "$failed" ] || fail "${failed#; }"
echo "e2e-busy: ok"
