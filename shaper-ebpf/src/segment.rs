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

use aya_ebpf::bindings::__sk_buff;
use shaper_common::abi::ShaperConfig;

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
