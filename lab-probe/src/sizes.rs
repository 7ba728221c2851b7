//! Transfer sizes: uniform in a range, drawn from a seed so that every contender of a scenario
//! (and every repetition) moves the same sizes in the same order, whatever the concurrency.
//!
//! The i-th size is a function of the seed and i alone (SplitMix64's i-th output, which can be
//! computed directly), so workers taking transfer numbers in any order still draw the same
//! sequence; a few lines instead of a random-number crate, as the probe stays std-only.

use crate::wire::MAX_TRANSFER;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    pub min: u64,
    pub max: u64,
    pub seed: u64,
}

/// SplitMix64's increment (2^64 / φ) and finaliser (Steele, Lea and Flood, 2014).
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Sizes {
    /// The size of transfer `i` (from 0), in [min, max].
    pub fn nth(&self, i: u64) -> u64 {
        let x = mix(self
            .seed
            .wrapping_add(i.wrapping_add(1).wrapping_mul(GAMMA)));
        // Scaling the 64-bit draw onto the span (Lemire's multiply-shift) instead of taking it
        // modulo keeps the bias below 2^-30 for any span a transfer can have.
        let span = u128::from(self.max - self.min) + 1;
        self.min + ((u128::from(x) * span) >> 64) as u64
    }

    /// "MIN-MAX" or a single "SIZE", in bytes.
    pub fn parse_range(s: &str, seed: u64) -> Result<Self, String> {
        let bad = || format!("--size {s}: bytes as MIN-MAX or one SIZE, e.g. 10240-102400");
        let (lo, hi) = s.split_once('-').unwrap_or((s, s));
        let (min, max): (u64, u64) = (
            lo.trim().parse().map_err(|_| bad())?,
            hi.trim().parse().map_err(|_| bad())?,
        );
        if min == 0 || max > MAX_TRANSFER {
            return Err(format!("--size {s}: sizes are 1-{MAX_TRANSFER} bytes"));
        }
        if min > max {
            return Err(format!("--size {s}: the minimum is above the maximum"));
        }
        Ok(Sizes { min, max, seed })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        let s = Sizes::parse_range("10240-102400", 1).unwrap();
        assert_eq!((s.min, s.max, s.seed), (10_240, 102_400, 1));
        let s = Sizes::parse_range("5000", 3).unwrap();
        assert_eq!((s.min, s.max), (5000, 5000));
        for bad in [
            "",
            "-",
            "10-",
            "a-b",
            "0-10",
            "20-10",
            "1-1073741825",
            "1-2-3",
        ] {
            assert!(Sizes::parse_range(bad, 1).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn draws_are_deterministic_in_range_and_even() {
        let s = Sizes {
            min: 10,
            max: 19,
            seed: 42,
        };
        let draws: Vec<u64> = (0..10_000).map(|i| s.nth(i)).collect();
        assert_eq!(draws, (0..10_000).map(|i| s.nth(i)).collect::<Vec<_>>());
        let mut counts = [0u32; 10];
        for d in &draws {
            counts[(d - 10) as usize] += 1;
        }
        // 1,000 expected per value; a fair draw stays well within 15 %.
        assert!(
            counts.iter().all(|&c| (850..=1150).contains(&c)),
            "{counts:?}"
        );
        // Another seed, another sequence.
        let other = Sizes { seed: 43, ..s };
        assert_ne!(
            draws[..20],
            (0..20).map(|i| other.nth(i)).collect::<Vec<_>>()
        );
        // One size, and the widest range, stay in bounds.
        let one = Sizes {
            min: 7,
            max: 7,
            seed: 0,
        };
        assert!((0..100).all(|i| one.nth(i) == 7));
        let wide = Sizes {
            min: 1,
            max: MAX_TRANSFER,
            seed: 0,
        };
        assert!(
            (0..1000)
                .map(|i| wide.nth(i))
                .all(|d| (1..=MAX_TRANSFER).contains(&d))
        );
    }
}
