#!/bin/sh
# End to end: floods on the shaped egress. Three established hosts (destinations 10.9.0.2-4,
# two iperf3 TCP flows each from src) share RATE while `lab-probe flood` sends, from inside
# src through the same egress, to a victim 10.9.0.5:
#   syn:   TCP SYNs, each from a random spoofed source (10.128.0.0/9) and source port: nearly
#          every packet a host and a flow the shaper has not seen;
#   hosts: UDP from 4 x MAX_HOSTS spoofed sources in turn, one flow each: more hosts than the
#          shaper keeps, each coming back before long;
#   udp:   1-byte UDP datagrams of one flow, as fast as the VM sends them.
# shaper runs in its default mode, triple-isolate, with [state] max-hosts MAX_HOSTS and
# max-flows MAX_FLOWS. The flooder runs at nice 19: on a shaping router the flood costs
# softirq time, not a process competing with the control loop.
#
# Fair shares (max-min, D: what the flooder offered, frames as shaper counts them). With four
# destinations triple-isolate is fair between destinations (docs/design.md, "Isolation modes"),
# and every flood counts as one host: the udp flood is one host pair, and the spoofed floods go
# to one victim, one destination, as CAKE's triple-isolate counts them (each spoofed source is a
# host shaper has never seen: a SYN's source is never seen again, and 4 x MAX_HOSTS sources in
# turn are evicted before they come back). So L = RATE/4 when D >= RATE/4, else (RATE - D)/3;
# without a flood L = RATE/3. As TCP goodput:
# L * 1448/1514, times what the three hosts together reached of that ceiling without a flood
# (phase "none", first, in the same boot).
#
# Promises checked for each flood, each a failure with its figures:
#   - every established host receives at least SHARE % of its fair share;
#   - every packet the device sent was stamped by shaper or passed unshaped (lib.sh's
#     accounting_fault);
#   - the device never sends faster than the rate: its bytes over the phase's middle (from 2 s
#     after the hosts start to 1 s before they stop, flood running throughout) over that time
#     stay within WIRE_OVER % of RATE (the two counters are read a process start apart);
#   - the control loop's longest tick (`shaper stats`: max_tick_us) stays under its 100 ms
#     interval, and none of its ticks fails (shaper logs each failure);
#   - memory stays bounded: what the kernel charges the shaper process for its maps and
#     programs (fdinfo memlock) does not change (the maps are preallocated), and its resident
#     memory grows by less than RSS_GROWTH_KIB over all floods (the control loop's per-host
#     state follows the hosts map, which the flood churns).
# Prints one "RESULT ..." line per phase.
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

RATE=${FLOODS_RATE_MBIT:-12}
SECS=${E2E_SECONDS:-8}
MAX_HOSTS=${FLOODS_MAX_HOSTS:-512}
MAX_FLOWS=${FLOODS_MAX_FLOWS:-4096}
SHARE=95
WIRE_OVER=2
TICK_LIMIT_US=100000
RSS_GROWTH_KIB=16384
HOSTS="10.9.0.2 10.9.0.3 10.9.0.4"
VICTIM=10.9.0.5
# "none" first: its goodput is the baseline of the fair shares after it.
PHASES=${*:-none syn hosts udp}

pair_up
for a in 10.9.0.3 10.9.0.4 $VICTIM; do ip -n "$DST" addr add "$a/24" dev d0; done
for a in $HOSTS; do run "$DST" iperf3 -s -D -B "$a" -p 5301 >/dev/null; done
sleep 0.3

cat >/tmp/floods.toml <<EOT
[state]
max-hosts = $MAX_HOSTS
max-flows = $MAX_FLOWS
EOT
shaper_start --iface s0 --rate "${RATE}mbit" --config /tmp/floods.toml
# A few seconds of traffic first, so the baseline memory holds a running control loop's.
goodput_mbit 2 1 >/dev/null
rss0=$(rss_kib "$SHAPER_PID")
lock0=$(memlock_kib "$SHAPER_PID")
log "shaper at ${RATE}mbit, max-hosts $MAX_HOSTS, max-flows $MAX_FLOWS: RSS $rss0 KiB, memlock $lock0 KiB"

# flood_args PHASE: lab-probe flood's arguments for PHASE.
flood_args() {
	case $1 in
	syn) echo "--kind syn --port 80" ;;
	hosts) echo "--kind udp --size 18 --port 9 --sources $((MAX_HOSTS * 4)) --tuples $((MAX_HOSTS * 4))" ;;
	udp) echo "--kind udp --size 1 --port 9 --from 10.9.0.1 --sources 1 --tuples 1" ;;
	esac
}

# wire_mbit: the rate s0 (in src) sends at over the phase's middle, from its own counters: from
# 2 s in to 1 s before the hosts' end. Goodput hides an overrun the flood takes; the device's
# bytes are the aggregate itself.
wire_mbit() {
	sleep 2
	b0=$(tx_bytes "$SRC" s0)
	t0=$(now_ms)
	sleep $((SECS - 3))
	b1=$(tx_bytes "$SRC" s0)
	t1=$(now_ms)
	awk -v b="$((b1 - b0))" -v t="$((t1 - t0))" 'BEGIN { printf "%.2f\n", b * 8 / t / 1000 }'
}

# fair_share: the goodput share of an established host in this $phase, the flood one host.
fair_share() {
	awk -v r="$RATE" -v d="$flood_mbit" -v p="$phase" -v e="$efficiency" 'BEGIN {
		l = (p == "none") ? r / 3 : (d >= r / 4 ? r / 4 : (r - d) / 3)
		if (l < 0) l = 0; printf "%.2f", l * 1448 / 1514 * e }'
}
# kept SHARE: each host's goodput in $got over SHARE.
kept() {
	echo "$got" | awk -v s="$1" '{ for (i = 1; i <= NF; i++) printf "%s%.3f", (i > 1 ? "," : ""), $i / s }'
}

failed=
efficiency=1
for phase in $PHASES; do
	flood_mbit=0
	# Read while nothing is sent: the counters are read one after the other.
	counted=$(byte_counters "$SRC" s0)
	if [ "$phase" != none ]; then
		# shellcheck disable=SC2046
		run "$SRC" lab-probe flood $(flood_args "$phase") --duration $((SECS + 3)) "$VICTIM" >/tmp/flood.out 2>&1 &
		flood_pid=$!
		# At nice 19 (`ip netns exec` execs the flooder, so this is its pid; the VM has renice,
		# not nice).
		renice -n 19 -p "$flood_pid" >/dev/null
		sleep 1
	fi
	clients=
	for a in $HOSTS; do
		run "$SRC" iperf3 -c "$a" -p 5301 -t "$SECS" -O 1 -P 2 --format m >"/tmp/floods-$a.out" 2>&1 &
		clients="$clients $!"
	done
	wire_mbit >/tmp/floods-wire &
	sampler=$!
	wait $clients $sampler
	wire=$(cat /tmp/floods-wire)
	awk -v w="$wire" -v r="$RATE" -v o="$WIRE_OVER" 'BEGIN { exit !(w > r * (1 + o / 100)) }' &&
		failed="$failed; $phase: the device sent at $wire Mbit/s, above the rate $RATE"
	if [ "$phase" != none ]; then
		wait "$flood_pid"
		flood_pid=
		out=$(cat /tmp/flood.out)
		echo "$out"
		# Offered: what it sent and what the full queue refused, over its run.
		flood_mbit=$(echo "$out" | awk '/^flood: sent/ { sent = $3; refused = substr($5, 2)
			printf "%.2f", $12 * (sent + refused) / sent }')
		[ -n "$flood_mbit" ] || fail "$phase: no report from lab-probe flood: $out"
	fi
	# Every packet of the flood and of the hosts passed shaper.
	wrong=$(accounting_fault s0 "$counted" "$(byte_counters "$SRC" s0)" 1)
	[ -z "$wrong" ] || failed="$failed; $phase: accounting$wrong"
	# The maps as the flood left them (a walk over a map being churned counts some keys twice).
	maps=$(run "$SRC" shaper stats --iface s0 --maps --json)
	stats=$(run "$SRC" shaper stats --iface s0 --json)
	tick=$(echo "$stats" | json_num tick_us)
	max_tick=$(echo "$stats" | json_num max_tick_us)
	# The data path's cumulative counters (passes without state, the calendar's debts), for
	# what an overrun or a short share came from.
	echo "$phase: stats $(echo "$stats" | tr -d ' \n')"
	hosts_n=$(echo "$maps" | map_entries SHAPER_HOSTS)
	flows_n=$(echo "$maps" | map_entries SHAPER_FLOWS)
	rates_n=$(echo "$maps" | map_entries SHAPER_HOST_RATES)
	rss=$(rss_kib "$SHAPER_PID")
	lock=$(memlock_kib "$SHAPER_PID")
	got=
	for a in $HOSTS; do
		v=$(receiver_mbit <"/tmp/floods-$a.out")
		[ -n "$v" ] || fail "$phase: iperf3 to $a: $(cat "/tmp/floods-$a.out")"
		got="$got $v"
	done
	[ "$phase" = none ] && efficiency=$(echo "$got" | awk -v c="$(tcp_ceiling_mbit "$RATE")" '{ printf "%.3f", ($1 + $2 + $3) / c }')
	share=$(fair_share)
	for v in $got; do
		awk -v v="$v" -v s="$share" -v p="$SHARE" 'BEGIN { exit !(v >= s * p / 100) }' ||
			failed="$failed; $phase: a host received $v Mbit/s, below $SHARE % of its fair share $share"
	done
	kept=$(kept "$share")
	log "$phase: flood offered $flood_mbit Mbit/s; device sent $wire Mbit/s; hosts received$got Mbit/s (fair share $share: kept $kept); maps: $hosts_n/$MAX_HOSTS hosts, $rates_n host rates, $flows_n/$MAX_FLOWS flows; tick $tick us, longest $max_tick us; RSS $rss KiB, memlock $lock KiB"
	echo "RESULT kernel=$(uname -r) phase=$phase rate_mbit=$RATE flood_offered_mbit=$flood_mbit wire_mbit=$wire efficiency=$efficiency fair_share_mbit=$share hosts_mbit=$(echo $got | tr ' ' ,) kept=$kept hosts_in_map=$hosts_n max_hosts=$MAX_HOSTS flows_in_map=$flows_n max_flows=$MAX_FLOWS max_tick_us=$max_tick rss_kib=$rss memlock_kib=$lock"
	case $failed in *"$phase: a host"*)
		echo "$phase: the busiest hosts after the flood:"
		run "$SRC" shaper stats --iface s0 --hosts --top 6 ;;
	esac
	[ "$max_tick" -lt "$TICK_LIMIT_US" ] ||
		failed="$failed; $phase: the control loop's longest tick took $max_tick us, beyond its 100 ms interval"
	[ "$lock" -eq "$lock0" ] ||
		failed="$failed; $phase: the kernel charges $lock KiB for shaper's maps and programs, $lock0 KiB before the floods"
	[ $((rss - rss0)) -lt "$RSS_GROWTH_KIB" ] ||
		failed="$failed; $phase: shaper's resident memory grew from $rss0 to $rss KiB"
done

# A failed tick keeps the previous levels in force, and shaper logs it.
errors=$(grep 'control loop on' /tmp/shaper.log | sed 's/^[^ ]* *//' | sort | uniq -c | sort -rn | head -3)
[ -z "$errors" ] || failed="$failed; control loop ticks failed: $errors"
shaper_stop
pair_down
[ -z "$failed" ] || fail "${failed#; }"
echo "e2e-floods: ok"
