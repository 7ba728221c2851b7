#!/bin/sh
# End to end: `shaper tune` on a stock host. The dry run changes nothing; --apply sets fq as the
# default qdisc, BBR and a 128 KiB unsent ceiling, and a new TCP connection uses BBR; --persist
# writes a sysctl.d file that procps' `sysctl -p` (as the host's boot does) applies to the same
# values; --revert puts every value back and removes the files. In a network namespace of its
# own the global default qdisc is left alone, with the reason.
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

PERSISTED=/etc/sysctl.d/90-shaper.conf
values() {
	echo "$(sysctl -n net.core.default_qdisc) $(sysctl -n net.ipv4.tcp_congestion_control) $(sysctl -n net.ipv4.tcp_notsent_lowat)"
}

# A stock host.
sysctl -q -w net.core.default_qdisc=pfifo_fast net.ipv4.tcp_congestion_control=cubic \
	net.ipv4.tcp_notsent_lowat=4294967295 || fail "setting the stock values"
STOCK=$(values)
[ "$STOCK" = "pfifo_fast cubic 4294967295" ] || fail "stock values: $STOCK"

out=$(shaper tune) || fail "dry run: $out"
log "dry run:
$out"
[ "$(echo "$out" | grep -c ' -> ')" = 3 ] || fail "the dry run should list 3 changes: $out"
echo "$out" | grep -q 'dry run: 3 to change' || fail "the dry run did not say so: $out"
[ "$(values)" = "$STOCK" ] || fail "the dry run changed something: $(values)"

out=$(shaper tune --apply --persist) || fail "apply: $out"
log "apply:
$out"
[ "$(values)" = "fq bbr 131072" ] || fail "after --apply: $(values)"
[ -f "$PERSISTED" ] || fail "no $PERSISTED"
grep -qx tcp_bbr /etc/modules-load.d/shaper.conf || fail "BBR's module is not loaded at boot"
[ "$(shaper tune | grep -c '(as advised)')" = 3 ] || fail "a second look should find all as advised"

# A connection made now uses BBR: iperf3 reports its sender's congestion control.
pair_up
report=$(run "$SRC" iperf3 -c 10.9.0.2 -t 1 -J 2>&1)
cc=$(echo "$report" | sed -n 's/.*"sender_tcp_congestion":[[:space:]]*"\([a-z]*\)".*/\1/p' | head -1)
[ "$cc" = bbr ] || fail "a new connection uses '$cc', not bbr: $(echo "$report" | grep -i congestion)"

# The persisted file is what a boot applies.
sysctl -q -w net.core.default_qdisc=pfifo_fast net.ipv4.tcp_congestion_control=cubic \
	net.ipv4.tcp_notsent_lowat=4294967295
sysctl -q -p "$PERSISTED" || fail "sysctl -p $PERSISTED: $(cat "$PERSISTED")"
[ "$(values)" = "fq bbr 131072" ] || fail "after sysctl -p $PERSISTED: $(values)"

# In a namespace of its own: the global default qdisc cannot be set there.
out=$(run "$SRC" shaper tune) || fail "tune in a namespace: $out"
echo "$out" | grep -q 'net.core.default_qdisc: left alone: not here' ||
	fail "the namespace's tune should leave the default qdisc alone: $out"
pair_down

out=$(shaper tune --revert) || fail "revert: $out"
log "revert:
$out"
[ "$(values)" = "$STOCK" ] || fail "after --revert: $(values), was $STOCK"
[ ! -e "$PERSISTED" ] && [ ! -e /etc/modules-load.d/shaper.conf ] || fail "--revert left files"
out=$(shaper tune --revert) || fail "second revert: $out"
echo "$out" | grep -q 'nothing to revert' || fail "a second --revert: $out"
shaper tune --apply --revert >/dev/null 2>&1 && fail "--apply with --revert was accepted"
log "PASS: dry run, apply, persist (sysctl -p), a BBR connection, revert"
