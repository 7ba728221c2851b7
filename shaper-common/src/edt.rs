//! Earliest Departure Time arithmetic, shared by the BPF data path and host tests.
//!
//! The model (as in the kernel's EDT work and sch_fq): every packet gets a departure time in
//! `skb->tstamp` (CLOCK_MONOTONIC ns); fq holds it until then. A clock per aggregate remembers
//! when the wire will be free again; a packet departs at `max(now, clock)` and pushes the clock
//! forward by its own transmission time at the configured rate. There is no burst allowance: an
//! idle clock restarts at `now`, so the long-run rate never exceeds the configured one.
//!
//! No division on the per-packet path: the control plane precomputes nanoseconds per byte in
//! fixed point (`ns_per_byte_fp`, [`NS_PER_BYTE_SHIFT`] fractional bits) and the data path
//! multiplies and shifts.

use crate::rate::{MAX_RATE_BPS, MIN_RATE_BPS};

pub const NSEC_PER_SEC: u64 = 1_000_000_000;

/// Fractional bits of `ns_per_byte_fp`. 20 bits keep the relative error below 2e-5 at 100 Gbit/s
/// while `wire_bytes * ns_per_byte_fp` cannot overflow u64 for packets up to 2 MiB at the slowest
/// accepted rate (1 kbit/s: 8e6 ns/byte << 20 = 8.4e12; × 2^21 = 1.76e19 < 2^64).
pub const NS_PER_BYTE_SHIFT: u32 = 20;

/// Nanoseconds per byte at `rate_bps`, in fixed point, rounded up so that the shaped rate is
/// never above the configured one.
pub const fn ns_per_byte_fp(rate_bps: u64) -> u64 {
    let rate = if rate_bps < MIN_RATE_BPS {
        MIN_RATE_BPS
    } else if rate_bps > MAX_RATE_BPS {
        MAX_RATE_BPS
    } else {
        rate_bps
    };
    let numerator = (8 * NSEC_PER_SEC as u128) << NS_PER_BYTE_SHIFT;
    numerator.div_ceil(rate as u128) as u64
}

/// Largest packet the arithmetic accounts exactly (2 MiB, beyond BIG TCP's 512 KiB); larger
/// values are clamped. Together with the slowest rate this bounds the product below 2^64, so the
/// data path multiplies without overflow checks (BPF has no 128-bit multiply for them).
pub const MAX_ACCOUNTED_BYTES: u64 = 2 << 20;

/// Time the wire needs for `wire_bytes` at the rate behind `ns_per_byte_fp`, rounded up: the
/// error is below 1 ns per packet and always on the side of not exceeding the rate.
#[inline(always)]
pub fn tx_time_ns(wire_bytes: u64, ns_per_byte_fp: u64) -> u64 {
    const ROUND_UP: u64 = (1 << NS_PER_BYTE_SHIFT) - 1;
    const MAX_NS_PER_BYTE_FP: u64 = crate::edt::ns_per_byte_fp(MIN_RATE_BPS);
    let bytes = if wire_bytes > MAX_ACCOUNTED_BYTES {
        MAX_ACCOUNTED_BYTES
    } else {
        wire_bytes
    };
    let fp = if ns_per_byte_fp > MAX_NS_PER_BYTE_FP {
        MAX_NS_PER_BYTE_FP
    } else {
        ns_per_byte_fp
    };
    (bytes.wrapping_mul(fp) + ROUND_UP) >> NS_PER_BYTE_SHIFT
}

/// Outcome of reserving the wire for one packet on a departure clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// When the packet may leave (`skb->tstamp`).
    pub depart_ns: u64,
    /// The clock's new value: when the wire is free after this packet.
    pub clock_ns: u64,
}

/// Reserves `tx_ns` of wire time on a clock currently at `clock_ns`.
///
/// `not_before_ns` is the packet's own earliest departure when it already has one (TCP's
/// internal pacing stamps `skb->tstamp`); it is honoured only when it lies within `horizon_ns` of
/// `now_ns`, because a forwarded packet may carry a receive timestamp of another clock base.
///
/// `credit_ns` is the longest gap a clock may catch up: a clock behind `now` by at most that
/// keeps its value, so a flow whose next packet comes a little late (a TCP Small Queues
/// completion, a scheduling hiccup) does not lose that time for good. With flows paced at
/// exactly their fair shares, those small losses add up to a link that is never full. A clock
/// further behind restarts at `now`: an idle or new flow gets no burst.
///
/// Returns `None` when the departure would be more than `horizon_ns` in the future: the caller
/// drops the packet and the clock is not advanced.
#[inline(always)]
pub fn reserve(
    clock_ns: u64,
    now_ns: u64,
    not_before_ns: u64,
    tx_ns: u64,
    horizon_ns: u64,
    credit_ns: u64,
) -> Option<Reservation> {
    // A short gap is caught up; after a longer one (an idle or new flow) the clock restarts at
    // now, so nobody gets a burst for having been quiet.
    let mut start = if clock_ns.saturating_add(credit_ns) >= now_ns {
        clock_ns
    } else {
        now_ns
    };
    if not_before_ns > start && not_before_ns - now_ns <= horizon_ns {
        start = not_before_ns;
    }
    let depart = if start > now_ns { start } else { now_ns };
    if depart - now_ns > horizon_ns {
        return None;
    }
    Some(Reservation {
        depart_ns: depart,
        clock_ns: start + tx_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ns_per_byte_matches_rate() {
        // 1 Gbit/s: 8 ns per byte, exactly.
        assert_eq!(ns_per_byte_fp(1_000_000_000), 8 << NS_PER_BYTE_SHIFT);
        assert_eq!(tx_time_ns(1514, ns_per_byte_fp(1_000_000_000)), 12_112);
        // 50 Mbit/s: 160 ns per byte.
        assert_eq!(tx_time_ns(1514, ns_per_byte_fp(50_000_000)), 242_240);
        // 64 KB GSO packet at 2.5 Gbit/s.
        assert_eq!(tx_time_ns(65_536, ns_per_byte_fp(2_500_000_000)), 209_716);
    }

    #[test]
    fn shaped_rate_never_exceeds_configured_rate() {
        for rate in [
            1_000,
            33_333,
            999_999,
            100_000_000,
            2_500_000_000,
            7_777_777_777,
        ] {
            let fp = ns_per_byte_fp(rate);
            // Over a million full frames the accumulated time is at least what the rate allows.
            let bytes = 1514u64 * 1_000_000;
            let ns = tx_time_ns(1514, fp) * 1_000_000;
            let achieved = bytes as u128 * 8 * NSEC_PER_SEC as u128 / ns as u128;
            assert!(achieved <= rate as u128, "{rate}: {achieved}");
            // Rounding costs at most 1 ns per frame: 0.1% at 7.8 Gbit/s with 1514-byte frames.
            assert!(achieved >= rate as u128 * 999 / 1000, "{rate}: {achieved}");
        }
    }

    #[test]
    fn no_overflow_at_extremes() {
        let slowest = ns_per_byte_fp(1_000);
        assert_eq!(tx_time_ns(2 << 20, slowest), (2u64 << 20) * 8_000_000);
        assert_eq!(
            tx_time_ns(u64::MAX, slowest),
            tx_time_ns(MAX_ACCOUNTED_BYTES, slowest)
        );
        assert_eq!(tx_time_ns(1, u64::MAX), tx_time_ns(1, slowest));
        assert_eq!(tx_time_ns(0, slowest), 0);
        assert!(ns_per_byte_fp(MAX_RATE_BPS) > 0);
        assert_eq!(ns_per_byte_fp(0), ns_per_byte_fp(MIN_RATE_BPS));
    }

    #[test]
    fn back_to_back_packets_are_spaced_by_their_tx_time() {
        let horizon = 1_000_000_000;
        let first = reserve(0, 1_000, 0, 500, horizon, 0).unwrap();
        assert_eq!(
            first,
            Reservation {
                depart_ns: 1_000,
                clock_ns: 1_500
            }
        );
        let second = reserve(first.clock_ns, 1_010, 0, 500, horizon, 0).unwrap();
        assert_eq!(
            second,
            Reservation {
                depart_ns: 1_500,
                clock_ns: 2_000
            }
        );
    }

    #[test]
    fn idle_clock_restarts_at_now_without_burst_credit() {
        let r = reserve(100, 1_000_000, 0, 500, 1_000_000_000, 0).unwrap();
        assert_eq!(r.depart_ns, 1_000_000);
        assert_eq!(r.clock_ns, 1_000_500);
    }

    #[test]
    fn credit_catches_up_a_short_gap_and_no_more() {
        // The clock stood at 900 µs when the packet came at 1 ms: with 300 µs of credit the
        // missed 100 µs are kept (the next packet may follow at once).
        let r = reserve(900_000, 1_000_000, 0, 50_000, 1_000_000_000, 300_000).unwrap();
        assert_eq!(r.depart_ns, 1_000_000);
        assert_eq!(r.clock_ns, 950_000);
        // After a longer gap the clock restarts at now: no burst for an idle or new flow.
        let r = reserve(100, 1_000_000, 0, 50_000, 1_000_000_000, 300_000).unwrap();
        assert_eq!(r.depart_ns, 1_000_000);
        assert_eq!(r.clock_ns, 1_050_000);
        let r = reserve(0, 1_000_000, 0, 50_000, 1_000_000_000, 300_000).unwrap();
        assert_eq!(r.clock_ns, 1_050_000);
        // A clock ahead of now is not affected.
        let r = reserve(1_200_000, 1_000_000, 0, 50_000, 1_000_000_000, 300_000).unwrap();
        assert_eq!((r.depart_ns, r.clock_ns), (1_200_000, 1_250_000));
    }

    #[test]
    fn packet_pacing_is_honoured_within_the_horizon_only() {
        let r = reserve(0, 1_000, 5_000, 100, 10_000, 0).unwrap();
        assert_eq!(r.depart_ns, 5_000);
        // A timestamp from another clock base (far future) is ignored, not a reason to drop.
        let r = reserve(0, 1_000, u64::MAX / 2, 100, 10_000, 0).unwrap();
        assert_eq!(r.depart_ns, 1_000);
    }

    #[test]
    fn beyond_the_horizon_is_refused() {
        assert_eq!(reserve(20_001, 10_000, 0, 100, 10_000, 0), None);
        assert!(reserve(20_000, 10_000, 0, 100, 10_000, 0).is_some());
    }
}
