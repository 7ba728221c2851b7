//! What the design says the data path does with a frame, restated on the host: the bad-input
//! tests' oracle. Written apart from the BPF parser on purpose: a check that ran the same code
//! could not disagree with it.
//!
//! The rules (docs/design.md, and the parser's contract in shaper-ebpf's `parse`):
//! - Ethernet, then up to two VLAN tags (802.1Q or 802.1ad); IPv4 or IPv6 after them, anything
//!   else (a third tag included) is not IP.
//! - Malformed: a header the parser reads that the frame does not hold (Ethernet type, tag, IP
//!   header, an extension's first two bytes or a fragment header's eight, the TCP header's 20,
//!   UDP's 8); an IP version that is not the Ethernet type's; IPv4 with IHL < 5 or a total
//!   length shorter than its header (a length of 0, BIG TCP's, is the frame's); TCP with a data
//!   offset < 5. Nothing else is checked: a payload shorter than the IP header says, options,
//!   checksums.
//! - IPv6 extension headers (hop-by-hop, routing, fragment, destination options) are walked up
//!   to four; a later IPv4 or IPv6 fragment has no transport header to read.
//! - Before any of that, a GSO packet of more segments than the segmenter's threshold, not
//!   coming back from the segmenter, is left to it unstamped.
//!
//! Non-IP and malformed frames pass untouched and counted; IP packets are shaped: passed with a
//! departure time, or dropped by the horizon, the AQM or the ACK filter; their only rewrite is
//! the DS field (CE, DSCP wash).

use shaper_common::{abi::ShaperConfig, stats::PassReason};

use crate::skb::SkbContext;

const MAX_VLAN_TAGS: usize = 2;
const MAX_IPV6_EXTENSIONS: usize = 4;
const ECN_MASK: u8 = 0b11;
const CE: u8 = 0b11;

/// What the egress program must do with a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expected {
    /// Left to the segmenter: passed unstamped and untouched, whatever it holds.
    Segmented,
    /// Passed untouched (bytes and context), counted under this reason.
    Unshaped(PassReason),
    /// An IP packet whose header starts at `l3`: passed with a departure time, or dropped.
    Shaped { l3: usize },
}

/// The egress program's expected handling of `frame` with `ctx` under `config`.
pub fn egress(frame: &[u8], ctx: &SkbContext, config: &ShaperConfig) -> Expected {
    if left_to_segmenter(ctx, config) {
        return Expected::Segmented;
    }
    match parse(frame) {
        Ok(l3) => Expected::Shaped { l3 },
        Err(reason) => Expected::Unshaped(reason),
    }
}

fn left_to_segmenter(ctx: &SkbContext, config: &ShaperConfig) -> bool {
    config.split_gso_segs != 0
        && ctx.gso_segs() > config.split_gso_segs
        && ctx.ingress_ifindex() != config.segmenter_ifindex
}

/// Whether the segmenter's classifier matches: a packet the egress program left to it, or a
/// frame coming back from it.
pub fn segmenter_matches(ctx: &SkbContext, config: &ShaperConfig) -> bool {
    left_to_segmenter(ctx, config)
        || (config.segmenter_ifindex != 0 && ctx.ingress_ifindex() == config.segmenter_ifindex)
}

/// The IP header's offset, or why the frame is not shaped.
pub fn parse(frame: &[u8]) -> Result<usize, PassReason> {
    let field = |at: usize, len: usize| frame.get(at..at + len).ok_or(PassReason::Malformed);
    let be16 = |b: &[u8]| u16::from_be_bytes([b[0], b[1]]);
    let mut ether_type = be16(field(12, 2)?);
    let mut l3 = 14;
    for _ in 0..MAX_VLAN_TAGS {
        if ether_type != 0x8100 && ether_type != 0x88a8 {
            break;
        }
        ether_type = be16(field(l3 + 2, 2)?);
        l3 += 4;
    }
    let transport = match ether_type {
        0x0800 => {
            let h = field(l3, 20)?;
            let ihl = usize::from(h[0] & 0x0f) * 4;
            // A total length of 0 (BIG TCP) takes the frame's.
            let total = match usize::from(be16(&h[2..4])) {
                0 => frame.len() - l3,
                len => len,
            };
            if h[0] >> 4 != 4 || ihl < 20 || total < ihl {
                return Err(PassReason::Malformed);
            }
            let later_fragment = be16(&h[6..8]) & 0x1fff != 0;
            (!later_fragment).then_some((h[9], l3 + ihl))
        }
        0x86dd => {
            let h = field(l3, 40)?;
            if h[0] >> 4 != 6 {
                return Err(PassReason::Malformed);
            }
            let (mut proto, mut at, mut later_fragment) = (h[6], l3 + 40, false);
            for _ in 0..MAX_IPV6_EXTENSIONS {
                match proto {
                    0 | 43 | 60 => {
                        let e = field(at, 2)?;
                        proto = e[0];
                        at += (usize::from(e[1]) + 1) * 8;
                    }
                    44 => {
                        let e = field(at, 8)?;
                        proto = e[0];
                        later_fragment = be16(&e[2..4]) & 0xfff8 != 0;
                        at += 8;
                    }
                    _ => break,
                }
            }
            (!later_fragment).then_some((proto, at))
        }
        _ => return Err(PassReason::NonIp),
    };
    match transport {
        Some((6, at)) if field(at, 20)?[12] >> 4 < 5 => Err(PassReason::Malformed),
        Some((17, at)) => field(at, 8).map(|_| l3),
        _ => Ok(l3),
    }
}

/// The DS-field rewrites a run may make.
#[derive(Clone, Copy, Debug)]
pub struct Rewrites {
    /// Set CE.
    pub mark: bool,
    /// Set CE on a packet that did not say it was ECN-capable: never for a packet the data
    /// path parsed itself; a program run on its own with another packet's instructions does.
    pub mark_not_ect: bool,
    /// Clear the DSCP (`wash`).
    pub wash: bool,
}

/// What a run changed in a packet's DS field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DsChange {
    pub marked: bool,
    pub washed: bool,
}

/// Checks that `after` differs from `before` at most in the DS field of the IP header at `l3`
/// (IPv4: the TOS byte and the header checksum, updated to match; else the traffic class,
/// which straddles the first two bytes), and only by the rewrites `may` allows. The version is
/// read at `l3`, as the marker reads it.
pub fn ds_rewrite(
    before: &[u8],
    after: &[u8],
    l3: usize,
    may: Rewrites,
) -> Result<DsChange, String> {
    if before.len() != after.len() {
        return Err(format!(
            "the frame came back {} bytes long, not {}",
            after.len(),
            before.len()
        ));
    }
    if before == after {
        return Ok(DsChange::default());
    }
    let changed: Vec<usize> = (0..before.len())
        .filter(|&i| before[i] != after[i])
        .collect();
    let v4 = before.get(l3).is_some_and(|b| b >> 4 == 4);
    let ds_bytes: &[usize] = if v4 {
        &[l3 + 1, l3 + 10, l3 + 11]
    } else {
        &[l3, l3 + 1]
    };
    if let Some(&i) = changed.iter().find(|i| !ds_bytes.contains(i)) {
        return Err(format!(
            "byte {i} changed ({:#04x} to {:#04x}; changed: {changed:?}): only the DS field of \
             the header at {l3} may be rewritten",
            before[i], after[i]
        ));
    }
    let traffic_class = |b: &[u8]| {
        if v4 {
            b[l3 + 1]
        } else {
            (b[l3] << 4) | (b[l3 + 1] >> 4)
        }
    };
    if !v4 && (before[l3] >> 4 != after[l3] >> 4 || before[l3 + 1] & 0x0f != after[l3 + 1] & 0x0f) {
        return Err(format!(
            "bytes {l3}-{} changed outside the traffic class",
            l3 + 1
        ));
    }
    let (old, new) = (traffic_class(before), traffic_class(after));
    let change = DsChange {
        marked: old & ECN_MASK != new & ECN_MASK,
        washed: old >> 2 != new >> 2,
    };
    if change.marked
        && !(may.mark && new & ECN_MASK == CE && (old & ECN_MASK != 0 || may.mark_not_ect))
    {
        return Err(format!(
            "ECN {:#04b} became {:#04b}",
            old & ECN_MASK,
            new & ECN_MASK
        ));
    }
    if change.washed && !(may.wash && new >> 2 == 0) {
        return Err(format!("DSCP {} became {}", old >> 2, new >> 2));
    }
    if v4 {
        // The checksum covers the word holding TOS; an incremental update keeps the one's
        // complement sum of those two words (0xffff and 0 being the same number).
        let words = |b: &[u8]| {
            u32::from(u16::from_be_bytes([b[l3], b[l3 + 1]]))
                + u32::from(u16::from_be_bytes([b[l3 + 10], b[l3 + 11]]))
        };
        if words(before) % 0xffff != words(after) % 0xffff {
            return Err(format!(
                "the IPv4 checksum was not updated with the TOS byte ({:02x?} to {:02x?})",
                &before[l3 + 10..l3 + 12],
                &after[l3 + 10..l3 + 12]
            ));
        }
    }
    Ok(change)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::{self, Frame};

    #[test]
    fn the_oracle_reads_the_crafted_frames_as_the_design_says() {
        let tcp = packet::tcp_header(1, 2, packet::ACK);
        let v4 = packet::ipv4(packet::TCP, [1; 4], [2; 4], &tcp);
        assert_eq!(parse(&packet::tcp4_frame(100)), Ok(14));
        assert_eq!(parse(&packet::arp_frame()), Err(PassReason::NonIp));
        let qinq = Frame::ether_type(packet::ETH_P_IP)
            .vlan(packet::ETH_P_8021AD, 1)
            .vlan(packet::ETH_P_8021Q, 2);
        assert_eq!(parse(&qinq.clone().payload(v4.clone()).build()), Ok(22));
        let three_tags = qinq.vlan(packet::ETH_P_8021Q, 3).payload(v4.clone());
        assert_eq!(parse(&three_tags.build()), Err(PassReason::NonIp));
        let mut bad_doff = v4.clone();
        bad_doff[32] = 4 << 4;
        let frame = Frame::ether_type(packet::ETH_P_IP).payload(bad_doff);
        assert_eq!(parse(&frame.build()), Err(PassReason::Malformed));
        let truncated = Frame::ether_type(packet::ETH_P_IP).payload(v4[..30].to_vec());
        assert_eq!(parse(&truncated.build()), Err(PassReason::Malformed));
    }

    #[test]
    fn a_ce_mark_with_its_checksum_update_is_a_ds_rewrite_and_anything_else_is_not() {
        let before = packet::tcp4_ds(1, 0b10, 100);
        let marked = packet::tcp4_ds(1, 0b11, 100);
        let may = Rewrites {
            mark: true,
            mark_not_ect: false,
            wash: false,
        };
        assert_eq!(
            ds_rewrite(&before, &marked, 14, may),
            Ok(DsChange {
                marked: true,
                washed: false
            })
        );
        let not_ect = packet::tcp4_ds(1, 0, 100);
        let mut stale_checksum = marked.clone();
        stale_checksum[24..26].copy_from_slice(&before[24..26]);
        let mut payload_changed = before.clone();
        payload_changed[60] ^= 1;
        for (what, before, after) in [
            ("a Not-ECT packet marked", &not_ect, &marked),
            ("a stale checksum", &before, &stale_checksum),
            ("a payload byte", &before, &payload_changed),
            (
                "a DSCP without wash",
                &before,
                &packet::tcp4_ds(1, 8 << 2 | 0b10, 100),
            ),
        ] {
            assert!(ds_rewrite(before, after, 14, may).is_err(), "{what}");
        }
    }
}
