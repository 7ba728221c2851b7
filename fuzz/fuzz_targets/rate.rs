//! `parse_rate` and `DisplayRate`.
//!
//! - The parse equals a reference reading: the number multiplied exactly by the unit's
//!   definition (tc(8) "RATES", systemd's bare K/M/G/T), floored to bits per second, then the
//!   documented bounds; errors included.
//! - Spellings of the same rate (whitespace, leading and trailing zeros, the unit's case)
//!   parse alike.
//! - A parsed rate, displayed as tc does, parses back to at most 0.1 % below it, and displays
//!   the same again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shaper_common::rate::{DisplayRate, MAX_RATE_BPS, MIN_RATE_BPS, RateError, parse_rate};
use shaper_fuzz::{Decimal, same_quantity, split_number};

/// Bits per second of one unit, from tc(8): SI and IEC prefixes on `bit`, the same on `bps`
/// (bytes), and systemd's bare SI prefixes (bits).
fn unit_bps(unit: &str) -> Option<u64> {
    const SI: [(&str, u64); 5] = [
        ("", 1),
        ("k", 1_000),
        ("m", 1_000_000),
        ("g", 1_000_000_000),
        ("t", 1_000_000_000_000),
    ];
    const IEC: [(&str, u64); 4] = [
        ("ki", 1 << 10),
        ("mi", 1 << 20),
        ("gi", 1 << 30),
        ("ti", 1 << 40),
    ];
    let unit = unit.to_ascii_lowercase();
    if unit.is_empty() {
        return Some(1);
    }
    for (prefix, scale) in SI.into_iter().chain(IEC) {
        if unit == format!("{prefix}bit") {
            return Some(scale);
        }
        if unit == format!("{prefix}bps") {
            return Some(8 * scale);
        }
        if !prefix.is_empty() && !prefix.ends_with('i') && unit == prefix {
            return Some(scale);
        }
    }
    None
}

fn reference(text: &str) -> Result<u64, RateError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(RateError::Empty);
    }
    let (number, unit) = split_number(text);
    let Some(scale) = unit_bps(unit.trim()) else {
        return Err(if number.is_empty() {
            RateError::Malformed
        } else {
            RateError::UnknownUnit
        });
    };
    let value = Decimal::parse(number).ok_or(RateError::Malformed)?;
    if value.is_zero() {
        return Err(RateError::Zero);
    }
    match value.times(scale).floor_up_to(MAX_RATE_BPS) {
        None => Err(RateError::TooHigh),
        Some(bps) if bps < MIN_RATE_BPS => Err(RateError::TooLow),
        Some(bps) => Ok(bps),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = parse_rate(text);
    assert_eq!(parsed, reference(text), "{text:?}");
    for variant in same_quantity(text) {
        assert_eq!(parse_rate(&variant), parsed, "{text:?} read as {variant:?}");
    }
    if let Ok(bps) = parsed {
        let shown = DisplayRate(bps).to_string();
        let again = parse_rate(&shown).unwrap_or_else(|e| panic!("{shown:?} ({bps}): {e}"));
        assert!(
            again <= bps && (bps - again) * 1000 < bps,
            "{bps} shown as {shown:?}, read back as {again}"
        );
        assert_eq!(DisplayRate(again).to_string(), shown);
    }
});
