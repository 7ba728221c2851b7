//! How many bytes a packet takes on the bottleneck link: CAKE's overhead compensation.
//!
//! Linux counts a frame as its own device sends it (`qdisc_pkt_len`: from the link-layer
//! header, one copy of the headers per GSO segment). The bottleneck is often a link further on
//! that frames the IP packet its own way: a DOCSIS MAC header, PPPoE and VLAN headers, PTM's
//! 64b/65b coding, ATM's 48-byte cells sent as 53. A shaper that counts fewer bytes than that
//! link sends lets a queue build there again. [`Framing`] is the link's description, built from
//! CAKE's keywords by the same rules as `tc` (iproute2's q_cake.c), and
//! [`Framing::frame_bytes`] is sch_cake's per-frame arithmetic (`cake_calc_overhead`), so that
//! a line described to shaper and to CAKE with the same words is counted the same.

/// Cell framing of the link (CAKE's `atm`/`ptm`/`noatm`; its `TCA_CAKE_ATM` values).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cells {
    None = 0,
    /// ATM (ADSL): whole 48-byte cells, each 53 bytes on the line.
    Atm = 1,
    /// PTM (VDSL2): one byte more per 64 bytes or part of them (64b/65b coding).
    Ptm = 2,
}

/// The link's framing, as the data path reads it (part of `abi::ShaperConfig`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    /// Bytes added to every frame; may be negative.
    pub overhead: i32,
    /// Least bytes a frame is counted as, after the overhead.
    pub mpu: u32,
    /// [`Cells`] as u32.
    pub cells: u32,
    /// Not zero: the frame is counted from its network header (the device's own link-layer
    /// header is replaced by `overhead`), as CAKE does once an overhead is given. Zero: from
    /// the frame's start (CAKE's `raw`).
    pub from_network: u32,
}

impl Framing {
    /// Frames counted as the device sends them (no keyword, or CAKE's `raw`).
    pub const RAW: Self = Self {
        overhead: 0,
        mpu: 0,
        cells: Cells::None as u32,
        from_network: 0,
    };

    /// Bytes on the link of one frame of `len` bytes whose network header starts
    /// `network_offset` bytes in: without the device's link-layer header when the framing
    /// counts from the network header, plus the overhead, at least the MPU, then in cells.
    /// Never zero.
    #[inline(always)]
    pub fn frame_bytes(&self, len: u32, network_offset: u32) -> u64 {
        // Branch-free (see `branchless`): the scheduler is verified through every path of it.
        let strip = 0u64.wrapping_sub((self.from_network != 0) as u64);
        let bytes = len as u64 - crate::branchless::min(network_offset as u64 & strip, len as u64);
        // Biased to stay positive however negative the overhead, then at least one byte.
        const BIAS: u64 = 1 << 32;
        let biased = (bytes + BIAS).wrapping_add(self.overhead as i64 as u64);
        let x = crate::branchless::max(biased, BIAS + 1) - BIAS;
        let x = crate::branchless::max(x, self.mpu as u64);
        let atm = x.div_ceil(48) * 53;
        let ptm = x + x.div_ceil(64);
        let cells = self.cells as u64;
        crate::branchless::select(
            (cells == Cells::Atm as u64) as u64,
            atm,
            crate::branchless::select((cells == Cells::Ptm as u64) as u64, ptm, x),
        )
    }

    /// Bytes on the link of a packet, a GSO super-packet counted as the frames it becomes.
    ///
    /// `packet.qdisc_len` is what the qdisc layer counts (`__sk_buff->wire_len`): for a GSO
    /// packet the kernel adds one copy of the headers per further segment, so their length is
    /// `(qdisc_len - len) / (segs - 1)` and each full segment is that plus `seg_size`; the last
    /// is what remains (sch_cake's `cake_overhead`). Counts that cannot be a real packet's
    /// (no room for a last segment) are taken as equal frames.
    #[inline(always)]
    pub fn packet_bytes(&self, packet: Packet) -> u64 {
        if packet.segs <= 1 || packet.seg_size == 0 || packet.qdisc_len <= packet.len {
            return self.frame_bytes(packet.qdisc_len, packet.network_offset);
        }
        let more = packet.segs - 1;
        if packet.len as u64 <= packet.seg_size as u64 * more as u64 {
            // Counts that do not add up (no last segment): the qdisc length in equal frames.
            let each = packet.qdisc_len.div_ceil(packet.segs);
            return self.frame_bytes(each, packet.network_offset) * packet.segs as u64;
        }
        let headers = (packet.qdisc_len - packet.len) / more;
        let full = headers.saturating_add(packet.seg_size);
        let last = packet
            .len
            .saturating_sub(packet.seg_size.saturating_mul(more));
        self.frame_bytes(full, packet.network_offset) * more as u64
            + self.frame_bytes(last, packet.network_offset)
    }
}

/// As tc shows CAKE's: `raw` when frames are counted whole, the overhead, the MPU and the cells.
impl core::fmt::Display for Framing {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.from_network == 0 {
            f.write_str("raw ")?;
        }
        write!(f, "overhead {}", self.overhead)?;
        if self.mpu != 0 {
            write!(f, " mpu {}", self.mpu)?;
        }
        match self.cells {
            c if c == Cells::Atm as u32 => f.write_str(" atm"),
            c if c == Cells::Ptm as u32 => f.write_str(" ptm"),
            _ => Ok(()),
        }
    }
}

/// A packet as the kernel hands it to the data path, for [`Framing::packet_bytes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    /// `__sk_buff->wire_len`.
    pub qdisc_len: u32,
    /// `__sk_buff->len`.
    pub len: u32,
    /// `__sk_buff->gso_segs` (0 or 1: not GSO).
    pub segs: u32,
    /// `__sk_buff->gso_size`.
    pub seg_size: u32,
    /// Where the network header starts in each frame.
    pub network_offset: u32,
}

/// One word of a link's description: CAKE's keywords, and its `overhead N` and `mpu N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Word {
    Keyword(Keyword),
    Overhead(i32),
    Mpu(u32),
}

macro_rules! keywords {
    ($( $(#[$doc:meta])* $variant:ident = $name:literal, )*) => {
        /// CAKE's framing keywords (tc-cake(8)).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Keyword {
            $( $(#[$doc])* $variant, )*
        }

        impl Keyword {
            pub const ALL: &'static [Keyword] = &[$(Keyword::$variant,)*];

            pub fn name(self) -> &'static str {
                match self {
                    $( Keyword::$variant => $name, )*
                }
            }

            pub fn parse(name: &str) -> Option<Self> {
                match name {
                    $( $name => Some(Keyword::$variant), )*
                    _ => None,
                }
            }
        }
    };
}

keywords! {
    /// Cell framing off.
    NoAtm = "noatm",
    Atm = "atm",
    Ptm = "ptm",
    /// Frames as the device sends them, no compensation.
    Raw = "raw",
    /// More than any common link: a whole ATM cell of overhead, in cells.
    Conservative = "conservative",
    /// An Ethernet cable: preamble, start delimiter, FCS and inter-frame gap.
    Ethernet = "ethernet",
    /// Cable: the Ethernet frame with its FCS, no preamble or gap.
    Docsis = "docsis",
    /// VDSL2 with a PPPoE session.
    PppoePtm = "pppoe-ptm",
    /// VDSL2 bridged.
    BridgedPtm = "bridged-ptm",
    PppoaVcmux = "pppoa-vcmux",
    PppoaLlc = "pppoa-llc",
    PppoeVcmux = "pppoe-vcmux",
    PppoeLlcsnap = "pppoe-llcsnap",
    BridgedVcmux = "bridged-vcmux",
    BridgedLlcsnap = "bridged-llcsnap",
    IpoaVcmux = "ipoa-vcmux",
    IpoaLlcsnap = "ipoa-llcsnap",
    /// An 802.1Q tag (repeat for each).
    EtherVlan = "ether-vlan",
    /// Accepted and ignored, as by tc: the device's link-layer header is taken off by itself.
    ViaEthernet = "via-ethernet",
}

/// What the words add up to: tc's reading of them, in order.
///
/// Most keywords add their bytes to the overhead so far; `raw`, `conservative` and
/// `overhead N` set it. `ethernet` and `docsis` set the MPU, as does `mpu N`. Any of them but
/// the cell switches counts frames from the network header, unless `raw` came anywhere (tc
/// then sends `TCA_CAKE_RAW`, and the kernel counts from the frame's start).
pub fn resolve(words: impl IntoIterator<Item = Word>) -> Framing {
    let mut overhead = 0i32;
    let mut overhead_set = false;
    let mut raw = false;
    let mut mpu = 0u32;
    let mut cells = Cells::None;
    for word in words {
        let (atm, add, set, set_mpu) = match word {
            Word::Overhead(n) => (None, None, Some(n), None),
            Word::Mpu(n) => (None, None, None, Some(n)),
            Word::Keyword(k) => match k {
                Keyword::NoAtm => (Some(Cells::None), None, None, None),
                Keyword::Atm => (Some(Cells::Atm), None, None, None),
                Keyword::Ptm => (Some(Cells::Ptm), None, None, None),
                Keyword::Raw => {
                    raw = true;
                    (Some(Cells::None), None, Some(0), None)
                }
                Keyword::Conservative => (Some(Cells::Atm), None, Some(48), None),
                Keyword::Ethernet => (None, Some(38), None, Some(84)),
                Keyword::Docsis => (Some(Cells::None), Some(18), None, Some(64)),
                Keyword::PppoePtm => (Some(Cells::Ptm), Some(30), None, None),
                Keyword::BridgedPtm => (Some(Cells::Ptm), Some(22), None, None),
                Keyword::PppoaVcmux => (Some(Cells::Atm), Some(10), None, None),
                Keyword::PppoaLlc => (Some(Cells::Atm), Some(14), None, None),
                Keyword::PppoeVcmux => (Some(Cells::Atm), Some(32), None, None),
                Keyword::PppoeLlcsnap => (Some(Cells::Atm), Some(40), None, None),
                Keyword::BridgedVcmux => (Some(Cells::Atm), Some(24), None, None),
                Keyword::BridgedLlcsnap => (Some(Cells::Atm), Some(32), None, None),
                Keyword::IpoaVcmux => (Some(Cells::Atm), Some(8), None, None),
                Keyword::IpoaLlcsnap => (Some(Cells::Atm), Some(16), None, None),
                Keyword::EtherVlan => (None, Some(4), None, None),
                Keyword::ViaEthernet => (None, None, None, None),
            },
        };
        if let Some(atm) = atm {
            cells = atm;
        }
        if let Some(add) = add {
            overhead = overhead.saturating_add(add);
            overhead_set = true;
        }
        if let Some(set) = set {
            overhead = set;
            overhead_set = true;
        }
        if let Some(set_mpu) = set_mpu {
            mpu = set_mpu;
        }
    }
    Framing {
        overhead,
        mpu,
        cells: cells as u32,
        from_network: (overhead_set && !raw) as u32,
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;

    fn words(text: &str) -> Vec<Word> {
        let mut out = Vec::new();
        let mut it = text.split_whitespace();
        while let Some(w) = it.next() {
            out.push(match w {
                "overhead" => Word::Overhead(it.next().unwrap().parse().unwrap()),
                "mpu" => Word::Mpu(it.next().unwrap().parse().unwrap()),
                k => Word::Keyword(Keyword::parse(k).unwrap()),
            });
        }
        out
    }

    fn framing(text: &str) -> Framing {
        resolve(words(text))
    }

    fn f(overhead: i32, mpu: u32, cells: Cells, from_network: bool) -> Framing {
        Framing {
            overhead,
            mpu,
            cells: cells as u32,
            from_network: from_network as u32,
        }
    }

    /// tc-cake(8)'s table: what each keyword is equivalent to.
    #[test]
    fn keywords_are_tcs() {
        use Cells::*;
        let table = [
            ("raw", f(0, 0, None, false)),
            ("conservative", f(48, 0, Atm, true)),
            ("ethernet", f(38, 84, None, true)),
            ("docsis", f(18, 64, None, true)),
            ("pppoe-ptm", f(30, 0, Ptm, true)),
            ("bridged-ptm", f(22, 0, Ptm, true)),
            ("pppoa-vcmux", f(10, 0, Atm, true)),
            ("pppoa-llc", f(14, 0, Atm, true)),
            ("pppoe-vcmux", f(32, 0, Atm, true)),
            ("pppoe-llcsnap", f(40, 0, Atm, true)),
            ("bridged-vcmux", f(24, 0, Atm, true)),
            ("bridged-llcsnap", f(32, 0, Atm, true)),
            ("ipoa-vcmux", f(8, 0, Atm, true)),
            ("ipoa-llcsnap", f(16, 0, Atm, true)),
            ("ether-vlan", f(4, 0, None, true)),
            ("via-ethernet", Framing::RAW),
            ("atm", f(0, 0, Atm, false)),
            ("ptm", f(0, 0, Ptm, false)),
            ("", Framing::RAW),
        ];
        for (text, want) in table {
            assert_eq!(framing(text), want, "{text}");
        }
        for k in Keyword::ALL {
            assert_eq!(Keyword::parse(k.name()), Some(*k));
        }
    }

    #[test]
    fn shown_as_tc_shows_it() {
        use std::string::ToString;
        assert_eq!(Framing::RAW.to_string(), "raw overhead 0");
        assert_eq!(framing("docsis").to_string(), "overhead 18 mpu 64");
        assert_eq!(framing("pppoe-ptm").to_string(), "overhead 30 ptm");
        assert_eq!(framing("atm").to_string(), "raw overhead 0 atm");
    }

    /// tc reads the words in order: keywords add, `overhead N` sets, `raw` anywhere counts
    /// whole frames.
    #[test]
    fn words_combine_as_in_tc() {
        use Cells::*;
        assert_eq!(framing("pppoe-ptm ether-vlan"), f(34, 0, Ptm, true));
        assert_eq!(
            framing("ether-vlan ether-vlan docsis"),
            f(26, 64, None, true)
        );
        assert_eq!(framing("docsis overhead 22"), f(22, 64, None, true));
        assert_eq!(framing("overhead 22 docsis"), f(40, 64, None, true));
        assert_eq!(framing("docsis mpu 0"), f(18, 0, None, true));
        assert_eq!(framing("pppoe-ptm noatm"), f(30, 0, None, true));
        assert_eq!(framing("pppoa-vcmux conservative"), f(48, 0, Atm, true));
        assert_eq!(framing("raw docsis"), f(18, 64, None, false));
        assert_eq!(framing("overhead -14"), f(-14, 0, None, true));
        assert_eq!(framing("mpu 64"), f(0, 64, None, false));
    }

    /// sch_cake's cake_calc_overhead, on an Ethernet device (network header at 14).
    #[test]
    fn frames_are_counted_as_cake_does() {
        let eth = 14;
        // A full 1500-byte IP packet.
        assert_eq!(Framing::RAW.frame_bytes(1514, eth), 1514);
        assert_eq!(framing("docsis").frame_bytes(1514, eth), 1518);
        assert_eq!(framing("ethernet").frame_bytes(1514, eth), 1538);
        // 1530 bytes in PTM: 24 blocks of 64, the last part-filled, one byte each.
        assert_eq!(framing("pppoe-ptm").frame_bytes(1514, eth), 1530 + 24);
        assert_eq!(framing("bridged-ptm").frame_bytes(1514, eth), 1522 + 24);
        // 1510 bytes in 48-byte cells: 32 cells of 53.
        assert_eq!(framing("pppoa-vcmux").frame_bytes(1514, eth), 32 * 53);
        assert_eq!(framing("pppoe-llcsnap").frame_bytes(1514, eth), 33 * 53);
        assert_eq!(framing("conservative").frame_bytes(1514, eth), 33 * 53);
        // A bare 40-byte ACK: the MPU, and a cell boundary.
        assert_eq!(framing("docsis").frame_bytes(54, eth), 64);
        assert_eq!(framing("ethernet").frame_bytes(54, eth), 84);
        assert_eq!(framing("ipoa-vcmux").frame_bytes(54, eth), 53);
        assert_eq!(framing("pppoa-vcmux").frame_bytes(54, eth), 2 * 53);
        assert_eq!(framing("pppoe-vcmux").frame_bytes(54, eth), 2 * 53);
        assert_eq!(framing("pppoe-ptm").frame_bytes(54, eth), 70 + 2);
        // A device with no link-layer header: the same line, the same count.
        assert_eq!(framing("pppoe-ptm").frame_bytes(1500, 0), 1530 + 24);
        // Raw frames are counted whole whatever the offset; `atm` alone cells them.
        assert_eq!(framing("atm").frame_bytes(1514, eth), 32 * 53);
        assert_eq!(framing("mpu 64").frame_bytes(42, eth), 64);
        // Never zero, however negative the overhead.
        assert_eq!(framing("overhead -64").frame_bytes(20, 0), 1);
    }

    /// A GSO packet counts as the frames it becomes (sch_cake's cake_overhead).
    #[test]
    fn gso_packets_count_their_frames() {
        let eth = 14;
        // 44 segments of 1448 bytes behind 66 bytes of headers.
        let headers = 66;
        let len = headers + 44 * 1448;
        let packet = Packet {
            qdisc_len: len + 43 * headers,
            len,
            segs: 44,
            seg_size: 1448,
            network_offset: eth,
        };
        assert_eq!(Framing::RAW.packet_bytes(packet), 44 * 1514);
        assert_eq!(framing("docsis").packet_bytes(packet), 44 * 1518);
        assert_eq!(framing("pppoa-vcmux").packet_bytes(packet), 44 * 32 * 53);
        // A short last segment is framed on its own.
        let short = Packet {
            qdisc_len: packet.qdisc_len - 1400,
            len: packet.len - 1400,
            ..packet
        };
        assert_eq!(
            framing("pppoa-vcmux").packet_bytes(short),
            43 * 32 * 53 + 3 * 53
        );
        assert_eq!(Framing::RAW.packet_bytes(short), 43 * 1514 + 114);
        // Counts that do not add up (a test run's one frame said to be six): equal frames.
        let claimed = Packet {
            qdisc_len: 6 * 1514,
            len: 1514,
            segs: 6,
            seg_size: 1472,
            network_offset: eth,
        };
        assert_eq!(Framing::RAW.packet_bytes(claimed), 6 * 1514);
        assert_eq!(framing("docsis").packet_bytes(claimed), 6 * 1518);
        // Not GSO, or a count the kernel did not fill in: one frame of the qdisc length.
        let single = Packet {
            qdisc_len: 1514,
            len: 1514,
            segs: 1,
            seg_size: 0,
            network_offset: eth,
        };
        assert_eq!(framing("docsis").packet_bytes(single), 1518);
        assert_eq!(
            framing("docsis").packet_bytes(Packet { segs: 0, ..single }),
            1518
        );
    }
}
