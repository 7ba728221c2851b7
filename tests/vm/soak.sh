#!/bin/sh
# Soak: full rate with host churn, for SECONDS (default 1800), and what shaper promises over it.
#
# Usage: soak.sh [SECONDS]
#
# s0 is shaped at RATE_MBIT (triple-isolate, the default: hosts are source/destination address
# pairs on egress). Two bulk TCP flows from two fixed source addresses on s0 (iperf3 -B, each to
# its own iperf3 server) run for the whole duration. Meanwhile a new host comes every second:
# a fresh source address from a pool of 64,000 is added to s0, pings dst with 500-byte
# packets every 20 ms for HOST_SECONDS (0.2 Mbit/s), and is removed; so the hosts map sees one
# more distinct host every second.
#
# Every SAMPLE_S seconds it samples the wire rate of s0 (tx_bytes), shaper's VmRSS, and the
# hosts and flows in the data path's maps, counted as `shaper stats --hosts/--flows --json`
# lists them (each a full walk of the map by its id from the state file, the same walk bpftool
# map dump does). Promises, after WARMUP_S:
#   - resident memory steady: the end sample within RSS_GROWTH_KB of the first after warm-up;
#   - hosts in the map bounded by the churn, not by the hosts seen: a host's entry goes once it
#     has been silent for HOST_FORGET_S (shaper/src/control.rs, REMOVE_AFTER_SILENT_TICKS), so
#     with one host a second the map holds about as many as a host's seconds there (host_bound);
#   - the rate error of the last samples equal to that of the first within 1 point (a machine
#     so loaded that the VM cannot offer the rate fails it: the samples then follow the load);
#     a run too short for FEW samples at each end (the suite's minute) is judged on its mean
#     rate after warm-up instead: within 3 % under and 1 % over the rate;
#   - no sample above the rate by more than 1 %;
#   - every byte accounted (tx = stamped + unshaped, lib.sh's accounting_fault, whole run);
#   - both bulk flows lived through the run, and (nearly) every churn host got replies.
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

DURATION=${1:-1800}
# The rate must be one the emulated VM carries with room to spare, beside the churn and on a
# shared machine, or the samples measure the emulator: at 50 Mbit/s the VM's CPUs were 97-99 %
# busy and its 10-s samples carried 6.6-27 Mbit/s.
RATE_MBIT=${SOAK_RATE_MBIT:-10}
SAMPLE_S=10
# Warm-up: TCP's slow start, the first hosts' entries, the allocator's first growth.
WARMUP_S=$((DURATION / 3 < 60 ? DURATION / 3 : 60))
# Samples averaged at the start and at the end (after warm-up).
FEW=3
HOST_SECONDS=3
# What shaper keeps a silent host's entry for (control.rs: REMOVE_AFTER_SILENT_TICKS, 100 ms
# ticks).
HOST_FORGET_S=10
TOLERANCE=1
# Resident memory may grow by this much over the run. Without forgetting, each host seen
# costs the control loop a map entry and a window of ticks (~0.5 KiB): 1,800 hosts in a
# 30-minute run would be ~900 KiB. What stays is the allocator's own slack.
RSS_GROWTH_KB=256
BULK_ADDRS="10.9.0.11 10.9.0.12"
BULK_PORTS="5202 5203"
[ "$DURATION" -ge 40 ] || fail "soak.sh: at least 40 seconds"

# host_bound LIFE_S: hosts in the map at any time, when churn hosts send for up to LIFE_S
# seconds (HOST_SECONDS, longer when the emulator is slow): the two bulk senders, a few of s0's
# own (IPv6 link-local reports, one key for what is not IP), and one churn host a second for
# as long as it sends, leaves the control loop's plan (1 s at most), is kept silent and goes
# (one tick), one more for the second that is under way; that last part twice over, since a
# starved VM runs its control ticks late (the silence is counted in ticks; 16-24 hosts were
# measured on 6.12 with the host machine fully loaded). Still well below the hosts seen: 62 in
# the short run.
host_bound() {
	echo $((2 + 4 + 2 * ($1 + 1 + HOST_FORGET_S + 1 + 1)))
}

# pool_addr I: the I-th address of the churn pool (10.10.0.1 ... 10.10.255.250).
pool_addr() {
	echo "10.10.$(($1 / 250 % 256)).$(($1 % 250 + 1))"
}

# churn_host I: host I comes, pings for HOST_SECONDS, goes; notes in /tmp/soak.silent when
# none of its pings were answered.
churn_host() {
	addr=$(pool_addr "$1")
	ip -n "$SRC" addr add "$addr/32" dev s0 || { echo "$addr: not added" >>/tmp/soak.silent; return; }
	came=$(now_ms)
	run "$SRC" ping -q -n -I "$addr" -s 500 -i 0.02 -c $((HOST_SECONDS * 50)) -W 1 10.9.0.2 >/dev/null 2>&1 ||
		echo "$addr" >>/tmp/soak.silent
	echo $(($(now_ms) - came)) >>/tmp/soak.lifetimes
	ip -n "$SRC" addr del "$addr/32" dev s0
}

# map_entries KIND: entries in shaper's hosts or flows map (KIND: host or flow).
map_entries() {
	run "$SRC" shaper stats --iface s0 "--${1}s" --json --top 100000000 | grep -c "\"$1\":"
}

# cpu_times: the VM's "BUSY IDLE" CPU time so far; busy_pct BEFORE AFTER: the share busy between.
cpu_times() {
	awk '/^cpu / { print $2 + $3 + $4 + $6 + $7 + $8, $5 }' /proc/stat
}
busy_pct() {
	echo "$1 $2" | awk '{ b = $3 - $1; i = $4 - $2; printf "%.0f", b * 100 / (b + i) }'
}

# rss_kb: shaper's resident memory.
rss_kb() {
	awk '/^VmRSS:/ { print $2 }' "/proc/$SHAPER_PID/status"
}

pair_up
for a in $BULK_ADDRS; do ip -n "$SRC" addr add "$a/24" dev s0; done
ip -n "$DST" route add 10.10.0.0/16 dev d0
for p in $BULK_PORTS; do run "$DST" iperf3 -s -D -p "$p" >/dev/null; done
sleep 0.3
shaper_start --iface s0 --rate "${RATE_MBIT}mbit"
[ "$(cat "/proc/$SHAPER_PID/comm")" = shaper ] || fail "pid $SHAPER_PID is not shaper"
log "soak: ${DURATION} s at ${RATE_MBIT} Mbit/s, a new host every second, samples every ${SAMPLE_S} s"

rm -f /tmp/soak.silent /tmp/soak.samples /tmp/soak.lifetimes
before=$(byte_counters "$SRC" s0)
bulk_pids=
set -- $BULK_PORTS
for a in $BULK_ADDRS; do
	run "$SRC" iperf3 -c 10.9.0.2 -p "$1" -B "$a" -t $((DURATION + 2)) --format m >"/tmp/soak.bulk.$1" 2>&1 &
	bulk_pids="$bulk_pids $!"
	shift
done

last_cpu=$(cpu_times)
t0=$(now_ms)
last_ms=$t0
last_tx=$(tx_bytes "$SRC" s0)
churn_pids=
i=0
while [ $i -lt "$DURATION" ]; do
	i=$((i + 1))
	churn_host "$i" &
	churn_pids="$churn_pids $!"
	if [ $((i % SAMPLE_S)) -eq 0 ]; then
		tx=$(tx_bytes "$SRC" s0)
		ms=$(now_ms)
		kill -0 "$SHAPER_PID" 2>/dev/null || fail "shaper exited after $i s"
		mbit=$(awk -v b=$((tx - last_tx)) -v ms=$((ms - last_ms)) 'BEGIN { printf "%.2f", b * 8 / ms / 1000 }')
		sample="$i $mbit $(rss_kb) $(map_entries host) $(map_entries flow) $((i + 2))"
		echo "$sample" >>/tmp/soak.samples
		cpu=$(cpu_times)
		echo "sample t=${i}s wire_mbit=$mbit rss_kb=$(echo "$sample" | cut -d' ' -f3) hosts=$(echo "$sample" | cut -d' ' -f4) flows=$(echo "$sample" | cut -d' ' -f5) hosts_seen=$((i + 2)) cpu_busy_pct=$(busy_pct "$last_cpu" "$cpu")"
		last_tx=$tx last_ms=$ms last_cpu=$cpu
	fi
	delay=$((t0 + i * 1000 - $(now_ms)))
	[ $delay -gt 0 ] && sleep "$(awk -v d=$delay 'BEGIN { printf "%.2f", d / 1000 }')"
done

failed=
for pid in $bulk_pids; do
	wait "$pid" || failed="$failed; a bulk flow failed: $(cat /tmp/soak.bulk.*)"
done
for pid in $churn_pids; do wait "$pid"; done
# What fq still holds leaves within the horizon; the counters are read after it has.
sleep 1
after=$(byte_counters "$SRC" s0)
failed="$failed$(accounting_fault s0 "$before" "$after" "$TOLERANCE")"
silent=$(cat /tmp/soak.silent 2>/dev/null | wc -l)
[ $((silent * 100)) -le "$DURATION" ] ||
	failed="$failed; $silent of $DURATION churn hosts got no reply: $(head -5 /tmp/soak.silent | tr '\n' ' ')"
for f in /tmp/soak.bulk.*; do log "bulk flow ${f##*.}: $(receiver_mbit <"$f") Mbit/s"; done

# The figures, from the samples after warm-up: start = the first FEW, end = the last FEW.
figures=$(awk -v w="$WARMUP_S" -v few="$FEW" -v rate="$RATE_MBIT" '
	{ all_max = ($2 > all_max) ? $2 : all_max }
	$1 > w { n++; t[n] = $1; mbit[n] = $2; rss[n] = $3; hosts[n] = $4; flows[n] = $5
		if ($4 > hosts_max) hosts_max = $4; if ($3 > rss_max) rss_max = $3 }
	END {
		if (n < 2) { print "too-few-samples"; exit }
		k = (n >= 2 * few) ? few : int(n / 2)
		for (j = 1; j <= k; j++) { s += mbit[j]; e += mbit[n - k + j] }
		s /= k; e /= k
		for (j = 1; j <= n; j++) mean += mbit[j] / n
		printf "start_mbit=%.2f end_mbit=%.2f start_err_pct=%.2f end_err_pct=%.2f max_mbit=%.2f",
			s, e, (s - rate) * 100 / rate, (e - rate) * 100 / rate, all_max
		printf " mean_err_pct=%.2f drift_judged=%d", (mean - rate) * 100 / rate, (n >= 2 * few)
		printf " rss_start_kb=%d rss_end_kb=%d rss_max_kb=%d", rss[1], rss[n], rss_max
		printf " hosts_start=%d hosts_end=%d hosts_max=%d flows_start=%d flows_end=%d samples=%d averaged=%d\n",
			hosts[1], hosts[n], hosts_max, flows[1], flows[n], n, k
	}' /tmp/soak.samples)
[ "$figures" = too-few-samples ] && fail "too few samples after a warm-up of $WARMUP_S s"
life_max_s=$(sort -n /tmp/soak.lifetimes | awk 'END { printf "%d", ($1 + 999) / 1000 }')
HOST_BOUND=$(host_bound "$life_max_s")
echo "RESULT kernel=$(uname -r) seconds=$DURATION rate_mbit=$RATE_MBIT $figures hosts_seen=$((DURATION + 2)) host_life_max_s=$life_max_s host_bound=$HOST_BOUND silent_hosts=$silent"
val() { echo "$figures" | tr ' ' '\n' | sed -n "s/^$1=//p"; }

# A drift is judged between averages of FEW samples each: fewer (the suite's one-minute run)
# follow the emulated machine's own load from one 10-s sample to the next, and the run is
# judged on its mean rate after warm-up instead.
if [ "$(val drift_judged)" = 1 ]; then
	awk -v s="$(val start_err_pct)" -v e="$(val end_err_pct)" 'BEGIN { d = e - s; exit !(d <= 1 && d >= -1) }' ||
		failed="$failed; the rate error moved from $(val start_err_pct) % at the start to $(val end_err_pct) % at the end (more than 1 point)"
else
	awk -v m="$(val mean_err_pct)" 'BEGIN { exit !(m >= -3 && m <= 1) }' ||
		failed="$failed; the mean rate after warm-up was $(val mean_err_pct) % off the rate (allowed: 3 % under, 1 % over)"
fi
awk -v m="$(val max_mbit)" -v r="$RATE_MBIT" 'BEGIN { exit !(m <= r * 1.01) }' ||
	failed="$failed; a ${SAMPLE_S}-s sample ran at $(val max_mbit) Mbit/s, more than 1 % over $RATE_MBIT"
[ $(($(val rss_end_kb) - $(val rss_start_kb))) -le "$RSS_GROWTH_KB" ] ||
	failed="$failed; shaper's resident memory grew from $(val rss_start_kb) to $(val rss_end_kb) KiB after warm-up (bound $RSS_GROWTH_KB KiB)"
[ "$(val hosts_max)" -le "$HOST_BOUND" ] ||
	failed="$failed; up to $(val hosts_max) hosts in the map after warm-up (end $(val hosts_end)), more than the $HOST_BOUND the churn keeps: hosts that left are not forgotten"

run "$SRC" shaper stats --iface s0
ticks_failed=$(grep -c "control loop on s0" /tmp/shaper.log)
log "control ticks failed: $ticks_failed"
[ "$ticks_failed" -eq 0 ] ||
	failed="$failed; $ticks_failed control ticks failed, the first: $(grep -m1 "control loop on s0" /tmp/shaper.log)"
kill -0 "$SHAPER_PID" 2>/dev/null || failed="$failed; shaper exited during the run"
shaper_stop
pair_down
[ -z "$failed" ] || fail "${failed#; }"
echo "soak: ok"
