//! DiffServ tins with CAKE's names, class mappings and bandwidth thresholds.
//!
//! A tin is a class of traffic with a bandwidth threshold: below it, its packets go ahead of
//! lower tins' queues; above it, it competes with them by weight, so a flooding tin cannot
//! starve the others (docs/design.md, "DiffServ tins"). The mode maps each DSCP to a tin; the
//! data path reads that map from its configuration and tags hosts and flows with their tin.

/// Most tins a mode has (diffserv8, precedence).
pub const MAX_TINS: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u32)]
pub enum Diffserv {
    /// One tin (the default: on a server the DSCP of its own traffic says little).
    #[default]
    Besteffort = 0,
    /// Eight tins by the IP precedence (the top three bits of the DSCP).
    Precedence = 1,
    /// Bulk (CS1, LE), best effort, voice (EF, VA, CS6, CS7, TOS4).
    Diffserv3 = 2,
    /// Bulk (CS1, LE), best effort, video (AF2x-AF4x, CS2, CS3, TOS4), voice (EF, VA, CS4-CS7).
    Diffserv4 = 3,
    /// Eight classes after RFC 4594, from background to network control.
    Diffserv8 = 4,
}

/// One tin of a mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tin {
    pub name: &'static str,
    /// Its bandwidth threshold as a fraction of the rate: `rate × num / den`.
    pub threshold_num: u64,
    pub threshold_den: u64,
    /// Higher goes first while within its threshold.
    pub priority: u8,
}

const fn tin(name: &'static str, num: u64, den: u64, priority: u8) -> Tin {
    Tin {
        name,
        threshold_num: num,
        threshold_den: den,
        priority,
    }
}

/// Tins of the modes whose tins are numbered as CAKE numbers them (0 is best effort in the
/// three- and four-tin modes, so that an unknown DSCP lands there).
const BESTEFFORT: [Tin; 1] = [tin("besteffort", 1, 1, 0)];
const DIFFSERV3: [Tin; 3] = [
    tin("besteffort", 1, 1, 1),
    tin("bulk", 1, 16, 0),
    tin("voice", 1, 4, 2),
];
const DIFFSERV4: [Tin; 4] = [
    tin("besteffort", 1, 1, 1),
    tin("bulk", 1, 16, 0),
    tin("video", 1, 2, 2),
    tin("voice", 1, 4, 3),
];
/// Eight tins whose thresholds shrink by 7/8 per step up in priority.
const EIGHT: [Tin; 8] = [
    tin("tin0", 1, 1, 0),
    tin("tin1", 7, 8, 1),
    tin("tin2", 49, 64, 2),
    tin("tin3", 343, 512, 3),
    tin("tin4", 2_401, 4_096, 4),
    tin("tin5", 16_807, 32_768, 5),
    tin("tin6", 117_649, 262_144, 6),
    tin("tin7", 823_543, 2_097_152, 7),
];

/// DSCP codepoints by name.
pub mod dscp {
    pub const CS0: u8 = 0;
    pub const LE: u8 = 1;
    pub const TOS1: u8 = 2;
    pub const TOS4: u8 = 4;
    pub const CS1: u8 = 8;
    pub const AF11: u8 = 10;
    pub const AF12: u8 = 12;
    pub const AF13: u8 = 14;
    pub const CS2: u8 = 16;
    pub const AF21: u8 = 18;
    pub const AF22: u8 = 20;
    pub const AF23: u8 = 22;
    pub const CS3: u8 = 24;
    pub const AF31: u8 = 26;
    pub const AF32: u8 = 28;
    pub const AF33: u8 = 30;
    pub const CS4: u8 = 32;
    pub const AF41: u8 = 34;
    pub const AF42: u8 = 36;
    pub const AF43: u8 = 38;
    pub const CS5: u8 = 40;
    pub const VA: u8 = 44;
    pub const EF: u8 = 46;
    pub const CS6: u8 = 48;
    pub const CS7: u8 = 56;
}

impl Diffserv {
    pub const ALL: [Self; 5] = [
        Self::Besteffort,
        Self::Precedence,
        Self::Diffserv3,
        Self::Diffserv4,
        Self::Diffserv8,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Self::Besteffort => "besteffort",
            Self::Precedence => "precedence",
            Self::Diffserv3 => "diffserv3",
            Self::Diffserv4 => "diffserv4",
            Self::Diffserv8 => "diffserv8",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    pub const fn tins(self) -> &'static [Tin] {
        match self {
            Self::Besteffort => &BESTEFFORT,
            Self::Diffserv3 => &DIFFSERV3,
            Self::Diffserv4 => &DIFFSERV4,
            Self::Precedence | Self::Diffserv8 => &EIGHT,
        }
    }

    /// The tin of a DSCP (0-63): CAKE's class mappings.
    pub const fn tin_of(self, d: u8) -> u8 {
        use dscp::*;
        let d = d & 63;
        match self {
            Self::Besteffort => 0,
            Self::Precedence => d >> 3,
            Self::Diffserv3 => match d {
                LE | CS1 => 1,
                TOS4 | VA | EF | CS6 | CS7 => 2,
                _ => 0,
            },
            Self::Diffserv4 => match d {
                LE | CS1 => 1,
                TOS4 | CS2 | AF21 | AF22 | AF23 | CS3 | AF31 | AF32 | AF33 | AF41 | AF42 | AF43 => {
                    2
                }
                CS4 | CS5 | VA | EF | CS6 | CS7 => 3,
                _ => 0,
            },
            Self::Diffserv8 => match d {
                LE => 0,
                TOS1 | CS1 | AF11 | AF12 | AF13 => 1,
                CS3 | AF31 | AF32 | AF33 | AF41 | AF42 | AF43 => 3,
                TOS4 | AF21 | AF22 | AF23 => 4,
                CS2 => 5,
                CS4 | CS5 | VA | EF => 6,
                CS6 | CS7 => 7,
                _ => 2,
            },
        }
    }

    /// The DSCP → tin table the data path reads.
    pub fn table(self) -> [u8; 64] {
        let mut t = [0u8; 64];
        for (d, slot) in t.iter_mut().enumerate() {
            *slot = self.tin_of(d as u8);
        }
        t
    }
}

/// Parses a DSCP name (`EF`, `AF41`, `CS1`, ...) or number (0-63).
pub fn parse_dscp(text: &str) -> Option<u8> {
    use dscp::*;
    let named = [
        ("CS0", CS0),
        ("LE", LE),
        ("CS1", CS1),
        ("AF11", AF11),
        ("AF12", AF12),
        ("AF13", AF13),
        ("CS2", CS2),
        ("AF21", AF21),
        ("AF22", AF22),
        ("AF23", AF23),
        ("CS3", CS3),
        ("AF31", AF31),
        ("AF32", AF32),
        ("AF33", AF33),
        ("CS4", CS4),
        ("AF41", AF41),
        ("AF42", AF42),
        ("AF43", AF43),
        ("CS5", CS5),
        ("VA", VA),
        ("EF", EF),
        ("CS6", CS6),
        ("CS7", CS7),
    ];
    let upper = text.trim();
    for (name, value) in named {
        if upper.eq_ignore_ascii_case(name) {
            return Some(value);
        }
    }
    match upper.parse::<u8>() {
        Ok(v) if v < 64 => Some(v),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{dscp::*, *};

    #[test]
    fn cake_class_mappings() {
        let d4 = Diffserv::Diffserv4;
        assert_eq!(d4.tin_of(EF), 3);
        assert_eq!(d4.tin_of(CS6), 3);
        assert_eq!(d4.tin_of(AF41), 2);
        assert_eq!(d4.tin_of(CS1), 1);
        assert_eq!(d4.tin_of(LE), 1);
        assert_eq!(d4.tin_of(CS0), 0);
        assert_eq!(d4.tin_of(AF11), 0, "AF1x is best effort in diffserv4");
        assert_eq!(d4.tin_of(63), 0, "unknown codepoints are best effort");
        let d3 = Diffserv::Diffserv3;
        assert_eq!((d3.tin_of(EF), d3.tin_of(AF41), d3.tin_of(CS1)), (2, 0, 1));
        let d8 = Diffserv::Diffserv8;
        assert_eq!(
            (
                d8.tin_of(CS7),
                d8.tin_of(EF),
                d8.tin_of(CS0),
                d8.tin_of(CS1)
            ),
            (7, 6, 2, 1)
        );
        assert_eq!(Diffserv::Precedence.tin_of(EF), 5);
        assert!(Diffserv::Besteffort.table().iter().all(|t| *t == 0));
        // Every table entry names a tin of its mode.
        for mode in Diffserv::ALL {
            assert!(
                mode.table()
                    .iter()
                    .all(|t| (*t as usize) < mode.tins().len())
            );
            assert!(mode.tins().len() <= MAX_TINS);
        }
    }

    #[test]
    fn thresholds_follow_cake() {
        let t = Diffserv::Diffserv4.tins();
        let frac = |i: usize| t[i].threshold_num as f64 / t[i].threshold_den as f64;
        assert_eq!(
            (frac(0), frac(1), frac(2), frac(3)),
            (1.0, 1.0 / 16.0, 0.5, 0.25)
        );
        // Voice above video above best effort above bulk.
        assert!(t[3].priority > t[2].priority && t[2].priority > t[0].priority);
        assert!(t[0].priority > t[1].priority);
        let e = Diffserv::Diffserv8.tins();
        assert!(
            (e[7].threshold_num as f64 / e[7].threshold_den as f64 - 0.875f64.powi(7)).abs()
                < 1e-12
        );
    }

    #[test]
    fn dscp_names_and_numbers() {
        assert_eq!(parse_dscp("EF"), Some(46));
        assert_eq!(parse_dscp("af41"), Some(34));
        assert_eq!(parse_dscp("63"), Some(63));
        assert_eq!(parse_dscp("64"), None);
        assert_eq!(parse_dscp("XX"), None);
    }
}
