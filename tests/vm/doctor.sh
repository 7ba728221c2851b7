#!/bin/sh
# End to end: `shaper doctor` on a kernel that has every piece shaper needs (the VM loads them
# as modules). The kernel checks pass, TCX only from Linux 6.6 (before, the netlink fallback is
# a warning), nothing fails, and an interface's checks follow a shaper on it: none, running,
# killed; the doctor itself changes nothing.
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

# status_of NAME: the status of check NAME in the `shaper doctor --json` report on stdin.
status_of() {
	tr -d ' \n' | sed 's/},{/}\n{/g' | sed -n "s/.*\"name\":\"$1\",\"status\":\"\([a-z]*\)\".*/\1/p"
}

# detail_of NAME: the detail of check NAME in the report on stdin.
detail_of() {
	tr -d '\n' | sed 's/}, *{/}\n{/g' | sed -n "s/.*\"name\": *\"$1\",.*\"detail\": *\"\([^\"]*\)\".*/\1/p"
}

# expect REPORT NAME STATUS: check NAME has STATUS in REPORT.
expect() {
	got=$(echo "$1" | status_of "$2")
	[ "$got" = "$3" ] || fail "$2: expected $3, got '${got}': $(echo "$1" | detail_of "$2")"
}

# TCX arrived in Linux 6.6.
if uname -r | awk -F. '{ exit !($1 > 6 || ($1 == 6 && $2 >= 6)) }'; then tcx=pass; else tcx=warn; fi

report=$(shaper doctor --json)
rc=$?
{ echo "$report" | tr -d ' \n'; echo; } | sed 's/},{/}\n{/g' |
	sed -n 's/.*"name":"\([a-z_]*\)","status":"\([a-z]*\)".*/  \2 \1/p'
[ "$rc" = 0 ] || fail "shaper doctor exited $rc: $report"
for check in capabilities btf sch_fq clsact cls_bpf ifb act_mirred cls_matchall bbr; do
	expect "$report" "$check" pass
done
expect "$report" tcx "$tcx"
echo "$report" | grep -q '"failed": 0' || fail "failures counted: $report"
log "kernel checks: all pieces found, tcx $tcx on $(uname -r)"

# An interface with nothing of shaper's on it, in its own namespace (where the host-wide
# default_qdisc cannot be read: a warning, not a failure).
pair_up
before=$(qdisc_state s0)
text=$(run "$SRC" shaper doctor --iface s0)
rc=$?
echo "$text"
[ "$rc" = 0 ] || fail "shaper doctor --iface s0 exited $rc"
echo "$text" | grep -q '^pass  interface  *s0 exists$' || fail "no passing interface line"
[ "$(qdisc_state s0)" = "$before" ] || fail "the doctor changed s0's qdiscs: $(qdisc_state s0)"
report=$(run "$SRC" shaper doctor --iface s0 --json) || fail "shaper doctor --iface s0 --json failed"
expect "$report" interface pass
expect "$report" running_shaper pass
expect "$report" tx_queues pass
# A veth's root is noqueue: no pacing without shaper.
expect "$report" root_qdisc warn
log "s0 without shaper: checked, unchanged"

shaper_start --iface s0 --rate 100mbit
report=$(run "$SRC" shaper doctor --iface s0 --json) || fail "shaper doctor with a shaper running failed"
expect "$report" running_shaper pass
echo "$report" | detail_of running_shaper | grep -q "pid $SHAPER_PID" ||
	fail "the running shaper not named: $(echo "$report" | detail_of running_shaper)"
echo "$report" | detail_of root_qdisc | grep -q "^shaper's " ||
	fail "root not shaper's: $(echo "$report" | detail_of root_qdisc)"
log "s0 with shaper: $(echo "$report" | detail_of running_shaper)"

kill -KILL "$SHAPER_PID"
wait "$SHAPER_PID" 2>/dev/null
report=$(run "$SRC" shaper doctor --iface s0 --json) || fail "shaper doctor after a kill failed"
expect "$report" running_shaper warn
echo "$report" | grep -q '"remedy": "shaper reset --iface s0' || fail "no reset remedy: $report"
run "$SRC" shaper reset --iface s0 >/dev/null || fail "shaper reset failed"
report=$(run "$SRC" shaper doctor --iface s0 --json) || fail "shaper doctor after reset failed"
expect "$report" running_shaper pass
log "s0 after a killed shaper: reset advised, then clean"

# A name that is not there fails, with exit code 1.
run "$SRC" shaper doctor --iface nosuch0 >/dev/null
rc=$?
[ "$rc" = 1 ] || fail "a missing interface: exit $rc, expected 1"
pair_down
echo "doctor: ok"
