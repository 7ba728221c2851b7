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
# The reference runs in the same boot: CAKE on s0, the same load and pings, CHANGES rate changes
# by `tc qdisc change` (CAKE's live change), the same windows. A window that misses with the
# queue never seen empty is the load's own when CAKE's windows miss as often; shaper may miss no
# larger share of its windows than CAKE did.
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
# Twice what one change takes in the emulated guest (the command, the settle time, the window,
# the checks: 2.3-4 s), to keep iperf3 and ping running past the last one; both are stopped
# when the changes are done.
PERIOD_S=8
CONFIG=/tmp/live.toml
RUN_DIR=${SHAPER_RUN_DIR:-/run/shaper}

# write_config RATE_MBIT [EXTRA]: the config file shaper runs with.
write_config() {
	printf 'iface = "s0"\nrate = "%smbit"\n%s\n' "$1" "${2:-}" >"$CONFIG"
}

# What is on s0 while changes are measured: `shaper`, or `cake` for the reference.
UNDER=shaper

# queue_counts: "DROPPED STALL_NS": the packets dropped (every reason), and the wire time shaper
# charged for packets the device sent late, all at once, after the machine stalled (`shaper
# stats`: "sent ahead of the rate"): time the link lost, which shaper does not make up by
# design. CAKE has no such measure (0).
queue_counts() {
	if [ "$UNDER" = cake ]; then
		echo "$(run "$SRC" tc -s qdisc show dev s0 | awk '/^qdisc cake/ { getline; sub(",", "", $7); print $7; exit }') 0"
		return
	fi
	json=$(run "$SRC" shaper stats --iface s0 --json | tr -d ' \n')
	dropped=$(echo "$json" | sed -n 's/.*"dropped":{\([^}]*\)}.*/\1/p' | tr ',' '\n' |
		awk -F: '{ s += $2 } END { print s + 0 }')
	echo "$dropped $(echo "$json" | json_num overrun_ns)"
}

# queue_empty: true when nothing is held back: shaper has no departure scheduled ahead of now
# (its backlog), or CAKE's queue is empty.
queue_empty() {
	if [ "$UNDER" = cake ]; then
		run "$SRC" tc -s qdisc show dev s0 | awk '/^qdisc cake/ { getline; getline; exit !($2 == "0b") }'
	else
		[ "$(run "$SRC" shaper stats --iface s0 --json | json_num backlog_ns)" = 0 ]
	fi
}

# sample_queue_until MICROSECONDS: samples the queue every 250 ms until then (a report costs the
# emulated guest CPU); prints 1 if it was ever empty, else 0. With nothing held back, the
# senders (a TCP still growing its window after a rise, or starved of CPU) were the limit at
# that moment, not the rate.
sample_queue_until() {
	emptied=0
	while [ "$(now_us)" -lt "$1" ]; do
		queue_empty && emptied=1
		sleep 0.25
	done
	echo "$emptied"
}

# rate_after T0_US RATE_MBIT WHAT: s0's wire rate over WINDOW_MS from SETTLE_MS after T0_US, the
# time just before the change was asked for. Sets VERDICT: `within` (TOLERANCE % of the rate),
# `stalled` (short, but the wire time shaper charged for the machine's stalls in the window
# makes up the shortfall), `senders` (short, and the queue ran empty at times in it) or `miss`.
rate_after() {
	t0=$1 want=$2 what=$3
	sleep_until $((t0 + SETTLE_MS * 1000))
	set -- $(tx_at "$SRC" s0)
	a_us=$1 a_bytes=$2
	counts=$(queue_counts)
	emptied=$(sample_queue_until $((a_us + WINDOW_MS * 1000)))
	set -- $(tx_at "$SRC" s0)
	b_us=$1 b_bytes=$2
	set -- $counts $(queue_counts)
	drops=$(($3 - $1)) stall_us=$((($4 - $2) / 1000))
	# bytes * 8 / microseconds = Mbit/s.
	mbit=$(awk -v b=$((b_bytes - a_bytes)) -v t=$((b_us - a_us)) 'BEGIN { printf "%.3f", b * 8 / t }')
	ran=$(awk -v b=$((b_bytes - a_bytes)) -v t=$((b_us - a_us - stall_us)) 'BEGIN { printf "%.3f", b * 8 / t }')
	err=$(awk -v m="$mbit" -v w="$want" 'BEGIN { d = (m - w) / w * 100; printf "%.2f", d }')
	short=$(awk -v m="$mbit" -v w="$want" 'BEGIN { print (m < w) }')
	if within "$mbit" "$want" "$TOLERANCE"; then
		VERDICT=within
	elif [ "$short" = 1 ] && within "$ran" "$want" "$TOLERANCE"; then
		VERDICT=stalled
	elif [ "$short" = 1 ] && [ "$emptied" = 1 ]; then
		VERDICT=senders
	else
		VERDICT=miss
	fi
	log "$UNDER, $what: ${mbit} Mbit/s from ${SETTLE_MS} ms after (${err} %), answered in ${ANSWER_MS} ms; $drops dropped, $((stall_us / 1000)) ms lost to stalls, queue empty at times: $emptied: $VERDICT"
	echo "RESULT kernel=$(uname -r) under=$UNDER change=\"$what\" rate_mbit=$want wire_mbit=$mbit error_pct=$err answer_ms=$ANSWER_MS dropped=$drops stall_ms=$((stall_us / 1000)) wire_mbit_without_stalls=$ran queue_emptied=$emptied verdict=$VERDICT"
}

# start_load SECONDS PORT: the load (iperf3, 4 flows, to the server on PORT: one per pass, so
# that one pass's ending test never keeps the next one's server busy) and a ping every 10 ms
# from src for that long; sets iperf_pid and ping_pid. Not through `run`: the pids must be iperf3's and ping's own (ip execs
# them), so that end_load stops them when the changes are done; a background subshell ignores
# SIGINT, and the load would run its whole length.
start_load() {
	ip netns exec "$SRC" iperf3 -c 10.9.0.2 -p "$2" -t $(($1 + 5)) -P 4 --format m >/tmp/live.iperf 2>&1 &
	iperf_pid=$!
	sleep 1
	ip netns exec "$SRC" ping -i 0.01 -c $(($1 * 100)) 10.9.0.2 >/tmp/live.ping 2>&1 &
	ping_pid=$!
	sleep 1
}

# The reference first, in this boot: CAKE on s0, CHANGES changes by `tc qdisc change`, the same
# load, pings and windows. Its pings are reported, not judged.
reference() {
	UNDER=cake
	run "$SRC" tc qdisc replace dev s0 root cake bandwidth "${LOW}mbit" besteffort raw ||
		fail "CAKE on s0"
	run "$DST" iperf3 -s -p 5202 -D >/dev/null || fail "a second iperf3 server"
	sleep 0.3
	start_load $((4 + (CHANGES + 2) * PERIOD_S)) 5202
	rate=$LOW
	n=0
	while [ $n -lt "$CHANGES" ]; do
		n=$((n + 1))
		[ "$rate" = "$LOW" ] && rate=$HIGH || rate=$LOW
		t0=$(now_us)
		out=$(run "$SRC" tc qdisc change dev s0 root cake bandwidth "${rate}mbit" 2>&1) ||
			fail "tc qdisc change to $rate Mbit/s: $out"
		ANSWER_MS=$((($(now_us) - t0) / 1000))
		rate_after "$t0" "$rate" "change $n to $rate Mbit/s"
		eval "CAKE_$VERDICT=\$((CAKE_$VERDICT + 1))"
	done
	kill -0 "$iperf_pid" 2>/dev/null || fail "CAKE: iperf3 ended before the changes did: $(tail -3 /tmp/live.iperf)"
	end_load "$iperf_pid" "$ping_pid"
	CAKE_PINGS=$(grep 'packets transmitted' /tmp/live.ping)
	CAKE_RTT=$(grep -o 'rtt min/avg/max/mdev = [^ ]*' /tmp/live.ping | cut -d' ' -f4)
	run "$SRC" tc qdisc del dev s0 root
	log "CAKE: $CHANGES changes, $CAKE_within within $TOLERANCE %, $CAKE_senders short with its queue empty at times, $CAKE_miss missed; pings: $CAKE_PINGS, rtt $CAKE_RTT ms"
	echo "RESULT kernel=$(uname -r) under=cake changes=$CHANGES within=$CAKE_within short_by_senders=$CAKE_senders missed=$CAKE_miss pings=\"$CAKE_PINGS\" ping_min_avg_max_mdev_ms=$CAKE_RTT"
	UNDER=shaper
}
CAKE_within=0 CAKE_stalled=0 CAKE_senders=0 CAKE_miss=0

FAILURES=
STALLED=
SENDER_LIMITED=
WORST=0
# judge WHAT: collects rate_after's VERDICT for shaper, with the figures it left ($err, $mbit,
# $ran, $stall_us).
judge() {
	case $VERDICT in
	within) WORST=$(awk -v a="$WORST" -v e="$err" 'BEGIN { if (e < 0) e = -e; print (e > a) ? e : a }') ;;
	stalled) STALLED="$STALLED; $1: $mbit Mbit/s, $ran without the $((stall_us / 1000)) ms of stalls" ;;
	senders) SENDER_LIMITED="$SENDER_LIMITED; $1: $mbit Mbit/s, nothing scheduled ahead at times" ;;
	miss) FAILURES="$FAILURES; $1: $mbit Mbit/s ($ran without stalls)" ;;
	esac
}

pair_up
# The pings are judged on their order: a veth may reorder them below any qdisc (see there).
one_receive_cpu
# One frame per packet, so that the device's byte counter is the wire rate (a GSO packet's
# headers count once there, once per segment on the wire).
run "$SRC" ethtool -K s0 tso off gso off >/dev/null || fail "turning GSO off on s0"
reference
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

start_load $((4 + (CHANGES + RELOADS + 3) * PERIOD_S)) 5201
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
	judge "$WHAT_NOW"
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
	judge "$WHAT_NOW"
	same_qdisc
	[ "$(stats_rate)" = "$((rate * 1000000))" ] || fail "$WHAT_NOW: shaper stats says $(stats_rate) bit/s"
done
[ "$(grep -c 'reload: rate: ' /tmp/shaper.log)" -eq "$RELOADS" ] ||
	fail "not every SIGHUP reloaded: $(grep 'reload' /tmp/shaper.log)"
# `shaper reload` with nothing edited: nothing changes, and it says so.
WHAT_NOW="reload, unchanged"
out=$(run "$SRC" shaper reload --iface s0 2>&1) || fail "$WHAT_NOW: $out"
echo "$out" | grep -q "nothing changed" || fail "$WHAT_NOW: printed [$out]"

kill -0 "$iperf_pid" 2>/dev/null || fail "iperf3 ended before the changes did: $(tail -3 /tmp/live.iperf)"
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
missed=$(printf '%s' "$FAILURES" | tr -cd ';' | wc -c)
windows=$((CHANGES + RELOADS))
echo "RESULT kernel=$(uname -r) under=shaper changes=$CHANGES reloads=$RELOADS within=$((windows - stalled - sender_limited - missed)) short_by_stalls=$stalled short_by_senders=$sender_limited missed=$missed worst_error_pct=$WORST pings=$sent lost=0 reordered=0 ping_min_avg_max_mdev_ms=$rtt"

shaper_stop
[ -z "$STALLED" ] || log "short of the rate while the machine stalled$STALLED"
[ -z "$SENDER_LIMITED" ] || log "short of the rate while shaper had nothing scheduled ahead$SENDER_LIMITED"
[ -z "$FAILURES" ] || log "missed $TOLERANCE % after a change$FAILURES"
# A window missed with the queue never seen empty: shaper may miss no larger share of its
# windows than CAKE did of its own in this boot, under the same load (none, when CAKE missed
# none).
allowed=$(awk -v c="$CAKE_miss" -v n="$CHANGES" -v w="$windows" 'BEGIN { a = c * w / n; printf "%d", (a == int(a)) ? a : int(a) + 1 }')
[ "$missed" -le "$allowed" ] ||
	fail "the rate missed $TOLERANCE % after $missed of $windows changes, CAKE after $CAKE_miss of $CHANGES$FAILURES"
[ $((2 * (stalled + sender_limited))) -le "$windows" ] ||
	fail "more than half of the windows were short, excused by stalls or idle senders: the machine was too busy to judge"
log "PASS: $CHANGES sets and $RELOADS reloads: $((windows - stalled - sender_limited - missed)) within $TOLERANCE % (worst $WORST %), $stalled short by the machine's stalls, $sender_limited by the senders, $missed missed; CAKE: $CAKE_within of $CHANGES within, $CAKE_senders short by the senders, $CAKE_miss missed"
