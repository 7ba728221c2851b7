//! `parse_duration_ns` (the horizon, a duration `rtt`) and `parse_rtt_ns`.
//!
//! - The parse equals a reference reading: the number multiplied exactly by the unit (tc's:
//!   a bare number is microseconds), floored to nanoseconds, at most an hour; errors included.
//! - Spellings of the same duration (whitespace, leading and trailing zeros, the unit's case)
//!   parse alike.
//! - Any duration printed in nanoseconds reads back exactly.
//! - An RTT is CAKE's preset of that exact name, or else the same as the duration.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shaper_common::{
    aqm::{RTT_PRESETS, parse_rtt_ns},
    time::{DurationError, parse_duration_ns},
};
use shaper_fuzz::{Decimal, same_quantity, split_number};

const HOUR_NS: u64 = 3_600_000_000_000;

fn unit_ns(unit: &str) -> Option<u64> {
    match unit.to_ascii_lowercase().as_str() {
        "ns" => Some(1),
        "" | "us" | "usec" => Some(1_000),
        "ms" | "msec" => Some(1_000_000),
        "s" | "sec" => Some(1_000_000_000),
        _ => None,
    }
}

fn reference(text: &str) -> Result<u64, DurationError> {
    let (number, unit) = split_number(text.trim());
    let Some(scale) = unit_ns(unit.trim()) else {
        return Err(if number.is_empty() {
            DurationError::Malformed
        } else {
            DurationError::UnknownUnit
        });
    };
    let value = Decimal::parse(number).ok_or(DurationError::Malformed)?;
    value
        .times(scale)
        .floor_up_to(HOUR_NS)
        .ok_or(DurationError::TooLong)
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = parse_duration_ns(text);
    assert_eq!(parsed, reference(text), "{text:?}");
    for variant in same_quantity(text) {
        assert_eq!(
            parse_duration_ns(&variant),
            parsed,
            "{text:?} read as {variant:?}"
        );
    }
    if let Ok(ns) = parsed {
        assert_eq!(parse_duration_ns(&format!("{ns}ns")), Ok(ns));
    }
    let preset = RTT_PRESETS.iter().find(|(name, _)| *name == text);
    match preset {
        Some(&(_, ns)) => assert_eq!(parse_rtt_ns(text), Ok(ns)),
        None => assert_eq!(parse_rtt_ns(text), parsed, "{text:?}"),
    }
});
