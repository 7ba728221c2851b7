#!/bin/sh
# End to end: `--autorate` on a link whose rate changes under it. A client uploads through a
# router whose uplink (a bloated modem: a token bucket with a deep buffer, RTT 30 ms) steps
# 50 -> 20 -> 40 Mbit/s, a phase each. The client shapes its own uplink, in turn:
#   shaper --autorate MIN..MAX with the server as its reflector;
#   CAKE at 50 Mbit/s (right for the first phase: bloats when the link drops);
#   CAKE at 20 Mbit/s (right for the second: wastes the rest).
# Each runs the same load (4 TCP uploads, pings every 100 ms) through the same schedule, in
# the same boot. Promises, each with its figures when broken:
#   - shaper's rate (`shaper stats`, every 250 ms) settles within SETTLE s of each step: from
#     then to the phase's end, IN_BAND of its samples lie within BAND_LOW..BAND_HIGH of the
#     link's rate (it probes past the link and is cut back below it, over and over);
#   - the pings' p99 under shaper is within DELAY_MS of the idle path's median;
#   - shaper's goodput in each phase is at least GOODPUT of what the phase's rate allows (TCP's
#     ceiling at the link's rate).
# The CAKE runs are the reference: printed, and held to nothing but running.
#
# Usage: [HOGS=1] e2e-autorate.sh [PHASE_SECONDS]   (default 15; HOGS=1: every run beside a
#        busy loop on every CPU)
# Prints one "RESULT ..." line per run for the record.
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

PHASE=${1:-15}
STEPS="50 20 40"
RANGE=10mbit..60mbit
SETTLE=2
BAND_LOW=0.75
BAND_HIGH=1.15
IN_BAND=0.80
DELAY_MS=15
GOODPUT=0.80
FLOWS=4
# The modem's buffer: 250 ms at the first phase's rate, what a cable modem ships with.
BUFFER=1600000
OUT=${SHAPER_OUT:-/tmp/autorate}
mkdir -p "$OUT"

routed_up
# The path: 15 ms each way; the uplink's modem a token bucket under the delay.
run rtr tc qdisc add dev rc root netem delay 15ms limit 100000
run rtr tc qdisc add dev rs root handle 1: netem delay 15ms limit 100000
modem() {
	run rtr tc qdisc "$1" dev rs parent 1:1 handle 2: tbf rate "$2mbit" burst 62500 limit "$BUFFER"
}
modem add 50
# The uploads are iperf3's reverse mode from the server's side, so that its per-second
# reports are the receiver's: what crossed the link, not what the client queued.
run cli iperf3 -s -D >/dev/null
sleep 0.3
original=$(run cli tc qdisc show dev c0 | sed 's/ refcnt [0-9]*//' | sort)

if [ -n "${HOGS:-}" ]; then
	hogs_start
	trap 'kill $HOG_PIDS 2>/dev/null' EXIT
fi

idle=$(run cli ping -c 20 -i 0.1 10.2.0.2 | sed -n 's/.*time=\([0-9.]*\) ms.*/\1/p' | sort -n |
	awk '{ v[NR] = $1 } END { print v[int(NR / 2) + 1] }')
[ -n "$idle" ] || fail "the path does not answer pings"
echo "== idle RTT median $idle ms" >&2

# load NAME: the schedule under the load; leaves $OUT/NAME.{iperf,ping,rates}.
load() {
	modem change 50
	total=$((PHASE * 3))
	run srv iperf3 -c 10.1.0.2 -R -t "$total" -P "$FLOWS" -i 1 --format k >"$OUT/$1.iperf" 2>&1 &
	iperf=$!
	run cli ping -i 0.1 -c $((total * 10 - 10)) 10.2.0.2 >"$OUT/$1.ping" 2>&1 &
	pinger=$!
	: >"$OUT/$1.rates"
	start=$(now_ms)
	(
		sleep "$PHASE"
		modem change 20
		sleep "$PHASE"
		modem change 40
	) &
	schedule=$!
	if [ "$1" = shaper ]; then
		while kill -0 "$iperf" 2>/dev/null; do
			r=$(run cli shaper stats --iface c0 --json 2>/dev/null | json_num rate_bps)
			[ -n "$r" ] && echo "$(($(now_ms) - start)) $r" >>"$OUT/$1.rates"
			sleep 0.25
		done
	fi
	wait "$iperf" || fail "$1: iperf3: $(tail -5 "$OUT/$1.iperf")"
	wait "$pinger"
	wait "$schedule"
}

# phase_goodput NAME I: the mean of the receiver's per-second sums over phase I's seconds
# (1-based phases), the step's settling included: what the phase carried, Mbit/s.
phase_goodput() {
	awk -v p="$PHASE" -v i="$2" '
		/\[SUM\]/ && /sec/ && !/sender|receiver/ {
			split($2, t, "-"); s = t[1] + 0
			if (s >= (i - 1) * p && s < i * p) {
				for (k = 1; k <= NF; k++) {
					if ($k == "Kbits/sec") { sum += $(k - 1) / 1000; n++ }
					if ($k == "Mbits/sec") { sum += $(k - 1); n++ }
				}
			}
		}
		END { printf "%.2f\n", (n ? sum / n : 0) }' "$OUT/$1.iperf"
}

# p99 NAME: the pings' 99th percentile, ms.
p99() {
	sed -n 's/.*time=\([0-9.]*\) ms.*/\1/p' "$OUT/$1.ping" | sort -n |
		awk '{ v[NR] = $1 } END { i = int(NR * 0.99 + 0.5); if (i < 1) i = 1; print v[i] }'
}

# settled PHASE_INDEX LINK_MBIT: "FRACTION MEDIAN": of shaper's rate samples from SETTLE s
# after the phase's step to its end, the fraction within BAND_LOW..BAND_HIGH of LINK_MBIT, and
# their median (Mbit/s).
settled() {
	awk -v p="$PHASE" -v i="$1" -v link="$2" -v lo="$BAND_LOW" -v hi="$BAND_HIGH" -v s="$SETTLE" '
		{ t = $1 / 1000; r = $2 / 1e6 }
		t >= (i - 1) * p + (i > 1 ? s : 0) && t < i * p {
			n++; v[n] = r
			if (r >= link * lo && r <= link * hi) in_band++
		}
		END {
			if (n == 0) { print 0, 0; exit }
			for (a = 1; a <= n; a++) for (b = a + 1; b <= n; b++) if (v[b] < v[a]) { x = v[a]; v[a] = v[b]; v[b] = x }
			printf "%.2f %.2f\n", in_band / n, v[int((n + 1) / 2)]
		}' "$OUT/shaper.rates"
}

problems=
report() {
	name=$1
	line="RESULT autorate $name hogs=${HOGS:-0} idle=${idle}ms p99=$(p99 "$name")ms"
	i=1
	for link in $STEPS; do
		line="$line phase$i(${link}mbit)=$(phase_goodput "$name" $i)"
		i=$((i + 1))
	done
	echo "$line"
}

# shaper
shaper_start_in cli c0 --iface c0 --rate 50mbit --autorate "$RANGE" --autorate-reflectors 10.2.0.2
grep -q "autorate from round trips to 10.2.0.2" /tmp/shaper.log ||
	fail "shaper did not report its autorate: $(cat /tmp/shaper.log)"
load shaper
run cli shaper stats --iface c0 >"$OUT/shaper.stats" 2>&1
shaper_stop
cp /tmp/shaper.log "$OUT/shaper.log"
[ "$(run cli tc qdisc show dev c0 | sed 's/ refcnt [0-9]*//' | sort)" = "$original" ] ||
	fail "qdisc not restored after shaper"
grep -c "autorate egress: cut" /tmp/shaper.log | sed 's/^/== cuts logged: /' >&2
report shaper
i=1
for link in $STEPS; do
	set -- $(settled $i "$link")
	echo "RESULT autorate shaper phase$i(${link}mbit) in_band=$1 median_rate=$2"
	awk -v f="$1" -v m="$IN_BAND" 'BEGIN { exit !(f < m) }' &&
		problems="$problems; phase $i: ${SETTLE}s after the step only $1 of the rate samples within ${BAND_LOW}..${BAND_HIGH} x ${link} Mbit/s (median $2)"
	got=$(phase_goodput shaper $i)
	want=$(awk -v l="$link" -v g="$GOODPUT" 'BEGIN { printf "%.2f", l * 1448 / 1514 * g }')
	awk -v a="$got" -v b="$want" 'BEGIN { exit !(a < b) }' &&
		problems="$problems; phase $i: goodput $got Mbit/s under $want ($GOODPUT of the ${link} Mbit/s link)"
	i=$((i + 1))
done
shaper_p99=$(p99 shaper)
awk -v p="$shaper_p99" -v i="$idle" -v d="$DELAY_MS" 'BEGIN { exit !(p > i + d) }' &&
	problems="$problems; ping p99 $shaper_p99 ms more than $DELAY_MS ms over the idle $idle ms"

# CAKE fixed at the first phase's rate, then at the second's.
for fixed in 50 20; do
	run cli tc qdisc replace dev c0 root cake bandwidth "${fixed}mbit" besteffort
	load "cake$fixed"
	run cli tc qdisc del dev c0 root
	report "cake$fixed"
done

[ -z "$problems" ] || fail "autorate${problems}"
echo "PASS e2e-autorate"
