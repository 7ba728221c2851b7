#!/bin/sh
# End to end: upgrades without a gap (docs/design.md, "Handing over to the next process"):
# TCX links on kernels that have them, netlink filters changed in place on the others.
# While iperf3 loads s0 and ping crosses it every 10 ms, a new `shaper run --keep` replaces the
# running one TAKEOVERS times: the old one, stopped by SIGTERM (SIGUSR2 for one of them, run
# without --keep; every third, a new one started with --replace asks it to leave), leaves s0
# shaped, and the new one takes over its programs in place and its flow state. Throughout: no ping is lost or reordered, the root qdisc is the same one (its
# handles, and fq's counters that only grow), nothing passes unshaped (the accounting
# invariant over the whole run, shaper's counters carried from one process to the next), and
# from 200 ms after each new process is shaping the device sends at the rate within 2 %, as
# often as it does in a window of the same run with no takeover (one before each). Each
# new process says it carried the flow state on, and leaves no pins behind. At the end a
# process without --keep takes over and restores s0 as it was found.
#
# The processes run in the namespace's network only (nsenter), not under `ip netns exec`,
# which mounts /sys afresh without bpffs: pins are shared only under one mount of bpffs, as
# on a host or between a DaemonSet's pods that mount the host's /sys/fs/bpf.
#
# Usage: e2e-takeover.sh [TAKEOVERS]   (default: 20; TAKEOVER_SETTLE_MS moves the window's start)
# Prints one "RESULT ..." line per takeover for the record.
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

TAKEOVERS=${1:-20}
RATE=30
TOLERANCE=2
SETTLE_MS=${TAKEOVER_SETTLE_MS:-200}
WINDOW_MS=1000
RUN_DIR=${SHAPER_RUN_DIR:-/run/shaper}
PINS=/sys/fs/bpf/shaper

grep -q ' /sys/fs/bpf bpf ' /proc/mounts || mount -t bpf bpf /sys/fs/bpf || fail "mounting bpffs"

# start_shaper LOG ARGS...: `shaper run --iface s0 --rate RATE ARGS` in src's network (the
# mounts of this shell), in the background; its pid in NEW_PID.
start_shaper() {
	log_file=$1
	shift
	nsenter --net=/run/netns/"$SRC" shaper run --iface s0 --rate "${RATE}mbit" "$@" >"$log_file" 2>&1 &
	NEW_PID=$!
}

# wait_shaping PID LOG: until the state file names PID as shaping s0 (not starting); fails if
# the process ends first.
wait_shaping() {
	waited=0
	until grep -q "\"pid\": $1," "$RUN_DIR"/*.json 2>/dev/null &&
		grep -q '"starting": false' "$RUN_DIR"/*.json 2>/dev/null; do
		waited=$((waited + 1))
		if [ $waited -gt 300 ] || ! kill -0 "$1" 2>/dev/null; then
			cat "$2" >&2
			fail "shaper (pid $1) did not take over s0"
		fi
		sleep 0.02
	done
}

# egress_program: the program at s0's egress, by kernel id (TCX or shaper's netlink filter),
# as `shaper stats` finds it in the kernel.
egress_program() {
	run "$SRC" shaper stats --iface s0 --json | tr -d ' \n' | sed -n 's/.*"egress_programs":\[\([0-9,]*\)\].*/\1/p'
}

FAILURES=
STEADY_FAILURES=
WORST=0
# rate_from T0_US WHAT [steady]: s0's wire rate over WINDOW_MS from SETTLE_MS after T0_US; a
# miss goes to FAILURES, or with `steady` (a window with no takeover, the reference) to
# STEADY_FAILURES; WORST is the worst error within the tolerance after a takeover.
rate_from() {
	kind=${3:-}
	sleep_until $(($1 + SETTLE_MS * 1000))
	set -- "$1" "$2" $(tx_at "$SRC" s0)
	sleep "$(awk -v m="$WINDOW_MS" 'BEGIN { printf "%.3f", m / 1000 }')"
	set -- "$@" $(tx_at "$SRC" s0)
	mbit=$(awk -v b=$(($6 - $4)) -v t=$(($5 - $3)) 'BEGIN { printf "%.3f", b * 8 / t }')
	err=$(awk -v m="$mbit" -v w="$RATE" 'BEGIN { printf "%.2f", (m - w) / w * 100 }')
	RATE_NOW=$mbit ERR_NOW=$err
	if within "$mbit" "$RATE" "$TOLERANCE"; then
		[ "$kind" = steady ] ||
			WORST=$(awk -v a="$WORST" -v e="$err" 'BEGIN { if (e < 0) e = -e; print (e > a) ? e : a }')
	elif [ "$kind" = steady ]; then
		STEADY_FAILURES="$STEADY_FAILURES; $2: $mbit Mbit/s"
	else
		FAILURES="$FAILURES; $2: $mbit Mbit/s"
	fi
}

# old_left: waits for the old shaper ($OLD_PID) to end, and checks that it ended well and left
# s0 shaped; how long after T0 in $left_ms.
old_left() {
	wait "$OLD_PID" || { cat "/tmp/takeover-$((n - 1)).log" >&2; fail "$WHAT_NOW: the old shaper exited with an error"; }
	grep -q "s0 left shaped for the next shaper" "/tmp/takeover-$((n - 1)).log" ||
		{ cat "/tmp/takeover-$((n - 1)).log" >&2; fail "$WHAT_NOW: the old shaper did not leave s0 shaped"; }
	left_ms=$((($(now_us) - t0) / 1000))
}

pair_up
# The pings are judged on their order: a veth may reorder them below any qdisc (see there).
one_receive_cpu
run "$SRC" ethtool -K s0 tso off gso off >/dev/null || fail "turning GSO off on s0"
before=$(qdisc_state s0)
start_shaper /tmp/takeover-0.log --keep
OLD_PID=$NEW_PID
wait_shaping "$OLD_PID" /tmp/takeover-0.log
set -- $(fq_root)
ROOT_HANDLE=$1
counted=$(byte_counters "$SRC" s0)

# What one takeover takes at most in the emulated guest (the old one leaving, the new one
# verifying its programs: 2-3 s on a quiet machine, up to 6 s on a busy one, then the window
# and the one before it without a takeover).
total_s=$((6 + TAKEOVERS * 12))
# Not through `run` either: killing a subshell would leave iperf3 sending while the counters
# are read.
ip netns exec "$SRC" iperf3 -c 10.9.0.2 -t $((total_s + 30)) -P 4 --format m >/tmp/takeover.iperf 2>&1 &
iperf_pid=$!
sleep 1
# Not through `run`: the pid must be ping's own (ip execs it), for end_load's SIGINT, which a
# background subshell would ignore.
ip netns exec "$SRC" ping -i 0.01 10.9.0.2 >/tmp/takeover.ping 2>&1 &
ping_pid=$!
sleep 2
WHAT_NOW=start
same_qdisc

n=0
while [ $n -lt "$TAKEOVERS" ]; do
	n=$((n + 1))
	WHAT_NOW="takeover $n"
	rate_from $(($(now_us) - SETTLE_MS * 1000)) "before takeover $n" steady
	log "before takeover $n: $RATE_NOW Mbit/s ($ERR_NOW %)"
	echo "RESULT kernel=$(uname -r) steady_before=$n wire_mbit=$RATE_NOW error_pct=$ERR_NOW"
	program_before=$(egress_program)
	t0=$(now_us)
	if [ $n -eq $((TAKEOVERS / 2 + 1)) ]; then
		# The documented signal: a process run without --keep leaves s0 shaped on SIGUSR2.
		kill -USR2 "$OLD_PID"
		how=SIGUSR2
	elif [ $((n % 3)) -eq 0 ]; then
		# As a rolling update that starts the new process first: it asks the old one to leave.
		how=replace
	else
		kill -TERM "$OLD_PID"
		how=SIGTERM
	fi
	if [ $how != replace ]; then
		old_left
		same_qdisc
		[ "$(egress_program)" = "$program_before" ] || fail "$WHAT_NOW: with no shaper running, s0's egress program is [$(egress_program)], was $program_before"
	fi
	# The one after the SIGUSR2 runs without --keep, and so does the last, which restores.
	keep=--keep
	if [ $n -eq $((TAKEOVERS / 2)) ] || [ $n -eq "$TAKEOVERS" ]; then
		keep=
	fi
	if [ $how = replace ]; then
		start_shaper "/tmp/takeover-$n.log" --replace $keep
	else
		start_shaper "/tmp/takeover-$n.log" $keep
	fi
	wait_shaping "$NEW_PID" "/tmp/takeover-$n.log"
	t1=$(now_us)
	gap_ms=$(((t1 - t0) / 1000))
	if [ $how = replace ]; then
		old_left
		grep -q "left to the next shaper at its request" "/tmp/takeover-$((n - 1)).log" ||
			{ cat "/tmp/takeover-$((n - 1)).log" >&2; fail "$WHAT_NOW: the old shaper did not say it was asked to leave"; }
	fi
	OLD_PID=$NEW_PID
	grep -q "taking over from the shaper (pid [0-9]*) that left it shaped" "/tmp/takeover-$n.log" ||
		{ cat "/tmp/takeover-$n.log" >&2; fail "$WHAT_NOW: the new shaper did not take over"; }
	grep -q "with the flow state the previous shaper left" "/tmp/takeover-$n.log" ||
		{ cat "/tmp/takeover-$n.log" >&2; fail "$WHAT_NOW: the new shaper did not carry the flow state on"; }
	[ -z "$(ls -A "$PINS" 2>/dev/null)" ] || fail "$WHAT_NOW: pins left behind: $(ls -R "$PINS")"
	program_after=$(egress_program)
	[ -n "$program_after" ] && [ "$program_after" != "$program_before" ] ||
		fail "$WHAT_NOW: s0's egress program is [$program_after], was $program_before"
	same_qdisc
	rate_from "$t1" "$WHAT_NOW"
	log "$WHAT_NOW ($how): old one gone in $left_ms ms, new one shaping $gap_ms ms after the signal (or the start); $RATE_NOW Mbit/s from $SETTLE_MS ms after ($ERR_NOW %)"
	echo "RESULT kernel=$(uname -r) takeover=$n signal=$how left_ms=$left_ms shaping_after_ms=$gap_ms wire_mbit=$RATE_NOW error_pct=$ERR_NOW"
done

kill -0 "$iperf_pid" 2>/dev/null || fail "iperf3 ended before the takeovers did"
end_load "$iperf_pid" "$ping_pid"
WHAT_NOW=end
same_qdisc
check_accounting "$SRC" s0 "$counted" "takeovers"

# Every ping answered, in order, once.
set -- $(check_pings /tmp/takeover.ping)
sent=$1 rtt=$2

# The last one ran without --keep: SIGTERM restores s0 as it was found.
kill -TERM "$OLD_PID"
wait "$OLD_PID" || { cat "/tmp/takeover-$TAKEOVERS.log" >&2; fail "the last shaper exited with an error"; }
[ "$(qdisc_state s0)" = "$before" ] || fail "s0 not restored: [$(qdisc_state s0)], was [$before]"
[ -z "$(egress_program)" ] || fail "a program is still attached to s0 after the restore"
[ -z "$(ls -A "$PINS" 2>/dev/null)" ] || fail "pins left after the restore: $(ls -R "$PINS")"
[ -z "$(ls "$RUN_DIR"/*.json 2>/dev/null)" ] || fail "a state file is left after the restore"

missed=$(printf '%s' "$FAILURES" | tr -cd ';' | wc -c)
steady_missed=$(printf '%s' "$STEADY_FAILURES" | tr -cd ';' | wc -c)
echo "RESULT kernel=$(uname -r) takeovers=$TAKEOVERS missed=$missed steady_missed=$steady_missed pings=$sent lost=0 reordered=0 worst_error_pct=$WORST ping_min_avg_max_mdev_ms=$rtt"
[ -z "$STEADY_FAILURES" ] || log "missed $TOLERANCE % with no takeover$STEADY_FAILURES"
[ -z "$FAILURES" ] || log "missed $TOLERANCE % after a takeover$FAILURES"
# A takeover may cost the rate nothing: its windows miss no more often than those without one.
[ "$missed" -le "$steady_missed" ] ||
	fail "the rate missed $TOLERANCE % after $missed takeovers, in $steady_missed windows without one$FAILURES"
log "PASS: $TAKEOVERS takeovers, $missed missed $TOLERANCE % after one and $steady_missed without, worst rate error $WORST %, no ping lost or reordered, nothing unshaped"
pair_down
