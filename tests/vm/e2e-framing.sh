#!/bin/sh
# End to end: `--framing` counts what the bottleneck link sends, as CAKE's keywords of the same
# names do. On the same veth at the same rate, in the same boot, bulk TCP's goodput under
# shaper with each keyword is within TOLERANCE % of CAKE's with that keyword, and both sit at
# the ceiling the keyword's arithmetic gives (a full frame's bytes on the link). Then a running
# shaper's framing is changed in place (`shaper set --framing`) and its goodput follows.
#
# Usage: e2e-framing.sh [RATE_MBIT]   (default: 20)
# Prints one "RESULT ..." line per keyword for the record.
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

RATE=${1:-20}
SECONDS_PER_RUN=${E2E_SECONDS:-10}
FLOWS=2
TOLERANCE=1
# Each keyword, and the bytes a 1514-byte Ethernet frame (a 1500-byte IP packet) takes on its
# link: DOCSIS 1500 + 18; VDSL2 PPPoE 1500 + 30, one byte per 64 (PTM); ADSL PPPoA 1500 + 10
# in 48-byte cells of 53.
KEYWORDS="docsis:1518 pppoe-ptm:1554 pppoa-vcmux:1696"

pair_up
original=$(qdisc_state s0)

# ceiling_for LINK_BYTES: TCP's goodput at RATE when a full segment takes LINK_BYTES.
ceiling_for() {
	awk -v r="$RATE" -v b="$1" 'BEGIN { printf "%.2f", r * 1448 / b }'
}

# measure KEYWORD: CAKE's goodput with KEYWORD, then shaper's, into $cake and $shaped.
# Neither splits GSO packets: each counts a super-packet's segments one by one, which is the
# arithmetic under test, and the goodput is not that of the split path, which at low rates
# falls short of CAKE's with or without a keyword (docs/notebook/work-conservation.md).
measure() {
	ip netns exec "$SRC" tc qdisc replace dev s0 root cake bandwidth "${RATE}mbit" besteffort no-split-gso "$1"
	cake=$(goodput_mbit "$SECONDS_PER_RUN" "$FLOWS") || exit 1
	ip netns exec "$SRC" tc qdisc del dev s0 root
	[ "$(qdisc_state s0)" = "$original" ] || fail "could not put the original qdisc back after CAKE"
	shaper_start --iface s0 --rate "${RATE}mbit" --no-split-gso --framing "$1"
	grep -q "framing $(framing_shown "$1")" /tmp/shaper.log ||
		fail "$1: shaper did not report the framing: $(cat /tmp/shaper.log)"
	verifier_budget
	shaped=$(goodput_mbit "$SECONDS_PER_RUN" "$FLOWS") || exit 1
	shaper_stop
	[ "$(qdisc_state s0)" = "$original" ] || fail "$1: qdisc not restored"
}

# framing_shown KEYWORD: how shaper shows KEYWORD's framing (tc's words for CAKE's).
framing_shown() {
	case $1 in
	docsis) echo "overhead 18 mpu 64" ;;
	pppoe-ptm) echo "overhead 30 ptm" ;;
	pppoa-vcmux) echo "overhead 10 atm" ;;
	esac
}

# wrong KEYWORD CEILING: what is wrong with $shaped beside $cake.
wrong() {
	within "$shaped" "$cake" "$TOLERANCE" ||
		printf "; %s: shaper %s Mbit/s not within %s%% of CAKE's %s" "$1" "$shaped" "$TOLERANCE" "$cake"
	# Both count the link's bytes: neither may carry more than the keyword's ceiling allows,
	# nor (CAKE reaching it) fall far under it.
	awk -v v="$shaped" -v c="$2" 'BEGIN { exit !(v > c * 1.01) }' &&
		printf '; %s: shaper %s above the ceiling %s' "$1" "$shaped" "$2"
	true
}

atm_shaped=
for entry in $KEYWORDS; do
	keyword=${entry%%:*}
	ceiling=$(ceiling_for "${entry#*:}")
	measure "$keyword"
	if [ -n "$(wrong "$keyword" "$ceiling")" ]; then
		# An emulated machine shares its host: one pair of runs can be starved by something
		# else on it. Measure both again once, and judge the second pair.
		log "$keyword: shaper $shaped, cake $cake: outside ${TOLERANCE}%, measuring again"
		measure "$keyword"
	fi
	log "$keyword: shaper $shaped, cake $cake, ceiling $ceiling Mbit/s"
	echo "RESULT kernel=$(uname -r) rate_mbit=$RATE framing=$keyword shaper_mbit=$shaped cake_mbit=$cake ceiling_mbit=$ceiling shaper_vs_cake=$(ratio "$shaped" "$cake") shaper_vs_ceiling=$(ratio "$shaped" "$ceiling")"
	problems=$(wrong "$keyword" "$ceiling")
	[ -z "$problems" ] || fail "${problems#; }"
	[ "$keyword" = pppoa-vcmux ] && atm_shaped=$shaped
done

# In place: from DOCSIS to ATM cells on a running shaper, then its goodput is ATM's.
shaper_start --iface s0 --rate "${RATE}mbit" --no-split-gso --framing docsis
state=$(qdisc_state s0)
ip netns exec "$SRC" shaper set --iface s0 --framing pppoa-vcmux >/tmp/set.out 2>&1 ||
	fail "shaper set --framing: $(cat /tmp/set.out)"
grep -q "framing: overhead 18 mpu 64 -> overhead 10 atm" /tmp/set.out ||
	fail "shaper set --framing did not report the change: $(cat /tmp/set.out)"
[ "$(qdisc_state s0)" = "$state" ] || fail "shaper set --framing re-installed the qdisc"
ip netns exec "$SRC" shaper set --iface s0 --framing pppoe >/tmp/set.out 2>&1 &&
	fail "shaper set --framing pppoe was accepted"
grep -q 'unknown framing keyword "pppoe"' /tmp/set.out ||
	fail "shaper set --framing pppoe: unexpected error: $(cat /tmp/set.out)"
live=$(goodput_mbit "$SECONDS_PER_RUN" "$FLOWS") || exit 1
shaper_stop
log "docsis, set to pppoa-vcmux in place: $live Mbit/s (pppoa-vcmux from the start: $atm_shaped)"
echo "RESULT kernel=$(uname -r) rate_mbit=$RATE framing=docsis-set-pppoa-vcmux shaper_mbit=$live atm_from_start_mbit=$atm_shaped"
# ATM's ceiling is 10 % under DOCSIS's: 2 % apart tells which one is counted.
within "$live" "$atm_shaped" 2 ||
	fail "after shaper set --framing pppoa-vcmux: $live Mbit/s, not ATM's $atm_shaped"

pair_down
echo "e2e-framing: ok"
