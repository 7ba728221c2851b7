#!/bin/sh
# Where shaper's departures run over its rate: FLOWS cubic downloads and a ping every 10 ms
# through shaper at RATE on a veth, every frame's arrival at the far end recorded (tcpdump; a
# veth delivers at once, so arrival is departure). Writes the trace to $SHAPER_OUT/trace.txt
# and shaper's counters to $SHAPER_OUT/stats.txt; tests/vm/departures.py reads them. A
# diagnostic: needs tcpdump on the machine that builds the VM.
#
# Usage: departures.sh [RATE_MBIT] [FLOWS] [SECONDS] [SHAPER-ARGS...]   (default 10 32 12)
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

RATE=${1:-10}
FLOWS=${2:-32}
SECS=${3:-12}
[ $# -ge 3 ] && shift 3 || shift $#
command -v tcpdump >/dev/null || fail "tcpdump is not in the VM (apt-get install tcpdump, then boot again)"
OUT=${SHAPER_OUT:-/tmp}

pair_up
shaper_start --iface s0 --rate "${RATE}mbit" "$@"
ip netns exec "$DST" tcpdump -Z root -i d0 -tt -n -S -l 'tcp or icmp' >"$OUT/trace.txt" 2>"$OUT/tcpdump.err" &
dump=$!
sleep 0.5
ip netns exec "$SRC" ping -i 0.01 -w "$SECS" 10.9.0.2 >"$OUT/ping.txt" 2>&1 &
ip netns exec "$SRC" iperf3 -c 10.9.0.2 -t "$SECS" -P "$FLOWS" -C cubic --format m \
	>"$OUT/iperf.txt" 2>&1 || fail "iperf3: $(cat "$OUT/iperf.txt")"
sleep 1
kill "$dump"
ip netns exec "$SRC" shaper stats --iface s0 >"$OUT/stats.txt" 2>&1
ip netns exec "$SRC" shaper stats --iface s0 --json >"$OUT/stats.json" 2>&1
shaper_stop
echo "RESULT rate=${RATE}mbit flows=$FLOWS goodput_mbit=$(receiver_mbit <"$OUT/iperf.txt") frames=$(wc -l <"$OUT/trace.txt")"
pair_down
