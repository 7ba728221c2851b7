#!/bin/sh
# End to end: whatever the interface had, shaper puts back exactly; what it cannot restore it
# refuses to touch; bad input fails cleanly; a crashed shaper's successor restores the original.
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

# check_round_trip DESCRIPTION: shaper on s0 (as configured now), then SIGTERM; the qdiscs must
# be exactly as before.
check_round_trip() {
	before=$(qdisc_state s0)
	gso_before=$(gso_state s0)
	shaper_start --iface s0 --rate 100mbit
	during=$(qdisc_state s0)
	echo "$during" | grep -q "5348:" || fail "$1: shaper's qdisc not installed: $during"
	# At 100 Mbit/s a GSO packet may take 1 ms of wire: 12,500 bytes, eight frames.
	[ "$(gso_state s0)" = "gso_max_size 12500 gso_max_segs 8" ] || fail "$1: GSO not lowered: $(gso_state s0)"
	shaper_stop
	after=$(qdisc_state s0)
	[ "$after" = "$before" ] || fail "$1: not restored
before: $before
after:  $after"
	[ "$(gso_state s0)" = "$gso_before" ] || fail "$1: GSO limits not restored: $(gso_state s0), were $gso_before"
	log "$1: restored"
}

gso_state() {
	ip -n "$SRC" -d link show "$1" | grep -o 'gso_max_size [0-9]* gso_max_segs [0-9]*'
}

# expect_refusal DESCRIPTION PATTERN ARGS...: shaper run must fail, say PATTERN, change nothing.
expect_refusal() {
	desc=$1
	pattern=$2
	shift 2
	before=$(qdisc_state s0)
	if ip netns exec "$SRC" shaper run "$@" 2>/tmp/refusal.err; then
		fail "$desc: accepted"
	fi
	grep -q "$pattern" /tmp/refusal.err || fail "$desc: expected '$pattern', got: $(cat /tmp/refusal.err)"
	[ "$(qdisc_state s0)" = "$before" ] || fail "$desc: the interface changed"
	log "$desc: refused ($(grep -m 1 'shaper: error' /tmp/refusal.err | cut -c 1-120))"
}

pair_up
check_round_trip "default noqueue root"

ip netns exec "$SRC" tc qdisc replace dev s0 root handle 8001: fq_codel target 3ms interval 50ms limit 2000 ecn
check_round_trip "fq_codel with custom parameters"

ip netns exec "$SRC" tc qdisc replace dev s0 root handle 7: netem delay 5ms 1ms loss 0.1%
check_round_trip "netem"

ip netns exec "$SRC" tc qdisc replace dev s0 root cake bandwidth 30mbit diffserv4 nat wash overhead 18 mpu 64
check_round_trip "cake with options"

ip netns exec "$SRC" tc qdisc replace dev s0 root handle 1: htb default 10
ip netns exec "$SRC" tc class add dev s0 parent 1: classid 1:10 htb rate 10mbit
expect_refusal "classful htb root" "classful" --iface s0 --rate 10mbit
ip netns exec "$SRC" tc qdisc del dev s0 root

ip netns exec "$SRC" tc qdisc replace dev s0 root handle 9: prio
expect_refusal "prio root (classes without explicit children)" "classful" --iface s0 --rate 10mbit
ip netns exec "$SRC" tc qdisc del dev s0 root

ip netns exec "$SRC" tc qdisc replace dev s0 root handle 2: fq_codel
ip netns exec "$SRC" tc filter add dev s0 parent 2: protocol ip u32 match ip dport 22 0xffff flowid 2:1
expect_refusal "root with a filter" "filter" --iface s0 --rate 10mbit
ip netns exec "$SRC" tc qdisc del dev s0 root

expect_refusal "unknown interface" "no interface named" --iface nosuch0 --rate 10mbit
expect_refusal "zero rate" "greater than zero" --iface s0 --rate 0
expect_refusal "malformed rate" "invalid rate" --iface s0 --rate 10mbps/s
expect_refusal "bad horizon" "invalid horizon" --iface s0 --rate 10mbit --horizon forever
expect_refusal "bad rtt" "invalid rtt" --iface s0 --rate 10mbit --rtt intranet
expect_refusal "bad diffserv mode" "unknown diffserv mode" --iface s0 --rate 10mbit --diffserv diffserv5
expect_refusal "bad ack-filter mode" "unknown ack-filter mode" --iface s0 --rate 10mbit --ack-filter always
echo 'rate = "10mbit"
latency = 5' >/tmp/bad.toml
expect_refusal "unknown config key" "unknown field" --iface s0 --config /tmp/bad.toml

# A crash (SIGKILL) leaves shaper's fq behind; the next shaper takes over and, on exit, restores
# what was there before the first one.
ip netns exec "$SRC" tc qdisc replace dev s0 root handle 8002: fq_codel target 7ms
before=$(qdisc_state s0)
shaper_start --iface s0 --rate 100mbit
kill -KILL "$SHAPER_PID"
wait "$SHAPER_PID" 2>/dev/null
echo "$(qdisc_state s0)" | grep -q "5348:" || fail "expected the crashed shaper's qdisc to remain"
shaper_start --iface s0 --rate 100mbit
grep -q "did not exit cleanly" /tmp/shaper.log || fail "the successor did not notice the crash"
shaper_stop
[ "$(qdisc_state s0)" = "$before" ] || fail "after a crash and restart: not restored to $before: $(qdisc_state s0)"
log "crash recovery: restored"
ip netns exec "$SRC" tc qdisc del dev s0 root

# Multi-queue device: mq with one fq per TX queue, and an mq with custom leaves comes back.
pair_down
ip netns add "$SRC"
ip netns add "$DST"
ip link add s0 netns "$SRC" numtxqueues 4 numrxqueues 4 type veth peer name d0 netns "$DST" numtxqueues 4 numrxqueues 4
ip -n "$SRC" link set s0 up
ip -n "$DST" link set d0 up
ip netns exec "$SRC" tc qdisc replace dev s0 root handle 1: mq
for q in 1 2 3 4; do
	ip netns exec "$SRC" tc qdisc replace dev s0 parent 1:$q fq_codel target 4ms
done
before=$(qdisc_state s0)
shaper_start --iface s0 --rate 100mbit
leaves=$(qdisc_state s0 | grep -c "qdisc fq .*parent 5348:")
[ "$leaves" = 4 ] || fail "mq: expected 4 fq leaves, got $leaves: $(qdisc_state s0)"
shaper_stop
[ "$(qdisc_state s0)" = "$before" ] || fail "mq: not restored: $(qdisc_state s0)"
log "mq with fq_codel leaves: restored"

# The ACK filter adds an ingress program; it goes with the rest.
before=$(qdisc_state s0)
shaper_start --iface s0 --rate 100mbit --ack-filter conservative
shaper_stop
[ "$(qdisc_state s0)" = "$before" ] || fail "ack filter: not restored: $(qdisc_state s0)"
if command -v bpftool >/dev/null; then
	ip netns exec "$SRC" bpftool net show dev s0 | grep -q shaper && fail "ack filter: a program left attached"
fi
log "ack filter (ingress program): restored"

# Without TCX (kernels < 6.6) the program hangs under clsact, which shaper adds and removes.
if ! ip netns exec "$SRC" tc qdisc show dev s0 | grep -q clsact; then
	shaper_start --iface s0 --rate 100mbit
	shaper_stop
	ip netns exec "$SRC" tc qdisc show dev s0 | grep -q clsact && fail "clsact left behind"
fi
pair_down
echo "e2e-restore: ok"
