//! Isolation modes (CAKE's names) and what each makes of a packet: the key of its *host*
//! (outer fairness level) and of its *flow* (inner level). See docs/design.md for the
//! semantics of every mode.

/// Which packet fields make up a key. Host fields are addresses masked to the host prefix;
/// address fields are whole addresses; transport adds the protocol and ports.
pub mod fields {
    pub const NONE: u32 = 0;
    pub const SRC_HOST: u32 = 1 << 0;
    pub const DST_HOST: u32 = 1 << 1;
    pub const SRC_ADDR: u32 = 1 << 2;
    pub const DST_ADDR: u32 = 1 << 3;
    pub const TRANSPORT: u32 = 1 << 4;
    pub const FIVE_TUPLE: u32 = SRC_ADDR | DST_ADDR | TRANSPORT;
}

#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Isolation {
    /// One clock for everything: the rate alone, first come first served.
    FlowBlind = 0,
    /// Fair between source hosts.
    SrcHost = 1,
    /// Fair between destination hosts.
    DstHost = 2,
    /// Fair between (source, destination) host pairs.
    Hosts = 3,
    /// Fair between flows (5-tuples).
    Flows = 4,
    /// Fair between source hosts, then between the flows of each.
    DualSrcHost = 5,
    /// Fair between destination hosts, then between the flows of each.
    DualDstHost = 6,
    /// Fair between source hosts and between destination hosts, then between flows.
    #[default]
    TripleIsolate = 7,
}

impl Isolation {
    pub const ALL: [Self; 8] = [
        Self::FlowBlind,
        Self::SrcHost,
        Self::DstHost,
        Self::Hosts,
        Self::Flows,
        Self::DualSrcHost,
        Self::DualDstHost,
        Self::TripleIsolate,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Self::FlowBlind => "flowblind",
            Self::SrcHost => "srchost",
            Self::DstHost => "dsthost",
            Self::Hosts => "hosts",
            Self::Flows => "flows",
            Self::DualSrcHost => "dual-srchost",
            Self::DualDstHost => "dual-dsthost",
            Self::TripleIsolate => "triple-isolate",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == s)
    }

    pub const fn from_u32(v: u32) -> Option<Self> {
        if (v as usize) < Self::ALL.len() {
            Some(Self::ALL[v as usize])
        } else {
            None
        }
    }

    /// Fields of the outer (host) key. `flowblind` and `flows` have none: all their flows share
    /// one pseudo-host whose level is the whole rate. `srchost`, `dsthost` and `hosts` are hosts
    /// of one flow each (as in CAKE, a host's packets share one queue): as hosts they get what
    /// the control loop gives hosts (an allocation held by a guard clock, the boost that
    /// recovers a lone TCP flow's lost time), which a pseudo-host's flows do not.
    pub const fn host_fields(self) -> u32 {
        match self {
            Self::FlowBlind | Self::Flows => fields::NONE,
            Self::SrcHost | Self::DualSrcHost => fields::SRC_HOST,
            Self::DstHost | Self::DualDstHost => fields::DST_HOST,
            Self::Hosts | Self::TripleIsolate => fields::SRC_HOST | fields::DST_HOST,
        }
    }

    /// Fields of the inner (flow) key.
    pub const fn flow_fields(self) -> u32 {
        match self {
            Self::FlowBlind => fields::NONE,
            Self::SrcHost => fields::SRC_HOST,
            Self::DstHost => fields::DST_HOST,
            Self::Hosts => fields::SRC_HOST | fields::DST_HOST,
            Self::Flows | Self::DualSrcHost | Self::DualDstHost | Self::TripleIsolate => {
                fields::FIVE_TUPLE
            }
        }
    }
}

/// The address mask of a host: the first `prefix` bits of a 128-bit (IPv6) or 32-bit (IPv4)
/// address, as four network-order words.
pub const fn prefix_mask(prefix: u32, words: usize) -> [u32; 4] {
    let mut mask = [0u32; 4];
    let mut i = 0;
    while i < words {
        let bits = prefix.saturating_sub(32 * i as u32);
        let word = if bits >= 32 {
            u32::MAX
        } else if bits == 0 {
            0
        } else {
            u32::MAX << (32 - bits)
        };
        mask[i] = word.to_be();
        i += 1;
    }
    mask
}

/// What a machine's own addresses are keyed as, in place of their host address: the machine is
/// one host whatever the family and the address it sends from (a dual-stack server is fair
/// between its IPv4 and IPv6 clients; see docs/design.md, "How a host is identified"). All ones:
/// no IPv4 key (its last three words are zero) and no IPv6 source (ff00::/8 is multicast).
pub const SELF_HOST: [u32; 4] = [u32::MAX; 4];

/// The key an address is looked up by among the machine's own: an IPv6 address as it is, an
/// IPv4 one as its IPv4-mapped IPv6 address (`::ffff:a.b.c.d`), so that one 16-byte key holds
/// both families. Words in network order, as the packet carries them.
#[inline(always)]
pub const fn own_lookup_key(addr: &[u32; 4], v6: bool) -> [u32; 4] {
    if v6 {
        *addr
    } else {
        [0, 0, u32::from_ne_bytes([0, 0, 0xff, 0xff]), addr[0]]
    }
}

/// The family a key of `want` fields records: 4 or 6, the packet's; 0 where no address in the
/// key is the packet's own, so that the key is the same in both families: none at all (the
/// single-level modes' pseudo-host), or host fields only, each the machine's own (`src_self`,
/// `dst_self`: [`SELF_HOST`]). A key with any other address keeps its family, for a v4 and a
/// v6 address could share their words.
#[inline(always)]
pub const fn key_family(want: u32, v6: bool, src_self: bool, dst_self: bool) -> u8 {
    let whole = fields::SRC_ADDR | fields::DST_ADDR | fields::TRANSPORT;
    let src_neutral = want & fields::SRC_HOST == 0 || src_self;
    let dst_neutral = want & fields::DST_HOST == 0 || dst_self;
    if want & whole == 0 && src_neutral && dst_neutral {
        0
    } else if v6 {
        6
    } else {
        4
    }
}

/// One side of a host key as the control plane tells sources (or destinations) apart: its
/// address and family, the family dropped for the machine itself, which is one host in both.
pub const fn side_identity(addr: [u32; 4], family: u8) -> ([u32; 4], u8) {
    if addr[0] == SELF_HOST[0]
        && addr[1] == SELF_HOST[1]
        && addr[2] == SELF_HOST[2]
        && addr[3] == SELF_HOST[3]
    {
        (addr, 0)
    } else {
        (addr, family)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for m in Isolation::ALL {
            assert_eq!(Isolation::parse(m.name()), Some(m));
            assert_eq!(Isolation::from_u32(m as u32), Some(m));
        }
        assert_eq!(Isolation::parse("triple"), None);
        assert_eq!(Isolation::from_u32(8), None);
        assert_eq!(Isolation::default(), Isolation::TripleIsolate);
    }

    #[test]
    fn dual_modes_nest_flows_in_hosts() {
        assert_eq!(Isolation::DualDstHost.host_fields(), fields::DST_HOST);
        assert_eq!(Isolation::DualDstHost.flow_fields(), fields::FIVE_TUPLE);
        assert_eq!(Isolation::DstHost.host_fields(), fields::DST_HOST);
        assert_eq!(Isolation::DstHost.flow_fields(), fields::DST_HOST);
        assert_eq!(Isolation::Flows.host_fields(), fields::NONE);
        assert_eq!(Isolation::FlowBlind.flow_fields(), fields::NONE);
    }

    #[test]
    fn masks() {
        assert_eq!(prefix_mask(32, 1), [u32::MAX, 0, 0, 0]);
        assert_eq!(prefix_mask(24, 1), [0xFFFF_FF00u32.to_be(), 0, 0, 0]);
        assert_eq!(prefix_mask(64, 4), [u32::MAX, u32::MAX, 0, 0]);
        assert_eq!(prefix_mask(56, 4), [u32::MAX, 0xFFFF_FF00u32.to_be(), 0, 0]);
        assert_eq!(prefix_mask(128, 4), [u32::MAX; 4]);
        assert_eq!(prefix_mask(0, 4), [0; 4]);
    }

    #[test]
    fn own_addresses_of_both_families_share_one_key_space() {
        let v4 = [u32::from_ne_bytes([10, 9, 0, 1]), 0, 0, 0];
        let mapped = own_lookup_key(&v4, false);
        let mut bytes = [0u8; 16];
        for (i, w) in mapped.iter().enumerate() {
            bytes[4 * i..4 * i + 4].copy_from_slice(&w.to_ne_bytes());
        }
        assert_eq!(
            bytes,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 9, 0, 1]
        );
        let v6 = [1, 2, 3, 4];
        assert_eq!(own_lookup_key(&v6, true), v6);
    }

    #[test]
    fn a_key_of_the_machine_alone_has_no_family() {
        use fields::*;
        // The machine as source host: one key in both families.
        assert_eq!(key_family(SRC_HOST, true, true, false), 0);
        assert_eq!(key_family(SRC_HOST, false, true, false), 0);
        assert_eq!(key_family(DST_HOST, false, false, true), 0);
        // Another host, or a pair with one: the packet's family.
        assert_eq!(key_family(SRC_HOST, true, false, false), 6);
        assert_eq!(key_family(SRC_HOST | DST_HOST, false, true, false), 4);
        assert_eq!(key_family(SRC_HOST | DST_HOST, true, true, true), 0);
        // Whole addresses and ports are never the machine's key.
        assert_eq!(key_family(FIVE_TUPLE, true, false, false), 6);
        assert_eq!(key_family(SRC_HOST | TRANSPORT, false, true, false), 4);
        // The pseudo-host.
        assert_eq!(key_family(NONE, true, false, false), 0);
    }

    #[test]
    fn the_machine_is_one_side_in_both_families() {
        assert_eq!(side_identity(SELF_HOST, 4), side_identity(SELF_HOST, 6));
        assert_ne!(
            side_identity([1, 0, 0, 0], 4),
            side_identity([1, 0, 0, 0], 6)
        );
    }
}
