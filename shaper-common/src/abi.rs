//! The map keys and values the BPF data path and the control plane share: one layout on both
//! sides, `#[repr(C)]` with explicit padding (no `bool`, no implicit holes), sizes asserted
//! below. What the control plane computes into them is `sizing`'s; the counters are `stats`'.

use crate::{
    aqm::{AqmParams, AqmState, DataReach},
    diffserv::MAX_TINS,
    framing::Framing,
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
    /// How a frame is counted on the bottleneck link (CAKE's overhead, mpu, atm/ptm).
    pub framing: Framing,
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
    /// to the link, at most (ns; see [`crate::sizing::LENT_WINDOW_FRAMES`]). Zero: until where the calendar
    /// booked its wire time.
    pub lent_window_ns: u32,
    /// The device's link-layer header in front of the network header (Ethernet's 14; 0 on
    /// devices that carry IP alone: PPP, WireGuard, IP tunnels).
    pub link_header_bytes: u32,
    /// Zero: the struct's 8-byte alignment made explicit.
    pub reserved: u32,
}

impl Default for ShaperConfig {
    /// Unconfigured: rate zero (packets pass unshaped), everything else off.
    fn default() -> Self {
        Self {
            rate_bps: 0,
            ns_per_byte_fp: 0,
            horizon_ns: 0,
            framing: Framing::RAW,
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
            link_header_bytes: 0,
            reserved: 0,
        }
    }
}

/// Marks a time as that of a packet the calendar lent a departure now (what `calendar::book`
/// returns, `FlowState::last_on_wire_ns`): the packet left at once, and the time is only the
/// calendar's estimate of when the link carries it. Times are nanoseconds since boot, far below
/// this bit.
pub const LENT: u64 = 1 << 63;

/// Key of a host or a flow (the fields the isolation mode selects; the others zero).
/// IPv4 addresses sit in the first word; `family` (4 or 6) keeps the two apart. Also the key
/// of the ACK filter's maps (a flow's 5-tuple as it travels; `overflow` and `tin` zero).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub src: [u32; 4],
    pub dst: [u32; 4],
    pub src_port: u16,
    pub dst_port: u16,
    pub proto: u8,
    pub family: u8,
    /// 1 for a new-flow overflow bucket: the flows a host creates beyond its per-epoch quota
    /// share a few of these (ports folded into `src_port`, `dst_port` zero), else 0.
    pub overflow: u8,
    /// The packet's tin: hosts and flows are per tin, as in CAKE.
    pub tin: u8,
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
    /// How far ahead of its allocation the host may book ([`crate::sizing::host_slack_ns`] at its
    /// flow level).
    pub slack_ns: u64,
    /// The least a kept ACK of a thinned flow charges its flow's clock (ns): its share of a
    /// round ([`ShaperConfig::ack_quantum_bytes`]) at the level of the host's flows before its
    /// boost. The boost recovers wire time that flows held by the host's guard lose; a kept ACK
    /// goes ahead of the guard and loses none. Computed here, so the data path multiplies once.
    pub ack_round_ns: u64,
}

/// Flags of a [`HostRate`].
pub mod host_flags {
    /// The host used less than its allocation (limited elsewhere, or not measured yet), and
    /// other hosts of its tin are bottlenecked: its packets go ahead of the calendar's
    /// bookings, which those hosts made at allocations that counted it at what it used, until
    /// the next tick measures it again.
    pub const AHEAD: u64 = 1;
    /// Set by the data path only, in its copy of the rates (`HostState::rates`): the host has no
    /// allocation of its own and runs at its tin's newcomer level. Where a host is a (source,
    /// destination) pair, all such hosts towards one destination share one more guard at that
    /// level (`schedule::destination_slot`).
    pub const NEWCOMER: u64 = 2;
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
    /// The CPU time the control loop's thread spent in its previous tick and the most it spent
    /// in one tick so far, in ns (`CLOCK_THREAD_CPUTIME_ID`, system calls included): a tick
    /// whose wall time is well above its CPU time waited for a CPU, one whose CPU time is
    /// near its wall time was slow by its own work. For `shaper stats`; the data path does not
    /// read them.
    pub tick_cpu_ns: u64,
    pub max_tick_cpu_ns: u64,
}

const _: () = {
    assert!(core::mem::size_of::<FlowKey>() == 40);
    assert!(core::mem::size_of::<HostState>() == 128);
    assert!(core::mem::size_of::<FlowState>() == 104);
    assert!(core::mem::size_of::<HostRate>() == 40);
    assert!(core::mem::size_of::<Levels>() == 56 + 16 * MAX_TINS);
    assert!(core::mem::size_of::<ShaperConfig>() == 80 + 40 + 64 + 40);
};

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: plain `#[repr(C)]` integers with no implicit padding (asserted above).
    unsafe impl aya::Pod for ShaperConfig {}
    unsafe impl aya::Pod for FlowKey {}
    unsafe impl aya::Pod for HostState {}
    unsafe impl aya::Pod for FlowState {}
    unsafe impl aya::Pod for HostRate {}
    unsafe impl aya::Pod for Levels {}
}

#[cfg(test)]
mod tests {
    use core::mem::{align_of, offset_of, size_of};

    use super::*;

    #[test]
    fn flow_key_layout_is_the_maps_key() {
        // The BPF object hashes these 40 bytes: any change is a new map key.
        assert_eq!(size_of::<FlowKey>(), 40);
        assert_eq!(align_of::<FlowKey>(), 4);
        assert_eq!(offset_of!(FlowKey, src), 0);
        assert_eq!(offset_of!(FlowKey, dst), 16);
        assert_eq!(offset_of!(FlowKey, src_port), 32);
        assert_eq!(offset_of!(FlowKey, dst_port), 34);
        assert_eq!(offset_of!(FlowKey, proto), 36);
        assert_eq!(offset_of!(FlowKey, family), 37);
        assert_eq!(offset_of!(FlowKey, overflow), 38);
        assert_eq!(offset_of!(FlowKey, tin), 39);
    }
}
