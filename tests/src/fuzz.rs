//! Random and mutated frames with `__sk_buff` contexts, for the bad-input tests: a seeded
//! generator, so that a failure names its seed and case and the same inputs come back.
//!
//! The mix is the worst a data path meets: random bytes; valid IPv4 and IPv6 TCP, UDP and ICMP
//! (0-3 VLAN tags, IPv4 options, IPv6 extension chains longer than the parser walks, TCP
//! options real and bogus) then mutated (cut at and around every header boundary, IHL and TCP
//! data offsets 0-15, versions, lengths, next headers and Ethernet types rewritten, bits
//! flipped); other Ethernet types; and contexts with GSO metadata, timestamps of every kind,
//! marks and a control block left dirty. Addresses and ports come from small pools, so flows
//! repeat and queues, the AQM and the ACK filter get to act; a tenth are random and churn the
//! LRU maps.

use crate::{
    packet::{
        ACK, ETH_P_8021AD, ETH_P_8021Q, ETH_P_ARP, ETH_P_IP, ETH_P_IPV6, HOPOPTS, ICMP, ICMPV6,
        PSH, TCP, UDP, ipv4_checksum, tcp_header, udp_header,
    },
    skb::{CB_WORDS, SkbContext},
};

/// The segmenter's IFB as the generated contexts name it (`ingress_ifindex`), for tests that
/// configure a segmenter with this index.
pub const SEGMENTER_IFINDEX: u32 = 4_242;

/// The longest frame generated: a test run takes at most a page of data, less the skb's
/// headroom and shared info (3,712 bytes on x86_64).
pub const MAX_FRAME: usize = 3_000;

/// The largest `wire_len` a test run takes (`GSO_LEGACY_MAX_SIZE`).
const MAX_WIRE_LEN: usize = 65_536;

const ROUTING: u8 = 43;
const FRAGMENT: u8 = 44;
const DSTOPTS: u8 = 60;
const NO_NEXT_HEADER: u8 = 59;
const SYN: u8 = 0x02;
const FIN: u8 = 0x01;
const RST: u8 = 0x04;
const ECE: u8 = 0x40;
const CWR: u8 = 0x80;

/// xorshift64* (Vigna, "An experimental exploration of Marsaglia's xorshift generators"):
/// small, fast, and plenty for picking bytes. Not for anything secret.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // splitmix64 of the seed: nearby seeds start far apart, and zero (xorshift's one
        // stuck state) cannot come out.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Self((z ^ (z >> 31)) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; its bias is below n / 2^64).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below((hi - lo + 1) as u64) as usize
    }

    pub fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }

    pub fn byte(&mut self) -> u8 {
        (self.next_u64() >> 56) as u8
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 8);
        while out.len() < n {
            out.extend(self.next_u64().to_le_bytes());
        }
        out.truncate(n);
        out
    }
}

/// Where a frame came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    RandomBytes,
    NonIp,
    Ipv4,
    Ipv6,
}

/// What was done to a built frame.
#[derive(Clone, Copy, Debug)]
pub enum Mutation {
    /// Cut to this length (or to the shortest a test run takes, see [`test_run_min_len`]).
    CutAt(usize),
    Ihl(u8),
    Version(u8),
    /// IPv4 total length or IPv6 payload length.
    IpLength(u16),
    TcpDataOffset(u8),
    /// A next-header field (IPv6's or an extension's) at this offset.
    NextHeader {
        at: usize,
        value: u8,
    },
    /// An extension header's length byte at this offset.
    ExtLength {
        at: usize,
        value: u8,
    },
    /// An Ethernet type (the outer one or a tag's) at this offset.
    EtherType {
        at: usize,
        value: u16,
    },
    /// IPv4 flags and fragment offset.
    Fragment(u16),
    BitFlips(u32),
}

/// One input: a frame, the context it runs with, and how it was made.
#[derive(Clone)]
pub struct Case {
    pub frame: Vec<u8>,
    pub ctx: SkbContext,
    pub origin: Origin,
    pub mutations: Vec<Mutation>,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hex: String = self.frame.iter().map(|b| format!("{b:02x}")).collect();
        write!(
            f,
            "{:?} frame, mutations {:?}, {} bytes: {hex}\n{:?}",
            self.origin,
            self.mutations,
            self.frame.len(),
            self.ctx
        )
    }
}

/// The shortest frame BPF_PROG_TEST_RUN takes: an Ethernet header, and a whole IP header when
/// the Ethernet type says IPv4 or IPv6 (newer kernels refuse a shorter one with EINVAL before
/// any program runs). Shorter IP headers are still generated behind VLAN tags, where the
/// kernel does not look, and reach the same bounds checks.
pub fn test_run_min_len(frame: &[u8]) -> usize {
    let ip_header = match frame.get(12..14) {
        Some(&[0x08, 0x00]) => 20,
        Some(&[0x86, 0xdd]) => 40,
        _ => 0,
    };
    14 + ip_header
}

/// A packet's addresses (see [`Generator::endpoints`]) and ports.
#[derive(Clone, Copy)]
struct Endpoints {
    src: u128,
    dst: u128,
    src_port: u16,
    dst_port: u16,
}

/// Places in a built frame worth mutating.
#[derive(Default)]
struct Layout {
    /// Where each header starts and ends, and the fields inside them that a cut can split.
    cuts: Vec<usize>,
    /// Ethernet type fields: the outer one, and the one after each tag.
    ether_types: Vec<usize>,
    l3: Option<usize>,
    v6: bool,
    /// Next-header fields: IPv6's and each extension's.
    next_headers: Vec<usize>,
    /// Extension length bytes.
    ext_lengths: Vec<usize>,
    tcp: Option<usize>,
}

pub struct Generator {
    rng: Rng,
}

impl Generator {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: Rng::new(seed),
        }
    }

    /// The next case; `now_ns` (CLOCK_MONOTONIC) anchors the timestamps that mean a time.
    pub fn case(&mut self, now_ns: u64) -> Case {
        let (mut frame, origin, mutations) = if self.rng.percent(8) {
            (self.random_frame(), Origin::RandomBytes, Vec::new())
        } else {
            let (mut frame, origin, layout) = self.built_frame();
            let mutations = self.mutate(&mut frame, &layout);
            (frame, origin, mutations)
        };
        let min = test_run_min_len(&frame);
        if frame.len() < min {
            let pad = self.rng.bytes(min - frame.len());
            frame.extend(pad);
        }
        let ctx = self.context(frame.len(), now_ns);
        Case {
            frame,
            ctx,
            origin,
            mutations,
        }
    }

    fn random_frame(&mut self) -> Vec<u8> {
        let len = if self.rng.percent(80) {
            self.rng.range(14, 200)
        } else {
            self.rng.range(14, MAX_FRAME)
        };
        let mut frame = self.rng.bytes(len);
        // Half of them claim a type the parser reads on, so random bytes reach the IP parsers.
        if self.rng.percent(50) {
            let ether_type = self
                .rng
                .pick(&[ETH_P_IP, ETH_P_IPV6, ETH_P_8021Q, ETH_P_8021AD]);
            frame[12..14].copy_from_slice(&ether_type.to_be_bytes());
        }
        frame
    }

    fn built_frame(&mut self) -> (Vec<u8>, Origin, Layout) {
        let mut layout = Layout::default();
        let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
        let tags = self.rng.pick(&[0, 0, 0, 0, 0, 0, 1, 1, 2, 3]);
        for _ in 0..tags {
            layout.ether_types.push(f.len());
            let tpid = self.rng.pick(&[ETH_P_8021Q, ETH_P_8021AD]);
            f.extend(tpid.to_be_bytes());
            layout.cuts.push(f.len());
            f.extend([self.rng.byte(), self.rng.byte()]);
            layout.cuts.push(f.len());
        }
        layout.ether_types.push(f.len());
        let origin = match self.rng.below(10) {
            0 => Origin::NonIp,
            1..=4 => Origin::Ipv4,
            _ => Origin::Ipv6,
        };
        let ether_type = match origin {
            Origin::Ipv4 => ETH_P_IP,
            Origin::Ipv6 => ETH_P_IPV6,
            _ => {
                let other = self.rng.next_u64() as u16;
                self.rng.pick(&[
                    ETH_P_ARP, 0x88cc, // LLDP
                    0x8847, // MPLS
                    0x8864, // PPPoE session
                    0x05dc, // an 802.3 length
                    0x0000, other,
                ])
            }
        };
        f.extend(ether_type.to_be_bytes());
        layout.cuts.push(f.len());
        match origin {
            Origin::Ipv4 => self.ipv4(&mut f, &mut layout),
            Origin::Ipv6 => self.ipv6(&mut f, &mut layout),
            _ => {
                let n = self.rng.range(0, 100);
                f.extend(self.rng.bytes(n));
            }
        }
        layout.cuts.push(f.len());
        // A transport header after a long extension chain can run past the page.
        f.truncate(MAX_FRAME);
        (f, origin, layout)
    }

    fn ipv4(&mut self, f: &mut Vec<u8>, layout: &mut Layout) {
        let l3 = f.len();
        layout.l3 = Some(l3);
        let ihl = if self.rng.percent(75) {
            5
        } else {
            self.rng.range(6, 15)
        };
        let proto = self.transport(false);
        let fragment: u16 = match self.rng.below(20) {
            0 => 0x4000, // DF
            1 => 0x2000, // MF: a first fragment
            2 => self.rng.next_u64() as u16,
            _ => 0,
        };
        let mut h = vec![0u8; 20];
        h[0] = 0x40 | ihl as u8;
        // Every DSCP and ECN codepoint.
        h[1] = self.rng.byte();
        h[4..6].copy_from_slice(&[self.rng.byte(), self.rng.byte()]);
        h[6..8].copy_from_slice(&fragment.to_be_bytes());
        h[8] = 64;
        h[9] = proto;
        let ends = self.endpoints();
        h[12..16].copy_from_slice(&ends.src.to_be_bytes()[12..]);
        h[16..20].copy_from_slice(&ends.dst.to_be_bytes()[12..]);
        h.extend(self.ip_options(ihl * 4 - 20));
        f.extend(h);
        layout
            .cuts
            .extend([l3 + 1, l3 + 4, l3 + 10, l3 + 19, l3 + 20, f.len()]);
        self.transport_header(f, layout, proto, ends);
        let total_len = (f.len() - l3) as u16;
        f[l3 + 2..l3 + 4].copy_from_slice(&total_len.to_be_bytes());
        // A valid checksum, so that a rewrite's checksum update can be checked.
        let sum = ipv4_checksum(&f[l3..l3 + ihl * 4]);
        f[l3 + 10..l3 + 12].copy_from_slice(&sum.to_be_bytes());
    }

    fn ipv6(&mut self, f: &mut Vec<u8>, layout: &mut Layout) {
        let l3 = f.len();
        layout.l3 = Some(l3);
        layout.v6 = true;
        let traffic_class = self.rng.byte();
        let flow_label = self.rng.next_u64() as u32 & 0xf_ffff;
        let mut h = [0u8; 40];
        h[0] = 0x60 | (traffic_class >> 4);
        h[1] = (traffic_class << 4) | (flow_label >> 16) as u8;
        h[2..4].copy_from_slice(&(flow_label as u16).to_be_bytes());
        h[7] = 64;
        let ends = self.endpoints();
        // The same hosts as IPv4's, in fd00::/64.
        let v6 = |a: u128| if a >> 32 == 0 { 0xfd00 << 112 | a } else { a };
        h[8..24].copy_from_slice(&v6(ends.src).to_be_bytes());
        h[24..40].copy_from_slice(&v6(ends.dst).to_be_bytes());
        f.extend(h);
        layout.next_headers.push(l3 + 6);
        layout.cuts.extend([l3 + 1, l3 + 6, l3 + 39, l3 + 40]);
        // The chain: each next-header field names the header after it. Up to eight, longer
        // than the parser walks (four).
        let extensions = self
            .rng
            .pick(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 4, 5, 8]);
        let mut next_field = l3 + 6;
        for _ in 0..extensions {
            let kind = self.rng.pick(&[HOPOPTS, ROUTING, FRAGMENT, DSTOPTS]);
            f[next_field] = kind;
            let at = f.len();
            let len8 = if kind == FRAGMENT {
                0
            } else if self.rng.percent(90) {
                self.rng.range(0, 2)
            } else {
                self.rng.range(0, 255)
            };
            let size = (len8 + 1) * 8;
            let mut ext = vec![0, len8 as u8];
            ext.extend(self.rng.bytes(size - 2));
            if kind == FRAGMENT {
                let offset: u16 = match self.rng.below(4) {
                    0 => self.rng.next_u64() as u16,
                    1 => 1, // M: a first fragment
                    _ => 0,
                };
                ext[1] = 0;
                ext[2..4].copy_from_slice(&offset.to_be_bytes());
            } else {
                layout.ext_lengths.push(at + 1);
            }
            layout.next_headers.push(at);
            if at + size > MAX_FRAME {
                // A header that runs past the end of the frame: the chain ends there.
                ext.truncate(MAX_FRAME - at);
                f.extend(ext);
                self.set_payload_length(f, l3);
                return;
            }
            f.extend(ext);
            layout.cuts.extend([at + 1, at + 2, f.len()]);
            next_field = at;
        }
        let proto = self.transport(true);
        f[next_field] = proto;
        self.transport_header(f, layout, proto, ends);
        self.set_payload_length(f, l3);
    }

    fn set_payload_length(&mut self, f: &mut [u8], l3: usize) {
        let payload = (f.len() - l3 - 40) as u16;
        f[l3 + 4..l3 + 6].copy_from_slice(&payload.to_be_bytes());
    }

    /// A transport protocol: mostly TCP and UDP, some ICMP, some extension-header types where
    /// the parser's walk stops (or that mean nothing after IPv4), some random.
    fn transport(&mut self, v6: bool) -> u8 {
        match self.rng.below(20) {
            0..=9 => TCP,
            10..=14 => UDP,
            15 | 16 => {
                if v6 {
                    ICMPV6
                } else {
                    ICMP
                }
            }
            17 => self
                .rng
                .pick(&[HOPOPTS, ROUTING, FRAGMENT, DSTOPTS, NO_NEXT_HEADER]),
            _ => self.rng.byte(),
        }
    }

    fn transport_header(
        &mut self,
        f: &mut Vec<u8>,
        layout: &mut Layout,
        proto: u8,
        ends: Endpoints,
    ) {
        let at = f.len();
        match proto {
            TCP => {
                layout.tcp = Some(at);
                let data_offset = if self.rng.percent(60) {
                    5
                } else {
                    self.rng.range(6, 15)
                };
                let other = self.rng.byte();
                let flags = self.rng.pick(&[
                    ACK,
                    ACK,
                    ACK,
                    ACK | PSH,
                    SYN,
                    SYN | ACK,
                    FIN | ACK,
                    FIN | PSH | ACK,
                    RST,
                    ACK | ECE,
                    ACK | CWR,
                    other,
                ]);
                let mut h = tcp_header(ends.src_port, ends.dst_port, flags);
                h[4..8].copy_from_slice(&self.sequence().to_be_bytes());
                h[8..12].copy_from_slice(&self.sequence().to_be_bytes());
                h[12] = (data_offset as u8) << 4;
                h[14..16].copy_from_slice(&[self.rng.byte(), self.rng.byte()]);
                h.extend(self.tcp_options(data_offset * 4 - 20));
                f.extend(h);
                layout
                    .cuts
                    .extend([at + 12, at + 13, at + 19, at + 20, f.len()]);
                // Mostly pure ACKs without payload: the ACK filter's candidates.
                let payload = if flags == ACK && self.rng.percent(70) {
                    0
                } else {
                    self.payload_len(f.len())
                };
                f.extend(self.rng.bytes(payload));
            }
            UDP => {
                let payload = self.payload_len(at + 8);
                f.extend(udp_header(ends.src_port, ends.dst_port, payload));
                layout.cuts.extend([at + 4, at + 7, at + 8]);
                f.extend(self.rng.bytes(payload));
            }
            ICMP | ICMPV6 => {
                let payload = self.payload_len(at + 8);
                f.extend(self.rng.bytes(8 + payload));
                layout.cuts.push(at + 8);
            }
            _ => {
                let n = self.rng.range(0, 64);
                f.extend(self.rng.bytes(n));
            }
        }
    }

    /// Payload bytes for a frame `used` long so far: mostly small, some full frames, a few
    /// up to the largest frame.
    fn payload_len(&mut self, used: usize) -> usize {
        let want = match self.rng.below(10) {
            0..=5 => self.rng.range(0, 64),
            6..=8 => self.rng.range(0, 1_460),
            _ => self.rng.range(0, MAX_FRAME),
        };
        want.min(MAX_FRAME.saturating_sub(used))
    }

    fn ip_options(&mut self, len: usize) -> Vec<u8> {
        if self.rng.percent(50) {
            // NOPs, then end of list.
            let mut options = vec![1; len];
            if let Some(last) = options.last_mut() {
                *last = 0;
            }
            options
        } else {
            self.rng.bytes(len)
        }
    }

    /// TCP options: well-formed sequences of real options, or bogus kinds and lengths, or
    /// random bytes.
    fn tcp_options(&mut self, len: usize) -> Vec<u8> {
        if self.rng.percent(30) {
            return self.rng.bytes(len);
        }
        let mut o = Vec::with_capacity(len + 40);
        while o.len() < len {
            match self.rng.below(9) {
                0 => o.push(1),
                1 => {
                    o.push(0);
                    let rest = self.rng.bytes(len - o.len());
                    o.extend(rest);
                }
                2 => o.extend([2, 4, 0x05, 0xb4]),
                3 => o.extend([3, 3, self.rng.byte()]),
                4 => o.extend([4, 2]),
                5 => {
                    o.extend([8, 10]);
                    let stamps = self.rng.bytes(8);
                    o.extend(stamps);
                }
                6 | 7 => {
                    let blocks = self.rng.range(1, 4);
                    o.extend([5, 2 + 8 * blocks as u8]);
                    for _ in 0..2 * blocks {
                        o.extend(self.sequence().to_be_bytes());
                    }
                }
                _ => {
                    let kind = self.rng.byte();
                    let length = self.rng.pick(&[0, 1, 2, 3, 40, 255]);
                    o.extend([kind, length]);
                }
            }
        }
        o.truncate(len);
        o
    }

    /// A sequence or acknowledgement number: mostly within a window of one another, so the
    /// ACK filter finds ACKs that cover others.
    fn sequence(&mut self) -> u32 {
        if self.rng.percent(70) {
            1_000_000 + self.rng.below(200_000) as u32
        } else {
            self.rng.next_u64() as u32
        }
    }

    /// Who talks to whom: two fifths from two "hot" connections in either direction (so that
    /// a flow builds a queue for the AQM, and its ACKs and its data meet in the ACK filter),
    /// the rest between eight hosts on common ports, a tenth random. Addresses are the low
    /// bits of IPv4's (IPv6 puts them in fd00::/64) or random 128-bit ones.
    fn endpoints(&mut self) -> Endpoints {
        const CLIENT: u128 = 0x0a00_0001;
        const SERVER: u128 = 0x0a00_0002;
        if self.rng.percent(40) {
            let client_port = 40_000 + self.rng.below(2) as u16;
            return if self.rng.percent(50) {
                Endpoints {
                    src: CLIENT,
                    dst: SERVER,
                    src_port: client_port,
                    dst_port: 5201,
                }
            } else {
                Endpoints {
                    src: SERVER,
                    dst: CLIENT,
                    src_port: 5201,
                    dst_port: client_port,
                }
            };
        }
        Endpoints {
            src: self.address(),
            dst: self.address(),
            src_port: self.port(),
            dst_port: self.port(),
        }
    }

    fn address(&mut self) -> u128 {
        if self.rng.percent(10) {
            u128::from(self.rng.next_u64()) << 64 | u128::from(self.rng.next_u64())
        } else {
            0x0a00_0000 | u128::from(self.rng.below(2)) << 8 | u128::from(1 + self.rng.below(8))
        }
    }

    fn port(&mut self) -> u16 {
        if self.rng.percent(80) {
            self.rng.pick(&[80, 443, 5201, 53, 40_000, 40_001, 123, 22])
        } else {
            self.rng.next_u64() as u16
        }
    }

    /// Zero to three mutations. Fields are rewritten first and the cut made last, so that
    /// every field of the built frame can be reached whatever the order.
    fn mutate(&mut self, f: &mut Vec<u8>, layout: &Layout) -> Vec<Mutation> {
        let count = self.rng.pick(&[0, 0, 0, 0, 1, 1, 1, 2, 2, 3]);
        let mut done = Vec::with_capacity(count);
        let mut cut = f.len();
        for _ in 0..count {
            let mutation = match self.rng.below(12) {
                0..=2 => {
                    // At a boundary, or one byte either side of it.
                    let boundary = self.rng.pick(&layout.cuts) as isize;
                    let at = (boundary + self.rng.range(0, 2) as isize - 1).max(14) as usize;
                    cut = cut.min(at);
                    Some(Mutation::CutAt(at))
                }
                3 => {
                    let at = self.rng.range(14, f.len().max(14));
                    cut = cut.min(at);
                    Some(Mutation::CutAt(at))
                }
                4 => layout.l3.filter(|_| !layout.v6).map(|l3| {
                    let ihl = self.rng.range(0, 15) as u8;
                    f[l3] = (f[l3] & 0xf0) | ihl;
                    Mutation::Ihl(ihl)
                }),
                5 => layout.l3.map(|l3| {
                    let version = self.rng.range(0, 15) as u8;
                    f[l3] = (version << 4) | (f[l3] & 0x0f);
                    Mutation::Version(version)
                }),
                6 => layout.l3.map(|l3| {
                    let at = if layout.v6 { l3 + 4 } else { l3 + 2 };
                    let other = self.rng.next_u64() as u16;
                    let len = self.rng.pick(&[0, 1, 19, 20, 21, 39, 40, 0xffff, other]);
                    f[at..at + 2].copy_from_slice(&len.to_be_bytes());
                    Mutation::IpLength(len)
                }),
                7 => layout.tcp.filter(|&t| t + 12 < f.len()).map(|t| {
                    let offset = self.rng.range(0, 15) as u8;
                    f[t + 12] = (offset << 4) | (f[t + 12] & 0x0f);
                    Mutation::TcpDataOffset(offset)
                }),
                8 => pick_within(&mut self.rng, &layout.next_headers, f.len()).map(|at| {
                    let other = self.rng.byte();
                    let value = self.rng.pick(&[
                        HOPOPTS,
                        TCP,
                        UDP,
                        ROUTING,
                        FRAGMENT,
                        ICMPV6,
                        NO_NEXT_HEADER,
                        DSTOPTS,
                        other,
                    ]);
                    f[at] = value;
                    Mutation::NextHeader { at, value }
                }),
                9 => pick_within(&mut self.rng, &layout.ext_lengths, f.len()).map(|at| {
                    let value = self.rng.byte();
                    f[at] = value;
                    Mutation::ExtLength { at, value }
                }),
                10 => {
                    let at = self.rng.pick(&layout.ether_types);
                    let other = self.rng.next_u64() as u16;
                    let value = self.rng.pick(&[
                        ETH_P_IP,
                        ETH_P_IPV6,
                        ETH_P_8021Q,
                        ETH_P_8021AD,
                        ETH_P_ARP,
                        other,
                    ]);
                    f[at..at + 2].copy_from_slice(&value.to_be_bytes());
                    Some(Mutation::EtherType { at, value })
                }
                _ => {
                    let flips = self.rng.range(1, 8);
                    for _ in 0..flips {
                        let bit = self.rng.below(f.len() as u64 * 8) as usize;
                        f[bit / 8] ^= 1 << (bit % 8);
                    }
                    Some(Mutation::BitFlips(flips as u32))
                }
            };
            done.extend(mutation);
        }
        f.truncate(cut.max(test_run_min_len(f)));
        done
    }

    /// A context: GSO metadata within what a test run takes (`gso_segs` up to 65,535,
    /// `wire_len` zero or from the frame's length to 64 KiB), timestamps of every kind (none,
    /// TCP's pacing a little ahead, further ahead, the past, beyond any horizon, a wall-clock
    /// receive time, random), a
    /// mark, a priority, the segmenter's or another ingress device, and a control block that is
    /// clean, holds plausible words of the data path's own, or holds garbage.
    fn context(&mut self, len: usize, now_ns: u64) -> SkbContext {
        const SECOND: u64 = 1_000_000_000;
        const MS: u64 = 1_000_000;
        // Pacing far ahead is rare: each one holds its flow's clock (and so its queue, for the
        // AQM) that far ahead, and a flow that often has one only meets the flow's hard limit.
        let tstamp = match self.rng.below(100) {
            0..=49 => 0,
            50..=79 => now_ns + self.rng.below(2 * MS),
            80 => now_ns + self.rng.below(100 * MS),
            81..=84 => now_ns.saturating_sub(self.rng.below(SECOND)),
            85..=89 => now_ns + 2 * SECOND + self.rng.below(60 * SECOND),
            90..=94 => 1_700_000_000 * SECOND + self.rng.below(100_000_000 * SECOND),
            _ => self.rng.next_u64(),
        };
        let mut ctx = SkbContext::default().with_tstamp(tstamp);
        if self.rng.percent(10) {
            let segs = if self.rng.percent(70) {
                self.rng.pick(&[1, 2, 3, 44, 45, 64])
            } else {
                self.rng.range(0, 65_535) as u32
            };
            let size = if self.rng.percent(70) {
                self.rng.pick(&[536, 1_448, 1_460, 9_000])
            } else {
                self.rng.next_u64() as u32
            };
            let wire_len = match self.rng.below(4) {
                0 => 0,
                1 => len,
                // One copy of the headers per segment, as the qdisc layer counts them.
                2 => (len + (segs as usize).saturating_sub(1) * 66).min(MAX_WIRE_LEN),
                _ => self.rng.range(len, MAX_WIRE_LEN),
            };
            ctx = ctx.with_gso(segs, size, wire_len as u32);
        } else if self.rng.percent(2) {
            ctx = ctx.with_gso(0, 0, self.rng.range(len, MAX_WIRE_LEN) as u32);
        }
        let mark = match self.rng.below(4) {
            0 | 1 => 0,
            2 => self.rng.range(0, 16) as u32,
            _ => self.rng.next_u64() as u32,
        };
        let priority = if self.rng.percent(70) {
            0
        } else {
            self.rng.next_u64() as u32
        };
        let ingress_ifindex = match self.rng.below(20) {
            0..=13 => 0,
            14..=16 => SEGMENTER_IFINDEX,
            _ => self.rng.next_u64() as u32,
        };
        let cb: [u32; CB_WORDS] = match self.rng.below(4) {
            0 | 1 => [0; CB_WORDS],
            // Words like the data path's own: an IP header's offset, what to rewrite, flags.
            2 => [
                self.rng.range(0, 64) as u32,
                self.rng.range(0, 3) as u32,
                self.rng.range(0, 15) as u32,
                self.rng.range(0, 15) as u32,
                self.rng.next_u64() as u32,
            ],
            _ => std::array::from_fn(|_| self.rng.next_u64() as u32),
        };
        ctx = ctx
            .with_mark(mark)
            .with_priority(priority)
            .with_ingress_ifindex(ingress_ifindex)
            .with_cb(cb);
        if self.rng.percent(10) {
            ctx = ctx.with_hwtstamp(self.rng.next_u64());
        }
        ctx
    }
}

/// One of `places` inside a frame of `len` bytes (an extension header that ran past the end
/// of the frame left its fields outside it).
fn pick_within(rng: &mut Rng, places: &[usize], len: usize) -> Option<usize> {
    if places.is_empty() {
        return None;
    }
    Some(rng.pick(places)).filter(|&at| at < len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_cases() {
        let (mut a, mut b) = (Generator::new(7), Generator::new(7));
        for _ in 0..1_000 {
            let (x, y) = (a.case(1), b.case(1));
            assert_eq!((x.frame, x.ctx), (y.frame, y.ctx));
        }
    }

    #[test]
    fn every_case_is_one_a_test_run_takes() {
        let mut g = Generator::new(1);
        for _ in 0..100_000 {
            let c = g.case(1);
            assert!(c.frame.len() >= test_run_min_len(&c.frame));
            assert!(c.frame.len() <= MAX_FRAME);
            let wire_len = c.ctx.wire_len() as usize;
            assert!(wire_len == 0 || (c.frame.len()..=MAX_WIRE_LEN).contains(&wire_len));
        }
    }
}
