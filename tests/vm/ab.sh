#!/bin/sh
# A/B in one boot: runs a VM test script with two or more shaper builds in turn, so that each
# build meets the same boot, kernel and machine load. Each build is a binary given to
# `cargo xtask vm` with --file and named shaper-NAME; each RESULT line is tagged with the build,
# the repetition and the script's exit code.
#
# Usage: cargo xtask vm --kernel K --file /path/shaper-main --file /path/shaper-new -- \
#            tests/vm/ab.sh "main new" REPS [VAR=VALUE...] SCRIPT [ARGS...]
# (SCRIPT is a name under tests/vm; VAR=VALUE pairs are exported to it, e.g. DIRECTIONS=egress.)
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm
builds=$1 reps=$2
shift 2
while case "${1:-}" in *=*) true ;; *) false ;; esac; do
	export "$1"
	shift
done
script=$1
shift
for b in $builds; do
	[ -f "/shaper/run/shaper-$b" ] || { echo "FAIL: no build shaper-$b (give it with --file)" >&2; exit 1; }
	mkdir -p "/tmp/ab-bin-$b"
	cp "/shaper/run/shaper-$b" "/tmp/ab-bin-$b/shaper"
	chmod +x "/tmp/ab-bin-$b/shaper"
done
n=0
while [ "$n" -lt "$reps" ]; do
	n=$((n + 1))
	for b in $builds; do
		PATH="/tmp/ab-bin-$b:$PATH" sh "$here/$script" "$@" >/tmp/ab-out 2>&1
		rc=$?
		grep RESULT /tmp/ab-out | sed "s/^/build=$b rep=$n rc=$rc /"
		[ "$rc" -eq 0 ] || grep -E "FAIL|attempt" /tmp/ab-out | tail -3 | sed "s/^/build=$b rep=$n /"
	done
done
