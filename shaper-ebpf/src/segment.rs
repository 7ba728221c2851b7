//! Which packets the segmenter splits before they are stamped.
//!
//! A GSO packet gets one departure time and fq releases it whole: a forwarded 64 KB
//! super-packet is 17 ms of wire time at 30 Mbit/s, one burst into the next bottleneck. shaper
//! lowers its own device's GSO limits so local TCP builds small packets, but packets built
//! elsewhere (a neighbour's TSO through a veth, GRO on the receiving NIC) arrive whole. BPF
//! cannot segment, so the packets above the budget are left unstamped to a filter after the
//! data path, which sends them through an IFB whose transmit path segments them; the frames
//! come back to this device's egress and are stamped one by one (docs/design.md, "The
//! segmenter").

use core::intrinsics::{AtomicOrdering::Relaxed, atomic_xadd};

use aya_ebpf::{
    bindings::__sk_buff,
    macros::map,
    maps::{Array, PerCpuArray},
};
use shaper_common::{
    abi::ShaperConfig,
    segmenter::{self, ORDER_SLOTS, Order},
};

use crate::parse::PacketInfo;

/// Per flow-hash slot: the flows' frames in the segmenter (`shaper_common::segmenter`).
#[map(name = "SHAPER_SEGMENT_ORDER")]
static ORDER: Array<Order> = Array::with_max_entries(ORDER_SLOTS, 0);

/// Whether the packet `shaper_egress` just passed goes to the segmenter behind its flow's
/// frames: written by `shaper_egress` for every packet it sees, read by the segmenter's filter
/// right after it on the same CPU (nothing runs between the two with bottom halves off).
#[map(name = "SHAPER_SEGMENT_NEXT")]
static NEXT: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// A classifier's verdict in a filter that is not direct-action: match (use the filter's
/// class and run its actions) or not (try the next filter).
pub const MATCH: i32 = -1;
pub const NO_MATCH: i32 = 0;

/// A super-packet over the budget that has not been through the segmenter already (the check
/// on its way back keeps a packet the IFB could not split from looping).
#[inline(always)]
pub fn wanted(skb: &__sk_buff, config: &ShaperConfig) -> bool {
    config.split_gso_segs != 0
        && skb.gso_segs > config.split_gso_segs
        && skb.ingress_ifindex != config.segmenter_ifindex
}

/// A frame coming back from the segmenter.
#[inline(always)]
pub fn returning(skb: &__sk_buff, config: &ShaperConfig) -> bool {
    config.segmenter_ifindex != 0 && skb.ingress_ifindex == config.segmenter_ifindex
}

/// What `shaper_egress` does with a packet, given the segmenter.
pub enum Route {
    /// Stamp it here.
    Stamp,
    /// Leave it unstamped to the segmenter: a super-packet, or a packet behind its flow's
    /// frames still in it (`follower`).
    Segmenter { follower: bool },
}

/// Where a parsed packet goes (`wanted`: it is a super-packet over the budget), and the count
/// of its flow's frames in the segmenter kept: a super-packet adds its segments, a follower one
/// frame, a frame coming back takes itself off.
#[inline(always)]
pub fn route(skb: &__sk_buff, config: &ShaperConfig, info: &PacketInfo, now: u64) -> Route {
    let wanted = wanted(skb, config);
    let slot = segmenter::slot(
        &info.src_addr,
        &info.dst_addr,
        info.src_port,
        info.dst_port,
        info.ip_proto,
    );
    let Some(order) = ORDER.get_ptr_mut(slot) else {
        return if wanted {
            Route::Segmenter { follower: false }
        } else {
            Route::Stamp
        };
    };
    // SAFETY: a map value, valid for the program's run; other CPUs' updates race with these
    // (a count a frame off only sends a packet around or not).
    let order = unsafe { &mut *order };
    if returning(skb, config) {
        let back = segmenter::frames_back(skb.gso_segs);
        unsafe {
            atomic_xadd::<u64, u64, { Relaxed }>(&raw mut order.pending, back.wrapping_neg())
        };
        return Route::Stamp;
    }
    if wanted {
        order.pending = segmenter::after_super_packet(order, skb.gso_segs as u64, now);
        order.sent_ns = now;
        return Route::Segmenter { follower: false };
    }
    if segmenter::in_segmenter(order, now) {
        unsafe { atomic_xadd::<u64, u64, { Relaxed }>(&raw mut order.pending, 1) };
        return Route::Segmenter { follower: true };
    }
    Route::Stamp
}

/// Notes for the segmenter's filter whether the packet at hand goes to the segmenter behind its
/// flow's frames.
#[inline(always)]
pub fn note_follower(follows: bool) {
    if let Some(next) = NEXT.get_ptr_mut(0) {
        // SAFETY: per-CPU map value, this CPU's for the run.
        unsafe { *next = follows as u32 };
    }
}

/// Whether `shaper_egress` sent the packet at hand behind its flow's frames (and forgets it).
#[inline(always)]
pub fn take_follower() -> bool {
    let Some(next) = NEXT.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: as in `note_follower`.
    unsafe {
        let follows = *next != 0;
        *next = 0;
        follows
    }
}
