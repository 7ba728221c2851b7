#!/bin/sh
# What shaping costs the machine: bulk TCP through the veth with no shaping, CAKE and shaper
# at the same rate, in one boot; for each the receiver's goodput and how busy the guest's CPUs
# were, and for shaper each program's runs and mean run time (kernel.bpf_stats_enabled).
#
# Usage: cargo xtask vm --kernel 6.12 -- tests/vm/cpu-cost.sh [RATE [FLOWS [SECONDS]]]
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

rate=${1:-100mbit} flows=${2:-16} seconds=${3:-10}

# cpu_ticks: busy and total jiffies of all CPUs so far.
cpu_ticks() {
	awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t }' /proc/stat
}

# measure NAME: goodput and CPU busy share of one iperf3 run.
measure() {
	set -- "$1" $(cpu_ticks)
	mbit=$(goodput_mbit "$seconds" "$flows")
	set -- "$1" "$2" "$3" $(cpu_ticks)
	busy=$(awk -v b0="$2" -v t0="$3" -v b1="$4" -v t1="$5" 'BEGIN { printf "%.0f", 100 * (b1 - b0) / (t1 - t0) }')
	log "$1: $mbit Mbit/s, CPUs $busy % busy"
}

pair_up
measure none

ip netns exec "$SRC" tc qdisc replace dev s0 root cake bandwidth "$rate" besteffort
measure cake
ip netns exec "$SRC" tc qdisc del dev s0 root

sysctl -qw kernel.bpf_stats_enabled=1
shaper_start --iface s0 --rate "$rate"
measure shaper
for fd in /proc/"$SHAPER_PID"/fdinfo/*; do
	awk '/^prog_tag/ { tag = $2 } /^run_time_ns/ { ns = $2 } /^run_cnt/ { n = $2 }
		END { if (n > 0) printf "== program %s: %d runs, %.0f ns each\n", tag, n, ns / n }' "$fd"
done
shaper_stop
sysctl -qw kernel.bpf_stats_enabled=0
pair_down
