#!/bin/sh
# Freezes the test VM now and then, as a host that stops running its guest does: every
# PERIOD seconds it stops the qemu process for STALL seconds (SIGSTOP, SIGCONT). The guest's
# clock keeps the host's time (tsc=reliable), so on resume the guest finds that time passed
# with nothing sent. Runs on the host beside a lab, until killed; logs each resume's time.
#
# Usage: tests/host/stall-vm.sh STALL PERIOD [LOG] &
#        cargo xtask lab run ...; kill %1
set -u
stall=${1:?stall seconds} period=${2:?period seconds} log=${3:-/dev/null}
while :; do
	sleep "$period"
	pid=$(pgrep -f -o qemu-system-x86_64) || continue
	kill -STOP "$pid" && sleep "$stall"
	kill -CONT "$pid"
	date +%s.%N >>"$log"
done
