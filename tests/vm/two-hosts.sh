#!/bin/sh
# A diagnostic, not in the suite: the simplest case of a share left unused (issue 46). Two LAN
# machines, each a namespace, routed (no NAT) to a server through a router whose WAN device w0
# is shaped at RATE: a uploads over NA TCP connections (default 1), b over NB (default 8), SECS
# seconds each, first under CAKE `dual-srchost`, then under shaper (SHAPER_ARGS added to its
# command line). For each: both goodputs, w0's wire rate, each sender's TCP segments out and
# retransmitted (from /proc/net/snmp: nstat shares one history file across namespaces), and
# for shaper its hosts' queues twice a second and its counters.
#
#   cargo xtask vm --kernel 6.12 -- tests/vm/two-hosts.sh
#   A_ONE_FRAME=1 B_ONE_FRAME=1: the senders' veths send one frame a packet (gso_max_segs 1)
#   TRACE=1: the control loop's trace in shaper's log, printed at the end
#   HOGS=1: both runs beside a busy loop on every CPU
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

RATE=${RATE:-20}
SECS=${SECS:-10}
NA=${NA:-1}
NB=${NB:-8}
[ -n "${TRACE:-}" ] && SHAPER_AS="env SHAPER_LOG=info,shaper::control=trace"
ROUTER=router

lan_router_up
ip -n server route add 10.77.0.0/16 via 10.78.0.1
[ -n "${A_ONE_FRAME:-}" ] && ip -n lana link set la gso_max_segs 1
[ -n "${B_ONE_FRAME:-}" ] && ip -n lanb link set lb gso_max_segs 1
if [ -n "${HOGS:-}" ]; then
	hogs_start
	trap 'kill $HOG_PIDS 2>/dev/null' EXIT
fi
run server iperf3 -s -D -p 5301 >/dev/null
run server iperf3 -s -D -p 5302 >/dev/null
sleep 0.5

# tcp_counts NS: the namespace's TCP segments in, out and retransmitted so far, then its
# reorderings seen in SACKs and its DSACKs received (spurious retransmissions).
tcp_counts() {
	run "$1" awk '/^Tcp:/ && $2 ~ /^[0-9]/ { printf "%s %s %s ", $11, $12, $13 }' /proc/net/snmp
	run "$1" awk '/^TcpExt:/ { if (!n) { for (i = 2; i <= NF; i++) col[$i] = i; n = 1 } else print $col["TCPSACKReorder"], $col["TCPDSACKRecv"] }' /proc/net/netstat
}

# load: a's and b's uploads, with what the senders and w0 did.
load() {
	before_a=$(tcp_counts lana)
	before_b=$(tcp_counts lanb)
	tx0=$(run "$ROUTER" cat /sys/class/net/w0/statistics/tx_bytes)
	run lana iperf3 -c 10.78.0.2 -p 5301 -P "$NA" -t "$SECS" -O 1 --format k >/tmp/a.out 2>&1 &
	pa=$!
	run lanb iperf3 -c 10.78.0.2 -p 5302 -P "$NB" -t "$SECS" -O 1 --format k >/tmp/b.out 2>&1 &
	pb=$!
	if [ -n "${SHAPER_PID:-}" ]; then
		for _ in $(seq $((SECS * 2))); do
			sleep 0.5
			run "$ROUTER" shaper stats --iface w0 --hosts |
				awk '/10\.77/ { printf "%s queue %s ms, flow level %s; ", $1, $NF, $(NF - 1) } END { print "" }'
		done
	fi
	wait $pa $pb
	tx1=$(run "$ROUTER" cat /sys/class/net/w0/statistics/tx_bytes)
	echo "a $(receiver_mbit </tmp/a.out) b $(receiver_mbit </tmp/b.out) Mbit/s; w0 sent $(((tx1 - tx0) * 8 / (SECS + 1) / 1000)) kbit/s"
	for h in a b; do
		eval before=\$before_$h
		echo "$h: TCP segments in/out/retransmitted, SACK reorderings, DSACKs $(tcp_counts "lan$h") (before: $before)"
	done
}

run "$ROUTER" tc qdisc replace dev w0 root cake bandwidth "${RATE}mbit" besteffort raw dual-srchost ||
	fail "CAKE dual-srchost on w0"
echo "== CAKE dual-srchost"
load
run "$ROUTER" tc -s qdisc show dev w0 | grep -E "dropped" | head -1
run "$ROUTER" tc qdisc del dev w0 root

echo "== shaper ${SHAPER_ARGS:-}"
# shellcheck disable=SC2086 # SHAPER_ARGS is a list of words
shaper_start_in "$ROUTER" w0 --iface w0 --rate "${RATE}mbit" ${SHAPER_ARGS:-}
load
run "$ROUTER" shaper stats --iface w0
run "$ROUTER" shaper stats --iface w0 --hosts | head -5
shaper_stop
[ -n "${TRACE:-}" ] && grep -a "allocation" /tmp/shaper.log | tail -40
topology_down
echo "two-hosts: done"
