//! The scheduler's decisions, one function a phase, over plain values (docs/design.md, "The
//! scheduler's phases"). The data path (`shaper-ebpf`'s `fair`) reads the maps, runs these in
//! order and writes back what they decide; the clocks' compare-and-swap and the calendar's bins
//! stay there.
//!
//! 1. classify: the packet's host and flow entries, and the paces the control plane set for the
//!    host (data path only).
//! 2. admit: a host's new flows beyond its quota share overflow buckets ([`over_quota`]).
//! 3. standing: what the flow is at this packet, sparse, sparse-waiting or bulk
//!    ([`standing`]), and what it is charged ([`charge`]).
//! 4. AQM: COBALT's verdict on the flow's own queue (`aqm`).
//! 5. clocks: the flow's clock (`edt::reserve`), then the host's guard ([`guard`]).
//! 6. stamp: when the packet may leave ([`release`]), then the calendar, then the departure
//!    ([`departure`]).
//! 7. account: the flow-time and the counters ([`flow_time`], [`waited`]), and when the link
//!    carries the packet, for the ACK filter ([`on_wire_estimate`]).
//!
//! Every function is branch-free arithmetic where the data path needs one verifier path (see
//! `branchless`); flags are 0 or 1 as `u64`.

use crate::{
    abi::{LENT, host_flags},
    ackfilter, branchless, edt, hash,
    isolation::fields,
    sizing::DESTINATION_GUARDS,
};

/// Buckets that absorb a host's new flows beyond its per-epoch quota.
pub const OVERFLOW_BUCKETS: u16 = 16;

/// Whether the host's `new_flows`-th new flow of this epoch goes to the overflow buckets: a
/// flood of new flows from one host shares a few entries of its own instead of evicting other
/// hosts' state. A quota of 0 is none.
#[inline(always)]
pub const fn over_quota(new_flows: u64, quota: u32) -> bool {
    quota != 0 && new_flows > quota as u64
}

/// The overflow bucket of a flow beyond its host's quota.
#[inline(always)]
pub const fn overflow_bucket(src_port: u16, dst_port: u16) -> u16 {
    (src_port ^ dst_port) % OVERFLOW_BUCKETS
}

/// What a packet is charged on its flow's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    /// 1 when it is a pure ACK charged a round (see [`charge`]).
    pub rounds: u64,
    /// The size the AQM's standing floor is taken on.
    pub bytes: u64,
    /// Its wire time at its flow's level: the flow-time it counts.
    pub tx_wire_ns: u64,
    /// How far it moves its flow's clock.
    pub tx_flow_ns: u64,
}

/// What a packet of `wire` bytes is charged at its flow's pace `flow_fp`.
///
/// A pure ACK while the filter is on, whose host has other flows' packets booked after its own
/// (`others_after`), is charged at least a round (`round_ns`, `ack_quantum_bytes`): its flow
/// sends an ACK per round of the bulk flows beside it, as under CAKE's DRR, and the filter
/// thins the ACKs between. Alone, it has no round to keep to and is charged its wire time. Its
/// flow-time is its wire time either way: the level it leaves unused goes to the others.
#[inline(always)]
pub fn charge(
    wire: u64,
    flow_fp: u64,
    pure_ack: u64,
    filter_on: u64,
    others_after: u64,
    ack_quantum_bytes: u64,
    round_ns: u64,
) -> Charge {
    let rounds = pure_ack & filter_on & others_after;
    let tx_wire_ns = edt::tx_time_ns(wire, flow_fp);
    Charge {
        rounds,
        bytes: branchless::select(rounds, branchless::max(wire, ack_quantum_bytes), wire),
        tx_wire_ns,
        tx_flow_ns: branchless::select(rounds, branchless::max(tx_wire_ns, round_ns), tx_wire_ns),
    }
}

/// Whether the host has packets of other flows booked to leave after this flow's: its latest
/// departure is beyond both now and the flow's own last one.
#[inline(always)]
pub fn others_after(now: u64, flow_last_depart: u64, host_latest_depart: u64) -> u64 {
    branchless::below(branchless::max(now, flow_last_depart), host_latest_depart)
}

/// A flow's standing at one of its packets, CAKE's flow states in EDT terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// It waits for nobody: it leaves at once, ahead of the calendar's bookings and its host's
    /// guard, within its share.
    Sparse,
    /// It queues, within the frame's bytes of credit it got when last found idle: its waits
    /// behind other flows' bookings are not carried to its clock.
    SparseWait,
    /// It queues and carries its waits: its clock stays where its packets leave.
    Bulk,
}

/// What [`standing`] decides, as flags the data path uses without branches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    pub sparse: u64,
    pub credited: u64,
    /// The credit the flow keeps after this packet (`FlowState::sparse_credit_bytes`): the
    /// state the flow carries between its packets. Zero is bulk.
    pub credit_bytes: u64,
}

impl Standing {
    pub const fn class(&self) -> Class {
        match (self.sparse, self.credited) {
            (1, _) => Class::Sparse,
            (_, 1) => Class::SparseWait,
            _ => Class::Bulk,
        }
    }
}

/// The flow's standing at a packet of `wire` bytes that moves its clock by `tx_flow`, its clock
/// standing at `flow_clock` with `credit` bytes of credit.
///
/// A flow idle for at least this packet's time at its level (a DNS query, a keystroke, a ping)
/// is sparse. Once found idle, it stays sparse while its queue is empty at each packet, within
/// the frame's bytes (`quantum`, CAKE's quantum for a new flow) of credit it then gets: idle for
/// a packet's time is the test to become sparse, not to stay so, or a flow at about half its
/// level falls out of it whenever a packet comes a little early, and the packets after it wait
/// behind the bulk bookings. A pure ACK takes the strict test only: an ACK flow's pace is its
/// download's, not its own. Packets that find their flow's queue not empty (a burst) are not
/// sparse; within the credit they are sparse-waiting. A packet TCP paced into the future
/// (`tcp_tstamp` after now) is neither: its sender already queues it.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn standing(
    now: u64,
    flow_clock: u64,
    tx_flow: u64,
    tcp_tstamp: u64,
    credit: u64,
    wire: u64,
    pure_ack: u64,
    quantum: u64,
) -> Standing {
    let idle = branchless::below(now, flow_clock + tx_flow) ^ 1;
    let unpaced = branchless::below(now, tcp_tstamp) ^ 1;
    let has_credit = branchless::below(credit, wire) ^ 1;
    let drained = branchless::below(now, flow_clock) ^ 1;
    let sparse = (idle | (drained & has_credit & (pure_ack ^ 1))) & unpaced;
    let credited = has_credit & (sparse ^ 1) & unpaced;
    let left = branchless::select(
        idle,
        quantum - branchless::min(quantum, wire),
        credit - branchless::min(credit, wire),
    );
    Standing {
        sparse,
        credited,
        credit_bytes: branchless::select(sparse | credited, left, 0),
    }
}

/// Whether a sparse packet is dropped before it books anything: its host has booked more than a
/// flow's hard limit (`limit_ns`) ahead of its allocation. Its flows' queues cannot explain
/// that: its traffic is many sparse flows (a flood of new ones) that no flow clock holds, and
/// what it sends is held to its allocation.
#[inline(always)]
pub const fn sparse_over_limit(host_clock: u64, now: u64, limit_ns: u64) -> bool {
    host_clock > now + limit_ns
}

/// No destination guard (`destination_slot`).
pub const NO_SLOT: u32 = u32::MAX;

/// The guard a host without an allocation of its own (`host_flags::NEWCOMER` in `flags`)
/// shares with every such host towards its destination `dst` (its key's destination field) in
/// tin `tin`: a slot of `DESTINATION_GUARDS`, or [`NO_SLOT`]. Only where a host is a (source,
/// destination) pair (`host_fields` has both): there every spoofed source towards one victim is
/// a host of its own, each at the newcomer level, and together they would take a share per
/// source. Held by the destination's guard at that level, they take one, as CAKE's
/// triple-isolate counts the victim once; newcomers towards other destinations are not held
/// by it. Where the host is one side only, it is the destination itself (its own guard holds
/// its newcomers) or the source, which CAKE also counts once per source.
#[inline(always)]
pub fn destination_slot(host_fields: u32, flags: u64, dst: &[u32; 4], tin: u8) -> u32 {
    let pair = (host_fields & (fields::SRC_HOST | fields::SRC_ADDR) != 0)
        & (host_fields & (fields::DST_HOST | fields::DST_ADDR) != 0);
    let newcomer = flags & host_flags::NEWCOMER != 0;
    let slot = hash::slot(hash::fold(dst).wrapping_add(tin as u32), DESTINATION_GUARDS);
    branchless::select((pair & newcomer) as u64, slot as u64, NO_SLOT as u64) as u32
}

/// The host guard's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guarded {
    /// The earliest the packet may leave, held to its host's allocation.
    pub at: u64,
    /// For a kept ACK that goes ahead of its host's bookings: where the guard would have held
    /// it (0: it was not). The ACK filter counts it until then as it counts a lent one.
    pub behind_host: u64,
}

/// The host's guard for a packet its flow's clock put at `want`, the guard's own reservation
/// starting at `start`: its flows may book ahead of its allocation by `slack`, no further.
/// It bites only when the flow levels overbook the host.
///
/// A sparse packet is charged to the guard but not held by it. A kept ACK (`kept`) goes ahead
/// of its host's bookings when the host has packets of other flows booked after it (uploads
/// beside a download): its wire time, charged to the guard, pushes those. A host with nothing
/// booked beyond its ACK flow's own packets has nobody to push: the guard holds it.
#[inline(always)]
pub fn guard(
    want: u64,
    start: u64,
    slack: u64,
    sparse: bool,
    kept: bool,
    host_latest_depart: u64,
    flow_last_depart: u64,
) -> Guarded {
    let floor = start.saturating_sub(slack);
    let mut out = Guarded {
        at: want,
        behind_host: 0,
    };
    if floor > want && !sparse {
        if kept && host_latest_depart > branchless::max(want, flow_last_depart) {
            out.behind_host = floor;
        } else {
            out.at = floor;
        }
    }
    out
}

/// When the packet asks the calendar to leave: where its host's guard holds it, or now for a
/// sparse one; never before its flow's last packet (a TCP flow's segments stay in order: after
/// an idle spell its clock may stand before packets still booked); now for an ACK sent ahead
/// of its flow's queue (`jumps`).
#[inline(always)]
pub fn release(now: u64, guarded: u64, flow_last_depart: u64, sparse: u64, jumps: u64) -> u64 {
    let at = branchless::max(branchless::select(sparse, now, guarded), flow_last_depart);
    branchless::select(jumps, now, at)
}

/// The departure from the calendar's answer `booked` to a packet that asked for `released`: a
/// packet it lent to ([`LENT`]) leaves when it asked. Returns (departure, lent as 0 or 1).
#[inline(always)]
pub fn departure(booked: u64, released: u64) -> (u64, u64) {
    let lent = booked >> LENT.trailing_zeros();
    (branchless::select(lent, released, booked & !LENT), lent)
}

/// Whether the flow's clock moves to behind this packet: held back past its clock (`want`) by
/// its host or the calendar, the flow's next packet queues behind it. Not for leaving behind
/// its own flow's last packet, nor within a sparse-waiting flow's credit: their waits are not
/// the flow's.
#[inline(always)]
pub fn carries_wait(depart: u64, want: u64, flow_last_depart: u64, credited: u64) -> bool {
    depart > branchless::max(want, flow_last_depart) && credited == 0
}

/// Flow-time: how far this packet moved its flow's clock, its wire time at the level (`tx_wire`)
/// plus any push by the guard or the calendar beyond where its clock put it (`want`). Returns
/// (where its flow's clock put it or later, the flow-time).
///
/// A flow kept busy here accounts for the whole interval whether its level or the overbooked
/// aggregate held it back, so the count of busy flows is the number of flows, not the rate
/// divided by a level that may be wrong. An ACK charged a round counts its wire time only.
#[inline(always)]
pub fn flow_time(depart: u64, want: u64, tx_wire: u64) -> (u64, u64) {
    let charged = branchless::max(depart, want);
    (charged, charged + tx_wire - want)
}

/// Whether the packet counts as waited (its flow bottlenecked here): held back by its own clock
/// or by the calendar (`charged` after now), or a sparse packet booked while its host's guard
/// already stood more than the slack and its own time ahead (`over_allocation`): it was sent
/// over the host's allocation. Otherwise a flow the calendar delays, or a host of many sparse
/// flows, would read as limited elsewhere, and its share would go to the very flows that
/// overbooked.
#[inline(always)]
pub const fn waited(charged: u64, now: u64, over_allocation: bool) -> bool {
    charged > now || over_allocation
}

/// Whether a sparse packet was sent over its host's allocation (see [`waited`]).
#[inline(always)]
pub const fn over_allocation(
    sparse: bool,
    guarded_host: bool,
    host_clock: u64,
    now: u64,
    slack: u64,
    tx_host: u64,
) -> bool {
    sparse && guarded_host && host_clock > now + slack + tx_host
}

/// When the link carries the packet, for the ACK filter, from the calendar's answer `booked`:
/// a kept ACK lent to ahead of its host's bookings is on its way no earlier than where its
/// host's guard would have held it (`behind_host`).
#[inline(always)]
pub fn on_wire_estimate(booked: u64, lent: u64, behind_host: u64) -> u64 {
    branchless::select(
        lent,
        LENT | branchless::max(booked & !LENT, behind_host),
        booked,
    )
}

/// The flow's (last, previous) on-wire times after this packet: an ACK sent ahead of its flow's
/// queue (`jumps`) is not scheduled ahead of anything, so the flow's departures stay those of
/// its queue.
#[inline(always)]
pub fn recent_on_wire(
    last: u64,
    prev: u64,
    estimate: u64,
    depart: u64,
    now: u64,
    window_ns: u64,
    jumps: u64,
) -> (u64, u64) {
    let on_wire = ackfilter::on_wire(estimate, depart, now, window_ns);
    (
        branchless::select(jumps, last, on_wire),
        branchless::select(jumps, prev, last),
    )
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    const MS: u64 = 1_000_000;
    /// 10 Mbit/s: 800 ns a byte.
    const FP_10M: u64 = edt::ns_per_byte_fp(10_000_000);

    #[test]
    fn the_quota_counts_flows_beyond_it_and_zero_is_none() {
        assert!(!over_quota(10, 10));
        assert!(over_quota(11, 10));
        assert!(!over_quota(u64::MAX >> 1, 0));
        for (s, d) in [(0, 0), (65_535, 1), (443, 51_000)] {
            assert!(overflow_bucket(s, d) < OVERFLOW_BUCKETS);
        }
        assert_eq!(overflow_bucket(5, 3), overflow_bucket(3, 5));
    }

    #[test]
    fn a_pure_ack_is_charged_a_round_only_with_the_filter_on_and_others_booked() {
        let round = 2 * MS;
        let alone = charge(66, FP_10M, 1, 1, 0, 1_514, round);
        assert_eq!(alone.rounds, 0);
        assert_eq!(alone.tx_flow_ns, alone.tx_wire_ns);
        assert_eq!(alone.bytes, 66);
        let off = charge(66, FP_10M, 1, 0, 1, 1_514, round);
        assert_eq!(off.rounds, 0);
        let data = charge(1_514, FP_10M, 0, 1, 1, 1_514, round);
        assert_eq!(data.rounds, 0);
        let among = charge(66, FP_10M, 1, 1, 1, 1_514, round);
        assert_eq!(among.rounds, 1);
        assert_eq!(among.tx_flow_ns, round);
        assert_eq!(among.bytes, 1_514);
        // Its flow-time stays its wire time.
        assert_eq!(among.tx_wire_ns, edt::tx_time_ns(66, FP_10M));
        // A round shorter than its own wire time charges the wire time.
        assert_eq!(
            charge(66, FP_10M, 1, 1, 1, 10, 1).tx_flow_ns,
            among.tx_wire_ns
        );
    }

    #[test]
    fn others_after_needs_a_later_booking_than_now_and_the_flows_own() {
        assert_eq!(others_after(10, 5, 11), 1);
        assert_eq!(others_after(10, 12, 11), 0);
        assert_eq!(others_after(10, 5, 10), 0);
    }

    #[test]
    fn an_idle_flow_is_sparse_and_gets_a_frame_of_credit() {
        let s = standing(100 * MS, 50 * MS, MS, 0, 0, 200, 0, 1_514);
        assert_eq!(s.class(), Class::Sparse);
        assert_eq!(s.credit_bytes, 1_514 - 200);
    }

    #[test]
    fn a_drained_flow_stays_sparse_within_its_credit_and_spends_it() {
        // Its queue is empty but not for this packet's time: sparse on its credit.
        let now = 100 * MS;
        let s = standing(now, now - MS / 2, MS, 0, 1_000, 200, 0, 1_514);
        assert_eq!(s.class(), Class::Sparse);
        assert_eq!(s.credit_bytes, 800);
        // Without the credit for this packet it is bulk, its credit gone.
        let s = standing(now, now - MS / 2, MS, 0, 100, 200, 0, 1_514);
        assert_eq!(s.class(), Class::Bulk);
        assert_eq!(s.credit_bytes, 0);
        // A pure ACK takes the strict test only.
        let s = standing(now, now - MS / 2, MS, 0, 1_000, 66, 1, 1_514);
        assert_ne!(s.class(), Class::Sparse);
    }

    #[test]
    fn a_queued_flow_within_its_credit_is_sparse_waiting_then_bulk() {
        let now = 100 * MS;
        let s = standing(now, now + 3 * MS, MS, 0, 1_000, 600, 0, 1_514);
        assert_eq!(s.class(), Class::SparseWait);
        assert_eq!(s.credit_bytes, 400);
        let s = standing(now, now + 3 * MS, MS, 0, 400, 600, 0, 1_514);
        assert_eq!(s.class(), Class::Bulk);
        assert_eq!(s.credit_bytes, 0);
    }

    #[test]
    fn a_packet_tcp_paced_into_the_future_is_bulk() {
        let now = 100 * MS;
        let s = standing(now, 0, MS, now + 1, 1_514, 200, 0, 1_514);
        assert_eq!(s.class(), Class::Bulk);
        assert_eq!(s.credit_bytes, 0);
        // Paced to now exactly is not in the future.
        let s = standing(now, 0, MS, now, 0, 200, 0, 1_514);
        assert_eq!(s.class(), Class::Sparse);
    }

    #[test]
    fn a_frame_larger_than_the_quantum_leaves_no_credit() {
        let s = standing(100 * MS, 0, MS, 0, 0, 64_000, 0, 1_514);
        assert_eq!(s.class(), Class::Sparse);
        assert_eq!(s.credit_bytes, 0);
    }

    #[test]
    fn the_guard_holds_a_bulk_packet_to_the_allocation_less_the_slack() {
        let g = guard(10 * MS, 20 * MS, 4 * MS, false, false, 0, 0);
        assert_eq!(
            g,
            Guarded {
                at: 16 * MS,
                behind_host: 0
            }
        );
        // Within the slack it does not bite.
        let g = guard(10 * MS, 13 * MS, 4 * MS, false, false, 0, 0);
        assert_eq!(g.at, 10 * MS);
        // A start within the slack of zero saturates.
        assert_eq!(guard(5, 3, 4 * MS, false, false, 0, 0).at, 5);
    }

    #[test]
    fn the_guard_never_holds_a_sparse_packet() {
        let g = guard(10 * MS, 50 * MS, 0, true, false, 0, 0);
        assert_eq!(
            g,
            Guarded {
                at: 10 * MS,
                behind_host: 0
            }
        );
    }

    #[test]
    fn a_kept_ack_goes_ahead_of_its_hosts_other_bookings_only() {
        // Other flows booked after it: noted where it would have waited, not held.
        let g = guard(10 * MS, 20 * MS, 0, false, true, 30 * MS, 10 * MS);
        assert_eq!(
            g,
            Guarded {
                at: 10 * MS,
                behind_host: 20 * MS
            }
        );
        // Nothing booked beyond its own flow's packets: held.
        let g = guard(10 * MS, 20 * MS, 0, false, true, 12 * MS, 12 * MS);
        assert_eq!(
            g,
            Guarded {
                at: 20 * MS,
                behind_host: 0
            }
        );
    }

    #[test]
    fn a_sparse_packet_is_dropped_once_its_host_booked_past_the_hard_limit() {
        assert!(!sparse_over_limit(150 * MS, 100 * MS, 50 * MS));
        assert!(sparse_over_limit(150 * MS + 1, 100 * MS, 50 * MS));
    }

    #[test]
    fn release_keeps_a_flows_order_and_lets_jumps_and_sparse_packets_go_now() {
        let now = 100 * MS;
        assert_eq!(release(now, 120 * MS, 110 * MS, 0, 0), 120 * MS);
        assert_eq!(release(now, 105 * MS, 110 * MS, 0, 0), 110 * MS);
        assert_eq!(release(now, 120 * MS, 0, 1, 0), now);
        assert_eq!(release(now, 120 * MS, 110 * MS, 1, 0), 110 * MS);
        assert_eq!(release(now, 120 * MS, 110 * MS, 1, 1), now);
    }

    #[test]
    fn a_lent_packet_leaves_when_it_asked() {
        assert_eq!(departure(LENT | (130 * MS), 100 * MS), (100 * MS, 1));
        assert_eq!(departure(130 * MS, 100 * MS), (130 * MS, 0));
    }

    #[test]
    fn only_a_wait_beyond_the_flows_clock_and_last_packet_is_carried() {
        assert!(carries_wait(20, 10, 15, 0));
        assert!(!carries_wait(20, 10, 15, 1));
        assert!(!carries_wait(15, 10, 15, 0));
        assert!(!carries_wait(10, 10, 0, 0));
    }

    #[test]
    fn flow_time_is_the_wire_time_plus_the_push() {
        assert_eq!(flow_time(10 * MS, 10 * MS, MS), (10 * MS, MS));
        assert_eq!(flow_time(13 * MS, 10 * MS, MS), (13 * MS, 4 * MS));
        // Leaving before its clock (a jump, a sparse packet) counts its wire time only.
        assert_eq!(flow_time(5 * MS, 10 * MS, MS), (10 * MS, MS));
    }

    #[test]
    fn a_packet_waited_when_held_or_sent_over_its_hosts_allocation() {
        assert!(waited(11, 10, false));
        assert!(!waited(10, 10, false));
        assert!(waited(10, 10, true));
        assert!(over_allocation(true, true, 20, 10, 5, 4));
        assert!(!over_allocation(true, true, 19, 10, 5, 4));
        assert!(!over_allocation(false, true, 20, 10, 5, 4));
        assert!(!over_allocation(true, false, 20, 10, 5, 4));
    }

    #[test]
    fn a_lent_acks_on_wire_time_is_no_earlier_than_its_host_would_have_held_it() {
        assert_eq!(on_wire_estimate(LENT | 5, 1, 9), LENT | 9);
        assert_eq!(on_wire_estimate(LENT | 9, 1, 5), LENT | 9);
        assert_eq!(on_wire_estimate(7, 0, 9), 7);
    }

    #[test]
    fn newcomers_share_their_destinations_guard_only_where_a_host_is_a_pair() {
        use crate::isolation::Isolation;
        let pair = Isolation::TripleIsolate.host_fields();
        let victim = [0x0500_090a, 0, 0, 0];
        let slot = destination_slot(pair, host_flags::NEWCOMER, &victim, 0);
        assert!(slot < DESTINATION_GUARDS);
        // Every source towards it shares that slot; a host with an allocation books none.
        assert_eq!(
            destination_slot(pair, host_flags::NEWCOMER | host_flags::AHEAD, &victim, 0),
            slot
        );
        assert_eq!(
            destination_slot(pair, host_flags::AHEAD, &victim, 0),
            NO_SLOT
        );
        assert_eq!(
            destination_slot(
                Isolation::Hosts.host_fields(),
                host_flags::NEWCOMER,
                &victim,
                0
            ),
            slot
        );
        // Where a host is one side only, none.
        for mode in [
            Isolation::DualDstHost,
            Isolation::DualSrcHost,
            Isolation::Flows,
        ] {
            let f = mode.host_fields();
            assert_eq!(
                destination_slot(f, host_flags::NEWCOMER, &victim, 0),
                NO_SLOT
            );
        }
        // Destinations and tins spread over the slots.
        let mut seen = std::collections::BTreeSet::new();
        for d in 0..256u32 {
            let dst = [0x0000_090a | (d << 24), 0, 0, 0];
            seen.insert(destination_slot(pair, host_flags::NEWCOMER, &dst, 0));
        }
        assert!(
            seen.len() > 200,
            "{} slots for 256 destinations",
            seen.len()
        );
        let v6 = [0x0db8_0120, 0, 0, 0x0100_0000];
        assert!(destination_slot(pair, host_flags::NEWCOMER, &v6, 2) < DESTINATION_GUARDS);
        assert_ne!(
            destination_slot(pair, host_flags::NEWCOMER, &victim, 1),
            destination_slot(pair, host_flags::NEWCOMER, &victim, 2)
        );
    }

    #[test]
    fn a_jump_leaves_the_flows_recent_departures_alone() {
        let now = 100 * MS;
        assert_eq!(recent_on_wire(3, 2, now + MS, now + MS, now, 0, 1), (3, 2));
        let (last, prev) = recent_on_wire(3, 2, now + MS, now + MS, now, 0, 0);
        assert_eq!(prev, 3);
        assert_eq!(last, ackfilter::on_wire(now + MS, now + MS, now, 0));
    }
}
