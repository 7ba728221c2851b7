//! With `--nat`, the addresses a packet's hosts are classified by are those it had before NAT,
//! read from its conntrack entry (`shaper_common::conntrack`): behind a masquerading router
//! each machine of the LAN is a host of its own, as CAKE's `nat` makes it.

use aya_ebpf::{
    macros::map,
    maps::{Array, LruHashMap},
    programs::TcContext,
};
use shaper_common::{
    abi::FlowKey,
    conntrack::{self, BeforeNat, ConntrackLayout, NAT_FLOWS, SKB_OFFSET_MASK},
};

use crate::{
    kmem::read,
    parse::{ETH_P_IPV6, PacketInfo},
};

/// Where the packet's entry and tuples lie in this kernel; all zero without `--nat`.
#[map(name = "SHAPER_CONNTRACK")]
static LAYOUT: Array<ConntrackLayout> = Array::with_max_entries(1, 0);

/// Each flow's addresses before NAT, by its 5-tuple after NAT, kept from its packets that came
/// with their conntrack entry for those that come without: GSO segments back from the
/// segmenter's IFB lose it on the way.
#[map(name = "SHAPER_NAT_FLOWS")]
static FLOWS: LruHashMap<FlowKey, BeforeNat> = LruHashMap::with_max_entries(NAT_FLOWS, 0);

/// Sets `info`'s host addresses to the packet's own direction's tuple in its conntrack entry:
/// where it came from and went to before any NAT; for a packet without one, to those its flow's
/// last packet with one had. A packet of neither (conntrack did not see it, or `--nat` is off)
/// keeps its own addresses.
#[inline(always)]
pub fn before_nat(ctx: &TcContext, info: &mut PacketInfo) -> Option<()> {
    let layout = LAYOUT.get(0)?;
    if layout.replies != 0 {
        // A reply's 5-tuple reversed is its connection's as it left through NAT: the way back
        // goes to the host it came from.
        // SAFETY: a read-only lookup; the value is copied.
        let found = *unsafe { FLOWS.get(&info.travel_key(true)) }?;
        info.host_src = found.dst;
        info.host_dst = found.src;
        return Some(());
    }
    if layout.skb_nfct == 0 {
        return None;
    }
    let key = info.travel_key(false);
    let found = match from_entry(ctx, layout, info.l3_proto == ETH_P_IPV6) {
        Some(before) => {
            // SAFETY: a read-only lookup; the value is copied.
            if unsafe { FLOWS.get(&key) } != Some(&before) {
                // A full map evicts its least recent flow; a failed insert only loses the
                // segments' host.
                let _ = FLOWS.insert(&key, &before, 0);
            }
            before
        }
        // SAFETY: as above.
        None => *unsafe { FLOWS.get(&key) }?,
    };
    info.host_src = found.src;
    info.host_dst = found.dst;
    Some(())
}

/// The packet's addresses before NAT, from its own direction's tuple in its conntrack entry.
#[inline(always)]
fn from_entry(ctx: &TcContext, layout: &ConntrackLayout, v6: bool) -> Option<BeforeNat> {
    // The context is the kernel's socket buffer; the verifier lets a program with
    // CAP_PERFMON hand its address, at a bounded offset, to the read helper.
    let skb = ctx.skb.skb as *const u8;
    let nfct: u64 = read(skb, layout.skb_nfct & SKB_OFFSET_MASK)?;
    let (entry, tuple) = conntrack::own_tuple(nfct, layout)?;
    let entry = entry as *const u8;
    let tuple = tuple as u32;
    let src: [u32; 4] = read(entry, tuple + layout.src_addr)?;
    let dst: [u32; 4] = read(entry, tuple + layout.dst_addr)?;
    Some(BeforeNat {
        src: conntrack::address(src, v6),
        dst: conntrack::address(dst, v6),
    })
}
