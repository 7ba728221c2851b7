#!/bin/sh
# Memory figures: what shaper's maps and process hold with N flows present, and CAKE's memory
# in the same boot under the same traffic (docs/notebook/reliability-memory.md).
#
# For each N, shaper runs at RATE with [state] max-flows N * 5/4 (the LRU map needs some room
# to keep N) and flow-quota 0 (no overflow buckets: every 5-tuple its own entry), and
# `lab-probe flood` sends 1-byte UDP datagrams over N distinct 5-tuples of one host (source
# ports, then destination ports), each at least once. Printed: flows and hosts in the maps,
# the computed and the kernel's (fdinfo memlock) bytes of each map, the process's total
# memlock and VmRSS. Then CAKE (triple-isolate, the same rate) gets the same flood:
# memory_used (the most its queued packets held) and what adding the qdisc took from MemFree
# (its flow tables, allocated at setup for CAKE_MAX_TINS tins of 1024 queues each).
#
# Usage: memory.sh [N...]   (default: 1000 100000 1000000)
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

COUNTS=${*:-1000 100000 1000000}
RATE=${MEMORY_RATE:-1gbit}

pair_up

# flood N: at least N packets over N distinct 5-tuples from src, however fast the VM sends.
flood() {
	run "$SRC" lab-probe flood --kind udp --size 1 --port 9 --from 10.9.0.1 --sources 1 \
		--tuples "$1" --duration $(($1 / 15000 + 3)) 10.9.0.2
}

mem_free_kib() {
	awk '/^MemFree:/ { print $2 }' /proc/meminfo
}

for n in $COUNTS; do
	max=$((n * 5 / 4)); [ "$max" -ge 1024 ] || max=1024
	printf '[state]\nmax-flows = %s\nflow-quota = 0\n' "$max" >/tmp/memory.toml
	shaper_start --iface s0 --rate "$RATE" --config /tmp/memory.toml
	rss_idle=$(rss_kib "$SHAPER_PID")
	flood "$n"
	# One walk of the maps (seconds for a million flows in the emulated VM).
	json=$(run "$SRC" shaper stats --iface s0 --maps --json)
	echo "$json" | tr -d ' \n'; echo
	flows=$(echo "$json" | map_entries SHAPER_FLOWS)
	rss=$(rss_kib "$SHAPER_PID")
	lock=$(memlock_kib "$SHAPER_PID")
	tick=$(run "$SRC" shaper stats --iface s0 --json | json_num max_tick_us)
	shaper_stop
	log "shaper, $n flows sent: $flows in the map (max-flows $max); process memlock $lock KiB, VmRSS $rss KiB ($rss_idle before the flows); longest tick $tick us"
	echo "RESULT kernel=$(uname -r) shaper flows_sent=$n flows_in_map=$flows max_flows=$max memlock_kib=$lock rss_kib=$rss rss_idle_kib=$rss_idle max_tick_us=$tick"

	free0=$(mem_free_kib)
	run "$SRC" tc qdisc replace dev s0 root cake bandwidth "$RATE" besteffort raw
	free1=$(mem_free_kib)
	flood "$n" >/dev/null
	used=$(run "$SRC" tc -s qdisc show dev s0 | sed -n 's/.*memory used: \([0-9]*\)b.*/\1/p' | head -1)
	run "$SRC" tc qdisc del dev s0 root
	log "CAKE, $n flows sent: memory_used $used B; adding it took $((free0 - free1)) KiB of MemFree"
	echo "RESULT kernel=$(uname -r) cake flows_sent=$n memory_used_bytes=$used setup_kib=$((free0 - free1))"
done
pair_down
echo "memory: done"
