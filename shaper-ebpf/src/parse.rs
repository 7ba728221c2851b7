//! Header parsing: Ethernet (up to two VLAN tags) or none, IPv4/IPv6 (with extension headers),
//! TCP/UDP.
//!
//! Direct packet access only, every read bounds-checked against `data_end` through `ptr_at`.
//! When headers are not in the linear part of the skb the parser says so
//! ([`ParseError::NotLinear`]) and the caller pulls them in once and parses again: pulling
//! unclones the skb, so it is never done for packets whose headers are already linear (TCP's
//! own packets always are).

use aya_ebpf::programs::TcContext;
use shaper_common::abi::FlowKey;

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86DD;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88A8;
const ETH_HLEN: usize = 14;
const VLAN_HLEN: usize = 4;
const MAX_VLAN_TAGS: usize = 2;
const IPV6_HLEN: usize = 40;
/// Extension headers walked before giving up on finding the transport header.
const MAX_IPV6_EXT_HEADERS: usize = 4;

pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
const IPPROTO_HOPOPTS: u8 = 0;
const IPPROTO_ROUTING: u8 = 43;
const IPPROTO_FRAGMENT: u8 = 44;
const IPPROTO_DSTOPTS: u8 = 60;

/// Longest header chain the parser may read: Ethernet + 2 VLAN tags + IPv6 + 4 extension headers
/// of up to 64 bytes + TCP with options. Also how much is pulled into the linear area.
pub const MAX_HEADER_BYTES: u32 = 14 + 8 + 40 + 4 * 64 + 60;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    /// Not IPv4 or IPv6.
    NonIp,
    /// Truncated or inconsistent headers.
    Malformed,
    /// The headers extend beyond the linear data; pull and retry.
    NotLinear,
}

/// What the data path needs to know about an IP packet.
#[derive(Clone, Copy)]
pub struct PacketInfo {
    /// `ETH_P_IP` or `ETH_P_IPV6`.
    pub l3_proto: u16,
    /// IPv4 addresses sit in the first word, the rest zero; IPv6 uses all four (network order).
    pub src_addr: [u32; 4],
    pub dst_addr: [u32; 4],
    /// The addresses its hosts are classified by: its own, or with `--nat` those it had before
    /// NAT (`conntrack`); the caller fills them in after parsing. Flows keep the packet's own,
    /// which the ACK filter matches against the other direction's.
    pub host_src: [u32; 4],
    pub host_dst: [u32; 4],
    /// Transport protocol (after IPv6 extension headers).
    pub ip_proto: u8,
    /// The DSCP/ECN byte (IPv4 TOS, IPv6 traffic class).
    pub tos: u8,
    /// Ports in host order, zero when the protocol has none or this is a non-first fragment.
    pub src_port: u16,
    pub dst_port: u16,
    /// TCP flags byte (FIN..CWR), zero for other protocols.
    pub tcp_flags: u8,
    /// TCP header length in bytes (with options), zero for other protocols.
    pub tcp_header_len: u8,
    /// TCP sequence and acknowledgement numbers, window field (host order).
    pub tcp_seq: u32,
    pub tcp_ack: u32,
    pub tcp_window: u16,
    /// Bytes of the IP payload (transport header included), from the IP header.
    pub ip_payload_len: u32,
    /// Offset of the IP header from the start of the frame.
    pub l3_offset: u32,
    /// DiffServ tin, set by the caller after parsing (see `diffserv`).
    pub tin: u8,
    /// Offset of the transport header from the start of the frame.
    pub l4_offset: u32,
    /// Bytes it takes on the bottleneck link (`Framing::packet_bytes`), set by the caller
    /// after parsing.
    pub wire: u32,
}

impl PacketInfo {
    /// Bytes of TCP payload; for other protocols, their whole IP payload (no TCP header to
    /// take off): callers that care test the protocol.
    #[inline(always)]
    pub fn tcp_payload_len(&self) -> u32 {
        self.ip_payload_len
            .saturating_sub(self.tcp_header_len as u32)
    }

    /// Its 5-tuple as it travels, the key of the ACK filter's maps and of the flows' addresses
    /// before NAT (`reversed`: the 5-tuple of the packets that answer it). Always called with a
    /// constant, so each use compiles to one straight path.
    #[inline(always)]
    pub fn travel_key(&self, reversed: bool) -> FlowKey {
        let (src, dst, src_port, dst_port) = if reversed {
            (self.dst_addr, self.src_addr, self.dst_port, self.src_port)
        } else {
            (self.src_addr, self.dst_addr, self.src_port, self.dst_port)
        };
        FlowKey {
            src,
            dst,
            src_port,
            dst_port,
            proto: self.ip_proto,
            family: if self.l3_proto == ETH_P_IPV6 { 6 } else { 4 },
            overflow: 0,
            tin: 0,
        }
    }
}

#[inline(always)]
fn ptr_at<T>(ctx: &TcContext, offset: usize) -> Result<*const T, ParseError> {
    let start = ctx.data();
    let end = ctx.data_end();
    let len = core::mem::size_of::<T>();
    if start + offset + len > end {
        // Past the linear data: either the packet is short (malformed) or the rest is paged.
        return if (ctx.len() as usize) >= offset + len {
            Err(ParseError::NotLinear)
        } else {
            Err(ParseError::Malformed)
        };
    }
    Ok((start + offset) as *const T)
}

#[inline(always)]
fn be16(bytes: [u8; 2]) -> u16 {
    u16::from_be_bytes(bytes)
}

/// Parses the packet, which starts with `link_header_bytes` of link-layer header: Ethernet's,
/// or none on a device that carries IP alone (PPP, WireGuard, IP tunnels), whose packets' IP
/// version the kernel keeps in `skb->protocol`.
#[inline(always)]
pub fn parse(ctx: &TcContext, link_header_bytes: u32) -> Result<PacketInfo, ParseError> {
    let (mut ether_type, mut offset) = if link_header_bytes == 0 {
        // SAFETY: the context is a valid __sk_buff for the whole run; the field holds the
        // network-order protocol.
        let protocol = unsafe { (*ctx.skb.skb).protocol } as u16;
        (u16::from_be(protocol), 0)
    } else {
        // SAFETY: ptr_at checked the bytes are inside the packet.
        (be16(unsafe { *ptr_at::<[u8; 2]>(ctx, 12)? }), ETH_HLEN)
    };
    for _ in 0..MAX_VLAN_TAGS {
        if ether_type != ETH_P_8021Q && ether_type != ETH_P_8021AD {
            break;
        }
        ether_type = be16(unsafe { *ptr_at::<[u8; 2]>(ctx, offset + 2)? });
        offset += VLAN_HLEN;
    }
    match ether_type {
        ETH_P_IP => parse_ipv4(ctx, offset),
        ETH_P_IPV6 => parse_ipv6(ctx, offset),
        _ => Err(ParseError::NonIp),
    }
}

#[inline(always)]
fn parse_ipv4(ctx: &TcContext, offset: usize) -> Result<PacketInfo, ParseError> {
    let hdr = unsafe { &*ptr_at::<[u8; 20]>(ctx, offset)? };
    if hdr[0] >> 4 != 4 {
        return Err(ParseError::Malformed);
    }
    let ihl = ((hdr[0] & 0x0f) as usize) * 4;
    let total_len = match be16([hdr[2], hdr[3]]) {
        // A GSO packet beyond 64 KB (BIG TCP): its length is the packet's.
        0 => (ctx.len() as usize).saturating_sub(offset),
        len => len as usize,
    };
    if ihl < 20 || total_len < ihl {
        return Err(ParseError::Malformed);
    }
    let frag = be16([hdr[6], hdr[7]]);
    let later_fragment = frag & 0x1fff != 0;
    let mut info = PacketInfo {
        l3_proto: ETH_P_IP,
        src_addr: [
            u32::from_ne_bytes([hdr[12], hdr[13], hdr[14], hdr[15]]),
            0,
            0,
            0,
        ],
        dst_addr: [
            u32::from_ne_bytes([hdr[16], hdr[17], hdr[18], hdr[19]]),
            0,
            0,
            0,
        ],
        host_src: [0; 4],
        host_dst: [0; 4],
        ip_proto: hdr[9],
        tos: hdr[1],
        src_port: 0,
        dst_port: 0,
        tcp_flags: 0,
        tcp_header_len: 0,
        tcp_seq: 0,
        tcp_ack: 0,
        tcp_window: 0,
        ip_payload_len: (total_len - ihl) as u32,
        l3_offset: offset as u32,
        tin: 0,
        l4_offset: (offset + ihl) as u32,
        wire: 0,
    };
    if !later_fragment {
        parse_l4(ctx, &mut info)?;
    }
    Ok(info)
}

#[inline(always)]
fn parse_ipv6(ctx: &TcContext, offset: usize) -> Result<PacketInfo, ParseError> {
    let hdr = unsafe { &*ptr_at::<[u8; IPV6_HLEN]>(ctx, offset)? };
    if hdr[0] >> 4 != 6 {
        return Err(ParseError::Malformed);
    }
    let word = |i: usize| u32::from_ne_bytes([hdr[i], hdr[i + 1], hdr[i + 2], hdr[i + 3]]);
    let mut info = PacketInfo {
        l3_proto: ETH_P_IPV6,
        src_addr: [word(8), word(12), word(16), word(20)],
        dst_addr: [word(24), word(28), word(32), word(36)],
        host_src: [0; 4],
        host_dst: [0; 4],
        ip_proto: hdr[6],
        tos: (hdr[0] << 4) | (hdr[1] >> 4),
        src_port: 0,
        dst_port: 0,
        tcp_flags: 0,
        tcp_header_len: 0,
        tcp_seq: 0,
        tcp_ack: 0,
        tcp_window: 0,
        ip_payload_len: match be16([hdr[4], hdr[5]]) {
            // A jumbogram (BIG TCP beyond 64 KB): what follows the header is its payload.
            0 => ctx.len().saturating_sub((offset + IPV6_HLEN) as u32),
            len => len as u32,
        },
        l3_offset: offset as u32,
        tin: 0,
        l4_offset: 0,
        wire: 0,
    };
    let mut next = offset + IPV6_HLEN;
    let mut later_fragment = false;
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        match info.ip_proto {
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => {
                let ext = unsafe { &*ptr_at::<[u8; 2]>(ctx, next)? };
                info.ip_proto = ext[0];
                next += (ext[1] as usize + 1) * 8;
            }
            IPPROTO_FRAGMENT => {
                let ext = unsafe { &*ptr_at::<[u8; 8]>(ctx, next)? };
                info.ip_proto = ext[0];
                later_fragment = be16([ext[2], ext[3]]) & 0xfff8 != 0;
                next += 8;
            }
            _ => break,
        }
    }
    info.l4_offset = next as u32;
    // The IPv6 payload length counts the extension headers too.
    info.ip_payload_len = info
        .ip_payload_len
        .saturating_sub((next - offset - IPV6_HLEN) as u32);
    if !later_fragment {
        parse_l4(ctx, &mut info)?;
    }
    Ok(info)
}

/// Ports and TCP flags; other protocols (ICMP, ...) are classified by addresses only.
#[inline(always)]
fn parse_l4(ctx: &TcContext, info: &mut PacketInfo) -> Result<(), ParseError> {
    let offset = info.l4_offset as usize;
    match info.ip_proto {
        IPPROTO_TCP => {
            let tcp = unsafe { &*ptr_at::<[u8; 20]>(ctx, offset)? };
            if (tcp[12] >> 4) < 5 {
                return Err(ParseError::Malformed);
            }
            info.src_port = be16([tcp[0], tcp[1]]);
            info.dst_port = be16([tcp[2], tcp[3]]);
            info.tcp_flags = tcp[13];
            info.tcp_header_len = (tcp[12] >> 4) * 4;
            info.tcp_seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
            info.tcp_ack = u32::from_be_bytes([tcp[8], tcp[9], tcp[10], tcp[11]]);
            info.tcp_window = be16([tcp[14], tcp[15]]);
        }
        IPPROTO_UDP => {
            let udp = unsafe { &*ptr_at::<[u8; 8]>(ctx, offset)? };
            info.src_port = be16([udp[0], udp[1]]);
            info.dst_port = be16([udp[2], udp[3]]);
        }
        _ => {}
    }
    Ok(())
}
