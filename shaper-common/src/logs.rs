//! The data path's debug events (`shaper run --log-datapath`): which kinds there are, how many
//! of each a CPU may send, and the words they name their decisions with.
//!
//! Off, none of this runs: the loader leaves the data path's switch at zero, the verifier
//! knows it (a read-only global) and removes every branch that would send an event. On, each
//! CPU sends at most [`EVENTS_PER_SECOND`] events of each kind, so a loaded link logs at a
//! bounded rate; the events refused meanwhile are counted and the next one sent says how many.

use crate::{ackfilter::KeepReason, stats::DropReason};

/// The name of the data path's switch: a read-only global, non-zero when events are sent.
pub const SWITCH: &str = "SHAPER_LOG_DATAPATH";

/// The kinds of events, each with a rate of its own: a packet's classification (every packet
/// has one) must not crowd out the AQM's rarer verdicts.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The packet's tin, host and flow, as the scheduler keys them.
    Classify = 0,
    /// A mark or a drop by the AQM.
    Aqm = 1,
    /// The ACK filter's decision on a pure ACK.
    AckFilter = 2,
}

impl Kind {
    pub const COUNT: usize = 3;
}

/// Events of one kind a CPU may send per second.
pub const EVENTS_PER_SECOND: u64 = 10;
/// The events of one kind a CPU may send at once after a quiet spell.
pub const BURST_EVENTS: u64 = 10;
const EVENT_INTERVAL_NS: u64 = 1_000_000_000 / EVENTS_PER_SECOND;

/// One kind's budget on one CPU: a GCRA (virtual scheduling) bucket, in plain integers.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bucket {
    /// When the budget is next back to full (ns, the data path's clock): each event sent
    /// moves it one interval on, and an event may be sent while it stands at most a burst
    /// ahead of now.
    pub full_at_ns: u64,
    /// Events refused since the last one sent.
    pub refused: u64,
}

impl Bucket {
    /// Whether an event may be sent at `now_ns`; if so, how many were refused before it (and
    /// the count starts again), else one more refused.
    #[inline(always)]
    pub fn admit(&mut self, now_ns: u64) -> Option<u64> {
        let from = if self.full_at_ns > now_ns {
            self.full_at_ns
        } else {
            now_ns
        };
        if from - now_ns > (BURST_EVENTS - 1) * EVENT_INTERVAL_NS {
            self.refused += 1;
            return None;
        }
        self.full_at_ns = from + EVENT_INTERVAL_NS;
        let refused = self.refused;
        self.refused = 0;
        Some(refused)
    }
}

/// The per-CPU map value: a bucket per kind.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Buckets {
    pub by_kind: [Bucket; Kind::COUNT],
}

/// How many bytes a decision's name takes in an event: a fixed length, so that the data path
/// copies a constant number of bytes (the reader trims the padding).
pub const NAME_BYTES: usize = 24;

/// A decision's name as the data path sends it: `a` then `b`, padded with spaces.
pub const fn name(a: &str, b: &str) -> [u8; NAME_BYTES] {
    let mut out = [b' '; NAME_BYTES];
    let (a, b) = (a.as_bytes(), b.as_bytes());
    assert!(
        a.len() + b.len() <= NAME_BYTES,
        "a decision's name is too long"
    );
    let mut n = 0;
    while n < a.len() {
        out[n] = a[n];
        n += 1;
    }
    while n < a.len() + b.len() {
        out[n] = b[n - a.len()];
        n += 1;
    }
    out
}

/// The AQM's verdicts, by `aqm::Verdict` (its `Pass` is never sent).
pub const AQM_VERDICTS: [[u8; NAME_BYTES]; 5] = [
    name("pass", ""),
    name("mark", ""),
    name("drop ", DropReason::Codel.name()),
    name("drop ", DropReason::Blue.name()),
    name("drop ", DropReason::Overlimit.name()),
];

/// The ACK filter's decisions: [`ACK_DROP`], or `ACK_KEEP + KeepReason`.
pub const ACK_DECISIONS: [[u8; NAME_BYTES]; 1 + KeepReason::COUNT] = {
    let mut names = [name("drop", ""); 1 + KeepReason::COUNT];
    let mut n = 0;
    while n < KeepReason::COUNT {
        let reason = KeepReason::ALL[n];
        names[ACK_KEEP + reason as usize] = name("keep ", reason.name());
        n += 1;
    }
    names
};
pub const ACK_DROP: usize = 0;
pub const ACK_KEEP: usize = 1;

/// A name as sent, without its padding.
pub fn trimmed(name: &[u8; NAME_BYTES]) -> &str {
    core::str::from_utf8(name).map_or("", |s| s.trim_end())
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::format;

    use super::*;
    use crate::aqm::Verdict;

    #[test]
    fn a_cpu_sends_a_burst_then_one_event_an_interval_and_counts_the_rest() {
        let mut b = Bucket::default();
        let t0 = 5_000_000_000;
        for _ in 0..BURST_EVENTS {
            assert_eq!(b.admit(t0), Some(0));
        }
        assert_eq!(b.admit(t0), None);
        assert_eq!(b.admit(t0 + 1), None);
        // One interval later, one more, saying how many were refused.
        assert_eq!(b.admit(t0 + EVENT_INTERVAL_NS), Some(2));
        assert_eq!(b.admit(t0 + EVENT_INTERVAL_NS), None);
        // Over a long run, at most the rate (plus the first burst).
        let mut sent = 0;
        for ms in 0..10_000 {
            sent += b
                .admit(t0 + 2 * EVENT_INTERVAL_NS + ms * 1_000_000)
                .is_some() as u64;
        }
        assert!(sent <= 10 * EVENTS_PER_SECOND + 1, "{sent}");
        assert!(sent >= 10 * EVENTS_PER_SECOND - 1, "{sent}");
    }

    #[test]
    fn after_a_quiet_spell_the_whole_burst_is_back() {
        let mut b = Bucket::default();
        for _ in 0..3 * BURST_EVENTS {
            b.admit(1_000);
        }
        let later = 1_000 + 60_000_000_000;
        for _ in 0..BURST_EVENTS {
            assert!(b.admit(later).is_some());
        }
        assert_eq!(b.admit(later), None);
    }

    #[test]
    fn decisions_are_named_as_the_counters_are() {
        assert_eq!(trimmed(&AQM_VERDICTS[Verdict::Mark as usize]), "mark");
        assert_eq!(
            trimmed(&AQM_VERDICTS[Verdict::DropBlue as usize]),
            "drop blue"
        );
        assert_eq!(
            trimmed(&AQM_VERDICTS[Verdict::DropOverlimit as usize]),
            "drop overlimit"
        );
        assert_eq!(trimmed(&ACK_DECISIONS[ACK_DROP]), "drop");
        for reason in KeepReason::ALL {
            assert_eq!(
                trimmed(&ACK_DECISIONS[ACK_KEEP + reason as usize]),
                format!("keep {}", reason.name())
            );
        }
    }
}
