//! Rates in the units people already type into `tc` and systemd-networkd.
//!
//! `tc` (tc(8) "RATES"): a bare number or `bit` is bits per second; `kbit`, `mbit`, `gbit`, `tbit`
//! are SI (×1000) and `kibit`, `mibit`, ... IEC (×1024); `bps` means *bytes* per second, with the
//! same prefixes (`kbps`, `mbps`, `kibps`, ...). Suffixes are case-insensitive, as in tc.
//! systemd (`[CAKE] Bandwidth=1995M`): a bare SI prefix `K`, `M`, `G`, `T` means bits per second.
//!
//! Parsing is exact (decimal digits into integers, no floating point), so `12.5MBps` is exactly
//! 100 000 000 bit/s.

/// Slowest rate accepted: below this one MTU takes longer than any sane horizon, and the
/// fixed-point EDT arithmetic would overflow.
pub const MIN_RATE_BPS: u64 = 1_000;
/// Fastest rate accepted (10 Tbit/s): far beyond any NIC, still exact in the EDT arithmetic.
pub const MAX_RATE_BPS: u64 = 10_000_000_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateError {
    Empty,
    /// Not a decimal number followed by a unit.
    Malformed,
    /// The unit after the number is not one tc or systemd knows.
    UnknownUnit,
    Zero,
    TooLow,
    TooHigh,
}

impl RateError {
    pub const fn describe(self) -> &'static str {
        match self {
            Self::Empty => "empty rate",
            Self::Malformed => {
                "not a number followed by a unit (e.g. 100mbit, 1gbit, 1995M, 12.5MBps)"
            }
            Self::UnknownUnit => {
                "unknown unit (use bit, kbit, mbit, gbit, tbit, kibit.., bps, kbps, mbps.., or K/M/G/T)"
            }
            Self::Zero => "rate must be greater than zero",
            Self::TooLow => "rate is below the minimum of 1kbit",
            Self::TooHigh => "rate is above the maximum of 10tbit",
        }
    }
}

impl core::fmt::Display for RateError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.describe())
    }
}

/// Multiplier to bits per second for a unit suffix (already lower-cased by the caller's
/// comparison), or `None` when the unit is unknown.
fn unit_multiplier(unit: &str) -> Option<u64> {
    const K: u64 = 1_000;
    const KI: u64 = 1_024;
    let table: [(&str, u64); 23] = [
        ("", 1),
        ("bit", 1),
        ("kbit", K),
        ("mbit", K * K),
        ("gbit", K * K * K),
        ("tbit", K * K * K * K),
        ("kibit", KI),
        ("mibit", KI * KI),
        ("gibit", KI * KI * KI),
        ("tibit", KI * KI * KI * KI),
        ("bps", 8),
        ("kbps", 8 * K),
        ("mbps", 8 * K * K),
        ("gbps", 8 * K * K * K),
        ("tbps", 8 * K * K * K * K),
        ("kibps", 8 * KI),
        ("mibps", 8 * KI * KI),
        ("gibps", 8 * KI * KI * KI),
        ("tibps", 8 * KI * KI * KI * KI),
        ("k", K),
        ("m", K * K),
        ("g", K * K * K),
        ("t", K * K * K * K),
    ];
    table
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(unit))
        .map(|&(_, mult)| mult)
}

/// Parses a rate into bits per second.
pub fn parse_rate(text: &str) -> Result<u64, RateError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(RateError::Empty);
    }
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(number_end);
    let multiplier = unit_multiplier(unit.trim()).ok_or(if number.is_empty() {
        RateError::Malformed
    } else {
        RateError::UnknownUnit
    })?;

    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
        return Err(RateError::Malformed);
    }
    if number.bytes().all(|b| b == b'0' || b == b'.') {
        return Err(RateError::Zero);
    }
    // bits = ⌊int_part.frac_part × multiplier⌋, exact for any number of digits: the integer
    // part times the multiplier, plus the fraction's share, which long multiplication from its
    // last digit up carries into the units (the carry never exceeds the multiplier).
    let mut whole: u64 = 0;
    for digit in int_part.bytes() {
        whole = whole * 10 + u64::from(digit - b'0');
        if whole > MAX_RATE_BPS {
            return Err(RateError::TooHigh);
        }
    }
    let mut fraction_bits: u64 = 0;
    for digit in frac_part.bytes().rev() {
        fraction_bits = (u64::from(digit - b'0') * multiplier + fraction_bits) / 10;
    }
    let bits = u128::from(whole) * u128::from(multiplier) + u128::from(fraction_bits);
    if bits < u128::from(MIN_RATE_BPS) {
        return Err(RateError::TooLow);
    }
    if bits > u128::from(MAX_RATE_BPS) {
        return Err(RateError::TooHigh);
    }
    Ok(bits as u64)
}

/// A rate for people: the largest SI unit that keeps at least one integer digit, as tc prints.
pub struct DisplayRate(pub u64);

impl core::fmt::Display for DisplayRate {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let bps = self.0;
        let units = [
            (1_000_000_000_000, "Tbit"),
            (1_000_000_000, "Gbit"),
            (1_000_000, "Mbit"),
            (1_000, "Kbit"),
        ];
        for (scale, name) in units {
            if bps >= scale {
                let whole = bps / scale;
                let milli = (bps % scale) * 1000 / scale;
                return if milli == 0 {
                    write!(f, "{whole}{name}")
                } else {
                    let text_milli = [milli / 100, milli / 10 % 10, milli % 10];
                    let digits = if text_milli[2] != 0 {
                        3
                    } else if text_milli[1] != 0 {
                        2
                    } else {
                        1
                    };
                    write!(f, "{whole}.")?;
                    for d in &text_milli[..digits] {
                        write!(f, "{d}")?;
                    }
                    write!(f, "{name}")
                };
            }
        }
        write!(f, "{bps}bit")
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::{format, string::ToString};

    use super::*;

    #[test]
    fn tc_units() {
        assert_eq!(parse_rate("100mbit"), Ok(100_000_000));
        assert_eq!(parse_rate("1gbit"), Ok(1_000_000_000));
        assert_eq!(parse_rate("500kbit"), Ok(500_000));
        assert_eq!(parse_rate("2.5gbit"), Ok(2_500_000_000));
        assert_eq!(parse_rate("1Mibit"), Ok(1_048_576));
        assert_eq!(parse_rate("64000"), Ok(64_000));
        assert_eq!(parse_rate("64000bit"), Ok(64_000));
        assert_eq!(parse_rate("50MBIT"), Ok(50_000_000));
    }

    #[test]
    fn bytes_per_second_units() {
        assert_eq!(parse_rate("12.5MBps"), Ok(100_000_000));
        assert_eq!(parse_rate("1kbps"), Ok(8_000));
        assert_eq!(parse_rate("125bps"), Ok(1_000));
        assert_eq!(parse_rate("1KiBps"), Ok(8_192));
    }

    #[test]
    fn systemd_units() {
        assert_eq!(parse_rate("1995M"), Ok(1_995_000_000));
        assert_eq!(parse_rate("48M"), Ok(48_000_000));
        assert_eq!(parse_rate("1G"), Ok(1_000_000_000));
        assert_eq!(parse_rate("300k"), Ok(300_000));
    }

    #[test]
    fn rejects_malformed_and_zero() {
        assert_eq!(parse_rate(""), Err(RateError::Empty));
        assert_eq!(parse_rate("   "), Err(RateError::Empty));
        assert_eq!(parse_rate("mbit"), Err(RateError::Malformed));
        assert_eq!(parse_rate("fast"), Err(RateError::Malformed));
        assert_eq!(parse_rate("-5mbit"), Err(RateError::Malformed));
        assert_eq!(parse_rate("1.2.3mbit"), Err(RateError::Malformed));
        assert_eq!(parse_rate("."), Err(RateError::Malformed));
        assert_eq!(parse_rate("10furlongs"), Err(RateError::UnknownUnit));
        assert_eq!(parse_rate("10 mbit/s"), Err(RateError::UnknownUnit));
        assert_eq!(parse_rate("0"), Err(RateError::Zero));
        assert_eq!(parse_rate("0mbit"), Err(RateError::Zero));
        assert_eq!(parse_rate("0.0gbit"), Err(RateError::Zero));
        assert_eq!(parse_rate("999bit"), Err(RateError::TooLow));
        assert_eq!(parse_rate("11tbit"), Err(RateError::TooHigh));
        assert_eq!(
            parse_rate("99999999999999999999999999999999999999999999gbit"),
            Err(RateError::TooHigh)
        );
    }

    #[test]
    fn any_number_of_digits_reads_exactly() {
        // 39 zeros after the point once overflowed the 128-bit fraction: 2 bit/s read as too
        // high, 0.0… as malformed.
        let zeros = "000000000000000000000000000000000000000";
        assert_eq!(parse_rate(&format!("2.{zeros}")), Err(RateError::TooLow));
        assert_eq!(parse_rate(&format!("1.{zeros}mbit")), Ok(1_000_000));
        assert_eq!(parse_rate(&format!("0.{zeros}gbit")), Err(RateError::Zero));
        assert_eq!(parse_rate(&format!("{zeros}1.5kbit")), Ok(1_500));
        assert_eq!(parse_rate(&format!("1.5{zeros}1kibit")), Ok(1_536));
        // The fraction is floored, not rounded, whatever its length.
        assert_eq!(
            parse_rate("1.99999999999999999999999999999999999999999999kbit"),
            Ok(1_999)
        );
        assert_eq!(
            parse_rate("0.0000000000000000000000000000000000000001tbit"),
            Err(RateError::TooLow)
        );
    }

    #[test]
    fn display_round_trips_common_rates() {
        assert_eq!(DisplayRate(100_000_000).to_string(), "100Mbit");
        assert_eq!(DisplayRate(2_500_000_000).to_string(), "2.5Gbit");
        assert_eq!(DisplayRate(1_995_000_000).to_string(), "1.995Gbit");
        assert_eq!(DisplayRate(500_000).to_string(), "500Kbit");
        assert_eq!(DisplayRate(999).to_string(), "999bit");
        for text in ["100Mbit", "2.5Gbit", "1.995Gbit", "500Kbit"] {
            let bps = parse_rate(text).unwrap();
            assert_eq!(DisplayRate(bps).to_string(), text);
        }
    }
}
