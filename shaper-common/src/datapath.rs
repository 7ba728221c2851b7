//! Types shared between the BPF data path and the control plane: map names, map values and the
//! counters. All `#[repr(C)]` with explicit padding so both sides agree on the layout.

use crate::{
    ackfilter::{AckState, KeepReason, ReverseState},
    aqm::{AqmParams, AqmState, DataReach},
    diffserv::MAX_TINS,
};

/// Per-interface shaping parameters, written by the control plane (array map, one entry).
/// The data path reads it on every packet; `ns_per_byte_fp` is precomputed so the fast path
/// never divides.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShaperConfig {
    /// Configured wire rate, bits per second. Zero means "not configured yet": packets pass
    /// unshaped (fail open) and are counted as such.
    pub rate_bps: u64,
    /// Nanoseconds per wire byte at `rate_bps`, with `edt::NS_PER_BYTE_SHIFT` fractional bits.
    pub ns_per_byte_fp: u64,
    /// Departures further than this in the future are dropped (last-resort bound on the queue).
    pub horizon_ns: u64,
    /// Bytes added to each frame (per GSO segment) before accounting; may be negative.
    pub overhead_bytes: i32,
    /// Minimum accounted size of a frame, bytes.
    pub mpu_bytes: u32,
    /// `isolation::Isolation` as u32.
    pub isolation: u32,
    /// New flow entries a host may create per control epoch before its further new flows
    /// share overflow buckets (0: unlimited).
    pub flow_quota: u32,
    /// Host prefix masks (network order): IPv4 in one word, IPv6 in four.
    pub host_mask_v4: u32,
    /// The least a kept ACK of a flow beside others charges its flow's clock while the filter
    /// is on, bytes: a round's quantum (`ackfilter::round_quantum_bytes`) divided between the
    /// ACKs the mode keeps scheduled.
    pub ack_quantum_bytes: u32,
    pub host_mask_v6: [u32; 4],
    /// Width of a calendar bin (see the data path's `calendar`): wire time per bin at the rate.
    pub calendar_bin_ns: u64,
    /// The AQM on each flow's scheduled delay (`aqm`; target zero: off).
    pub aqm: AqmParams,
    /// DSCP → tin (`diffserv::Diffserv::table`); all zero with one tin.
    pub tin_of_dscp: [u8; 64],
    /// `skb->mark & fwmark_mask`, shifted right by `fwmark_shift`, when not zero, is the tin
    /// plus one and overrides the DSCP (CAKE's `fwmark`). Mask zero: off.
    pub fwmark_mask: u32,
    pub fwmark_shift: u32,
    /// Number of tins of the mode (1 with besteffort): a larger fwmark tin is ignored.
    pub tins: u32,
    /// Clear the DSCP (keep ECN) after classifying (CAKE's `wash`).
    pub wash: u32,
    /// `ackfilter::AckFilter` as u32.
    pub ack_filter: u32,
    /// A GSO packet of more segments than this is not stamped but left to the segmenter (a
    /// filter after the data path that sends it through an IFB, whose transmit path splits it
    /// into frames, which come back to be stamped one by one). Zero: no segmenter.
    pub split_gso_segs: u32,
    /// The segmenter's IFB: packets coming back from it (`skb->skb_iif`) are never sent to it
    /// again, whatever their size.
    pub segmenter_ifindex: u32,
    /// How long after now a packet the calendar lent a departure counts as still on its way
    /// to the link, at most (ns; see [`LENT_WINDOW_FRAMES`]). Zero: until where the calendar
    /// booked its wire time.
    pub lent_window_ns: u32,
}

impl Default for ShaperConfig {
    /// Unconfigured: rate zero (packets pass unshaped), everything else off.
    fn default() -> Self {
        Self {
            rate_bps: 0,
            ns_per_byte_fp: 0,
            horizon_ns: 0,
            overhead_bytes: 0,
            mpu_bytes: 0,
            isolation: 0,
            flow_quota: 0,
            host_mask_v4: 0,
            ack_quantum_bytes: 0,
            host_mask_v6: [0; 4],
            calendar_bin_ns: 0,
            aqm: AqmParams::default(),
            tin_of_dscp: [0; 64],
            fwmark_mask: 0,
            fwmark_shift: 0,
            tins: 1,
            wash: 0,
            ack_filter: 0,
            split_gso_segs: 0,
            segmenter_ifindex: 0,
            lent_window_ns: 0,
        }
    }
}

/// Bins in the global calendar (a power of two) and how many one packet may span.
pub const CALENDAR_BINS: u32 = 4096;
pub const CALENDAR_MAX_SPAN_BINS: usize = 4;

/// The longest gap a flow's clock catches up (see `edt::reserve`): a TCP Small Queues
/// completion or a scheduling delay, not an idle period.
pub const FLOW_CREDIT_NS: u64 = 2_000_000;

/// How far ahead of its allocation, in calendar bins, a host may book before its guard clock
/// holds its packets back, at least (see [`host_slack_ns`]).
pub const HOST_SLACK_BINS: u64 = 4;

/// How far ahead of its allocation a host may book before its guard clock holds its packets
/// back: room for its flows' own queues, so that the guard only bites when the flow levels
/// overbook the host (a new flow, a level not yet lowered), and a flow of a host within its
/// allocation never waits behind the host's other flows.
///
/// Those queues are what the AQM lets each flow keep: its standing floor at the host's flow
/// level. A host whose n flows each hold it has booked n of them ahead at a 1/n of its
/// allocation: one floor at the flow level, in the host's time. A fixed slack in bins is less
/// than that at low rates (at 1 Mbit/s eight flows each hold two full frames, 200 ms), and the
/// host's small-packet flows (ACKs, DNS) waited behind the bulk flows' queues for the
/// difference. At least [`HOST_SLACK_BINS`] bins; at most the AQM's interval, the time it lets a
/// standing queue last before it acts (a host of many slow flows would otherwise get seconds).
/// The target stands whole here: with a packet's own frame, a flow keeps that much booked.
/// Computed by the control plane with the host's levels; the data path only reads it.
pub fn host_slack_ns(config: &ShaperConfig, flow_ns_per_byte_fp: u64) -> u64 {
    let floor = crate::aqm::standing_floor_ns(
        &config.aqm,
        config.aqm.mtu_bytes as u64,
        flow_ns_per_byte_fp,
        config.ns_per_byte_fp,
    );
    floor
        .max(config.aqm.base_target_ns)
        .min(config.aqm.interval_ns)
        .max(config.calendar_bin_ns * HOST_SLACK_BINS)
}

/// The calendar's bin width for a rate, a horizon and the largest packet the device sends (wire
/// bytes; its GSO limit): at least 1 ms, wide enough that the largest packet fits in half the
/// bins one packet may book, and so that the ring spans the horizon (every departure the data
/// path admits is booked). The width is also the aggregate's burst: inside its bin a packet
/// leaves when its flow says, so a bin's worth of wire time can leave at once. Sized for 64 KiB
/// whatever the device sends, a bin at 1 Mbit/s was 276 ms: 33 KB released together into the
/// modem behind it, whose queue then held every upload's ping for tens of milliseconds.
pub fn calendar_bin_ns(ns_per_byte_fp: u64, horizon_ns: u64, largest_packet_bytes: u64) -> u64 {
    let largest = crate::edt::tx_time_ns(largest_packet_bytes, ns_per_byte_fp);
    // Half the span: the largest packet still fits when the bins it lands in are half booked.
    let for_gso = largest.div_ceil(CALENDAR_MAX_SPAN_BINS as u64 / 2);
    let for_horizon = horizon_ns.div_ceil(CALENDAR_BINS as u64 - 2);
    let mut bin = 1_000_000;
    if for_gso > bin {
        bin = for_gso;
    }
    if for_horizon > bin {
        bin = for_horizon;
    }
    bin
}

/// Marks a time as that of a packet the calendar lent a departure now (what `calendar::book`
/// returns, `FlowState::last_on_wire_ns`): the packet left at once, and the time is only the
/// calendar's estimate of when the link carries it. Times are nanoseconds since boot, far below
/// this bit.
pub const LENT: u64 = 1 << 63;

/// A packet the calendar lent a departure counts as on its way to the link for at most this
/// many full frames' wire time at the rate (`ShaperConfig::lent_window_ns`), however far
/// behind the bulk flows' bookings the calendar booked it. CAKE sends a sparse flow's packet
/// after the frame being sent and the sparse packets ahead of it (a frame's time and a little
/// more), and a newer ACK of its flow replaces it only meanwhile. Counted until its booking
/// behind the bins the bulk flows had filled, a lent ACK stood ahead up to 4 ms on a 50 Mbit/s
/// uplink (bins of 1 ms, four to a span), where CAKE's waits 0.25 ms: the filter dropped 43 %
/// of the downloads' ACKs on a symmetric link against CAKE's under 1 %, and the download lost
/// 1.5 %. On 30/1 the senders, hearing fewer and larger ACKs, sent bursts that queued in the
/// modem ahead of the router, where the ping waited: one frame gave the ping 3 ms back and the
/// uploads 8 points of the uplink less, two frames most of the ping and 4 points less.
pub const LENT_WINDOW_FRAMES: u64 = 2;

/// Key of a host or a flow (the fields the isolation mode selects; the others zero).
/// IPv4 addresses sit in the first word; `family` (4 or 6) keeps the two apart. `_pad[0]` marks
/// a new-flow overflow bucket, `_pad[1]` is the tin: hosts and flows are per tin.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub src: [u32; 4],
    pub dst: [u32; 4],
    pub src_port: u16,
    pub dst_port: u16,
    pub proto: u8,
    pub family: u8,
    pub _pad: [u8; 2],
}

/// A host's state, written only by the data path (LRU hash). Counters are cumulative: the
/// control plane diffs them between ticks and never writes here.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostState {
    pub bytes: u64,
    pub packets: u64,
    /// Wire bytes of packets that waited on their flow clock or the calendar (backlogged flows),
    /// or that were sent over their host's allocation (sparse packets booked while the host's
    /// guard stood more than its slack ahead).
    pub waited_bytes: u64,
    /// Flow-time: the sum over its packets of how far each moved its flow's clock (transmission
    /// time at the flow's level, plus any push by the calendar). Over an interval, its growth
    /// divided by the interval is the number of flows kept busy (a flow limited elsewhere counts
    /// as the fraction of the level it uses), whatever the packet sizes (one 64 KB GSO packet
    /// every 100 ms counts as much as its 45 frames) and whether the level or the aggregate
    /// held the flow back.
    pub busy_ns: u64,
    /// The same for the packets counted in `waited_bytes`: backlogged flows.
    pub backlogged_busy_ns: u64,
    /// Epoch of `new_flows` (new-flow quota window).
    pub quota_epoch: u64,
    /// Flow entries this host created in `quota_epoch`.
    pub new_flows: u64,
    /// Latest departure scheduled for one of its flows (its queue: this minus now).
    pub latest_depart_ns: u64,
    /// The host's guard clock: when its allocation has carried everything it booked so far.
    pub clock_ns: u64,
    /// Flows seen, counted once per control epoch each: an upper bound for the flow-time
    /// counts, which a flow whose clock was pushed far ahead inflates in the tick it is pushed.
    pub flows_seen: u64,
    /// Control epoch (offset by one) in which `rates` was read.
    pub rates_epoch: u64,
    /// The host's rates as the data path read them in `rates_epoch`: its entry in the host
    /// rates map, or its tin's newcomer level (flags: whether it goes ahead). The control plane
    /// changes them only at a tick, which starts a new epoch, so a host's packets look them up
    /// once an epoch: a hash lookup per packet was a fifth of the data path's cost.
    pub rates: HostRate,
}

/// A flow's state, written only by the data path (LRU hash).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowState {
    /// Departure clock: when the flow's next packet may leave at its level.
    pub clock_ns: u64,
    pub bytes: u64,
    pub packets: u64,
    /// Control epoch (offset by one) in which the flow was last counted in `flows_seen`.
    pub epoch: u64,
    /// COBALT's state for this flow's queue.
    pub aqm: AqmState,
    /// Departure of its most recent packet: no later packet of the flow leaves before it.
    pub last_depart_ns: u64,
    /// When its two most recent packets go on the link (last, previous): their departures, or
    /// for a packet the calendar lent to (it left at once, ahead of what the link still
    /// carries), where the calendar booked its wire time, marked [`LENT`]. For the ACK filter:
    /// how many of them the sender has still to hear.
    pub last_on_wire_ns: u64,
    pub prev_on_wire_ns: u64,
    /// Bytes the flow may still send without their waits behind other flows' bookings being
    /// carried to its clock: a frame (`AqmParams::mtu_bytes`) less what it sent since it was
    /// last found idle, zero once a packet beyond them queued (see `fair::schedule`).
    pub sparse_credit_bytes: u64,
    /// How far its TCP data reaches: its retransmissions are spared the AQM's drops.
    pub data_reach: DataReach,
}

/// A host's levels, written only by the control plane (hash, key [`FlowKey`] of the host).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostRate {
    /// ns per wire byte (fixed point) at the level of the host's flows: their clocks' pace.
    pub flow_ns_per_byte_fp: u64,
    /// ns per wire byte (fixed point) at the host's allocation: its guard clock's pace.
    pub host_ns_per_byte_fp: u64,
    /// [`host_flags`].
    pub flags: u64,
    /// How far ahead of its allocation the host may book ([`host_slack_ns`] at its flow level).
    pub slack_ns: u64,
    /// The least a kept ACK of a thinned flow charges its flow's clock (ns): its share of a
    /// round ([`ShaperConfig::ack_quantum_bytes`]) at the level of the host's flows before its
    /// boost. The boost recovers wire time that flows held by the host's guard lose; a kept ACK
    /// goes ahead of the guard and loses none. Computed here, so the data path multiplies once.
    pub ack_round_ns: u64,
}

impl HostRate {
    /// The levels of a host whose flows run at `flow_ns_per_byte_fp` and whose guard at
    /// `host_ns_per_byte_fp` (0: no guard), with the guard's slack for that flow level.
    pub fn new(
        config: &ShaperConfig,
        flow_ns_per_byte_fp: u64,
        host_ns_per_byte_fp: u64,
        flags: u64,
    ) -> Self {
        Self {
            flow_ns_per_byte_fp,
            host_ns_per_byte_fp,
            flags,
            slack_ns: host_slack_ns(config, flow_ns_per_byte_fp),
            ack_round_ns: ack_round_ns(config, flow_ns_per_byte_fp),
        }
    }

    /// The same, with the rounds of its thinned ACK flows at `level_ns_per_byte_fp` (the level
    /// before the host's boost).
    pub fn with_rounds_at(self, config: &ShaperConfig, level_ns_per_byte_fp: u64) -> Self {
        Self {
            ack_round_ns: ack_round_ns(config, level_ns_per_byte_fp),
            ..self
        }
    }
}

/// A thinned ACK's share of a round at a level of `ns_per_byte_fp` (see
/// [`HostRate::ack_round_ns`]).
#[inline(always)]
pub fn ack_round_ns(config: &ShaperConfig, ns_per_byte_fp: u64) -> u64 {
    crate::edt::tx_time_ns(config.ack_quantum_bytes as u64, ns_per_byte_fp)
}

/// Flags of a [`HostRate`].
pub mod host_flags {
    /// The host used less than its allocation (limited elsewhere, or not measured yet), and
    /// other hosts of its tin are bottlenecked: its packets go ahead of the calendar's
    /// bookings, which those hosts made at allocations that counted it at what it used, until
    /// the next tick measures it again.
    pub const AHEAD: u64 = 1;
}

/// Global values of the control loop (array, one entry), written by the control plane.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Levels {
    /// Control epoch, bumped every tick.
    pub epoch: u64,
    /// Tins within their bandwidth threshold and above best effort (bit per tin): their packets
    /// book the calendar ahead of lower tins' queues.
    pub priority_tins: u64,
    /// Tins with bottlenecked hosts (bit per tin): a newcomer's packets go ahead of their
    /// bookings, and the wire time it takes pushes their later packets. In a tin without any,
    /// nothing would be pushed: newcomers book like everyone else, or hosts appearing together
    /// (each at the newcomer level, up to the whole rate) would overrun the rate until the next
    /// tick. (Hosts not bottlenecked get `host_flags::AHEAD` on the same condition.)
    pub newcomers_ahead_tins: u64,
    /// Per tin, the pace of the flows of a host seen for the first time (the level it would
    /// get as one more bottlenecked host of the tin), used until the control plane writes its
    /// [`HostRate`].
    pub new_host_ns_per_byte_fp: [u64; MAX_TINS],
    /// Per tin, the guard's slack of such a host ([`HostRate::slack_ns`] at that level).
    pub new_host_slack_ns: [u64; MAX_TINS],
    /// How long the control loop's previous tick took (from reading the hosts to writing its
    /// levels), and the longest tick so far, in ns: the loop keeps its interval only while
    /// they stay below it. For `shaper stats`; the data path does not read them.
    pub tick_ns: u64,
    pub max_tick_ns: u64,
}

impl Levels {
    /// Sets tin `tin`'s newcomer level (0: none; a new host's flows then run at the rate,
    /// unguarded).
    pub fn set_newcomer(&mut self, config: &ShaperConfig, tin: usize, ns_per_byte_fp: u64) {
        self.new_host_ns_per_byte_fp[tin] = ns_per_byte_fp;
        self.new_host_slack_ns[tin] = host_slack_ns(config, ns_per_byte_fp);
    }
}

/// Why a packet was dropped by the data path.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Its departure time would be beyond the horizon.
    Horizon = 0,
    /// CoDel's signal on a packet that cannot carry an ECN mark.
    Codel = 1,
    /// BLUE's probabilistic drop of a flow that overflowed its hard limit.
    Blue = 2,
    /// Its flow's queue was beyond the flow's hard limit.
    Overlimit = 3,
}

impl DropReason {
    pub const COUNT: usize = 4;
    pub const ALL: [Self; Self::COUNT] = [Self::Horizon, Self::Codel, Self::Blue, Self::Overlimit];
    pub const fn name(self) -> &'static str {
        match self {
            Self::Horizon => "horizon",
            Self::Codel => "codel",
            Self::Blue => "blue",
            Self::Overlimit => "overlimit",
        }
    }
}

/// Why a packet left without a departure time (fail-open paths).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassReason {
    /// Not IPv4/IPv6 (ARP, LLDP, ...): never delayed.
    NonIp = 0,
    /// Truncated or inconsistent headers.
    Malformed = 1,
    /// No rate configured yet.
    Unconfigured = 2,
    /// No host or flow entry could be had (map full beyond what LRU eviction frees), or a
    /// program of the data path could not be reached by its tail call.
    NoState = 3,
}

impl PassReason {
    pub const COUNT: usize = 4;
    pub const ALL: [Self; Self::COUNT] = [
        Self::NonIp,
        Self::Malformed,
        Self::Unconfigured,
        Self::NoState,
    ];
    pub const fn name(self) -> &'static str {
        match self {
            Self::NonIp => "non_ip",
            Self::Malformed => "malformed",
            Self::Unconfigured => "unconfigured",
            Self::NoState => "no_state",
        }
    }
}

/// Per-CPU counters (one per-CPU array entry); the control plane sums the CPUs.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DatapathStats {
    /// Packets stamped with a departure time (GSO super-packets count once).
    pub shaped_packets: u64,
    /// Wire bytes of the stamped packets, as accounted against the rate.
    pub shaped_bytes: u64,
    /// Packets dropped, by [`DropReason`].
    pub dropped: [u64; DropReason::COUNT],
    /// Packets passed without a departure time, by [`PassReason`].
    pub passed: [u64; PassReason::COUNT],
    /// Clock reservations that lost the compare-and-swap race too often and fell back to an
    /// atomic add (see the data path's `edt` module): a measure of cross-CPU contention.
    pub clock_contended: u64,
    /// Packets the calendar moved past their flow's time (the aggregate was overbooked).
    pub calendar_delayed: u64,
    /// Wire time (ns) the calendar could not place: what priority packets borrowed beyond the
    /// bins they may span (the lent debt), and a packet's when the bin after its span changed
    /// under it.
    pub calendar_unplaced_ns: u64,
    /// Priority packets (a sparse flow's, a host's going ahead, a prioritised tin's) the
    /// calendar did not lend to because its debt stood at what it lends: they booked behind
    /// the others' packets, and a sparse flow's waited.
    pub calendar_refused: u64,
    /// Latest departure stamped on this CPU (the scheduled queue: this minus now).
    pub latest_depart_ns: u64,
    /// Packets CE-marked by the AQM.
    pub ecn_marked: u64,
    /// Packets of sparse flows (their flow idle for at least the packet's own time), sent at
    /// once without waiting for the calendar or their host's guard.
    pub sparse: u64,
    /// GSO packets left to the segmenter unstamped (see `ShaperConfig::split_gso_segs`); their
    /// frames come back and are counted as shaped.
    pub segmented: u64,
    /// Frames (GSO segments) by scheduled delay, see [`delay_bucket`].
    pub delay_hist: [u64; DELAY_BUCKETS],
    /// Frames scheduled further ahead than the AQM's target: against the frames of the
    /// histogram, whether the median stands within the target, which the histogram's octaves
    /// cannot tell (a finer one costs the verifier more than the scheduler can spare).
    pub over_target: u64,
    /// ECN-capable packets dropped, for any reason: the AQM marks them, so these are the drops
    /// an ECN flow still sees (its hard limit, BLUE, the horizon).
    pub ecn_capable_dropped: u64,
    /// Packets and wire bytes stamped, per tin.
    pub tin_packets: [u64; MAX_TINS],
    pub tin_bytes: [u64; MAX_TINS],
    /// Pure ACKs the ACK filter examined, dropped, and kept by [`KeepReason`].
    pub ack_seen: u64,
    pub ack_dropped: u64,
    pub ack_kept: [u64; KeepReason::COUNT],
    /// Kept pure ACKs sent at once, ahead of their flow's packets still scheduled
    /// ([`crate::ackfilter::jumps_queue`]).
    pub ack_jumped: u64,
    /// Packets the device sent ahead of the rate beyond the meter's burst (a stall's clump,
    /// `overrun::meter`), and the wire time charged to the calendar as owed for them.
    pub overrun_packets: u64,
    pub overrun_ns: u64,
}

/// Buckets of the scheduled-delay histogram: bucket 0 is under 64 µs, bucket `i` (1..15) is
/// `[64 µs · 2^(i-1), 64 µs · 2^i)`, the last is open-ended (1.05 s and more).
pub const DELAY_BUCKETS: usize = 16;
const DELAY_BUCKET_BASE_NS: u64 = 64_000;

/// The histogram bucket of a scheduled delay (a bounded scan: no count-leading-zeros in BPF).
#[inline(always)]
pub fn delay_bucket(delay_ns: u64) -> usize {
    let mut bucket = 0;
    let mut bound = DELAY_BUCKET_BASE_NS;
    while bucket < DELAY_BUCKETS - 1 && delay_ns >= bound {
        bucket += 1;
        bound <<= 1;
    }
    bucket
}

/// The bucket of a histogram holding its `per_mille` / 1000 quantile: the first whose running
/// count reaches that rank. `None` when the histogram is empty. Shared by `shaper stats` and
/// the lab's reports, which pool several runs' histograms.
pub fn quantile_bucket(counts: &[u64], per_mille: u64) -> Option<usize> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = total.saturating_mul(per_mille).div_ceil(1000).max(1);
    let mut seen = 0;
    counts.iter().position(|&n| {
        seen += n;
        seen >= rank
    })
}

/// The upper bound (ns) of a bucket; `u64::MAX` for the last.
pub const fn delay_bucket_upper_ns(bucket: usize) -> u64 {
    if bucket >= DELAY_BUCKETS - 1 {
        u64::MAX
    } else {
        DELAY_BUCKET_BASE_NS << bucket
    }
}

impl DatapathStats {
    /// Adds another CPU's counters into this one.
    pub fn accumulate(&mut self, other: &Self) {
        self.shaped_packets += other.shaped_packets;
        self.shaped_bytes += other.shaped_bytes;
        for (a, b) in self.dropped.iter_mut().zip(other.dropped.iter()) {
            *a += b;
        }
        for (a, b) in self.passed.iter_mut().zip(other.passed.iter()) {
            *a += b;
        }
        self.clock_contended += other.clock_contended;
        self.calendar_delayed += other.calendar_delayed;
        self.calendar_unplaced_ns += other.calendar_unplaced_ns;
        self.calendar_refused += other.calendar_refused;
        self.latest_depart_ns = self.latest_depart_ns.max(other.latest_depart_ns);
        self.ecn_marked += other.ecn_marked;
        self.sparse += other.sparse;
        self.segmented += other.segmented;
        for (a, b) in self.delay_hist.iter_mut().zip(other.delay_hist.iter()) {
            *a += b;
        }
        self.over_target += other.over_target;
        self.ecn_capable_dropped += other.ecn_capable_dropped;
        for t in 0..MAX_TINS {
            self.tin_packets[t] += other.tin_packets[t];
            self.tin_bytes[t] += other.tin_bytes[t];
        }
        self.ack_seen += other.ack_seen;
        self.ack_dropped += other.ack_dropped;
        for (a, b) in self.ack_kept.iter_mut().zip(other.ack_kept.iter()) {
            *a += b;
        }
        self.ack_jumped += other.ack_jumped;
        self.overrun_packets += other.overrun_packets;
        self.overrun_ns += other.overrun_ns;
    }
}

/// Names of the maps, as declared in the BPF object.
pub mod map_names {
    pub const CONFIG: &str = "SHAPER_CONFIG";
    pub const STATS: &str = "SHAPER_STATS";
    pub const LEVELS: &str = "SHAPER_LEVELS";
    pub const HOSTS: &str = "SHAPER_HOSTS";
    pub const HOST_RATES: &str = "SHAPER_HOST_RATES";
    pub const FLOWS: &str = "SHAPER_FLOWS";
    pub const CALENDAR: &str = "SHAPER_CALENDAR";
    /// Programs reached by tail calls, at [`super::program_slots`].
    pub const PROGRAMS: &str = "SHAPER_PROGRAMS";
    pub const ACKS: &str = "SHAPER_ACKS";
    pub const REVERSE: &str = "SHAPER_REVERSE";
    /// The dequeue observer's device and offsets (`overrun::DequeueWatch`).
    pub const DEQUEUE_WATCH: &str = "SHAPER_DEQUEUE_WATCH";
}

/// Names of the BPF programs.
pub mod program_names {
    /// Attached at egress: classifies each packet and hands it to the ACK filter or the
    /// scheduler by a tail call.
    pub const EGRESS: &str = "shaper_egress";
    /// Stamps the departure time; reached by a tail call from the egress program or the ACK
    /// filter.
    pub const SCHEDULE: &str = "shaper_schedule";
    /// Sets CE on packets the AQM picked; reached by a tail call from the egress program.
    pub const MARK: &str = "shaper_mark";
    /// The ACK filter's decision on a pure ACK; tail-called from the egress program, it hands
    /// the ACKs it keeps to the scheduler.
    pub const ACK_FILTER: &str = "shaper_ack_filter";
    /// Records the data direction for the ACK filter (attached at ingress).
    pub const INGRESS: &str = "shaper_ingress";
    /// Picks the packets the segmenter splits: a classifier (not direct-action) whose filter
    /// carries a `mirred` redirect to the segmenter's IFB, after the egress program.
    pub const SEGMENT: &str = "shaper_segment";
    pub const ALL: [&str; 6] = [EGRESS, SCHEDULE, MARK, ACK_FILTER, INGRESS, SEGMENT];
    /// Watches the qdisc's dequeues for packets leaving late (a raw tracepoint on
    /// `qdisc_dequeue`, not a classifier: not in [`ALL`]).
    pub const DEQUEUE: &str = "shaper_dequeue";
}

/// Slots of `SHAPER_PROGRAMS`.
pub mod program_slots {
    pub const MARK: u32 = 0;
    pub const ACK_FILTER: u32 = 1;
    pub const SCHEDULE: u32 = 2;
}

const _: () = {
    assert!(core::mem::size_of::<FlowKey>() == 40);
    assert!(core::mem::size_of::<HostState>() == 128);
    assert!(core::mem::size_of::<FlowState>() == 104);
    assert!(core::mem::size_of::<HostRate>() == 40);
    assert!(core::mem::size_of::<Levels>() == 40 + 16 * MAX_TINS);
    assert!(core::mem::size_of::<ShaperConfig>() == 72 + 40 + 64 + 32);
    assert!(
        core::mem::size_of::<DatapathStats>()
            == 8 * (17
                + DropReason::COUNT
                + PassReason::COUNT
                + DELAY_BUCKETS
                + 2 * MAX_TINS
                + KeepReason::COUNT)
    );
    assert!(core::mem::size_of::<AckState>() == 56);
    assert!(core::mem::size_of::<ReverseState>() == 8);
    assert!(core::mem::size_of::<crate::overrun::DequeueWatch>() == 32);
};

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: plain `#[repr(C)]` integers with no implicit padding (asserted above).
    unsafe impl aya::Pod for ShaperConfig {}
    unsafe impl aya::Pod for DatapathStats {}
    unsafe impl aya::Pod for FlowKey {}
    unsafe impl aya::Pod for HostState {}
    unsafe impl aya::Pod for FlowState {}
    unsafe impl aya::Pod for HostRate {}
    unsafe impl aya::Pod for Levels {}
    unsafe impl aya::Pod for AckState {}
    unsafe impl aya::Pod for ReverseState {}
    unsafe impl aya::Pod for crate::overrun::DequeueWatch {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar_bins_fit_the_largest_packet_and_no_more() {
        use crate::edt::ns_per_byte_fp;
        const S: u64 = 1_000_000_000;
        // 1 ms at the rates where the largest packet takes less than 2 ms.
        assert_eq!(
            calendar_bin_ns(ns_per_byte_fp(100_000_000), 2 * S, 3_028),
            1_000_000
        );
        // Two frames at 950 kbit/s take 25.5 ms: bins of half that, not the 276 ms a 64 KiB
        // packet would need.
        let slow = calendar_bin_ns(ns_per_byte_fp(950_000), 2 * S, 3_028);
        assert!((12_700_000..12_800_000).contains(&slow), "{slow}");
        let gso = calendar_bin_ns(ns_per_byte_fp(950_000), 2 * S, 65_536);
        assert!((275_000_000..277_000_000).contains(&gso), "{gso}");
        // The ring always spans the horizon.
        let far = calendar_bin_ns(ns_per_byte_fp(1_000_000_000), 100 * S, 1_514);
        assert!(far * (CALENDAR_BINS as u64 - 2) >= 100 * S);
    }

    #[test]
    fn host_slack_holds_its_flows_standing_queues_up_to_an_interval() {
        use crate::{aqm::AqmParams, edt::ns_per_byte_fp};
        const MS: u64 = 1_000_000;
        let config = |rate: u64, largest: u64| {
            let fp = ns_per_byte_fp(rate);
            ShaperConfig {
                ns_per_byte_fp: fp,
                calendar_bin_ns: calendar_bin_ns(fp, 2_000 * MS, largest),
                aqm: AqmParams::for_rate(crate::aqm::DEFAULT_RTT_NS, fp, 1514, 2_000 * MS),
                ..Default::default()
            }
        };
        // 100 Mbit/s, 64 KiB packets: a host of 10 flows at 10 Mbit/s holds 2.4 ms of its
        // flows' floors; the four bins (10.5 ms) are more.
        let fast = config(100_000_000, 65_536);
        assert_eq!(
            host_slack_ns(&fast, ns_per_byte_fp(10_000_000)),
            4 * fast.calendar_bin_ns
        );
        // 950 kbit/s, eight flows at a level of 118.75 kbit/s: two full frames at that level
        // are 204 ms, more than the interval (113.9 ms): the interval.
        let slow = config(950_000, 3_028);
        let interval = slow.aqm.interval_ns;
        assert!((113 * MS..115 * MS).contains(&interval), "{interval}");
        assert_eq!(host_slack_ns(&slow, ns_per_byte_fp(118_750)), interval);
        // Two flows at 475 kbit/s: their floors (51 ms) and the four bins (51 ms) agree.
        let two = host_slack_ns(&slow, ns_per_byte_fp(475_000));
        assert!((50 * MS..52 * MS).contains(&two), "{two}");
    }

    #[test]
    fn quantile_bucket_is_the_first_to_reach_the_rank() {
        assert_eq!(quantile_bucket(&[0, 0, 0], 500), None);
        // 10 frames: the median is the 5th, the 99th percentile the 10th.
        let h = [4, 1, 0, 5];
        assert_eq!(quantile_bucket(&h, 500), Some(1));
        assert_eq!(quantile_bucket(&h, 990), Some(3));
        assert_eq!(quantile_bucket(&h, 400), Some(0));
        // The smallest quantile is still a frame's bucket, not an empty one before it.
        assert_eq!(quantile_bucket(&[0, 3], 0), Some(1));
    }

    #[test]
    fn delay_buckets_double_from_64us() {
        assert_eq!(delay_bucket(0), 0);
        assert_eq!(delay_bucket(63_999), 0);
        assert_eq!(delay_bucket(64_000), 1);
        assert_eq!(delay_bucket(127_999), 1);
        assert_eq!(delay_bucket(128_000), 2);
        assert_eq!(delay_bucket(5_000_000), 7); // [4.096, 8.192) ms
        assert_eq!(delay_bucket(u64::MAX), DELAY_BUCKETS - 1);
        for b in 0..DELAY_BUCKETS - 1 {
            let upper = delay_bucket_upper_ns(b);
            assert_eq!(delay_bucket(upper - 1), b);
            assert_eq!(delay_bucket(upper), b + 1);
        }
    }
}
