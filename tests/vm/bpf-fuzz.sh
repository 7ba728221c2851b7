#!/bin/sh
# Bad input on this kernel: the bad-input test (tests/tests/bad_input.rs), built static, runs
# random and mutated frames through every packet program of the data path by
# BPF_PROG_TEST_RUN, and the kernel logs no warning meanwhile.
#
# Usage: cargo xtask vm --kernel 6.1 --file "$(cargo xtask dist --bpf-fuzz)" -- \
#            tests/vm/bpf-fuzz.sh [FRAMES [SEED]]
# FRAMES per test (default 1000000), SEED of the generator (default the test's own).
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

# `--file` copies the binary next to the script.
bin=$(dirname "$0")/bpf-fuzz
[ -x "$bin" ] || fail "no $bin: pass the static test with --file (see Usage)"

export SHAPER_FUZZ_PACKETS="${1:-1000000}"
[ -n "${2:-}" ] && export SHAPER_FUZZ_SEED="$2"
log "bad input on Linux $SHAPER_VM_KERNEL: $SHAPER_FUZZ_PACKETS frames per test"
dmesg -c >/dev/null
started=$(date +%s)
# Two tests, one per vCPU: each loads its own copy of the data path.
"$bin" --test-threads=2 --nocapture || fail "the bad-input test failed"
log "bad input: done in $(($(date +%s) - started)) s"
if dmesg | grep -E 'WARNING|BUG|Oops|Call Trace|general protection'; then
	fail "the kernel logged the above during the runs"
fi
