#!/bin/sh
# End to end: everything a shaped interface sends is accounted for, with two shaper processes on
# one machine and traffic both ways. A client shapes its uplink (1 Mbit/s), a server its
# download direction (20 Mbit/s), a router between them adds 20 ms each way; 4 TCP uploads and
# 4 TCP downloads run at once. Over the run, each interface's own transmit counter must equal
# what its shaper stamped, plus what it passed unshaped (counted by reason, at most a full frame
# each), within 1 %; fq must have sent the same. Midway the server's shaper is stopped (SIGSTOP)
# for 2 s, a control loop that is starved: the data path must keep the rate with stale levels.
#
#   cli [c0: shaped 1 Mbit/s] --- rtr (netem 20 ms each way) --- [s0: shaped 20 Mbit/s] srv
#
# Counting starts once both shapers answer `shaper stats`: what a link sends before its shaper is
# in place is not shaper's to account for.
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

SECONDS_PER_RUN=${E2E_SECONDS:-16}
UP_MBIT=1
DOWN_MBIT=20
TOLERANCE=1
routed_up
run rtr tc qdisc add dev rc root netem delay 20ms limit 10000
run rtr tc qdisc add dev rs root netem delay 20ms limit 10000
run srv iperf3 -s -D -p 5201 >/dev/null
run srv iperf3 -s -D -p 5202 >/dev/null

shaper_start_in cli c0 --iface c0 --rate "${UP_MBIT}mbit"
CLI_PID=$SHAPER_PID
cp /tmp/shaper.log /tmp/shaper-cli.log
shaper_start_in srv s0 --iface s0 --rate "${DOWN_MBIT}mbit"
SRV_PID=$SHAPER_PID

before_c=$(byte_counters cli c0)
before_s=$(byte_counters srv s0)
run cli iperf3 -c 10.2.0.2 -p 5201 -t "$SECONDS_PER_RUN" -P 4 --format m >/tmp/up.out 2>&1 &
up_pid=$!
run cli iperf3 -c 10.2.0.2 -p 5202 -t "$SECONDS_PER_RUN" -P 4 -R --format m >/tmp/down.out 2>&1 &
down_pid=$!
sleep $((SECONDS_PER_RUN / 2))
kill -STOP "$SRV_PID"
sleep 2
kill -CONT "$SRV_PID"
wait "$up_pid" || fail "iperf3 upload: $(cat /tmp/up.out)"
wait "$down_pid" || fail "iperf3 download: $(cat /tmp/down.out)"
# What fq still holds leaves within the horizon; the counters are read after it has.
sleep 1
after_c=$(byte_counters cli c0)
after_s=$(byte_counters srv s0)

up=$(receiver_mbit </tmp/up.out)
down=$(receiver_mbit </tmp/down.out)
log "upload $up Mbit/s at ${UP_MBIT}mbit, download $down Mbit/s at ${DOWN_MBIT}mbit (server's shaper stopped for 2 s)"

failed=
failed="$failed$(accounting_fault c0 "$before_c" "$after_c" "$TOLERANCE")"
failed="$failed$(accounting_fault s0 "$before_s" "$after_s" "$TOLERANCE")"

# The rate held both ways, the stopped control loop included.
awk -v v="$up" -v c="$(tcp_ceiling_mbit "$UP_MBIT")" 'BEGIN { exit !(v <= c * 1.01) }' ||
	failed="$failed; upload $up Mbit/s above the ceiling at ${UP_MBIT}mbit"
awk -v v="$down" -v c="$(tcp_ceiling_mbit "$DOWN_MBIT")" 'BEGIN { exit !(v <= c * 1.01) }' ||
	failed="$failed; download $down Mbit/s above the ceiling at ${DOWN_MBIT}mbit"

for pid in $CLI_PID $SRV_PID; do
	kill -TERM "$pid"
	wait "$pid" || failed="$failed; a shaper exited with an error"
done
topology_down
[ -z "$failed" ] || fail "${failed#; }"
echo "e2e-accounting: ok"
