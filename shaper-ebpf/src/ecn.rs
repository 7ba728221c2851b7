//! Rewriting the DS field of the packet at hand: Congestion Experienced (RFC 3168), the AQM's
//! gentle signal, and washing the DSCP after classification (CAKE's `wash`).
//!
//! Written with `bpf_skb_store_bytes`, only on the packets being rewritten: direct packet
//! writes would make the verifier unclone the head of every packet the program sees (TCP keeps
//! a clone of each for retransmission), a cost on the fast path for a rare event.
//!
//! It runs in a program of its own (`shaper_mark`), reached by a tail call with the IP header's
//! offset and what to do in the packet's control block (`shaper_common::cb`, the L3 offset and
//! rewrite words): a flag the verifier knows on each path (rewrite or not) made it keep every
//! later path of the main program apart, and that program no longer verified.

use aya_ebpf::programs::TcContext;

use shaper_common::cb::rewrite::{SET_CE, WASH};

use crate::parse::PacketInfo;

/// ECN field values (the low two bits of TOS / traffic class).
const ECN_MASK: u8 = 0b11;
const ECN_CE: u8 = 0b11;

/// Whether the packet is ECN-capable (ECT(0), ECT(1)) or already CE.
#[inline(always)]
pub fn capable(info: &PacketInfo) -> bool {
    info.tos & ECN_MASK != 0
}

/// Rewrites the DS field of the IP header at `l3`: CE set (`SET_CE`), DSCP cleared (`WASH`).
/// `Err` when it could not be read or written.
#[inline(always)]
pub fn rewrite(ctx: &TcContext, l3: usize, what: u32) -> Result<(), ()> {
    let first: [u8; 2] = ctx.load(l3).map_err(|_| ())?;
    let ce = if what & SET_CE != 0 { ECN_CE } else { 0 };
    if first[0] >> 4 == 4 {
        let mut tos = first[1] | ce;
        if what & WASH != 0 {
            tos &= ECN_MASK;
        }
        // The TOS byte shares a checksummed 16-bit word with version/IHL.
        let from = u16::from_ne_bytes(first) as u64;
        let to = u16::from_ne_bytes([first[0], tos]) as u64;
        ctx.l3_csum_replace(l3 + 10, from, to, 2).map_err(|_| ())?;
        ctx.store(l3 + 1, &tos, 0).map_err(|_| ())
    } else {
        // IPv6: the traffic class straddles the first two bytes (its DSCP is the low nibble of
        // the first and the top two bits of the second; ECN is bits 4-5 of the second). No
        // header checksum.
        let mut head = [first[0], first[1] | (ce << 4)];
        if what & WASH != 0 {
            head[0] &= 0xf0;
            head[1] &= 0x3f;
        }
        ctx.store(l3, &head, 0).map_err(|_| ())
    }
}
