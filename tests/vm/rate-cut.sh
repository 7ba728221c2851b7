#!/bin/sh
# A deep rate cut under load: what `--autorate` does when the link slows, and `shaper set
# --rate` by hand. A client uploads through a router whose uplink is a bloated modem (a token
# bucket at 50 Mbit/s, 1.6 MB of buffer, RTT 30 ms), shaping its own uplink above the link
# (60 Mbit/s), so its senders' windows grow to fill the modem's buffer. Then the rate is cut to
# CUT Mbit/s, far below the link, with those windows in flight. Each flow's queue at its new
# pace overflows the hard limit at once; the senders must come down to the new rate without
# stalling. CAKE runs the same (bandwidth changed in place) in the same boot.
#
# Promises, for shaper, each with its figures when broken:
#   - from SETTLE s after the cut to the run's end, goodput is at least GOODPUT of TCP's
#     ceiling at the new rate, and no second of it carries under STALL of that ceiling.
#
# Usage: [HOGS=1] rate-cut.sh [SECONDS_EACH_SIDE [CUT_MBIT]]   (default 10 s, 10 Mbit/s; HOGS=1:
#        both runs beside a busy loop on every CPU)
# Prints "RESULT rate-cut ..." lines for the record; not in the suite (docs/benchmarks.md).
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

PHASE=${1:-10}
CUT=${2:-10}
SETTLE=2
GOODPUT=0.80
STALL=0.25
FLOWS=4
BUFFER=1600000
OUT=${SHAPER_OUT:-/tmp/rate-cut}
mkdir -p "$OUT"

routed_up
run rtr tc qdisc add dev rc root netem delay 15ms limit 100000
run rtr tc qdisc add dev rs root handle 1: netem delay 15ms limit 100000
run rtr tc qdisc add dev rs parent 1:1 handle 2: tbf rate 50mbit burst 62500 limit "$BUFFER"
# iperf3's reverse mode from the server's side: its per-second reports are the receiver's.
run cli iperf3 -s -D >/dev/null
sleep 0.3
if [ -n "${HOGS:-}" ]; then
	hogs_start
	trap 'kill $HOG_PIDS 2>/dev/null' EXIT
fi

# load NAME CUT_COMMAND...: the uploads for two phases, CUT_COMMAND run between them; leaves
# $OUT/NAME.iperf.
load() {
	name=$1
	shift
	run srv iperf3 -c 10.1.0.2 -R -t $((PHASE * 2)) -P "$FLOWS" -i 1 --format k >"$OUT/$name.iperf" 2>&1 &
	iperf=$!
	sleep "$PHASE"
	"$@" || fail "$name: the cut failed"
	wait "$iperf" || fail "$name: iperf3: $(tail -5 "$OUT/$name.iperf")"
}

# seconds NAME: the receiver's per-second sums after the cut's settling, Mbit/s, one a line.
seconds() {
	awk -v from=$((PHASE + SETTLE)) -v to=$((PHASE * 2)) '
		/\[SUM\]/ && /sec/ && !/sender|receiver/ {
			split($2, t, "-"); s = t[1] + 0
			if (s >= from && s < to)
				for (k = 1; k <= NF; k++) {
					if ($k == "Kbits/sec") print $(k - 1) / 1000
					if ($k == "Mbits/sec") print $(k - 1)
				}
		}' "$OUT/$1.iperf"
}

# report NAME: "mean least" of those seconds.
report() {
	seconds "$1" | awk '{ s += $1; n++; if (n == 1 || $1 < m) m = $1 }
		END { printf "%.2f %.2f\n", (n ? s / n : 0), m }'
}

shaper_start_in cli c0 --iface c0 --rate 60mbit
load shaper run cli shaper set --iface c0 --rate "${CUT}mbit"
run cli shaper stats --iface c0 >"$OUT/shaper.stats" 2>&1
shaper_stop
set -- $(report shaper)
shaper_mean=$1 shaper_least=$2
drops=$(sed -n 's/.*dropped: //p' "$OUT/shaper.stats")
echo "RESULT rate-cut shaper hogs=${HOGS:-0} 60->${CUT}mbit mean=${shaper_mean} least=${shaper_least} dropped: $drops"

run cli tc qdisc replace dev c0 root cake bandwidth 60mbit besteffort
load cake run cli tc qdisc change dev c0 root cake bandwidth "${CUT}mbit"
run cli tc -s qdisc show dev c0 >"$OUT/cake.stats" 2>&1
run cli tc qdisc del dev c0 root
set -- $(report cake)
echo "RESULT rate-cut cake hogs=${HOGS:-0} 60->${CUT}mbit mean=$1 least=$2"

ceiling=$(awk -v c="$CUT" 'BEGIN { printf "%.2f", c * 1448 / 1514 }')
problems=
awk -v a="$shaper_mean" -v c="$ceiling" -v g="$GOODPUT" 'BEGIN { exit !(a < c * g) }' &&
	problems="$problems; goodput after the cut $shaper_mean Mbit/s under $GOODPUT of $ceiling"
awk -v a="$shaper_least" -v c="$ceiling" -v g="$STALL" 'BEGIN { exit !(a < c * g) }' &&
	problems="$problems; a second at $shaper_least Mbit/s, under $STALL of $ceiling (a stall)"
[ -z "$problems" ] || fail "rate cut${problems}"
echo "PASS: rate-cut"
