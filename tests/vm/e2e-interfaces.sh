#!/bin/sh
# End to end: one `shaper run --config` shapes several interfaces (docs/design.md, "Several
# interfaces"). Three veths from src to dst are named three ways in one file, s0 by its name,
# s1 as the device of the default route, s2 by a glob, each with its own rate and another
# setting of its own over the file's defaults:
#
# - all three loaded at once, each sends at its own rate (within TOLERANCE % of the TCP
#   ceiling) and its counters add up (the accounting invariant);
# - a bad file is refused naming its line and field, touching nothing;
# - s2 deleted is let go; re-created, it is shaped again within RESHAPE_MS (shaper's log line
#   against the time of the creation; its root qdisc checked in tc);
# - a reload that drops s0's section and adds s3's restores s0 as found, shapes s3, and changes
#   s2 in place (the same qdisc); `shaper set --iface s3` reaches s3 only;
# - the default route moved from s1 to s3: s3 takes its section's settings in place, s1 is
#   restored;
# - /readyz answers 200 while every configured interface is shaped;
# - SIGTERM leaves every interface as found.
#
# Usage: e2e-interfaces.sh
# Prints "RESULT ..." lines for the record.
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

SECONDS_PER_RUN=${E2E_SECONDS:-8}
TOLERANCE=3
RESHAPE_MS=1000
CONFIG=/tmp/interfaces.toml
BAD=/tmp/interfaces-bad.toml
URL=http://127.0.0.1:9101

# veth N: s$N in src, d$N in dst, 10.9.N.1/24 and .2, up.
veth() {
	ip link add "s$1" netns "$SRC" type veth peer name "d$1" netns "$DST"
	veth_addresses "$1"
}

# veth_addresses N: the addresses of veth N, up.
veth_addresses() {
	ip -n "$SRC" addr add "10.9.$1.1/24" dev "s$1"
	ip -n "$DST" addr add "10.9.$1.2/24" dev "d$1"
	ip -n "$SRC" link set "s$1" up
	ip -n "$DST" link set "d$1" up
}

pair_down
ip netns add "$SRC"
ip netns add "$DST"
for ns in "$SRC" "$DST"; do ip -n "$ns" link set lo up; done
for n in 0 1 2 3; do veth "$n"; done
ip -n "$SRC" route add default via 10.9.1.2 dev s1
for port in 5200 5201 5202 5203; do
	ip netns exec "$DST" iperf3 -s -D -p "$port" >/dev/null
done
sleep 0.3
for n in 0 1 2 3; do eval "original_s$n=\"\$(qdisc_state s$n)\""; done

cat >"$CONFIG" <<'EOF'
# The defaults every section inherits.
diffserv = "diffserv3"
split-gso = false
metrics = "9101"

[[interface]]
iface = "s0"
rate = "8mbit"
diffserv = "diffserv4"

[[interface]]
iface = "default-route"
rate = "12mbit"
isolation = "flows"

[[interface]]
iface = "s[0-2]"
rate = "16mbit"
wash = true
EOF

# A bad value in a section: refused, with the file's line and the field; nothing touched.
sed 's/wash = true/ack-filter = "sometimes"/' "$CONFIG" >"$BAD"
run "$SRC" shaper run --config "$BAD" >/tmp/bad.out 2>&1 && fail "a bad config file was accepted"
grep -q "$BAD, line 19, \`ack-filter\`" /tmp/bad.out || fail "bad file: unexpected error: $(cat /tmp/bad.out)"
printf '[[interface]]\niface = "s0"\nrate = "8mbit"\nmetrics = "9102"\n' >"$BAD"
run "$SRC" shaper run --config "$BAD" >/tmp/bad.out 2>&1 && fail "metrics in a section was accepted"
grep -q "line 4, \`metrics\`" /tmp/bad.out || fail "bad file: unexpected error: $(cat /tmp/bad.out)"
for n in 0 1 2 3; do
	[ "$(qdisc_state "s$n")" = "$(eval echo "\"\$original_s$n\"")" ] || fail "a refused start changed s$n"
done

# The link watcher says when it is woken (for the timeline of a re-shape below).
export SHAPER_LOG=info,shaper::linkwatch=debug
shaper_start_in "$SRC" s0 --config "$CONFIG"
unset SHAPER_LOG
# The others are shaped in the same start; wait for them too.
for dev in s1 s2; do
	i=0
	while ! run "$SRC" shaper stats --iface "$dev" >/dev/null 2>&1; do
		i=$((i + 1))
		[ $i -gt 50 ] && { cat /tmp/shaper.log >&2; fail "$dev not shaped"; }
		sleep 0.1
	done
done
run "$SRC" shaper stats --iface s3 >/dev/null 2>&1 && fail "s3 is shaped though no section names it"

# setting DEV KEY: KEY's value in DEV's `shaper stats --json`.
setting() {
	run "$SRC" shaper stats --iface "$1" --json | tr -d ' \n' | grep -o "\"$2\":\"*[a-z0-9-]*" | head -1 | cut -d: -f2 | tr -d '"'
}
[ "$(setting s0 rate_bps)" = 8000000 ] && [ "$(setting s0 diffserv)" = diffserv4 ] ||
	fail "s0: $(run "$SRC" shaper stats --iface s0)"
[ "$(setting s1 rate_bps)" = 12000000 ] && [ "$(setting s1 isolation)" = flows ] &&
	[ "$(setting s1 diffserv)" = diffserv3 ] || fail "s1: $(run "$SRC" shaper stats --iface s1)"
[ "$(setting s2 rate_bps)" = 16000000 ] && [ "$(setting s2 isolation)" = triple-isolate ] &&
	[ "$(setting s2 diffserv)" = diffserv3 ] ||
	fail "s2: $(run "$SRC" shaper stats --iface s2)"

# ready: /readyz's status code.
ready() {
	run "$SRC" timeout 10 wget -S -q -O /dev/null "$URL/readyz" 2>&1 | grep -o 'HTTP/1\.[01] [0-9]*' | head -1 | cut -d' ' -f2
}
[ "$(ready)" = 200 ] || fail "/readyz is not 200 with every interface shaped"

# measure_all: the three loaded at once for SECONDS_PER_RUN; goodput into got_sN.
measure_all() {
	for n in 0 1 2; do
		eval "counted_s$n=\"\$(byte_counters \"\$SRC\" s$n)\""
	done
	for n in 0 1 2; do
		run "$SRC" iperf3 -c "10.9.$n.2" -p "520$n" -t "$SECONDS_PER_RUN" -O 1 --format m >"/tmp/iperf-s$n.out" 2>&1 &
		eval "iperf_s$n=$!"
	done
	for n in 0 1 2; do
		eval "wait \$iperf_s$n" || fail "iperf3 on s$n: $(cat "/tmp/iperf-s$n.out")"
		eval "got_s$n=$(receiver_mbit <"/tmp/iperf-s$n.out")"
	done
}

# judge: each interface within TOLERANCE of its own ceiling; prints the failures.
judge() {
	for pair in "0 8" "1 12" "2 16"; do
		set -- $pair
		got=$(eval echo "\$got_s$1")
		within "$got" "$(tcp_ceiling_mbit "$2")" "$TOLERANCE" || echo "s$1 at $got Mbit/s, not within $TOLERANCE % of $(tcp_ceiling_mbit "$2")"
	done
}

measure_all
wrong=$(judge)
if [ -n "$wrong" ]; then
	log "outside the tolerance ($wrong): measuring again"
	measure_all
	wrong=$(judge)
fi
for pair in "0 8" "1 12" "2 16"; do
	set -- $pair
	got=$(eval echo "\$got_s$1")
	ceiling=$(tcp_ceiling_mbit "$2")
	log "s$1 at ${2}mbit: $got Mbit/s (ceiling $ceiling)"
	echo "RESULT kernel=$(uname -r) iface=s$1 rate_mbit=$2 goodput_mbit=$got ceiling_mbit=$ceiling vs_ceiling=$(ratio "$got" "$ceiling")"
	check_accounting "$SRC" "s$1" "$(eval echo "\"\$counted_s$1\"")" "s$1"
done
[ -z "$wrong" ] || fail "$wrong"

# Deleted: let go (nothing of shaper's left for it). Re-created: shaped again, timed.
ip -n "$SRC" link del s2
i=0
while run "$SRC" shaper stats --iface s2 >/dev/null 2>&1 || ls /run/shaper/*.json 2>/dev/null | wc -l | grep -qv '^2$'; do
	i=$((i + 1))
	[ $i -gt 50 ] && { cat /tmp/shaper.log >&2; fail "s2's state was not let go: $(ls /run/shaper)"; }
	sleep 0.1
done
kill -0 "$SHAPER_PID" || fail "shaper ended when s2 went away"
# Timed from just before the device is created to shaper's own log line for it, both in the
# guest's one clock. A poll from outside (`tc` in the namespace) takes hundreds of ms a round in
# the emulated guest and would time itself; it only confirms the qdisc.
shaped_s2='s2: shaped in'
shaped_before=$(grep -c "$shaped_s2" /tmp/shaper.log)
t0=$(now_us)
ip link add s2 netns "$SRC" type veth peer name d2 netns "$DST"
i=0
while [ "$(grep -c "$shaped_s2" /tmp/shaper.log)" -le "$shaped_before" ]; do
	i=$((i + 1))
	[ $i -gt 250 ] && { cat /tmp/shaper.log >&2; fail "s2 not shaped again within 5 s"; }
	sleep 0.02
done
run "$SRC" tc qdisc show dev s2 | grep -Eq "qdisc (fq|mq) 5348: root" ||
	fail "shaper logged s2 shaped, but its root is $(run "$SRC" tc qdisc show dev s2 | head -1)"
veth_addresses 2
reshape_ms=$((($(log_us "$(grep "$shaped_s2" /tmp/shaper.log | tail -1)" "$t0") - t0) / 1000))
log "s2 shaped again ${reshape_ms} ms after it was re-created; shaper's log of it:"
grep -E 's2|changed' /tmp/shaper.log | tail -10
echo "RESULT kernel=$(uname -r) reshape_ms=$reshape_ms"
[ "$reshape_ms" -le "$RESHAPE_MS" ] || fail "s2 shaped again after $reshape_ms ms (> $RESHAPE_MS)"
i=0
while [ "$(setting s2 rate_bps)" != 16000000 ]; do
	i=$((i + 1))
	[ $i -gt 50 ] && fail "s2 re-shaped with other settings: $(run "$SRC" shaper stats --iface s2)"
	sleep 0.1
done
i=0
while [ "$(ready)" != 200 ]; do
	i=$((i + 1))
	[ $i -gt 20 ] && fail "/readyz is not 200 after s2 came back"
	sleep 0.1
done
got=$(run "$SRC" iperf3 -c 10.9.2.2 -p 5202 -t "$SECONDS_PER_RUN" -O 1 --format m 2>&1 | receiver_mbit)
log "s2 after re-creation: $got Mbit/s"
within "$got" "$(tcp_ceiling_mbit 16)" "$TOLERANCE" || fail "s2 after re-creation at $got Mbit/s"

# Reload: s0's section dropped (restored as found), s3's added, s2 changed in place.
s2_root=$(run "$SRC" tc qdisc show dev s2 | awk '/ root/ { print $2 }')
cat >"$CONFIG" <<'EOF'
diffserv = "diffserv3"
split-gso = false
metrics = "9101"

[[interface]]
iface = "default-route"
rate = "12mbit"
isolation = "flows"

[[interface]]
iface = "s2"
rate = "18mbit"
wash = true

[[interface]]
iface = "s3"
rate = "10mbit"
EOF
run "$SRC" shaper reload --iface s1 >/tmp/reload.out 2>&1 || fail "reload: $(cat /tmp/reload.out)"
log "reload: $(tr '\n' ' ' </tmp/reload.out)"
[ "$(qdisc_state s0)" = "$original_s0" ] || fail "s0 not restored by the reload: $(qdisc_state s0)"
run "$SRC" shaper stats --iface s0 >/dev/null 2>&1 && fail "s0 still shaped after the reload"
[ "$(setting s3 rate_bps)" = 10000000 ] || fail "s3 not shaped by the reload"
[ "$(setting s2 rate_bps)" = 18000000 ] || fail "s2 not changed by the reload"
[ "$(run "$SRC" tc qdisc show dev s2 | awk '/ root/ { print $2 }')" = "$s2_root" ] ||
	fail "s2's qdisc was replaced, not changed in place"
[ "$(setting s1 rate_bps)" = 12000000 ] || fail "s1 changed by the reload"
run "$SRC" shaper set --iface s3 --rate 14mbit >/tmp/set.out 2>&1 || fail "set on s3: $(cat /tmp/set.out)"
[ "$(setting s3 rate_bps)" = 14000000 ] && [ "$(setting s2 rate_bps)" = 18000000 ] &&
	[ "$(setting s1 rate_bps)" = 12000000 ] || fail "shaper set --iface s3 did not reach s3 alone"
[ "$(ready)" = 200 ] || fail "/readyz is not 200 after the reload"

# The default route moves to s3: s3 is now the default-route section's (changed in place, its
# `shaper set` dropped), and s1, which no section names any more, is restored as found.
s3_root=$(run "$SRC" tc qdisc show dev s3 | awk '/ root/ { print $2 }')
ip -n "$SRC" route replace default via 10.9.3.2 dev s3
i=0
while [ "$(setting s3 rate_bps)" != 12000000 ] || run "$SRC" shaper stats --iface s1 >/dev/null 2>&1; do
	i=$((i + 1))
	[ $i -gt 20 ] && { tail -5 /tmp/shaper.log >&2; fail "the default route's section did not follow it to s3"; }
	sleep 0.1
done
[ "$(setting s3 isolation)" = flows ] || fail "s3 did not take the default route's section's isolation"
[ "$(run "$SRC" tc qdisc show dev s3 | awk '/ root/ { print $2 }')" = "$s3_root" ] ||
	fail "s3's qdisc was replaced, not changed in place"
[ "$(qdisc_state s1)" = "$original_s1" ] || fail "s1 not restored when the default route left it"
log "the default route moved to s3, followed by poll $((i + 1)) (100 ms apart): $(grep -E 's1|s3' /tmp/shaper.log | tail -2 | tr '\n' ' ')"

shaper_stop
for n in 0 1 2 3; do
	now=$(qdisc_state "s$n")
	[ "$now" = "$(eval echo "\"\$original_s$n\"")" ] || fail "s$n not left as found: [$now]"
done
[ -z "$(ls /run/shaper/*.json /run/shaper/*.sock 2>/dev/null)" ] || fail "state left behind: $(ls /run/shaper)"
pair_down
echo "e2e-interfaces: ok"
