//! Minimum and maximum without a branch, for the data path.
//!
//! BPF has no conditional move: `if a < b` is a jump, and the verifier walks both sides of every
//! jump through all the code after it, with the bounds it learnt on each side kept apart. A few
//! compares in a per-packet formula, before a calendar and two clocks, multiplied the scheduler's
//! verification by half on Linux 6.12. Arithmetic on the sign of the difference leaves one path.
//!
//! Both operands must be below 2^63 (times in ns, byte counts, fixed-point paces all are).

/// All ones when `a < b`, else zero (operands below 2^63).
#[inline(always)]
fn below_mask(a: u64, b: u64) -> u64 {
    ((a.wrapping_sub(b) as i64) >> 63) as u64
}

/// The smaller of `a` and `b` (both below 2^63).
#[inline(always)]
pub fn min(a: u64, b: u64) -> u64 {
    b.wrapping_add(a.wrapping_sub(b) & below_mask(a, b))
}

/// The larger of `a` and `b` (both below 2^63).
#[inline(always)]
pub fn max(a: u64, b: u64) -> u64 {
    a.wrapping_sub(a.wrapping_sub(b) & below_mask(a, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agree_with_the_branching_versions_below_2_pow_63() {
        let edge = (1u64 << 63) - 1;
        let values = [0, 1, 2, 1_514, 5_000_000, u32::MAX as u64, edge - 1, edge];
        for a in values {
            for b in values {
                assert_eq!(min(a, b), a.min(b), "min({a}, {b})");
                assert_eq!(max(a, b), a.max(b), "max({a}, {b})");
            }
        }
    }
}
