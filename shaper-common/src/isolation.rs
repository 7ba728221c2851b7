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
}
