//! Crafted frames: Ethernet (optionally VLAN-tagged) carrying IPv4/IPv6 with TCP, UDP or ICMP,
//! ARP, and deliberately broken variants. Checksums are not computed: the data path never reads
//! them.

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86DD;
pub const ETH_P_ARP: u16 = 0x0806;
pub const ETH_P_8021Q: u16 = 0x8100;
pub const ETH_P_8021AD: u16 = 0x88A8;

pub const TCP: u8 = 6;
pub const UDP: u8 = 17;
pub const ICMP: u8 = 1;
pub const ICMPV6: u8 = 58;
pub const HOPOPTS: u8 = 0;

/// TCP flags.
pub const ACK: u8 = 0x10;
pub const PSH: u8 = 0x08;

/// Builds a frame layer by layer.
#[derive(Default, Clone)]
pub struct Frame {
    vlans: Vec<(u16, u16)>,
    ether_type: u16,
    l3: Vec<u8>,
}

impl Frame {
    pub fn ether_type(ether_type: u16) -> Self {
        Self {
            ether_type,
            ..Default::default()
        }
    }

    /// Adds an outer VLAN tag (TPID 0x8100 or 0x88a8).
    pub fn vlan(mut self, tpid: u16, vid: u16) -> Self {
        self.vlans.push((tpid, vid));
        self
    }

    pub fn payload(mut self, bytes: Vec<u8>) -> Self {
        self.l3 = bytes;
        self
    }

    pub fn build(&self) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
        for (tpid, vid) in &self.vlans {
            f.extend_from_slice(&tpid.to_be_bytes());
            f.extend_from_slice(&vid.to_be_bytes());
        }
        f.extend_from_slice(&self.ether_type.to_be_bytes());
        f.extend_from_slice(&self.l3);
        f
    }
}

pub fn tcp_header(src_port: u16, dst_port: u16, flags: u8) -> Vec<u8> {
    let mut h = vec![0u8; 20];
    h[0..2].copy_from_slice(&src_port.to_be_bytes());
    h[2..4].copy_from_slice(&dst_port.to_be_bytes());
    h[12] = 5 << 4;
    h[13] = flags;
    h
}

pub fn udp_header(src_port: u16, dst_port: u16, payload_len: usize) -> Vec<u8> {
    let mut h = vec![0u8; 8];
    h[0..2].copy_from_slice(&src_port.to_be_bytes());
    h[2..4].copy_from_slice(&dst_port.to_be_bytes());
    h[4..6].copy_from_slice(&((8 + payload_len) as u16).to_be_bytes());
    h
}

/// A UDP header and `payload_len` bytes of payload (0x11 each).
pub fn udp_datagram(src_port: u16, dst_port: u16, payload_len: usize) -> Vec<u8> {
    let mut l4 = udp_header(src_port, dst_port, payload_len);
    l4.extend(std::iter::repeat_n(0x11, payload_len));
    l4
}

pub fn ipv4(proto: u8, src: [u8; 4], dst: [u8; 4], l4: &[u8]) -> Vec<u8> {
    let mut h = vec![0u8; 20];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
    h[8] = 64;
    h[9] = proto;
    h[12..16].copy_from_slice(&src);
    h[16..20].copy_from_slice(&dst);
    h.extend_from_slice(l4);
    h
}

pub fn ipv6(next_header: u8, src_last: u8, dst_last: u8, l4: &[u8]) -> Vec<u8> {
    let mut h = vec![0u8; 40];
    h[0] = 0x60;
    h[4..6].copy_from_slice(&(l4.len() as u16).to_be_bytes());
    h[6] = next_header;
    h[7] = 64;
    h[8] = 0xfd;
    h[23] = src_last;
    h[24] = 0xfd;
    h[39] = dst_last;
    h.extend_from_slice(l4);
    h
}

/// An IPv4 TCP frame of exactly `frame_len` bytes (payload padded), like one MSS-sized segment.
pub fn tcp4_frame(frame_len: usize) -> Vec<u8> {
    tcp4_flow([10, 0, 0, 1], [10, 0, 0, 2], 40000, 5201, frame_len)
}

/// An IPv4 TCP frame of `frame_len` bytes of the given flow.
pub fn tcp4_flow(
    src: [u8; 4],
    dst: [u8; 4],
    src_port: u16,
    dst_port: u16,
    frame_len: usize,
) -> Vec<u8> {
    let headers = 14 + 20 + 20;
    let payload = vec![0xab; frame_len.saturating_sub(headers)];
    let mut l4 = tcp_header(src_port, dst_port, ACK | PSH);
    l4.extend_from_slice(&payload);
    Frame::ether_type(ETH_P_IP)
        .payload(ipv4(TCP, src, dst, &l4))
        .build()
}

/// An IPv4 TCP frame of `frame_len` bytes from port `src_port` with the DS field `ds`
/// (DSCP << 2 | ECN) and a valid header checksum.
pub fn tcp4_ds(src_port: u16, ds: u8, frame_len: usize) -> Vec<u8> {
    let mut f = tcp4_flow([10, 0, 0, 1], [10, 0, 0, 2], src_port, 5201, frame_len);
    f[15] = ds;
    f[24..26].copy_from_slice(&[0, 0]);
    let sum = ipv4_checksum(&f[14..34]);
    f[24..26].copy_from_slice(&sum.to_be_bytes());
    f
}

/// The one's-complement sum of an IPv4 header whose checksum field is zero, or the check of
/// one that has it (0 when valid).
pub fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|w| u16::from_be_bytes([w[0], w[1]]) as u32)
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

pub fn udp6_frame(payload_len: usize) -> Vec<u8> {
    let mut l4 = udp_header(5353, 53, payload_len);
    l4.extend(std::iter::repeat_n(0x11, payload_len));
    Frame::ether_type(ETH_P_IPV6)
        .payload(ipv6(UDP, 1, 2, &l4))
        .build()
}

pub fn arp_frame() -> Vec<u8> {
    let mut arp = vec![0, 1, 8, 0, 6, 4, 0, 1];
    arp.extend_from_slice(&[
        0x02, 0, 0, 0, 0, 1, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2,
    ]);
    Frame::ether_type(ETH_P_ARP).payload(arp).build()
}
