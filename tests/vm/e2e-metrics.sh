#!/bin/sh
# End to end: `shaper run --metrics` serves, while it shapes a loaded link, Prometheus metrics
# that promtool (Prometheus's own parser and linter) accepts and whose counters agree with
# `shaper stats --json` read around the same scrape; /healthz and /readyz answer 200, other
# paths 404; clients that send nothing hold neither the control loop nor a scrape back; an
# address in use fails the start before the interface is touched; after exit nothing listens.
# shaper runs with only the capabilities its DaemonSet and systemd unit grant (CAP_BPF,
# CAP_NET_ADMIN, CAP_PERFMON: no CAP_SYS_ADMIN to open maps by id), and everything fq sent under
# load went through it (the accounting invariant), with nothing "repaired" that nobody changed.
#
# Then, as in a DaemonSet's rolling update: a shaper started with `--when-replaced wait` is
# replaced by a `shaper run --replace`; it stays alive, /readyz 503 (replaced), /healthz 200
# beyond the time a stalled control loop fails it, and exits 0 on SIGTERM, leaving s0 shaped
# by the new one. Those two run in src's network only (nsenter, not `ip netns exec`, which
# hides bpffs, through which the data path is handed over).
#
# Usage: e2e-metrics.sh
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

RATE_MBIT=50
PORT=9101
URL=http://127.0.0.1:$PORT
LOAD_SECONDS=12

command -v promtool >/dev/null || fail "promtool is not in the VM image"
pair_up
original=$(qdisc_state s0)

# fetch_from BASE PATH OUT [WGET-ARGS...]: requests PATH from the endpoint at BASE in src, the
# body into OUT; prints the HTTP status (empty when nothing answered).
fetch_from() {
	fetch_base=$1 fetch_path=$2 fetch_out=$3
	shift 3
	run "$SRC" timeout 10 wget -S -q -O "$fetch_out" "$@" "$fetch_base$fetch_path" 2>/tmp/wget.err
	grep -o 'HTTP/1\.[01] [0-9]*' /tmp/wget.err | head -1 | cut -d' ' -f2
}

# fetch PATH OUT [WGET-ARGS...]: the same from the endpoint at $URL.
fetch() {
	fetch_from "$URL" "$@"
}

# metric FILE NAME [LABEL...]: the value of the sample of NAME in FILE having every LABEL
# (as `key="value"`); fails unless exactly one sample matches.
metric() {
	metric_file=$1 metric_name=$2
	shift 2
	metric_lines=$(grep -E "^$metric_name(\{| )" "$metric_file")
	for label in "$@"; do
		metric_lines=$(echo "$metric_lines" | grep -F "$label")
	done
	[ -n "$metric_lines" ] && [ "$(echo "$metric_lines" | wc -l)" -eq 1 ] ||
		fail "not one sample of $metric_name $*: [$metric_lines]"
	echo "$metric_lines" | awk '{ print $NF }'
}

# repaired_nothing LOG: fails if the shaper that wrote LOG repaired something; nobody changes
# anything behind its back here.
repaired_nothing() {
	repairs=$(grep "behind shaper's back" "$1" | head -3)
	[ -z "$repairs" ] || fail "$1: shaper repaired what nobody changed: $repairs"
}

# stats_json: `shaper stats --json` of the egress, on one line.
stats_json() {
	run "$SRC" shaper stats --iface s0 --json | tr -d ' \n'
}

# An address in use fails the start, and the interface is left as it was.
run "$SRC" nc -l -p 9102 >/dev/null 2>&1 &
holder=$!
sleep 0.3
if run "$SRC" shaper run --iface s0 --rate "${RATE_MBIT}mbit" --metrics 127.0.0.1:9102 2>/tmp/inuse.err; then
	fail "shaper started on a metrics address in use"
fi
kill "$holder" 2>/dev/null
grep -q "metrics endpoint 127.0.0.1:9102" /tmp/inuse.err || fail "address in use: unexpected error: $(cat /tmp/inuse.err)"
[ "$(qdisc_state s0)" = "$original" ] || fail "a start refused for its metrics address changed the qdisc"

EGRESS='interface="s0",direction="egress"'
INGRESS='interface="s0",direction="ingress"'
SHAPER_AS=$ONLY_SHAPER_CAPS
shaper_start --iface s0 --rate "${RATE_MBIT}mbit" --ingress-rate 100mbit --metrics "$PORT" --metrics-top-hosts 3
SHAPER_AS=
caps=$(awk '/^CapEff:/ { print $2 }' /proc/$SHAPER_PID/status)
[ "$caps" = "$ONLY_SHAPER_CAPS_HEX" ] || fail "shaper runs with capabilities $caps, not $ONLY_SHAPER_CAPS_HEX"
listening=$(run "$SRC" ss -H -ltnp | grep "pid=$SHAPER_PID,")
echo "$listening" | grep -q "127.0.0.1:$PORT " || fail "shaper does not listen on 127.0.0.1:$PORT alone: [$listening]"
[ "$(echo "$listening" | wc -l)" -eq 1 ] || fail "shaper listens on more than its metrics address: [$listening]"

counted=$(byte_counters "$SRC" s0)
run "$SRC" iperf3 -c 10.9.0.2 -t "$LOAD_SECONDS" -P 2 >/tmp/iperf3.out 2>&1 &
load=$!
sleep 4

[ "$(fetch /healthz /tmp/healthz)" = 200 ] || fail "/healthz: $(cat /tmp/wget.err /tmp/healthz)"
[ "$(fetch /readyz /tmp/readyz)" = 200 ] || fail "/readyz: $(cat /tmp/wget.err /tmp/readyz)"
[ "$(fetch /nothing /tmp/nothing)" = 404 ] || fail "/nothing: $(cat /tmp/wget.err)"
[ "$(fetch /metrics /tmp/post --post-data x)" = 405 ] || fail "POST /metrics: $(cat /tmp/wget.err)"

# The scrape between two reads of the same counters: every counter of the scrape lies between
# them, and they are apart by no more than the rate over the time they took (wire bytes at
# 50 Mbit/s: 6.25 MB/s, plus a second of slack for a slow VM's scheduling).
t0=$(now_ms)
before=$(stats_json)
code=$(fetch /metrics /tmp/metrics.txt)
after=$(stats_json)
t1=$(now_ms)
[ "$code" = 200 ] || fail "/metrics: $code $(cat /tmp/wget.err)"
lint=$(promtool check metrics </tmp/metrics.txt 2>&1) || fail "promtool check metrics: $lint"
[ -z "$lint" ] || fail "promtool check metrics: $lint"
log "promtool check metrics: no problem in $(wc -l </tmp/metrics.txt) lines"

# between NAME METRIC_VALUE KEY: the scrape's value of NAME within the stats' KEY around it.
between() {
	lo=$(echo "$before" | json_num "$3") hi=$(echo "$after" | json_num "$3")
	[ -n "$lo" ] && [ -n "$hi" ] || fail "stats --json has no $3"
	awk -v v="$2" -v lo="$lo" -v hi="$hi" 'BEGIN { exit !(v >= lo && v <= hi) }' ||
		fail "$1 = $2, not between stats' $3 before ($lo) and after ($hi)"
	echo "$lo $hi"
}
bytes=$(metric /tmp/metrics.txt shaper_bytes_total "$EGRESS")
set -- $(between shaper_bytes_total "$bytes" bytes)
gap_ms=$((t1 - t0))
awk -v d=$(($2 - $1)) -v ms="$gap_ms" -v r="$RATE_MBIT" 'BEGIN { exit !(d <= r * 1e6 / 8 * (ms + 1000) / 1000) }' ||
	fail "stats' bytes moved by $(($2 - $1)) in $gap_ms ms around the scrape: more than the rate explains"
[ "$1" -gt 0 ] || fail "nothing shaped under load"
log "scrape: $bytes bytes, stats before $1 and after $2 ($gap_ms ms apart)"
between shaper_packets_total "$(metric /tmp/metrics.txt shaper_packets_total "$EGRESS")" packets >/dev/null
for reason in horizon codel blue overlimit; do
	between "dropped $reason" "$(metric /tmp/metrics.txt shaper_dropped_packets_total "$EGRESS" "reason=\"$reason\"")" "$reason" >/dev/null
done
for reason in non_ip malformed unconfigured no_state; do
	between "passed $reason" "$(metric /tmp/metrics.txt shaper_passed_unshaped_packets_total "$EGRESS" "reason=\"$reason\"")" "$reason" >/dev/null
done
between ecn_marked "$(metric /tmp/metrics.txt shaper_ecn_marked_packets_total "$EGRESS")" ecn_marked >/dev/null
between sparse "$(metric /tmp/metrics.txt shaper_sparse_packets_total "$EGRESS")" sparse >/dev/null
# The sum in seconds, a float: compared in microseconds, a microsecond either way.
sum_us=$(metric /tmp/metrics.txt shaper_scheduled_delay_seconds_sum "$EGRESS" | awk '{ printf "%.0f", $1 * 1e6 }')
lo=$(echo "$before" | json_num delay_sum_ns) hi=$(echo "$after" | json_num delay_sum_ns)
awk -v v="$sum_us" -v lo="$lo" -v hi="$hi" 'BEGIN { exit !(v >= lo / 1000 - 1 && v <= hi / 1000 + 1) }' ||
	fail "delay sum $sum_us us not between stats' $lo and $hi ns"
[ "$(metric /tmp/metrics.txt shaper_rate_bytes_per_second "$EGRESS")" = 6250000 ] || fail "egress rate"
[ "$(metric /tmp/metrics.txt shaper_rate_bytes_per_second "$INGRESS")" = 12500000 ] || fail "ingress rate"
metric /tmp/metrics.txt shaper_info "$INGRESS" 'device="ifb4s0"' >/dev/null

# The delay histogram: cumulative, its +Inf bucket its count, its count the frames of stats'
# histogram around the scrape.
grep "^shaper_scheduled_delay_seconds_bucket{$EGRESS," /tmp/metrics.txt | awk '{ print $NF }' >/tmp/buckets
[ "$(wc -l </tmp/buckets)" -eq 16 ] || fail "not 16 delay buckets: $(cat /tmp/buckets)"
sort -n -c /tmp/buckets || fail "delay buckets not cumulative: $(cat /tmp/buckets)"
count=$(metric /tmp/metrics.txt shaper_scheduled_delay_seconds_count "$EGRESS")
[ "$(tail -1 /tmp/buckets)" = "$count" ] || fail "+Inf bucket $(tail -1 /tmp/buckets) is not the count $count"
frames() { echo "$1" | grep -o '"frames":[0-9]*' | awk -F: '{ s += $2 } END { print s + 0 }'; }
[ "$count" -ge "$(frames "$before")" ] && [ "$count" -le "$(frames "$after")" ] ||
	fail "delay histogram count $count not between stats' frames $(frames "$before") and $(frames "$after")"

# The control loop and the host table under load.
[ "$(metric /tmp/metrics.txt shaper_active_hosts "$EGRESS")" -ge 1 ] || fail "no active host under load"
awk -v f="$(metric /tmp/metrics.txt shaper_active_flows "$EGRESS")" 'BEGIN { exit !(f > 0) }' ||
	fail "no active flow under load"
hosts=$(grep -c "^shaper_host_bytes_total{$EGRESS," /tmp/metrics.txt)
[ "$hosts" -ge 1 ] && [ "$hosts" -le 3 ] || fail "$hosts top hosts, not 1 to 3"
ticks0=$(metric /tmp/metrics.txt shaper_control_ticks_total "$EGRESS")

# Clients that connect and send nothing: the control loop keeps ticking and scrapes are
# still answered at once.
idle=
for i in 1 2 3; do
	sleep 20 | run "$SRC" nc 127.0.0.1 "$PORT" >/dev/null 2>&1 &
	idle="$idle $!"
done
sleep 1
s0=$(now_ms)
[ "$(fetch /metrics /tmp/metrics2.txt)" = 200 ] || fail "/metrics beside idle clients: $(cat /tmp/wget.err)"
took=$(($(now_ms) - s0))
[ "$took" -lt 2000 ] || fail "a scrape beside idle clients took $took ms"
ticks1=$(metric /tmp/metrics2.txt shaper_control_ticks_total "$EGRESS")
[ $((ticks1 - ticks0)) -ge 5 ] || fail "the control loop ticked $((ticks1 - ticks0)) times in over a second beside idle clients"
late=$(metric /tmp/metrics2.txt shaper_control_tick_lateness_seconds_count)
[ "$late" -ge "$ticks1" ] || fail "lateness counted $late ticks of $ticks1"
log "beside 3 idle clients: scrape in $took ms, $((ticks1 - ticks0)) ticks since the last one"
kill $idle 2>/dev/null
wait "$load" || fail "iperf3: $(cat /tmp/iperf3.out)"
check_accounting "$SRC" s0 "$counted" "the load under shaper's own capabilities"
repaired_nothing /tmp/shaper.log

shaper_stop
[ "$(qdisc_state s0)" = "$original" ] || fail "qdisc not restored"
[ -z "$(fetch /healthz /tmp/gone)" ] || fail "the endpoint still answers after exit"
listening=$(run "$SRC" ss -H -ltn "sport = :$PORT")
[ -z "$listening" ] || fail "something still listens on $PORT after exit: $listening"

# Replaced, then waiting (--when-replaced wait): the old one on PORT, the new one on PORT2.
PORT2=9103
grep -q ' /sys/fs/bpf bpf ' /proc/mounts || mount -t bpf bpf /sys/fs/bpf || fail "mounting bpffs"
# replacing_start LOG PORT ARGS...: `shaper run` with only shaper's capabilities in src's
# network (this shell's mounts), its metrics on PORT; its pid in STARTED.
replacing_start() {
	start_log=$1 start_port=$2
	shift 2
	nsenter --net=/run/netns/"$SRC" $ONLY_SHAPER_CAPS shaper run --iface s0 --rate "${RATE_MBIT}mbit" \
		--metrics "$start_port" --when-replaced wait "$@" >"$start_log" 2>&1 &
	STARTED=$!
}
# ready_on PORT PID LOG: until PORT's /readyz answers 200; fails if PID ends first.
ready_on() {
	waited=0
	until [ "$(fetch_from "http://127.0.0.1:$1" /readyz /tmp/ready_on)" = 200 ]; do
		waited=$((waited + 1))
		if [ $waited -gt 100 ] || ! kill -0 "$2" 2>/dev/null; then
			cat "$3" >&2
			fail "shaper (pid $2) did not become ready on port $1"
		fi
		sleep 0.1
	done
}
replacing_start /tmp/old.log "$PORT" --keep --replace
old=$STARTED
ready_on "$PORT" "$old" /tmp/old.log
replacing_start /tmp/new.log "$PORT2" --replace
new=$STARTED
ready_on "$PORT2" "$new" /tmp/new.log
grep -q "waiting for SIGTERM or SIGINT" /tmp/old.log || { cat /tmp/old.log >&2; fail "the replaced shaper does not say it waits"; }
# Beyond the 5 s after which a control loop that stopped ticking fails /healthz.
sleep 6
kill -0 "$old" 2>/dev/null || { cat /tmp/old.log >&2; fail "the replaced shaper with --when-replaced wait exited"; }
[ "$(fetch /readyz /tmp/readyz_old)" = 503 ] || fail "the replaced shaper's /readyz: $(cat /tmp/wget.err /tmp/readyz_old)"
# wget keeps no body of an error answer: the reason is read with nc.
reason=$(printf 'GET /readyz HTTP/1.0\r\n\r\n' | run "$SRC" nc 127.0.0.1 "$PORT" | tail -1)
case "$reason" in replaced:*) ;; *) fail "the replaced shaper's /readyz says [$reason]" ;; esac
[ "$(fetch /healthz /tmp/healthz_old)" = 200 ] || fail "the replaced shaper's /healthz: $(cat /tmp/wget.err /tmp/healthz_old)"
program=$(run "$SRC" shaper stats --iface s0 --json | tr -d ' \n')
echo "$program" | grep -q "\"pid\":$new," || fail "s0 is not the new shaper's: $program"
kill -TERM "$old"
wait "$old" || { cat /tmp/old.log >&2; fail "the replaced shaper exited non-zero on SIGTERM"; }
# Still the new one's: its program attached, its stats and readiness as before.
sleep 0.5
after=$(run "$SRC" shaper stats --iface s0 --json | tr -d ' \n') || fail "shaper stats after the old one exited"
echo "$after" | grep -q "\"pid\":$new," || fail "s0 is not the new shaper's after the old one exited: $after"
echo "$after" | grep -q '"egress_programs":\[[0-9]' || fail "no program at s0's egress after the old one exited: $after"
[ "$(fetch_from "http://127.0.0.1:$PORT2" /readyz /tmp/readyz_new)" = 200 ] || fail "the new shaper is not ready after the old one exited"
[ "$(qdisc_state s0)" != "$original" ] || fail "s0 was restored when the replaced shaper exited"
kill -TERM "$new"
wait "$new" || { cat /tmp/new.log >&2; fail "the new shaper exited with an error"; }
[ "$(qdisc_state s0)" = "$original" ] || fail "qdisc not restored by the new shaper"
repaired_nothing /tmp/old.log
repaired_nothing /tmp/new.log
log "replaced with --when-replaced wait: alive and 503 on /readyz, 200 on /healthz after 6 s; exited 0 on SIGTERM, s0 left to the new one"

echo "RESULT kernel=$(uname -r) metrics_lines=$(wc -l </tmp/metrics.txt) scrape_gap_ms=$gap_ms idle_scrape_ms=$took"
pair_down
log "e2e-metrics: ok"
