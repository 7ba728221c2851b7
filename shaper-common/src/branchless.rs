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

/// 1 when `a < b`, else 0 (operands below 2^63).
#[inline(always)]
pub fn below(a: u64, b: u64) -> u64 {
    below_mask(a, b) & 1
}

/// `if_one` when `bit` is 1, `if_zero` when it is 0.
#[inline(always)]
pub fn select(bit: u64, if_one: u64, if_zero: u64) -> u64 {
    let mask = 0u64.wrapping_sub(bit);
    (if_one & mask) | (if_zero & !mask)
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
                assert_eq!(below(a, b), (a < b) as u64, "below({a}, {b})");
                assert_eq!(select(1, a, b), a);
                assert_eq!(select(0, a, b), b);
            }
        }
    }
}
