#!/bin/sh
# End to end: the ACK filter on a congested uplink, on the booted kernel. A download whose ACKs
# leave through a narrow shaped egress is limited by how many ACKs fit; the filter must drop
# covered ones (reading the options Linux puts on them: timestamps, SACK), keep none for options
# it cannot read, and keep the download going.
#
# Usage: e2e-ackfilter.sh [UPLINK_KBIT [DOWNLINK_MBIT]]   (default: 100, 30)
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

UPLINK=${1:-100}kbit
DOWNLINK=${2:-30}mbit
SECONDS_PER_RUN=${E2E_SECONDS:-8}
# The download with shaper's filter, against CAKE's with its ack-filter at the same rates in the
# same boot. shaper's own `off` carries three to four times CAKE's here (16.6-25.0 against
# 5.7-6.6 Mbit/s on 6.12), and the filter's gain over it varies from run to run (conservative
# 0.8-1.6x, aggressive 1.7x), so that is measured in the lab (asymmetric-acks-100k); this test
# guards that the filter works on the booted kernel and does not starve the download.
MIN_OF_CAKE=0.5
# A pure ACK with timestamps on the wire: 66 bytes of frame, 20 of preamble and gap.
ACK_WIRE_BITS=688

# filter_field FIELD: a counter of the running shaper's ACK filter (seen, dropped, or a keep
# reason such as unknown_option).
filter_field() {
	ip netns exec "$SRC" shaper stats --iface s0 --json | tr -d ' \n' |
		sed -n 's/.*"ack_filter":\({[^}]*}[^}]*}\).*/\1/p' |
		sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p"
}

pair_up
# The downlink: a token bucket on the sender's side, as the link's own rate.
ip netns exec "$DST" tc qdisc replace dev d0 root tbf rate "$DOWNLINK" burst 32k latency 100ms

ip netns exec "$SRC" tc qdisc replace dev s0 root cake bandwidth "$UPLINK" besteffort
cake_off=$(download_mbit "$SECONDS_PER_RUN" 1) || exit 1
ip netns exec "$SRC" tc qdisc replace dev s0 root cake bandwidth "$UPLINK" besteffort ack-filter
cake_on=$(download_mbit "$SECONDS_PER_RUN" 1) || exit 1
ip netns exec "$SRC" tc qdisc del dev s0 root
log "CAKE at $UPLINK up: download $cake_off Mbit/s, with ack-filter $cake_on"

shaper_start --iface s0 --rate "$UPLINK"
off=$(download_mbit "$SECONDS_PER_RUN" 1) || exit 1
shaper_stop
log "shaper at $UPLINK up: download $off Mbit/s without the filter"

for mode in conservative aggressive; do
	shaper_start --iface s0 --rate "$UPLINK" --ack-filter "$mode"
	counted=$(byte_counters "$SRC" s0)
	on=$(download_mbit "$SECONDS_PER_RUN" 1) || exit 1
	check_accounting "$SRC" s0 "$counted" "$mode"
	seen=$(filter_field seen) dropped=$(filter_field dropped) unknown=$(filter_field unknown_option)
	kept=$(ip netns exec "$SRC" shaper stats --iface s0 | sed -n 's/.*kept: \(.*\); sent ahead.*/\1/p')
	shaper_stop
	log "shaper --ack-filter $mode: download $on Mbit/s ($(ratio "$on" "$off")x); ACKs seen $seen, dropped $dropped, kept: $kept"
	[ "${seen:-0}" -gt 0 ] || fail "$mode: the filter saw no ACKs"
	# The receiver acknowledges every second segment, or fewer when it runs late and takes a
	# batch at once (stretch ACKs; the emulated guest is often late): in one CI run on 6.12 it
	# sent 1,344 ACKs in 9 s, what the uplink carries, and nothing needed dropping. When it
	# offers more than half as much again as the uplink carries, most are covered by a later
	# one with two of the flow's ACKs scheduled ahead (60-85 % dropped on 6.12).
	offered=$(awk -v n="${seen:-0}" -v bits="$ACK_WIRE_BITS" -v up="${UPLINK%kbit}" \
		-v t="$SECONDS_PER_RUN" 'BEGIN { printf "%.2f", n * bits / (up * 1000 * (t + 1)) }')
	if awk -v o="$offered" 'BEGIN { exit !(o >= 1.5) }'; then
		[ "${dropped:-0}" -ge $((seen / 4)) ] ||
			fail "$mode: ACKs offered at ${offered}x the uplink, the filter dropped $dropped of $seen"
	else
		log "$mode: ACKs offered at ${offered}x the uplink: not congested, no drops required"
	fi
	[ "${unknown:-1}" -eq 0 ] || fail "$mode: $unknown ACKs kept for options the filter should read"
	awk -v a="$on" -v c="$cake_on" -v m="$MIN_OF_CAKE" 'BEGIN { exit !(a >= m * c) }' ||
		fail "$mode: download $on Mbit/s, less than $MIN_OF_CAKE of CAKE's $cake_on with its filter"
done

pair_down
