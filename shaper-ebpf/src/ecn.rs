//! Setting Congestion Experienced on the packet at hand (RFC 3168), the AQM's gentle signal.
//!
//! Written with `bpf_skb_store_bytes`, only on the packets being marked: direct packet writes
//! would make the verifier unclone the head of every packet the program sees (TCP keeps a clone
//! of each for retransmission), a cost on the fast path for a rare event.
//!
//! It runs in a program of its own (`shaper_mark`), reached by a tail call with the IP header's
//! offset in `cb[0]`: with a helper that rewrites the packet anywhere in it, the verifier could
//! no longer prune the scheduling paths against each other and gave up on the main program.

use aya_ebpf::programs::TcContext;

use crate::parse::PacketInfo;

/// ECN field values (the low two bits of TOS / traffic class).
const ECN_MASK: u8 = 0b11;
const ECN_CE: u8 = 0b11;

/// Whether the packet is ECN-capable (ECT(0), ECT(1)) or already CE.
#[inline(always)]
pub fn capable(info: &PacketInfo) -> bool {
    info.tos & ECN_MASK != 0
}

/// Sets CE in the IP header at `l3`; `Err` when it could not be read or written (the caller
/// drops the packet instead: the AQM wanted a signal).
#[inline(always)]
pub fn set_ce(ctx: &TcContext, l3: usize) -> Result<(), ()> {
    let first: [u8; 2] = ctx.load(l3).map_err(|_| ())?;
    if first[0] >> 4 == 4 {
        // The TOS byte shares a checksummed 16-bit word with version/IHL.
        let tos = first[1] | ECN_CE;
        let from = u16::from_ne_bytes(first) as u64;
        let to = u16::from_ne_bytes([first[0], tos]) as u64;
        ctx.l3_csum_replace(l3 + 10, from, to, 2).map_err(|_| ())?;
        ctx.store(l3 + 1, &tos, 0).map_err(|_| ())
    } else {
        // IPv6: the traffic class straddles the first two bytes; ECN is bits 4-5 of the second.
        // No header checksum.
        ctx.store(l3 + 1, &(first[1] | (ECN_CE << 4)), 0)
            .map_err(|_| ())
    }
}
