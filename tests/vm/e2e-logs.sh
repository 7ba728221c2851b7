#!/bin/sh
# End to end: the data path's debug events (`shaper run --log-datapath`) on the booted kernel.
# With the option, a loaded link logs classifications, AQM verdicts and ACK-filter decisions,
# at most EVENTS a second of each kind per CPU after a BURST, saying how many were not logged;
# the rate holds as without it (one flow's goodput, after the load). Without it, there is no
# such line.
#
# Usage: e2e-logs.sh [RATE_MBIT]   (default: 20)
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

RATE=${1:-20}mbit
SECONDS_PER_RUN=${E2E_SECONDS:-8}
# shaper_common::logs::{EVENTS_PER_SECOND, BURST_EVENTS}.
EVENTS=10
BURST=10
# The rate with events on beside the rate without, in the same boot.
TOLERANCE=3
CPUS=$(nproc)

# load: an upload of 4 flows (the AQM's verdicts; a LAN's RTT makes it signal often) and, at
# the same time, a download whose pure ACKs leave through s0 (the ACK filter's decisions).
load() {
	ip netns exec "$SRC" iperf3 -c 10.9.0.2 -p 5202 -R -t "$SECONDS_PER_RUN" >/dev/null 2>&1 &
	download=$!
	goodput_mbit "$SECONDS_PER_RUN" 4 >/dev/null || exit 1
	wait "$download"
}

# measure ARGS...: shaper started with ARGS under the load, then one flow's goodput at the
# internet's RTT (where the AQM leaves TCP at the rate: the rate is compared there), printed;
# every byte s0 sent meanwhile was stamped or passed unshaped (lib.sh's accounting_fault).
measure() {
	shaper_start $start "$@"
	verifier_budget >&2
	counted=$(byte_counters "$SRC" s0)
	load
	run "$SRC" shaper set --iface s0 --rtt internet >/dev/null || fail "shaper set --rtt internet"
	goodput_mbit "$SECONDS_PER_RUN" 1 || exit 1
	check_accounting "$SRC" s0 "$counted" "shaper run $*"
	shaper_stop
}

# events KIND: the forwarded events of KIND (`classify`, `aqm`, `ack filter`) in shaper's log.
events() {
	grep "shaper::datapath: $1: " /tmp/shaper.log
}

# per_second_max: the most lines on stdin stamped within one second (tracing's timestamps).
per_second_max() {
	cut -c1-19 | sort | uniq -c | awk '$1 > m { m = $1 } END { print m + 0 }'
}

pair_up
ip netns exec "$DST" iperf3 -s -p 5202 -D >/dev/null
sleep 0.3
start="--iface s0 --rate $RATE --rtt lan --ack-filter conservative"

off=$(measure) || exit 1
log "without --log-datapath: $off Mbit/s"
if grep -q 'shaper::datapath' /tmp/shaper.log; then
	fail "events logged without --log-datapath: $(grep -m3 'shaper::datapath' /tmp/shaper.log)"
fi
on=$(measure --log-datapath) || exit 1
log "with --log-datapath: $on Mbit/s"
if ! within "$on" "$off" "$TOLERANCE"; then
	# An emulated machine shares its host: one pair of runs can be starved by something else
	# on it. Measure both again once, and judge the second pair.
	log "not within $TOLERANCE%, measuring again"
	off=$(measure) || exit 1
	cp /tmp/shaper.log /tmp/shaper-off.log
	on=$(measure --log-datapath) || exit 1
	log "again: without $off Mbit/s, with $on Mbit/s"
	grep -q 'shaper::datapath' /tmp/shaper-off.log && fail "events logged without --log-datapath"
fi
for kind in classify aqm "ack filter"; do
	count=$(events "$kind" | wc -l)
	[ "$count" -gt 0 ] || fail "no '$kind' event logged: $(tail -5 /tmp/shaper.log)"
	most=$(events "$kind" | per_second_max)
	# A CPU sends at most BURST + EVENTS in any second; the log's clock is the forwarding
	# thread's, up to 200 ms late, and can put a little more than a second's worth in one.
	limit=$((CPUS * (BURST + 2 * EVENTS)))
	log "'$kind': $count events, at most $most in a second (limit $limit on $CPUS CPUs); e.g. $(events "$kind" | tail -1 | sed 's/.*shaper::datapath: //')"
	[ "$most" -le "$limit" ] || fail "'$kind': $most events in one second, over $limit"
	seconds=$(events "$kind" | cut -c1-19 | sort -u | wc -l)
	[ "$count" -le $((CPUS * (BURST + EVENTS * seconds))) ] ||
		fail "'$kind': $count events over $seconds seconds"
done
# Classifications come with every packet, far beyond the limit: the events say how many were
# not logged.
events classify | grep -q '([1-9][0-9]* not logged)' || fail "no classify event counted the events not logged"
events classify | grep -q 'iface=s0' || fail "events do not name the interface: $(events classify | tail -1)"
events aqm | grep -Eq ': (mark|drop codel|drop blue|drop overlimit)' || fail "aqm events without a verdict: $(events aqm | tail -1)"
events "ack filter" | grep -Eq ': (drop|keep [a-z_]+)' || fail "ack filter events without a decision: $(events "ack filter" | tail -1)"
within "$on" "$off" "$TOLERANCE" || fail "one flow with --log-datapath $on Mbit/s, without $off: not within $TOLERANCE%"

pair_down
echo "e2e-logs: ok"
