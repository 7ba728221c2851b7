# Shared helpers for the VM end-to-end scripts (sourced, POSIX sh).
#
# Topology: two network namespaces joined by a veth pair.
#   ns "src": veth "s0" 10.9.0.1/24, fd09::1/64   (shaper runs on s0 egress)
#   ns "dst": veth "d0" 10.9.0.2/24, fd09::2/64   (iperf3 server)

set -u

SRC=src
DST=dst
# How long `shaper run` may take to shape its interface (the verifier's share grows with the
# emulator host's load).
START_SECONDS=${START_SECONDS:-60}

fail() {
	echo "FAIL: $*" >&2
	exit 1
}

log() {
	echo "== $*"
}

# run NS CMD...: in a namespace.
run() {
	ns=$1
	shift
	ip netns exec "$ns" "$@"
}

# topology_down: every process in each namespace of $NSES, then the namespaces.
topology_down() {
	for ns in $NSES; do
		pids=$(ip netns pids "$ns" 2>/dev/null) && [ -n "$pids" ] && kill $pids 2>/dev/null
		ip netns del "$ns" 2>/dev/null
	done
	true
}

# namespaces_up: $NSES afresh, each with its loopback up.
namespaces_up() {
	topology_down
	for ns in $NSES; do
		ip netns add "$ns"
		ip -n "$ns" link set lo up
	done
}

# routed_up: namespaces cli, rtr and srv afresh (as $NSES), a veth from cli's c0 to rtr's rc
# (10.1.0.2 and .1) and one from srv's s0 to rtr's rs (10.2.0.2 and .1), rtr forwarding
# between them and each end's default route through it:
#   cli [c0] --- [rc] rtr [rs] --- [s0] srv
routed_up() {
	NSES="cli rtr srv"
	namespaces_up
	ip link add c0 netns cli type veth peer name rc netns rtr
	ip link add s0 netns srv type veth peer name rs netns rtr
	ip -n cli addr add 10.1.0.2/24 dev c0
	ip -n rtr addr add 10.1.0.1/24 dev rc
	ip -n srv addr add 10.2.0.2/24 dev s0
	ip -n rtr addr add 10.2.0.1/24 dev rs
	for link in cli:c0 rtr:rc rtr:rs srv:s0; do ip -n "${link%%:*}" link set "${link#*:}" up; done
	ip -n cli route add default via 10.1.0.1
	ip -n srv route add default via 10.2.0.1
	run rtr sysctl -qw net.ipv4.ip_forward=1
}

# lan_router_up: two LAN machines behind a router, as namespaces lana, lanb, $ROUTER and
# server afresh (as $NSES), the router forwarding:
#   lana [la] 10.77.1.2 --- [ra] 10.77.1.1 \
#                                            $ROUTER [w0] 10.78.0.1 --- [s0] 10.78.0.2 server
#   lanb [lb] 10.77.2.2 --- [rb] 10.77.2.1 /
# The server has no route back to the LAN: the caller masquerades or adds one.
lan_router_up() {
	NSES="lana lanb $ROUTER server"
	namespaces_up
	for h in a b; do
		n=1
		[ $h = b ] && n=2
		ip link add "l$h" netns "lan$h" type veth peer name "r$h" netns "$ROUTER"
		ip -n "lan$h" addr add "10.77.$n.2/24" dev "l$h"
		ip -n "lan$h" link set "l$h" up
		ip -n "lan$h" route add default via "10.77.$n.1"
		ip -n "$ROUTER" addr add "10.77.$n.1/24" dev "r$h"
		ip -n "$ROUTER" link set "r$h" up
	done
	ip link add w0 netns "$ROUTER" type veth peer name s0 netns server
	ip -n "$ROUTER" addr add 10.78.0.1/24 dev w0
	ip -n "$ROUTER" link set w0 up
	ip -n server addr add 10.78.0.2/24 dev s0
	ip -n server link set s0 up
	run "$ROUTER" sysctl -qw net.ipv4.ip_forward=1
}

# hogs_start: a busy loop at normal priority on every CPU, its pids added to $HOG_PIDS.
HOG_PIDS=
hogs_start() {
	for _ in $(seq "$(nproc)"); do
		sh -c 'while :; do :; done' &
		HOG_PIDS="$HOG_PIDS $!"
	done
}

# pair_up: (re)create the two namespaces and the veth between them.
pair_up() {
	pair_down
	ip netns add "$SRC"
	ip netns add "$DST"
	ip link add s0 netns "$SRC" type veth peer name d0 netns "$DST"
	ip -n "$SRC" addr add 10.9.0.1/24 dev s0
	ip -n "$DST" addr add 10.9.0.2/24 dev d0
	ip -n "$SRC" -6 addr add fd09::1/64 dev s0 nodad
	ip -n "$DST" -6 addr add fd09::2/64 dev d0 nodad
	for ns in "$SRC" "$DST"; do ip -n "$ns" link set lo up; done
	ip -n "$SRC" link set s0 up
	ip -n "$DST" link set d0 up
	ip netns exec "$DST" iperf3 -s -D >/dev/null
	sleep 0.3
}

# one_receive_cpu: every packet that crosses the veth, either way, is received on CPU 0 (RPS
# on s0 and d0). A veth hands a packet to the receive backlog of the CPU that transmits it; a
# qdisc that holds packets (fq releasing them at their departure times) transmits a flow's
# packets from whichever CPU runs it then, and when one CPU's backlog waits (its vCPU preempted)
# the next packet, handed over on the other, overtakes it: pings that left s0 in order arrive
# out of order, with no shaper at all (docs/notebook/takeover.md). For the scripts that judge
# the order of pings.
one_receive_cpu() {
	run "$SRC" sh -c 'echo 1 >/sys/class/net/s0/queues/rx-0/rps_cpus' &&
		run "$DST" sh -c 'echo 1 >/sys/class/net/d0/queues/rx-0/rps_cpus' ||
		fail "steering s0's and d0's receive to CPU 0"
}

pair_down() {
	for ns in "$SRC" "$DST"; do
		pids=$(ip netns pids "$ns" 2>/dev/null) && [ -n "$pids" ] && kill $pids 2>/dev/null
	done
	ip netns del "$SRC" 2>/dev/null || true
	ip netns del "$DST" 2>/dev/null || true
}

# goodput_mbit SECONDS PARALLEL [IPERF3-ARGS...]: iperf3 from src to dst (with -R, from dst to
# src); prints the receiver's Mbit/s.
goodput_mbit() {
	seconds=$1 parallel=$2
	shift 2
	out=$(ip netns exec "$SRC" iperf3 -c 10.9.0.2 -t "$seconds" -O 1 -P "$parallel" --format k "$@" 2>&1) ||
		fail "iperf3 $*: $out"
	echo "$out" | receiver_mbit
}

# receiver_mbit: the receiver's Mbit/s in the iperf3 client output on stdin (the sum's, with
# parallel streams), to 10 kbit/s (iperf3's own Mbit/s has one decimal: 0.5 % at 20 Mbit/s, so
# goodput_mbit asks for Kbit/s).
receiver_mbit() {
	awk '/receiver/ { for (i = 1; i <= NF; i++) {
			if ($i == "Mbits/sec") v = $(i - 1)
			if ($i == "Kbits/sec") v = $(i - 1) / 1000 } }
		END { if (v != "") printf "%.2f\n", v }'
}

# qdisc_state IF: the qdisc configuration of IF in src, stripped of counters, sorted (the
# kernel's dump order follows its handle hash, not the configuration).
qdisc_state() {
	ip netns exec "$SRC" tc qdisc show dev "$1" | sed 's/ refcnt [0-9]*//' | sort
}

SHAPER_PID=

# `$ONLY_SHAPER_CAPS CMD...` runs CMD with the capabilities shaper's DaemonSet and systemd unit
# grant and no others: as root, an exec under this bounding set has exactly these.
ONLY_SHAPER_CAPS="setpriv --bounding-set=-all,+bpf,+net_admin,+perfmon --"
# CapEff of such a process, as /proc/PID/status shows it.
ONLY_SHAPER_CAPS_HEX=000000c000001000
# A command shaper_start runs `shaper run` under (e.g. $ONLY_SHAPER_CAPS); none by default.
SHAPER_AS=

# verifier_cost: the line a started shaper logged with each program's verifier cost.
verifier_cost() {
	grep -o 'data path verified: .*' /tmp/shaper.log || fail "shaper did not report its verifier cost"
}

# verifier_budget: every program verified within half the kernel's limit of 1M processed
# instructions, so that a change to the data path that brings one near the limit on some kernel
# fails here rather than as a shaper that does not start.
VERIFIER_BUDGET=500000
verifier_budget() {
	line=$(verifier_cost) || exit 1
	log "$line"
	echo "$line" | grep -o 'shaper_[a-z_]* [0-9]*' | awk -v max="$VERIFIER_BUDGET" '
		$2 > max { print "over budget:", $0; bad = 1 }
		END { exit bad }' || fail "a program is over the verifier budget of $VERIFIER_BUDGET instructions"
}

# shaper_start ARGS...: runs `shaper run ARGS` in src in the background and waits until it
# reports (via `shaper stats`) that it is shaping s0.
shaper_start() {
	shaper_start_in "$SRC" s0 "$@"
}

# shaper_start_in NS IF ARGS...: the same in namespace NS, waiting for interface IF; with
# SHAPER_NET_ONLY set, in NS's network only (bpffs as this shell sees it).
shaper_start_in() {
	start_ns=$1 start_dev=$2
	shift 2
	# In the namespace's network only, with this shell's mounts, or as `ip netns exec`, which
	# mounts /sys afresh, without bpffs.
	enter="ip netns exec $start_ns"
	[ -n "${SHAPER_NET_ONLY:-}" ] && enter="nsenter --net=/run/netns/$start_ns"
	$enter $SHAPER_AS shaper run "$@" >/tmp/shaper.log 2>&1 &
	SHAPER_PID=$!
	# The ingress direction is set up after the egress.
	start_ingress=
	case "$*" in *--ingress-rate*) start_ingress=--ingress ;; esac
	# The verifier alone takes 20 s on 6.1 when the emulator's host is busy: a deadline in
	# time, not in tries.
	start_by=$(($(date +%s) + START_SECONDS))
	while ! ip netns exec "$start_ns" shaper stats --iface "$start_dev" $start_ingress >/dev/null 2>&1; do
		if [ "$(date +%s)" -gt "$start_by" ] || ! kill -0 "$SHAPER_PID" 2>/dev/null; then
			cat /tmp/shaper.log >&2
			fail "shaper did not start on $start_dev"
		fi
		sleep 0.1
	done
}

# shaper_stop: SIGTERM and wait; fails if shaper exits non-zero.
shaper_stop() {
	kill -TERM "$SHAPER_PID"
	if ! wait "$SHAPER_PID"; then
		cat /tmp/shaper.log >&2
		fail "shaper exited with an error"
	fi
	SHAPER_PID=
}

# within VALUE TARGET PERCENT: true when |VALUE - TARGET| <= PERCENT% of TARGET.
within() {
	awk -v v="$1" -v t="$2" -v p="$3" 'BEGIN { d = v - t; if (d < 0) d = -d; exit !(d <= t * p / 100) }'
}

# short VALUE REFERENCE: VALUE is more than TOLERANCE % below REFERENCE.
short() {
	awk -v v="$1" -v r="$2" -v p="$TOLERANCE" 'BEGIN { exit !(v < r * (1 - p / 100)) }'
}

# shortfall WHAT SHAPED CAKE CEILING: "; what is wrong" (nothing when all holds) with shaper's
# goodput SHAPED beside CAKE's in the same boot: it may not fall more than TOLERANCE % short of
# CAKE's, nor of the ceiling wherever CAKE reaches it. Where CAKE does not, the emulated machine
# cannot drive the rate and only the comparison with CAKE says anything about the shaper; above
# CAKE's is better. A goodput above the ceiling is data queued before the sender stopped,
# counted in its window, not rate: CAKE is held to the ceiling where it reads above it.
shortfall() {
	reference=$(awk -v c="$3" -v l="$4" 'BEGIN { print (c > l ? l : c) }')
	if ! short "$3" "$4"; then
		short "$2" "$4" && printf '; %s: %s not within %s%% of the ceiling %s' "$1" "$2" "$TOLERANCE" "$4"
	fi
	short "$2" "$reference" && printf "; %s: %s more than %s%% below CAKE's %s" "$1" "$2" "$TOLERANCE" "$3"
	true
}

# ratio A B: A/B with three decimals.
ratio() {
	awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'
}

# rate_mbit RATE_IN_MBIT: the goodput ceiling of 1500-byte-MTU TCP at a wire rate.
tcp_ceiling_mbit() {
	awk -v r="$1" 'BEGIN { printf "%.2f", r * 1448 / 1514 }'
}

# download_mbit SECONDS PARALLEL: iperf3 from dst to src (arriving on s0's ingress); prints the
# receiver's Mbit/s.
download_mbit() {
	goodput_mbit "$1" "$2" -R
}

# ping_ms COUNT: pings dst from src every 50 ms; prints "P50 P99" of the round trips in ms.
ping_ms() {
	ip netns exec "$SRC" ping -c "$1" -i 0.05 10.9.0.2 |
		sed -n 's/.*time=\([0-9.]*\) ms.*/\1/p' | sort -n |
		awk '{ v[NR] = $1 } END { if (NR == 0) { print "none"; exit 1 }
			i50 = int(NR * 0.50 + 0.5); i99 = int(NR * 0.99 + 0.5); if (i50 < 1) i50 = 1; if (i99 < 1) i99 = 1
			printf "%.2f %.2f\n", v[i50], v[i99] }'
}

# tx_bytes NS DEV: the bytes DEV in NS has sent, by its own counter.
tx_bytes() {
	run "$1" cat "/sys/class/net/$2/statistics/tx_bytes"
}

# now_us: microseconds of wall-clock time (bash's $EPOCHREALTIME), for windows too short for
# now_ms's 10 ms.
now_us() {
	bash -c 'echo "${EPOCHREALTIME/[.,]/}"'
}

# log_us LINE [NEAR_US]: the time of a shaper log line ("2026-11-30T10:01:15.823433Z ...", UTC)
# in now_us's clock, on the day that puts it nearest NEAR_US (default now).
log_us() {
	near=${2:-$(now_us)}
	tod=$(echo "$1" | awk -F'[T:Z ]' '{ printf "%.0f", (($2 * 60 + $3) * 60 + $4) * 1000000 }')
	day=86400000000
	t=$((near - near % day + tod))
	[ $t -gt $((near + day / 2)) ] && t=$((t - day))
	[ $t -lt $((near - day / 2)) ] && t=$((t + day))
	echo $t
}

# tx_at NS DEV: "MICROSECONDS BYTES": the time and DEV's sent bytes, read together.
tx_at() {
	run "$1" bash -c 'read -r b <"/sys/class/net/$1/statistics/tx_bytes"; echo "${EPOCHREALTIME/[.,]/} $b"' - "$2"
}

# sleep_until MICROSECONDS: sleeps until that time (now_us's clock); returns at once if past.
sleep_until() {
	sleep_us=$(($1 - $(now_us)))
	[ "$sleep_us" -gt 0 ] && sleep "$(awk -v u="$sleep_us" 'BEGIN { printf "%.6f", u / 1e6 }')"
	true
}

# byte_counters NS DEV: DEV's counters now, "TX_BYTES TX_PACKETS TX_DROPPED STAMPED_BYTES
# STAMPED_PACKETS UNSHAPED_PACKETS FQ_BYTES FQ_PACKETS FQ_DROPPED": what the device sent (and
# dropped at transmit), what shaper stamped, what it passed unshaped, what its fq sent (and
# dropped: a full queue refusing a flood). Read once fq has sent what it held (at most 3 s),
# so that the counters are at rest.
byte_counters() {
	i=0
	while [ $i -lt 60 ] && ! run "$1" tc -s qdisc show dev "$2" |
		awk '/^qdisc (mq|fq) 5348: root/ { getline; getline; exit !($2 == "0b") }'; do
		i=$((i + 1))
		sleep 0.05
	done
	tx=$(tx_bytes "$1" "$2")
	txp=$(run "$1" cat "/sys/class/net/$2/statistics/tx_packets")
	txd=$(run "$1" cat "/sys/class/net/$2/statistics/tx_dropped")
	json=$(run "$1" shaper stats --iface "$2" --json | tr -d ' \n')
	stamped=$(echo "$json" | sed -n 's/^{[^{]*"bytes":\([0-9]*\).*/\1/p')
	stampedp=$(echo "$json" | sed -n 's/^{[^{]*"packets":\([0-9]*\).*/\1/p')
	unshaped=$(echo "$json" | sed -n 's/.*"passed_unshaped":{\([^}]*\)}.*/\1/p' | tr ',' '\n' | awk -F: '{ s += $2 } END { print s + 0 }')
	fq=$(run "$1" tc -s qdisc show dev "$2" |
		awk '/^qdisc (mq|fq) 5348: root/ { getline; sub(",", "", $7); print $2, $4, $7; exit }')
	echo "$tx $txp $txd $stamped $stampedp $unshaped $fq"
}

# accounting_fault NAME BEFORE AFTER PERCENT: the accounting invariant between two
# byte_counters of one interface, within PERCENT. Bytes are wire bytes as the qdisc layer
# counts them (a GSO packet's headers once per segment), which is what shaper stamps and fq
# sends; packets are not comparable across the layers (fq counts a GSO packet's segments,
# shaper and a device that takes it whole count it once, a device that needs it segmented
# counts its segments). So:
# - shaper saw every byte fq passed: fq sent what shaper stamped, plus at most a full frame
#   per packet shaper passed unshaped, less at most a full frame per packet fq dropped (a full
#   queue refusing a flood: stamped, never sent);
# - the device sent what fq passed, less what it did not count for a documented reason: the
#   headers of GSO segments it took in one packet (at most 128 bytes for each segment fq
#   counted beyond the device's packets) and the packets it dropped at transmit.
# Prints "; what is wrong" when it does not hold (nothing when it does), and a RESULT line on
# stderr.
accounting_fault() {
	set -- "$1" $2 $3 "$4"
	name=$1
	tx=$((${11} - $2)) txp=$((${12} - $3)) txd=$((${13} - $4)) stamped=$((${14} - $5))
	stampedp=$((${15} - $6)) unshaped=$((${16} - $7)) fq=$((${17} - $8)) fqp=$((${18} - $9))
	fqd=$((${19} - ${10})) pct=${20}
	echo "== $name: device sent $tx bytes in $txp packets (+$txd dropped); shaper stamped $stamped bytes in $stampedp packets, passed $unshaped unshaped; fq sent $fq bytes in $fqp packets, dropped $fqd" >&2
	echo "RESULT kernel=$(uname -r) iface=$name sent_bytes=$tx sent_packets=$txp tx_dropped=$txd stamped_bytes=$stamped stamped_packets=$stampedp unshaped_packets=$unshaped fq_bytes=$fq fq_packets=$fqp fq_dropped=$fqd" >&2
	awk -v f="$fq" -v s="$stamped" -v u="$unshaped" -v d="$fqd" -v p="$pct" \
		'BEGIN { exit !(f <= (s + u * 1514) * (1 + p / 100) && f >= s * (1 - p / 100) - d * 1514) }' ||
		printf '; %s: fq sent %s bytes, shaper stamped %s and passed %s packets unshaped (fq dropped %s)' "$name" "$fq" "$stamped" "$unshaped" "$fqd"
	awk -v t="$tx" -v f="$fq" -v tp="$txp" -v fp="$fqp" -v d="$txd" -v p="$pct" 'BEGIN {
		extra = fp - tp; if (extra < 0) extra = 0
		exit !(t <= f * (1 + p / 100) && f - t <= extra * 128 + d * 1514 + f * p / 100) }' ||
		printf '; %s: the device sent %s bytes in %s packets (+%s dropped), fq %s bytes in %s' "$name" "$tx" "$txp" "$txd" "$fq" "$fqp"
}

# check_accounting NS DEV BEFORE WHAT: the accounting invariant (within 1 %) on DEV since
# BEFORE (a byte_counters); fails naming WHAT.
check_accounting() {
	wrong=$(accounting_fault "$2" "$3" "$(byte_counters "$1" "$2")" 1)
	[ -z "$wrong" ] || fail "$4: accounting$wrong"
}

# now_ms: milliseconds since boot (10 ms resolution).
now_ms() {
	awk '{ printf "%d", $1 * 1000 }' /proc/uptime
}

# stamped_packets NS DEV: packets the shaper on DEV has stamped.
stamped_packets() {
	run "$1" shaper stats --iface "$2" --json | tr -d ' \n' | sed -n 's/^{[^{]*"packets":\([0-9]*\).*/\1/p'
}

# json_num KEY: the first number after "KEY": in the JSON on stdin.
json_num() {
	tr -d ' \n' | grep -o "\"$1\":[0-9]*" | head -1 | cut -d: -f2
}

# map_entries NAME: entries of the shaper map NAME in `shaper stats --maps --json` on stdin.
map_entries() {
	tr -d ' \n' | sed 's/},{/}\n{/g' | sed -n "s/.*\"name\":\"$1\",\"entries\":\([0-9]*\).*/\1/p"
}

# rss_kib PID: the resident memory of process PID (VmRSS), in KiB.
rss_kib() {
	awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"
}

# memlock_kib PID: what the kernel charges for the BPF maps and programs process PID holds
# (the memlock lines of its descriptors' fdinfo), in KiB.
memlock_kib() {
	cat /proc/"$1"/fdinfo/* 2>/dev/null | awk '/^memlock:/ { s += $2 } END { printf "%d\n", s / 1024 }'
}

# check_pings FILE: every ping in FILE (ping's output) was answered, once, in order; fails
# otherwise. Prints "SENT RTT" (RTT: min/avg/max/mdev, ms).
check_pings() {
	summary=$(grep 'packets transmitted' "$1")
	sent=$(echo "$summary" | awk '{ print $1 }')
	received=$(echo "$summary" | awk '{ print $4 }')
	echo "== ping: $summary" >&2
	[ -n "$sent" ] && [ "$sent" = "$received" ] || fail "pings lost: $summary"
	grep -q 'DUP!' "$1" && fail "duplicate pings"
	# icmp_seq is 16 bits: a long run wraps from 65535 to 0, which is not a reordering.
	sed -n 's/.*icmp_seq=\([0-9]*\) .*/\1/p' "$1" |
		awk '{ s = $1 + wrap }
			NR > 1 && s < last - 32768 { wrap += 65536; s += 65536 }
			NR > 1 && s <= last { print "reordered: " $1 " after " last % 65536; bad = 1 }
			{ last = s } END { exit bad }' >&2 ||
		fail "pings reordered"
	echo "$sent $(grep -o 'rtt min/avg/max/mdev = [^ ]*' "$1" | cut -d' ' -f4)"
}

# end_load IPERF_PID PING_PID: ends a load and its pings: the ping is interrupted (it counts
# what it sent so far), iperf3 killed. Both pids must be the programs' own (`ip netns exec ...
# &`, which execs them): a shell running ping in the background ignores SIGINT, and killing one
# running iperf3 leaves iperf3 sending.
end_load() {
	kill -INT "$2" 2>/dev/null
	wait "$2"
	kill "$1" 2>/dev/null
	wait "$1" 2>/dev/null
	true
}

# fq_root: "HANDLES FLOW_LIMIT SENT_BYTES" of s0 in src: the handles of its qdiscs (the root, and the
# fq leaves under an mq root; sorted, joined by commas), the first fq's flow_limit and the
# root's sent bytes (under mq, the sum of its leaves').
fq_root() {
	handles=$(run "$SRC" tc qdisc show dev s0 | awk '{ print $2 "-" $3 }' | sort | tr '\n' ',')
	run "$SRC" tc -s qdisc show dev s0 | awk -v h="$handles" '
		/^qdisc fq / && f == "" { for (i = 1; i <= NF; i++) if ($i == "flow_limit") f = $(i + 1) }
		/^qdisc (fq|mq) [0-9a-f]+: root/ { getline; sent = $2 }
		END { print h, (f == "" ? "-" : f), sent }'
}

# stats_rate: the rate (bits/s) `shaper stats` reports.
stats_rate() {
	run "$SRC" shaper stats --iface s0 --json | json_num rate_bps
}

ROOT_HANDLE=
FQ_SENT=0
# same_qdisc: the qdiscs are still shaper's first ones: the same handles, the root's sent bytes
# no fewer than at the last check (a new qdisc would count from zero).
same_qdisc() {
	set -- $(fq_root)
	[ "$1" = "$ROOT_HANDLE" ] || fail "$WHAT_NOW: the qdiscs are now [$(fq_root)], were $ROOT_HANDLE"
	[ "$3" -ge "$FQ_SENT" ] || fail "$WHAT_NOW: fq's counters went back from $FQ_SENT to $3 bytes: a new qdisc"
	FQ_SENT=$3 FQ_FLOW_LIMIT=$2
}
