#!/bin/sh
# The best-effort flows' level under a DiffServ load, sampled from `shaper stats --hosts` every
# 0.2 s: 32 TCP flows, a 2 Mbit/s UDP stream marked EF and a ping every 10 ms, shaped at
# 10 Mbit/s (the load of lab/scenarios/diffserv-tins.toml without its modem). Prints the levels,
# then what TCP and the EF stream carried and the ping's summary. A diagnostic, not a test.
#
# Usage: cargo xtask vm --kernel 6.1 -- tests/vm/tin-levels.sh [DIFFSERV]   (default diffserv4)
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

pair_up
# pair_up started the server for TCP on iperf3's default port; the EF stream gets its own.
ip netns exec "$DST" iperf3 -s -p 5202 -D
sleep 0.5
shaper_start --iface s0 --rate 10mbit --diffserv "${1:-diffserv4}"
ip netns exec "$SRC" iperf3 -c 10.9.0.2 -p 5201 -P 32 -t 14 >/tmp/tcp.txt &
tcp=$!
ip netns exec "$SRC" iperf3 -c 10.9.0.2 -p 5202 -u -b 2M -l 1400 --tos 0xb8 -t 14 >/tmp/udp.txt &
udp=$!
ip netns exec "$SRC" ping -i 0.01 -c 1300 -q 10.9.0.2 >/tmp/ping.txt &
pings=$!
sleep 4
i=0
while [ $i -lt 40 ]; do
	# The first host row is the one with the most bytes: best effort's.
	ip netns exec "$SRC" shaper stats --iface s0 --hosts | awk 'NR == 2 { print $6 }'
	sleep 0.2
	i=$((i + 1))
done | tr '\n' ' '
echo
wait $tcp $udp $pings
grep -E "SUM.*receiver" /tmp/tcp.txt
grep -E "receiver" /tmp/udp.txt | tail -1
tail -1 /tmp/ping.txt
shaper_stop
pair_down
