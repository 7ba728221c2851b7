#!/bin/sh
# The verifier's work per program on the running kernel: starts shaper on a veth, prints the
# "data path verified" line it logs, and stops it. A change to the data path is measured with
# it on both test kernels before the suite's budget (e2e-rate.sh) judges it.
#
# Usage: cargo xtask vm --kernel 6.1 -- tests/vm/verifier-cost.sh [SHAPER ARGS...]
here=$(dirname "$0"); [ -f "$here/lib.sh" ] || here=/shaper/tests/vm; . "$here/lib.sh"

pair_up
shaper_start --iface s0 --rate 10mbit "$@"
verifier_cost
shaper_stop
pair_down
