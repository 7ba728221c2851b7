//! DiffServ code points as scenario files write them: the names of the RFCs (CS0-CS7 from RFC
//! 2474, AF11-AF43 from RFC 2597, EF from RFC 3246, VA from RFC 5865, LE from RFC 8622), in any
//! case, or a number 0-63.

use anyhow::{Result, anyhow, bail, ensure};

/// A DSCP from a scenario file's `dscp` value.
pub fn parse(v: &toml::Value) -> Result<u8> {
    match v {
        toml::Value::Integer(n) => {
            ensure!((0..=63).contains(n), "dscp = {n}: a number must be 0-63");
            Ok(*n as u8)
        }
        toml::Value::String(s) => by_name(s),
        other => {
            bail!("dscp = {other}: write a name (\"EF\", \"AF41\", \"CS1\", ...) or a number 0-63")
        }
    }
}

fn by_name(name: &str) -> Result<u8> {
    let upper = name.trim().to_ascii_uppercase();
    let digits = |prefix: &str| -> Option<Vec<u8>> {
        let rest = upper.strip_prefix(prefix)?;
        rest.bytes()
            .map(|b| b.is_ascii_digit().then(|| b - b'0'))
            .collect()
    };
    let code = match upper.as_str() {
        "EF" => Some(46),
        "VA" => Some(44),
        "LE" => Some(1),
        _ => match (digits("CS").as_deref(), digits("AF").as_deref()) {
            // Class selectors keep the old IP precedence bits: CSn = n << 3.
            (Some(&[n]), _) if n <= 7 => Some(n << 3),
            // Assured forwarding class x (1-4), drop precedence y (1-3): 8x + 2y.
            (_, Some(&[x, y])) if (1..=4).contains(&x) && (1..=3).contains(&y) => {
                Some(8 * x + 2 * y)
            }
            _ => None,
        },
    };
    code.ok_or_else(|| {
        anyhow!(
            "dscp = {name:?}: not a DSCP name (CS0-CS7, AF11-AF43, EF, VA, LE) nor a number 0-63"
        )
    })
}

/// The IP TOS byte (IPv6 traffic class) carrying `dscp`, ECN bits clear: what iperf3 --tos
/// takes.
pub fn tos(dscp: u8) -> u8 {
    dscp << 2
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Result<u8> {
        parse(&toml::Value::String(s.into()))
    }

    #[test]
    fn names_and_numbers() {
        assert_eq!(name("EF").unwrap(), 46);
        assert_eq!(name("ef").unwrap(), 46);
        assert_eq!(name("VA").unwrap(), 44);
        assert_eq!(name("LE").unwrap(), 1);
        assert_eq!(name("CS0").unwrap(), 0);
        assert_eq!(name("CS1").unwrap(), 8);
        assert_eq!(name("CS7").unwrap(), 56);
        assert_eq!(name("AF11").unwrap(), 10);
        assert_eq!(name("AF41").unwrap(), 34);
        assert_eq!(name("AF43").unwrap(), 38);
        assert_eq!(parse(&toml::Value::Integer(63)).unwrap(), 63);
        assert_eq!(tos(46), 184);
        for bad in ["CS8", "AF14", "AF51", "AF1", "CS", "EF1", "46", "BE"] {
            assert!(name(bad).is_err(), "{bad}");
        }
        assert!(parse(&toml::Value::Integer(64)).is_err());
        assert!(parse(&toml::Value::Integer(-1)).is_err());
        assert!(parse(&toml::Value::Float(4.5)).is_err());
    }
}
