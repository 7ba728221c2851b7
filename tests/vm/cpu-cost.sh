#!/bin/sh
# What shaping costs the machine: bulk TCP through the veth with no shaping, CAKE and shaper
# at the same rate, in one boot; for each the receiver's goodput and how busy the guest's CPUs
# were; for shaper also the data path's cost (`shaper stats --cost`, the kernel's BPF run-time
# statistics over the middle of the run) and the control plane's CPU time.
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

shaper_start --iface s0 --rate "$rate"
# The control plane's CPU time over the run: user + system ticks of its process (USER_HZ is
# 100 on x86).
control_ticks() { awk '{ print $14 + $15 }' /proc/"$SHAPER_PID"/stat; }
ticks0=$(control_ticks)
(sleep $((seconds / 3)) && ip netns exec "$SRC" shaper stats --iface s0 --cost "$((seconds / 3))s" >/tmp/cost.txt) &
cost_pid=$!
measure shaper
wait "$cost_pid"
ticks1=$(control_ticks)
sed 's/^/== /' /tmp/cost.txt
log "control plane: $(awk -v t="$((ticks1 - ticks0))" -v hz=100 -v s="$seconds" \
	'BEGIN { printf "%.2f", 100 * t / hz / s }') % of a CPU"
shaper_stop
pair_down
