//! The data path's counters (per CPU, summed by the control plane) and what they count by:
//! drop and pass reasons, the scheduled-delay histogram.

use crate::{ackfilter::KeepReason, diffserv::MAX_TINS};

/// Why a packet was dropped by the data path.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Its departure time would be beyond the horizon.
    Horizon = 0,
    /// CoDel's signal on a packet that cannot carry an ECN mark.
    Codel = 1,
    /// BLUE's probabilistic drop of a flow that overflowed its hard limit.
    Blue = 2,
    /// Its flow's queue was beyond the flow's hard limit.
    Overlimit = 3,
}

impl DropReason {
    pub const COUNT: usize = 4;
    pub const ALL: [Self; Self::COUNT] = [Self::Horizon, Self::Codel, Self::Blue, Self::Overlimit];
    pub const fn name(self) -> &'static str {
        match self {
            Self::Horizon => "horizon",
            Self::Codel => "codel",
            Self::Blue => "blue",
            Self::Overlimit => "overlimit",
        }
    }
}

/// Why a packet left without a departure time (fail-open paths).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassReason {
    /// Not IPv4/IPv6 (ARP, LLDP, ...): never delayed.
    NonIp = 0,
    /// Truncated or inconsistent headers.
    Malformed = 1,
    /// No rate configured yet.
    Unconfigured = 2,
    /// No host or flow entry could be had (map full beyond what LRU eviction frees), or a
    /// program of the data path could not be reached by its tail call.
    NoState = 3,
    /// Autorate's own round-trip probes (`autorate::PROBE_PRIORITY`): they measure the link's
    /// queue, not shaper's.
    Probe = 4,
}

impl PassReason {
    pub const COUNT: usize = 5;
    pub const ALL: [Self; Self::COUNT] = [
        Self::NonIp,
        Self::Malformed,
        Self::Unconfigured,
        Self::NoState,
        Self::Probe,
    ];
    pub const fn name(self) -> &'static str {
        match self {
            Self::NonIp => "non_ip",
            Self::Malformed => "malformed",
            Self::Unconfigured => "unconfigured",
            Self::NoState => "no_state",
            Self::Probe => "probe",
        }
    }
}

/// Per-CPU counters (one per-CPU array entry); the control plane sums the CPUs.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DatapathStats {
    /// Packets stamped with a departure time (GSO super-packets count once).
    pub shaped_packets: u64,
    /// Wire bytes of the stamped packets, as accounted against the rate.
    pub shaped_bytes: u64,
    /// Packets dropped, by [`DropReason`].
    pub dropped: [u64; DropReason::COUNT],
    /// Packets passed without a departure time, by [`PassReason`].
    pub passed: [u64; PassReason::COUNT],
    /// Clock reservations that lost the compare-and-swap race too often and fell back to an
    /// atomic add (see the data path's `edt` module): a measure of cross-CPU contention.
    pub clock_contended: u64,
    /// Packets the calendar moved past their flow's time (the aggregate was overbooked).
    pub calendar_delayed: u64,
    /// Wire time (ns) the calendar could not place: what priority packets borrowed beyond the
    /// bins they may span (the lent debt), and a packet's when the bin after its span changed
    /// under it.
    pub calendar_unplaced_ns: u64,
    /// Priority packets (a sparse flow's, a host's going ahead, a prioritised tin's) the
    /// calendar did not lend to because its debt stood at what it lends: they booked behind
    /// the others' packets, and a sparse flow's waited.
    pub calendar_refused: u64,
    /// Latest departure stamped on this CPU (the scheduled queue: this minus now).
    pub latest_depart_ns: u64,
    /// Packets CE-marked by the AQM.
    pub ecn_marked: u64,
    /// Packets of sparse flows (their flow idle for at least the packet's own time), sent at
    /// once without waiting for the calendar or their host's guard.
    pub sparse: u64,
    /// GSO packets left to the segmenter unstamped (see `ShaperConfig::split_gso_segs`); their
    /// frames come back and are counted as shaped.
    pub segmented: u64,
    /// Frames (GSO segments) by scheduled delay, see [`delay_bucket`].
    pub delay_hist: [u64; DELAY_BUCKETS],
    /// The scheduled delays of the histogram's frames added up (ns): with their count, the
    /// mean, which the buckets' octaves only bound.
    pub delay_sum_ns: u64,
    /// Frames scheduled further ahead than the AQM's target: against the frames of the
    /// histogram, whether the median stands within the target, which the histogram's octaves
    /// cannot tell (a finer one costs the verifier more than the scheduler can spare).
    pub over_target: u64,
    /// ECN-capable packets dropped, for any reason: the AQM marks them, so these are the drops
    /// an ECN flow still sees (its hard limit, BLUE, the horizon).
    pub ecn_capable_dropped: u64,
    /// Packets and wire bytes stamped, per tin.
    pub tin_packets: [u64; MAX_TINS],
    pub tin_bytes: [u64; MAX_TINS],
    /// Pure ACKs the ACK filter examined, dropped, and kept by [`KeepReason`].
    pub ack_seen: u64,
    pub ack_dropped: u64,
    pub ack_kept: [u64; KeepReason::COUNT],
    /// Kept pure ACKs sent at once, ahead of their flow's packets still scheduled
    /// ([`crate::ackfilter::jumps_queue`]).
    pub ack_jumped: u64,
    /// Packets the device sent ahead of the rate beyond the meter's burst (a stall's clump,
    /// `overrun::meter`), and the wire time charged to the calendar as owed for them.
    pub overrun_packets: u64,
    pub overrun_ns: u64,
    /// Packets sent through the segmenter behind frames of their flow still in it, to keep
    /// their place (`segmenter`).
    pub segment_followers: u64,
}

/// Buckets of the scheduled-delay histogram: bucket 0 is under 64 µs, bucket `i` (1..15) is
/// `[64 µs · 2^(i-1), 64 µs · 2^i)`, the last is open-ended (1.05 s and more).
pub const DELAY_BUCKETS: usize = 16;
const DELAY_BUCKET_BASE_NS: u64 = 64_000;

/// The histogram bucket of a scheduled delay (a bounded scan: no count-leading-zeros in BPF).
#[inline(always)]
pub fn delay_bucket(delay_ns: u64) -> usize {
    let mut bucket = 0;
    let mut bound = DELAY_BUCKET_BASE_NS;
    while bucket < DELAY_BUCKETS - 1 && delay_ns >= bound {
        bucket += 1;
        bound <<= 1;
    }
    bucket
}

/// The bucket of a histogram holding its `per_mille` / 1000 quantile: the first whose running
/// count reaches that rank. `None` when the histogram is empty. Shared by `shaper stats` and
/// the lab's reports, which pool several runs' histograms.
pub fn quantile_bucket(counts: &[u64], per_mille: u64) -> Option<usize> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = total.saturating_mul(per_mille).div_ceil(1000).max(1);
    let mut seen = 0;
    counts.iter().position(|&n| {
        seen += n;
        seen >= rank
    })
}

/// The upper bound (ns) of a bucket; `u64::MAX` for the last.
pub const fn delay_bucket_upper_ns(bucket: usize) -> u64 {
    if bucket >= DELAY_BUCKETS - 1 {
        u64::MAX
    } else {
        DELAY_BUCKET_BASE_NS << bucket
    }
}

impl DatapathStats {
    /// Adds another CPU's counters into this one.
    pub fn accumulate(&mut self, other: &Self) {
        self.shaped_packets += other.shaped_packets;
        self.shaped_bytes += other.shaped_bytes;
        for (a, b) in self.dropped.iter_mut().zip(other.dropped.iter()) {
            *a += b;
        }
        for (a, b) in self.passed.iter_mut().zip(other.passed.iter()) {
            *a += b;
        }
        self.clock_contended += other.clock_contended;
        self.calendar_delayed += other.calendar_delayed;
        self.calendar_unplaced_ns += other.calendar_unplaced_ns;
        self.calendar_refused += other.calendar_refused;
        self.latest_depart_ns = self.latest_depart_ns.max(other.latest_depart_ns);
        self.ecn_marked += other.ecn_marked;
        self.sparse += other.sparse;
        self.segmented += other.segmented;
        self.segment_followers += other.segment_followers;
        for (a, b) in self.delay_hist.iter_mut().zip(other.delay_hist.iter()) {
            *a += b;
        }
        self.delay_sum_ns += other.delay_sum_ns;
        self.over_target += other.over_target;
        self.ecn_capable_dropped += other.ecn_capable_dropped;
        for t in 0..MAX_TINS {
            self.tin_packets[t] += other.tin_packets[t];
            self.tin_bytes[t] += other.tin_bytes[t];
        }
        self.ack_seen += other.ack_seen;
        self.ack_dropped += other.ack_dropped;
        for (a, b) in self.ack_kept.iter_mut().zip(other.ack_kept.iter()) {
            *a += b;
        }
        self.ack_jumped += other.ack_jumped;
        self.overrun_packets += other.overrun_packets;
        self.overrun_ns += other.overrun_ns;
    }
}

const _: () = assert!(
    core::mem::size_of::<DatapathStats>()
        == 8 * (19
            + DropReason::COUNT
            + PassReason::COUNT
            + DELAY_BUCKETS
            + 2 * MAX_TINS
            + KeepReason::COUNT)
);

// SAFETY: plain `#[repr(C)]` integers with no implicit padding (asserted above).
#[cfg(feature = "user")]
unsafe impl aya::Pod for DatapathStats {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_bucket_is_the_first_to_reach_the_rank() {
        assert_eq!(quantile_bucket(&[0, 0, 0], 500), None);
        // 10 frames: the median is the 5th, the 99th percentile the 10th.
        let h = [4, 1, 0, 5];
        assert_eq!(quantile_bucket(&h, 500), Some(1));
        assert_eq!(quantile_bucket(&h, 990), Some(3));
        assert_eq!(quantile_bucket(&h, 400), Some(0));
        // The smallest quantile is still a frame's bucket, not an empty one before it.
        assert_eq!(quantile_bucket(&[0, 3], 0), Some(1));
    }

    #[test]
    fn delay_buckets_double_from_64us() {
        assert_eq!(delay_bucket(0), 0);
        assert_eq!(delay_bucket(63_999), 0);
        assert_eq!(delay_bucket(64_000), 1);
        assert_eq!(delay_bucket(127_999), 1);
        assert_eq!(delay_bucket(128_000), 2);
        assert_eq!(delay_bucket(5_000_000), 7); // [4.096, 8.192) ms
        assert_eq!(delay_bucket(u64::MAX), DELAY_BUCKETS - 1);
        for b in 0..DELAY_BUCKETS - 1 {
            let upper = delay_bucket_upper_ns(b);
            assert_eq!(delay_bucket(upper - 1), b);
            assert_eq!(delay_bucket(upper), b + 1);
        }
    }
}
