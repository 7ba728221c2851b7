//! Types shared between the BPF data path and the control plane: map names, map values and the
//! counters. All `#[repr(C)]` with explicit padding so both sides agree on the layout.

/// Per-interface shaping parameters, written by the control plane (array map, one entry).
/// The data path reads it on every packet; `ns_per_byte_fp` is precomputed so the fast path
/// never divides.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShaperConfig {
    /// Configured wire rate, bits per second. Zero means "not configured yet": packets pass
    /// unshaped (fail open) and are counted as such.
    pub rate_bps: u64,
    /// Nanoseconds per wire byte at `rate_bps`, with `edt::NS_PER_BYTE_SHIFT` fractional bits.
    pub ns_per_byte_fp: u64,
    /// Departures further than this in the future are dropped (last-resort bound on the queue).
    pub horizon_ns: u64,
    /// Bytes added to each frame (per GSO segment) before accounting; may be negative.
    pub overhead_bytes: i32,
    /// Minimum accounted size of a frame, bytes.
    pub mpu_bytes: u32,
}

/// A departure clock: when the wire (for the aggregate it belongs to) is next free, in
/// CLOCK_MONOTONIC nanoseconds. Updated with compare-and-swap from every CPU.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Clock {
    pub next_ns: u64,
}

/// Why a packet was dropped by the data path.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Its departure time would be beyond the horizon.
    Horizon = 0,
}

impl DropReason {
    pub const COUNT: usize = 1;
    pub const ALL: [Self; Self::COUNT] = [Self::Horizon];
    pub const fn name(self) -> &'static str {
        match self {
            Self::Horizon => "horizon",
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
}

impl PassReason {
    pub const COUNT: usize = 3;
    pub const ALL: [Self; Self::COUNT] = [Self::NonIp, Self::Malformed, Self::Unconfigured];
    pub const fn name(self) -> &'static str {
        match self {
            Self::NonIp => "non_ip",
            Self::Malformed => "malformed",
            Self::Unconfigured => "unconfigured",
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
    }
}

/// Names of the maps, as declared in the BPF object.
pub mod map_names {
    pub const CONFIG: &str = "SHAPER_CONFIG";
    pub const CLOCK: &str = "SHAPER_CLOCK";
    pub const STATS: &str = "SHAPER_STATS";
}

/// Names of the BPF programs.
pub mod program_names {
    pub const EGRESS: &str = "shaper_egress";
}

const _: () = {
    assert!(core::mem::size_of::<ShaperConfig>() == 32);
    assert!(core::mem::size_of::<Clock>() == 8);
    assert!(
        core::mem::size_of::<DatapathStats>() == 8 * (3 + DropReason::COUNT + PassReason::COUNT)
    );
};

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: plain `#[repr(C)]` integers with no implicit padding (asserted above).
    unsafe impl aya::Pod for ShaperConfig {}
    unsafe impl aya::Pod for Clock {}
    unsafe impl aya::Pod for DatapathStats {}
}
