#!/bin/sh
# The demo: a veth link between two namespaces, measured unshaped, then shaped by shaper, then
# unshaped again after shaper exits.  Usage: demo.sh [RATE]   (default 100mbit)
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

RATE=${1:-100mbit}
pair_up
echo
echo "shaper demo on $(uname -r): veth between two network namespaces, iperf3 TCP"
echo
unshaped=$(goodput_mbit 4 1) || exit 1
printf '  %-34s %10s Mbit/s\n' "unshaped:" "$unshaped"
shaper_start --iface s0 --rate "$RATE"
shaped=$(goodput_mbit 6 1) || exit 1
printf '  %-34s %10s Mbit/s\n' "shaper run --rate $RATE:" "$shaped"
echo
ip netns exec "$SRC" shaper stats --iface s0 | sed 's/^/    /'
shaper_stop
again=$(goodput_mbit 4 1) || exit 1
printf '  %-34s %10s Mbit/s\n' "after shaper exits:" "$again"
echo
echo "  (goodput of 1500-byte TCP at a wire rate is at most 1448/1514 = 95.6% of it)"
pair_down
