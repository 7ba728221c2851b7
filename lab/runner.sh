#!/bin/bash
# The lab's in-VM runner (see docs/lab.md). `cargo xtask lab run` generates one plan per
# (scenario, contender) and a manifest of runs; this runs them one after the other in this boot,
# in the manifest's order, each in a fresh topology, and leaves raw results under
# $SHAPER_OUT/lab.
#
# Usage: runner.sh MANIFEST   (lines: PLAN SCENARIO CONTENDER REPETITION SECONDS)
# After each run the results so far go to the VM's results disk ($SHAPER_VM_SAVE), so a
# guest crash costs the run it hit, not the ones before it.
#
# bash, not sh: $EPOCHREALTIME gives the microsecond timestamps that line up flows, probes
# and ping -D without forking a clock per sample (busybox date has no %N).
set -u

OUT=${SHAPER_OUT:-/out}/lab
# Probes start this long before the flows, so every run has idle latency samples.
IDLE=2

# ---- helpers the plans call (each plan runs in a subshell, cwd = its run directory) --------

lab_failed() {
	printf 'failed\n%s\n' "$*" >status
	echo "lab:   FAILED: $*"
}

# lab_do CMD...: runs CMD; on failure records the command and its error as the run's result.
lab_do() {
	if ! "$@" 2>.err; then
		lab_failed "$* : $(cat .err)"
		exit 1
	fi
}

LAB_WAIT_PIDS=
LAB_SHAPERS=
# ns:dev of the shapers that also shape their ingress (--ingress-rate).
LAB_INGRESS=

# lab_shaper_bin: the run's shaper: the one on PATH, or the file a plan names in LAB_SHAPER_BIN
# beside the manifest (a baseline build, `lab run --baseline`).
lab_shaper_bin() {
	case ${LAB_SHAPER_BIN:-shaper} in
	shaper) echo shaper ;;
	*) echo "$(dirname "$manifest")/$LAB_SHAPER_BIN" ;;
	esac
}

# lab_shaper NS DEV ARGS...: shaper run in NS on DEV until the run ends; a shaper that exits
# before it shapes (say, an option it does not know yet) fails the run with its own error.
lab_shaper() {
	ns=$1 dev=$2
	shift 2
	shaper=$(lab_shaper_bin)
	log=shaper-$ns-$dev.log
	# The control loop's trace: each host's levels and boost every tick (ten lines a second),
	# what the fairness and ACK-filter analyses read beside the run's counters.
	# A bpffs that `ip netns exec` (which mounts /sys afresh) leaves in place, where the ingress
	# direction of `--nat` finds the egress direction's flows, as under a host's /sys/fs/bpf.
	bpffs=/run/lab-bpffs
	if ! grep -q " $bpffs bpf " /proc/mounts; then
		lab_do mkdir -p "$bpffs"
		lab_do mount -t bpf bpf "$bpffs"
	fi
	SHAPER_BPFFS=$bpffs SHAPER_LOG=${SHAPER_LOG:-shaper::control=trace,info} ip netns exec "$ns" "$shaper" run --iface "$dev" "$@" >"$log" 2>&1 &
	pid=$!
	LAB_SHAPERS="$LAB_SHAPERS $pid:$ns:$dev"
	ready=
	case " $* " in *" --ingress-rate "*)
		LAB_INGRESS="$LAB_INGRESS $ns:$dev"
		# The ingress is set up after egress: wait for both.
		ready=--ingress ;;
	esac
	# The verifier alone takes 20 s on 6.1 when the emulator's host is busy.
	start_by=$(($(date +%s) + 60))
	until ip netns exec "$ns" "$shaper" stats --iface "$dev" $ready >/dev/null 2>&1; do
		if ! kill -0 "$pid" 2>/dev/null || [ "$(date +%s)" -gt "$start_by" ]; then
			kill "$pid" 2>/dev/null
			lab_failed "shaper run --iface $dev $*: $(tr '\n' ' ' <"$log")"
			exit 1
		fi
		sleep 0.1
	done
}

# lab_tune NS: `shaper tune --apply` in NS (its TCP settings; the namespace, and with it the
# settings, goes when the run ends); what it changed is kept in tune-NS.log.
lab_tune() {
	if ! ip netns exec "$1" "$(lab_shaper_bin)" tune --apply >"tune-$1.log" 2>&1; then
		lab_failed "shaper tune --apply in $1: $(tr '\n' ' ' <"tune-$1.log")"
		exit 1
	fi
}

# lab_ifb NS DEV IFB: redirects what DEV receives to a new IFB, whose egress a qdisc then
# shapes (sqm-scripts' ingress setup).
lab_ifb() {
	ns=$1 dev=$2 ifb=$3
	lab_do ip -n "$ns" link add "$ifb" type ifb
	lab_do ip -n "$ns" link set "$ifb" up
	lab_do tc -n "$ns" qdisc add dev "$dev" handle ffff: ingress
	lab_do tc -n "$ns" filter add dev "$dev" parent ffff: matchall action mirred egress redirect dev "$ifb"
}

# lab_server NS PORT ID IPERF3-ARGS...: a one-shot iperf3 server reporting JSON at 100 ms.
lab_server() {
	ns=$1 port=$2 id=$3
	shift 3
	ip netns exec "$ns" iperf3 -s -1 -J -i 0.1 -p "$port" "$@" >"$id.server.json" 2>"$id.server.err" &
	LAB_WAIT_PIDS="$LAB_WAIT_PIDS $!"
}

# lab_listening NS PORT...: waits until every port listens.
lab_listening() {
	ns=$1
	shift
	for port in "$@"; do
		i=0
		until ip netns exec "$ns" ss -Hltn "sport = :$port" | grep -q .; do
			i=$((i + 1))
			[ $i -gt 100 ] && { lab_failed "iperf3 server on port $port did not start"; exit 1; }
			sleep 0.05
		done
	done
}

# lab_start: time zero of the run's clock (probes start now, flows IDLE s later).
lab_start() {
	echo "$EPOCHREALTIME" >t0
	echo "$IDLE" >idle
	head -1 /proc/stat >cpu.before
}

# lab_flow ID NS START SECONDS IPERF3-ARGS...: an iperf3 client START s after the flows' zero.
lab_flow() {
	id=$1 ns=$2 start=$3 secs=$4
	shift 4
	(
		sleep "$(awk -v s="$start" -v i="$IDLE" 'BEGIN { print s + i }')"
		echo "$EPOCHREALTIME" >"$id.t"
		exec ip netns exec "$ns" iperf3 -J --interval 0.1 -t "$secs" "$@" >"$id.json" 2>"$id.err"
	) &
	LAB_WAIT_PIDS="$LAB_WAIT_PIDS $!"
}

# lab_queues PERIOD-US SECONDS NS...: every qdisc of each NS (`tc -s -j qdisc show`: each
# qdisc's device, kind, parent and backlog) every PERIOD-US from now for SECONDS: one JSON
# line per tick in queues-NS.jsonl, and when each tick asked in queues.t, line for line. One
# tc per namespace reads its requests from a FIFO (-batch), so a sample is a netlink dump
# (0.3-0.5 ms in the emulated VM, well inside the period: requests do not pile up), not a
# process; one loop paces them all, sleeping in `read -t` on a FIFO nobody writes and reading
# the clock from $EPOCHREALTIME, so it forks nothing. A tick that comes late (a starved vCPU)
# is taken at once and the schedule restarts from it rather than catching up in a burst.
lab_queues() {
	period=$1 secs=$2
	shift 2
	(
		# The lowest priority, for the loop and the tcs it starts: the flows, the probes and
		# the contender come first, and a sample may come a little late instead.
		renice -n 19 -p "$BASHPID" >/dev/null
		# FIFOs outside the run directory, which is saved as it is.
		fifos=/tmp/lab-queues-$BASHPID
		mkdir -p "$fifos" && mkfifo "$fifos/sleep"
		exec 3>queues.t 4<>"$fifos/sleep"
		# Every tc starts before any request pipe is opened, so none holds another's open and
		# each sees the end of its input when the loop closes it. (FIFOs: the VM has no /dev/fd
		# for process substitution.) Opened read-write, which never blocks: a tc that died
		# before opening its pipe leaves its .err, not a hung loop.
		tcs=() fds=()
		for ns; do
			mkfifo "$fifos/$ns"
			tc -n "$ns" -s -j -batch "$fifos/$ns" >"queues-$ns.jsonl" 2>"queues-$ns.err" &
			tcs+=("$!")
		done
		for ns; do
			exec {fd}<>"$fifos/$ns"
			fds+=("$fd")
		done
		now=${EPOCHREALTIME/./}
		next=$now end=$((now + secs * 1000000))
		while ((now < end)); do
			echo "$EPOCHREALTIME" >&3
			for fd in "${fds[@]}"; do echo 'qdisc show' >&"$fd"; done
			next=$((next + period))
			now=${EPOCHREALTIME/./}
			if ((next > now)); then
				printf -v pause '%d.%06d' $(((next - now) / 1000000)) $(((next - now) % 1000000))
				read -r -t "$pause" -u 4
				now=${EPOCHREALTIME/./}
			else
				next=$now
			fi
		done
		# tc answers what is still in its pipe, flushes and exits at the end of its input.
		for fd in "${fds[@]}"; do exec {fd}>&-; done
		wait "${tcs[@]}"
		rm -r "$fifos"
	) &
	LAB_WAIT_PIDS="$LAB_WAIT_PIDS $!"
}

# lab_ping ID NS INTERVAL SECONDS PING-ARGS...: timestamped pings from time zero on.
lab_ping() {
	id=$1 ns=$2 interval=$3 secs=$4
	shift 4
	ip netns exec "$ns" ping -D -n -i "$interval" -w "$secs" "$@" >"$id.ping" 2>&1 &
	LAB_WAIT_PIDS="$LAB_WAIT_PIDS $!"
}

# lab_probe_server NS PORT TRANSFERS-PORT: lab-probe's UDP and TCP echo for the
# request/response probes on PORT, and its end of the transfers on TRANSFERS-PORT; it runs
# until the run's cleanup.
lab_probe_server() {
	ip netns exec "$1" lab-probe server --port "$2" --transfers-port "$3" >"probe-server-$1.log" 2>&1 &
}

# lab_rr ID NS KIND INTERVAL SECONDS ADDR PORT: request/response round trips (KIND udp-rr or
# tcp-rr) from time zero on, one line per reply in ping -D's format.
lab_rr() {
	id=$1 ns=$2 kind=$3 interval=$4 secs=$5 addr=$6 port=$7
	ip netns exec "$ns" lab-probe client --proto "${kind%-rr}" --port "$port" \
		--interval "$interval" --duration "$secs" "$addr" >"$id.$kind" 2>&1 &
	LAB_WAIT_PIDS="$LAB_WAIT_PIDS $!"
}

# lab_transfers ID HOST-NS SERVER-NS START SECONDS LAB-PROBE-ARGS...: short TCP transfers from
# the host START s after the flows' zero, for at most SECONDS, one line per transfer; both
# namespaces' TCP counters (nstat: absolute, no history file) just before and after, for the
# retransmission timeouts the transfers' senders took.
lab_transfers() {
	id=$1 hns=$2 sns=$3 start=$4 secs=$5
	shift 5
	(
		sleep "$(awk -v s="$start" -v i="$IDLE" 'BEGIN { print s + i }')"
		ip netns exec "$hns" nstat -asz >"$id.host-before.nstat" 2>&1
		ip netns exec "$sns" nstat -asz >"$id.server-before.nstat" 2>&1
		ip netns exec "$hns" lab-probe transfers --duration "$secs" "$@" >"$id.transfers" 2>&1
		ip netns exec "$hns" nstat -asz >"$id.host-after.nstat" 2>&1
		ip netns exec "$sns" nstat -asz >"$id.server-after.nstat" 2>&1
	) &
	LAB_WAIT_PIDS="$LAB_WAIT_PIDS $!"
}

# lab_wait SECONDS: waits for flows, servers and probes; kills stragglers after a grace time.
lab_wait() {
	(
		sleep $(($1 + 30))
		echo "lab:   killing processes still running after $(($1 + 30)) s"
		kill $LAB_WAIT_PIDS 2>/dev/null
	) &
	watchdog=$!
	for pid in $LAB_WAIT_PIDS; do wait "$pid"; done
	kill "$watchdog" 2>/dev/null
	wait "$watchdog" 2>/dev/null
	head -1 /proc/stat >cpu.after
}

# lab_collect NAME NS DEV: the qdisc counters of DEV (and shaper's, when it runs there).
lab_collect() {
	ip netns exec "$2" tc -s -j qdisc show dev "$3" >"qdisc-$1.json" 2>&1
	for s in $LAB_SHAPERS; do
		case $s in *":$2:$3")
			ip netns exec "$2" "$(lab_shaper_bin)" stats --iface "$3" --json >"shaper-$1.json" 2>&1 ;;
		esac
	done
	case " $LAB_INGRESS " in *" $2:$3 "*)
		ip netns exec "$2" "$(lab_shaper_bin)" stats --iface "$3" --ingress --json >"shaper-$1-ingress.json" 2>&1 ;;
	esac
}

# lab_end: stops the shapers (their exit status is part of the result) and records success.
lab_end() {
	note=
	for s in $LAB_SHAPERS; do
		pid=${s%%:*}
		kill -TERM "$pid" 2>/dev/null
		wait "$pid" || note="$note shaper ${s#*:} exited with an error: $(tail -3 "shaper-$(echo "${s#*:}" | tr : -).log" | tr '\n' ' ')"
	done
	printf 'ok\n%s\n' "$note" >status
}

# ---- the driver ------------------------------------------------------------------------------

# cleanup: every process in every namespace, then the namespaces.
cleanup() {
	for ns in $(ip netns list | awk '{ print $1 }'); do
		pids=$(ip netns pids "$ns" 2>/dev/null)
		[ -n "$pids" ] && kill -9 $pids 2>/dev/null
	done
	sleep 0.2
	for ns in $(ip netns list | awk '{ print $1 }'); do ip netns del "$ns"; done
}

manifest=${1:?usage: runner.sh MANIFEST}
mkdir -p "$OUT"
uname -r >"$OUT/kernel"
nproc >"$OUT/cpus"
total=$(grep -c . "$manifest")
done_runs=0
started=$(date +%s)
while read -r plan scenario contender rep secs; do
	[ -n "$plan" ] || continue
	done_runs=$((done_runs + 1))
	dir=$OUT/$scenario/$contender/$rep
	mkdir -p "$dir"
	echo "lab: [$done_runs/$total] $scenario / $contender / repetition $rep (${secs} s, $(($(date +%s) - started)) s elapsed)"
	(cd "$dir" && . "$plan") >"$dir/log" 2>&1 </dev/null
	rc=$?
	cleanup
	if [ ! -s "$dir/status" ]; then
		printf 'failed\nthe plan stopped with status %s; see log\n' "$rc" >"$dir/status"
	fi
	echo "lab:   $(head -1 "$dir/status") $(sed -n 2p "$dir/status")"
	[ -z "${SHAPER_VM_SAVE:-}" ] || "$SHAPER_VM_SAVE"
done <"$manifest"
echo "lab: $total runs in $(($(date +%s) - started)) s"
