//! The order of a flow's packets around the segmenter (docs/design.md, "The segmenter").
//!
//! A super-packet goes through the segmenter's IFB and its frames come back to be stamped a
//! little later (a softirq's turn); a single-frame packet of the same flow right behind it would
//! be stamped at once, before them, and leave first. TCP reads the segments that come late as a
//! reordering: duplicate ACKs, a spurious fast retransmission and a window cut. So while a flow
//! has frames in the segmenter, its other packets go through it too, behind them in the IFB's
//! queue, and keep their place.
//!
//! The data path keeps, per slot of a flow hash, how many frames it sent through the segmenter
//! that have not come back ([`Order::pending`], a super-packet counts its segments), and when it
//! last sent a super-packet there ([`Order::sent_ns`]). A frame the IFB drops never comes back;
//! the count is trusted for [`STALE_NS`] after the last super-packet only, so a lost frame costs
//! a flow at most that long of detours. Two flows that share a slot both take the detour while
//! either has frames in it: that costs the segmenter a little work, never the order.

use crate::hash;

/// Slots of the order table (a power of two).
pub const ORDER_SLOTS: u32 = 4096;

/// How long after its last super-packet a flow's count of frames in the segmenter is trusted.
/// The IFB hands frames back within its softirq's turn, well under a millisecond on an idle
/// CPU; a CPU starved for longer than this loses the guarantee, no more.
pub const STALE_NS: u64 = 10_000_000;

/// A slot of the order table (`SHAPER_SEGMENT_ORDER`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Order {
    /// Frames sent through the segmenter and not yet back, as a signed count: a frame that comes
    /// back after its count was reset takes it below zero, which reads as none.
    pub pending: u64,
    /// When the last super-packet of the slot's flows went to the segmenter.
    pub sent_ns: u64,
}

/// The slot of a flow, from its addresses and ports: the same for a super-packet, its frames
/// coming back and the packets between them.
#[inline(always)]
pub fn slot(src: &[u32; 4], dst: &[u32; 4], src_port: u16, dst_port: u16, proto: u8) -> u32 {
    let word = (hash::fold(src) ^ hash::fold(dst).rotate_left(3))
        .wrapping_add(((src_port as u32) << 16) | dst_port as u32)
        .wrapping_add(proto as u32);
    hash::slot(word, ORDER_SLOTS)
}

/// Whether the count in `order` is live at `now`: frames are in the segmenter and the last
/// super-packet went there recently.
#[inline(always)]
pub fn in_segmenter(order: &Order, now: u64) -> bool {
    (order.pending as i64) > 0 && now.wrapping_sub(order.sent_ns) < STALE_NS
}

/// What a super-packet of `segs` segments makes of the count: added to it while it is live, in
/// place of it otherwise (a stale count or one taken below zero starts over).
#[inline(always)]
pub fn after_super_packet(order: &Order, segs: u64, now: u64) -> u64 {
    if in_segmenter(order, now) {
        order.pending.wrapping_add(segs)
    } else {
        segs
    }
}

/// How many frames a packet coming back from the segmenter stands for: its segments if the IFB
/// could not split it, else one frame.
#[inline(always)]
pub fn frames_back(gso_segs: u32) -> u64 {
    gso_segs.max(1) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u32; 4] = [0x0a4d_0102, 0, 0, 0];
    const B: [u32; 4] = [0x0a4e_0002, 0, 0, 0];

    #[test]
    fn a_flow_follows_its_frames_until_they_are_back() {
        let mut o = Order::default();
        assert!(!in_segmenter(&o, 1_000));
        o.pending = after_super_packet(&o, 44, 1_000);
        o.sent_ns = 1_000;
        assert!(in_segmenter(&o, 2_000));
        // A packet behind it follows (one more frame), then every frame comes back.
        o.pending += 1;
        for _ in 0..44 {
            o.pending = o.pending.wrapping_sub(frames_back(0));
            assert!(in_segmenter(&o, 3_000));
        }
        o.pending = o.pending.wrapping_sub(frames_back(1));
        assert!(!in_segmenter(&o, 3_000));
    }

    #[test]
    fn a_lost_frame_holds_the_detour_no_longer_than_the_staleness_bound() {
        let o = Order {
            pending: 3,
            sent_ns: 1_000,
        };
        assert!(in_segmenter(&o, 1_000 + STALE_NS - 1));
        assert!(!in_segmenter(&o, 1_000 + STALE_NS));
        // The next super-packet starts the count over rather than adding to the lost frames.
        assert_eq!(after_super_packet(&o, 10, 1_000 + STALE_NS), 10);
    }

    #[test]
    fn a_count_taken_below_zero_reads_as_none_and_starts_over() {
        let o = Order {
            pending: 0u64.wrapping_sub(2),
            sent_ns: 1_000,
        };
        assert!(!in_segmenter(&o, 1_500));
        assert_eq!(after_super_packet(&o, 5, 1_500), 5);
    }

    #[test]
    fn a_packet_back_whole_counts_its_segments() {
        assert_eq!(frames_back(0), 1);
        assert_eq!(frames_back(1), 1);
        assert_eq!(frames_back(7), 7);
    }

    #[test]
    fn a_flows_packets_share_a_slot_and_flows_spread_over_them() {
        let s = slot(&A, &B, 40_000, 5_201, 6);
        assert_eq!(s, slot(&A, &B, 40_000, 5_201, 6));
        assert!(s < ORDER_SLOTS);
        let mut used = [false; ORDER_SLOTS as usize];
        for p in 0..1000u16 {
            used[slot(&A, &B, 40_000 + p, 5_201, 6) as usize] = true;
        }
        let spread = used.iter().filter(|u| **u).count();
        assert!(spread > 800, "{spread} slots for 1000 flows");
    }
}
