//! Durations as people write them for tc and CAKE: `100us`, `5ms`, `2s`, `1.5s`; a bare number
//! is microseconds, as in tc.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurationError {
    Malformed,
    UnknownUnit,
    TooLong,
}

impl DurationError {
    pub const fn describe(self) -> &'static str {
        match self {
            Self::Malformed => "not a number followed by a unit (e.g. 100us, 5ms, 2s)",
            Self::UnknownUnit => "unknown unit (use ns, us, ms, s)",
            Self::TooLong => "duration is longer than an hour",
        }
    }
}

impl core::fmt::Display for DurationError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.describe())
    }
}

const MAX_NS: u128 = 3_600 * 1_000_000_000;

/// Parses a duration into nanoseconds (exact decimal arithmetic).
pub fn parse_duration_ns(text: &str) -> Result<u64, DurationError> {
    let text = text.trim();
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(end);
    const UNITS: [(&str, u128); 8] = [
        ("ns", 1),
        ("", 1_000),
        ("us", 1_000),
        ("usec", 1_000),
        ("ms", 1_000_000),
        ("msec", 1_000_000),
        ("s", 1_000_000_000),
        ("sec", 1_000_000_000),
    ];
    let unit = unit.trim();
    let scale = match UNITS
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(unit))
    {
        Some(&(_, scale)) => scale,
        None if number.is_empty() => return Err(DurationError::Malformed),
        None => return Err(DurationError::UnknownUnit),
    };
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
        return Err(DurationError::Malformed);
    }
    let mut value: u128 = 0;
    let mut divisor: u128 = 1;
    for d in int_part.bytes() {
        value = value * 10 + u128::from(d - b'0');
        if value > MAX_NS {
            return Err(DurationError::TooLong);
        }
    }
    for d in frac_part.bytes().take(9) {
        value = value * 10 + u128::from(d - b'0');
        divisor *= 10;
    }
    let ns = value * scale / divisor;
    if ns > MAX_NS {
        return Err(DurationError::TooLong);
    }
    Ok(ns as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_duration_ns("100us"), Ok(100_000));
        assert_eq!(parse_duration_ns("5ms"), Ok(5_000_000));
        assert_eq!(parse_duration_ns("2s"), Ok(2_000_000_000));
        assert_eq!(parse_duration_ns("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse_duration_ns("250"), Ok(250_000));
        assert_eq!(parse_duration_ns("7ns"), Ok(7));
    }

    #[test]
    fn rejects() {
        assert_eq!(parse_duration_ns("ms"), Err(DurationError::Malformed));
        assert_eq!(parse_duration_ns("soon"), Err(DurationError::Malformed));
        assert_eq!(
            parse_duration_ns("5 fortnights"),
            Err(DurationError::UnknownUnit)
        );
        assert_eq!(parse_duration_ns("2h"), Err(DurationError::UnknownUnit));
        assert_eq!(parse_duration_ns("3601s"), Err(DurationError::TooLong));
        assert_eq!(parse_duration_ns("1.2.3s"), Err(DurationError::Malformed));
    }
}
