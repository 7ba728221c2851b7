//! The quantities scenario files are written in: rates, durations, byte sizes and percentages,
//! in the units `tc` accepts, so a value can be copied between a scenario and a tc command line.

use anyhow::{Context, Result, bail};

/// Splits "12.5mbit" into (12.5, "mbit").
fn split_number(s: &str) -> Result<(f64, String)> {
    let s = s.trim();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(end);
    let value: f64 = num
        .parse()
        .with_context(|| format!("{s:?} does not start with a number"))?;
    if !value.is_finite() || value < 0.0 {
        bail!("{s:?} is not a non-negative number");
    }
    Ok((value, unit.trim().to_ascii_lowercase()))
}

/// A rate in bits per second from tc units: bit, kbit, mbit, gbit, tbit (decimal), their
/// byte forms bps, kbps, mbps, gbps (bytes per second, as tc reads them), and the
/// iec forms kibit, mibit, gibit.
pub fn rate_bps(s: &str) -> Result<f64> {
    let (v, unit) = split_number(s)?;
    let factor = match unit.as_str() {
        "bit" => 1.0,
        "kbit" | "k" => 1e3,
        "mbit" | "m" => 1e6,
        "gbit" | "g" => 1e9,
        "tbit" | "t" => 1e12,
        "kibit" => 1024.0,
        "mibit" => 1024.0 * 1024.0,
        "gibit" => 1024.0 * 1024.0 * 1024.0,
        "bps" => 8.0,
        "kbps" => 8e3,
        "mbps" => 8e6,
        "gbps" => 8e9,
        "" => bail!("rate {s:?} has no unit (write e.g. 100mbit)"),
        _ => bail!("rate {s:?}: unknown unit {unit:?} (use bit, kbit, mbit, gbit or kbps, mbps)"),
    };
    let bps = v * factor;
    if bps < 1.0 {
        bail!("rate {s:?} is below 1 bit/s");
    }
    Ok(bps)
}

/// A duration in seconds: 250us, 15ms, 1.5s, 2m.
pub fn seconds(s: &str) -> Result<f64> {
    let (v, unit) = split_number(s)?;
    let factor = match unit.as_str() {
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "" => bail!("duration {s:?} has no unit (write e.g. 10s or 15ms)"),
        _ => bail!("duration {s:?}: unknown unit {unit:?} (use us, ms, s or m)"),
    };
    Ok(v * factor)
}

/// A size in bytes: 1514, 64kb, 2mb, 1gb (tc's kb/mb are 1024-based), or kib/mib.
pub fn bytes(s: &str) -> Result<u64> {
    let (v, unit) = split_number(s)?;
    let factor = match unit.as_str() {
        "" | "b" => 1.0,
        "kb" | "k" | "kib" => 1024.0,
        "mb" | "m" | "mib" => 1024.0 * 1024.0,
        "gb" | "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        _ => bail!("size {s:?}: unknown unit {unit:?} (use b, kb, mb or gb)"),
    };
    Ok((v * factor).round() as u64)
}

/// A percentage: "0.3%" (the % is required, so 0.3 cannot be mistaken for 30%).
pub fn percent(s: &str) -> Result<f64> {
    let t = s.trim();
    let num = t
        .strip_suffix('%')
        .with_context(|| format!("{s:?}: write a percentage with %, e.g. 0.3%"))?;
    let v: f64 = num
        .trim()
        .parse()
        .with_context(|| format!("{s:?} is not a percentage"))?;
    if !(0.0..=100.0).contains(&v) {
        bail!("{s:?} is not between 0% and 100%");
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(rate_bps("100mbit").unwrap(), 100e6);
        assert_eq!(rate_bps("1.5Gbit").unwrap(), 1.5e9);
        assert_eq!(rate_bps("12.5mbps").unwrap(), 100e6);
        assert!(rate_bps("100").is_err());
        assert!(rate_bps("fast").is_err());
        assert!(rate_bps("100mbits").is_err());
    }

    #[test]
    fn durations_sizes_percentages() {
        assert_eq!(seconds("15ms").unwrap(), 0.015);
        assert_eq!(seconds("2m").unwrap(), 120.0);
        assert!(seconds("15").is_err());
        assert_eq!(bytes("64kb").unwrap(), 65536);
        assert_eq!(bytes("1514").unwrap(), 1514);
        assert!(bytes("1 parsec").is_err());
        assert_eq!(percent("0.3%").unwrap(), 0.3);
        assert!(percent("0.3").is_err());
        assert!(percent("120%").is_err());
    }
}
