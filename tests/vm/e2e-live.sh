#!/bin/sh
# End to end: live changes on a loaded link (docs/design.md, "Live changes"). While iperf3
# loads s0 and ping crosses it every 10 ms, `shaper set` switches the rate between two values
# CHANGES times and SIGHUP reloads an edited config file RELOADS times. Throughout: no ping is
# lost or reordered, the root qdisc is the same one (its handle, and fq's counters that only
# grow; fq's limits follow the rate through `tc qdisc change`), nothing passes unshaped, and
# from 200 ms after each change the device sends at the new rate within 2 %. A window short of
# the rate is excused only when the machine stalled (the wire time shaper charged for it makes up
# the shortfall) or shaper had nothing scheduled ahead at times in it (the senders were the limit), and at most half of them may
# be. A bad value and a setting that needs a restart are refused and change nothing.
#
# Usage: e2e-live.sh [CHANGES [RELOADS]]   (default: 20 4)
# Prints one "RESULT ..." line per change for the record.
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

CHANGES=${1:-20}
RELOADS=${2:-4}
LOW=20
HIGH=40
TOLERANCE=2
# The window over which the new rate is measured starts this long after the change.
SETTLE_MS=200
WINDOW_MS=1000
# What one change takes at most in the emulated guest (the command, the settle time, the
# window, the checks: 2.3 s measured on a quiet machine, up to 3.5 s on a busy one), to keep
# iperf3 and ping running past the last one.
PERIOD_S=4
CONFIG=/tmp/live.toml
RUN_DIR=${SHAPER_RUN_DIR:-/run/shaper}

# write_config RATE_MBIT [EXTRA]: the config file shaper runs with.
write_config() {
	printf 'iface = "s0"\nrate = "%smbit"\n%s\n' "$1" "${2:-}" >"$CONFIG"
}

# shaper_counts: "DROPPED STALL_NS": the packets shaper dropped (every reason), and the wire
# time it charged for packets the device sent late, all at once, after the machine stalled
# (`shaper stats`: "sent ahead of the rate"): time the link lost, which shaper does not
# make up by design.
shaper_counts() {
	json=$(run "$SRC" shaper stats --iface s0 --json | tr -d ' \n')
	dropped=$(echo "$json" | sed -n 's/.*"dropped":{\([^}]*\)}.*/\1/p' | tr ',' '\n' |
		awk -F: '{ s += $2 } END { print s + 0 }')
	echo "$dropped $(echo "$json" | json_num overrun_ns)"
}

# sample_queue_until MICROSECONDS: samples shaper's backlog (how far ahead of now its latest
# departure is scheduled) every 250 ms until then (a report costs the emulated guest CPU); prints 1 if it was ever empty, else 0. With
# nothing scheduled ahead, shaper held nothing back at that moment: the senders (a TCP still
# growing its window after a rise, or starved of CPU) were the limit, not the rate.
sample_queue_until() {
	emptied=0
	while [ "$(now_us)" -lt "$1" ]; do
		[ "$(run "$SRC" shaper stats --iface s0 --json | json_num backlog_ns)" = 0 ] && emptied=1
		sleep 0.25
	done
	echo "$emptied"
}

FAILURES=
WORST=0
# rate_after T0_US RATE_MBIT WHAT: s0's wire rate over WINDOW_MS from SETTLE_MS after T0_US, the
# time just before the change was asked for; a miss is collected in FAILURES. The emulated
# machine stalls (its host runs other work): a window short of the rate passes only when the
# wire time shaper charged for stalls in it makes up the shortfall, and is counted apart.
rate_after() {
	t0=$1 want=$2 what=$3
	sleep_until $((t0 + SETTLE_MS * 1000))
	set -- $(tx_at "$SRC" s0)
	a_us=$1 a_bytes=$2
	counts=$(shaper_counts)
	emptied=$(sample_queue_until $((a_us + WINDOW_MS * 1000)))
	set -- $(tx_at "$SRC" s0)
	b_us=$1 b_bytes=$2
	set -- $counts $(shaper_counts)
	drops=$(($3 - $1)) stall_us=$((($4 - $2) / 1000))
	# bytes * 8 / microseconds = Mbit/s.
	mbit=$(awk -v b=$((b_bytes - a_bytes)) -v t=$((b_us - a_us)) 'BEGIN { printf "%.3f", b * 8 / t }')
	ran=$(awk -v b=$((b_bytes - a_bytes)) -v t=$((b_us - a_us - stall_us)) 'BEGIN { printf "%.3f", b * 8 / t }')
	err=$(awk -v m="$mbit" -v w="$want" 'BEGIN { d = (m - w) / w * 100; printf "%.2f", d }')
	log "$what: ${mbit} Mbit/s from ${SETTLE_MS} ms after (${err} %), answered in ${ANSWER_MS} ms; $drops dropped, $((stall_us / 1000)) ms lost to stalls, nothing ahead at times: $emptied"
	echo "RESULT kernel=$(uname -r) change=\"$what\" rate_mbit=$want wire_mbit=$mbit error_pct=$err answer_ms=$ANSWER_MS dropped=$drops stall_ms=$((stall_us / 1000)) wire_mbit_without_stalls=$ran queue_emptied=$emptied"
	if within "$mbit" "$want" "$TOLERANCE"; then
		WORST=$(awk -v a="$WORST" -v e="$err" 'BEGIN { if (e < 0) e = -e; print (e > a) ? e : a }')
	elif awk -v m="$mbit" -v w="$want" 'BEGIN { exit !(m < w) }' && within "$ran" "$want" "$TOLERANCE"; then
		STALLED="$STALLED; $what: $mbit Mbit/s, $ran without the $((stall_us / 1000)) ms of stalls"
	elif awk -v m="$mbit" -v w="$want" 'BEGIN { exit !(m < w) }' && [ "$emptied" = 1 ]; then
		SENDER_LIMITED="$SENDER_LIMITED; $what: $mbit Mbit/s, nothing scheduled ahead at times"
	else
		FAILURES="$FAILURES; $what: $mbit Mbit/s ($ran without stalls)"
	fi
}
STALLED=
SENDER_LIMITED=

pair_up
# One frame per packet, so that the device's byte counter is the wire rate (a GSO packet's
# headers count once there, once per segment on the wire).
run "$SRC" ethtool -K s0 tso off gso off >/dev/null || fail "turning GSO off on s0"
write_config "$LOW"
shaper_start --config "$CONFIG"
# The control socket is bound once the interface is shaped, a moment after `shaper stats`
# first answers.
i=0
until [ -S "$(ls "$RUN_DIR"/*.sock 2>/dev/null | head -1)" ]; do
	i=$((i + 1))
	[ $i -le 50 ] || fail "no control socket in $RUN_DIR after 5 s: $(ls -la "$RUN_DIR")"
	sleep 0.1
done
[ "$(stat -c '%a' "$RUN_DIR"/*.sock)" = 600 ] || fail "the control socket is not root's alone: $(ls -la "$RUN_DIR")"
set -- $(fq_root)
ROOT_HANDLE=$1
counted=$(byte_counters "$SRC" s0)

total_s=$((4 + (CHANGES + RELOADS + 3) * PERIOD_S))
# Not through `run`: the pids must be iperf3's and ping's own (ip execs them), so that
# end_load stops them when the changes are done; a background subshell ignores SIGINT, and
# the load would run its whole length.
ip netns exec "$SRC" iperf3 -c 10.9.0.2 -t $((total_s + 5)) -P 4 --format m >/tmp/live.iperf 2>&1 &
iperf_pid=$!
sleep 1
ip netns exec "$SRC" ping -i 0.01 -c $((total_s * 100)) 10.9.0.2 >/tmp/live.ping 2>&1 &
ping_pid=$!
sleep 1
WHAT_NOW=start
same_qdisc

rate=$LOW
i=0
while [ $i -lt "$CHANGES" ]; do
	i=$((i + 1))
	[ "$rate" = "$LOW" ] && rate=$HIGH || rate=$LOW
	WHAT_NOW="set $i to $rate Mbit/s"
	same_qdisc
	t0=$(now_us)
	out=$(run "$SRC" shaper set --iface s0 --rate "${rate}mbit" 2>&1) || fail "$WHAT_NOW: $out"
	ANSWER_MS=$((($(now_us) - t0) / 1000))
	echo "$out" | grep -q "rate: .* -> ${rate}Mbit" || fail "$WHAT_NOW: shaper set printed [$out]"
	same_qdisc
	# fq's limits that follow the rate were changed on the same qdisc.
	limit=$(echo "$out" | sed -n 's/.*: fq flow-limit: [0-9]* packets -> \([0-9]*\) packets/\1/p')
	[ -z "$limit" ] || [ "$FQ_FLOW_LIMIT" = "${limit}p" ] ||
		fail "$WHAT_NOW: fq's flow_limit is $FQ_FLOW_LIMIT, shaper set said $limit"
	rate_after "$t0" "$rate" "$WHAT_NOW"
	[ "$(stats_rate)" = "$((rate * 1000000))" ] || fail "$WHAT_NOW: shaper stats says $(stats_rate) bit/s"
done

# A bad value and a setting that needs a restart: refused, nothing changed.
WHAT_NOW="bad value"
before=$(stats_rate)
run "$SRC" shaper set --iface s0 --rate fast >/tmp/live.out 2>&1 && fail "shaper set --rate fast was accepted"
grep -q 'invalid rate "fast"' /tmp/live.out || fail "bad value: unexpected answer: $(cat /tmp/live.out)"
[ "$(stats_rate)" = "$before" ] || fail "bad value: the rate changed"
same_qdisc
WHAT_NOW="restart-only setting"
write_config "$HIGH" '[state]
max-flows = 4096'
run "$SRC" shaper reload --iface s0 >/tmp/live.out 2>&1 && fail "a reload changing max-flows was accepted"
grep -q "max-flows.*Restart" /tmp/live.out || fail "restart-only: unexpected answer: $(cat /tmp/live.out)"
[ "$(stats_rate)" = "$before" ] || fail "restart-only: the rate changed"
same_qdisc
log "refused: $(cat /tmp/live.out)"

i=0
while [ $i -lt "$RELOADS" ]; do
	i=$((i + 1))
	[ "$rate" = "$LOW" ] && rate=$HIGH wash=true || rate=$LOW wash=false
	WHAT_NOW="SIGHUP $i to $rate Mbit/s"
	write_config "$rate" "wash = $wash"
	same_qdisc
	t0=$(now_us)
	kill -HUP "$SHAPER_PID"
	ANSWER_MS=-
	rate_after "$t0" "$rate" "$WHAT_NOW"
	same_qdisc
	[ "$(stats_rate)" = "$((rate * 1000000))" ] || fail "$WHAT_NOW: shaper stats says $(stats_rate) bit/s"
done
[ "$(grep -c 'reload: rate: ' /tmp/shaper.log)" -eq "$RELOADS" ] ||
	fail "not every SIGHUP reloaded: $(grep 'reload' /tmp/shaper.log)"
# `shaper reload` with nothing edited: nothing changes, and it says so.
WHAT_NOW="reload, unchanged"
out=$(run "$SRC" shaper reload --iface s0 2>&1) || fail "$WHAT_NOW: $out"
echo "$out" | grep -q "nothing changed" || fail "$WHAT_NOW: printed [$out]"

kill -0 "$iperf_pid" 2>/dev/null || fail "iperf3 ended before the changes did (raise PERIOD_S)"
kill -0 "$ping_pid" 2>/dev/null || fail "ping ended before the changes did (raise PERIOD_S)"
end_load "$iperf_pid" "$ping_pid"
WHAT_NOW=end
same_qdisc
check_accounting "$SRC" s0 "$counted" "live changes"

# Every ping answered, in order, once.
set -- $(check_pings /tmp/live.ping)
sent=$1 rtt=$2
stalled=$(printf '%s' "$STALLED" | tr -cd ';' | wc -c)
sender_limited=$(printf '%s' "$SENDER_LIMITED" | tr -cd ';' | wc -c)
echo "RESULT kernel=$(uname -r) changes=$CHANGES reloads=$RELOADS pings=$sent lost=0 reordered=0 worst_error_pct=$WORST short_by_stalls=$stalled short_by_senders=$sender_limited ping_min_avg_max_mdev_ms=$rtt"

shaper_stop
[ -z "$STALLED" ] || log "short of the rate while the machine stalled$STALLED"
[ -z "$SENDER_LIMITED" ] || log "short of the rate while shaper had nothing scheduled ahead$SENDER_LIMITED"
[ -z "$FAILURES" ] || fail "the rate missed $TOLERANCE % after a change$FAILURES"
[ $((2 * (stalled + sender_limited))) -le $((CHANGES + RELOADS)) ] ||
	fail "more than half of the windows were short, excused by stalls or idle senders: the machine was too busy to judge"
log "PASS: $CHANGES sets and $RELOADS reloads, worst rate error $WORST % ($stalled windows short by the machine's stalls, $sender_limited by the senders)"
