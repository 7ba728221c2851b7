//! A network namespace's TCP/IP counters, as `nstat -asz` prints them (absolute values, every
//! counter, no history file touched), and what changed between two snapshots. The runner takes
//! them in a namespace before and after something runs there: the kernel's own count of
//! retransmission timeouts and retransmitted segments, which no application sees.

use std::collections::BTreeMap;

/// `TcpExtTCPTimeouts   12   0.0` lines (after a `#kernel` header) to name -> value.
pub fn parse(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (name, value) = (w.next()?, w.next()?.parse().ok()?);
            Some((name.to_string(), value))
        })
        .collect()
}

/// How much each of `names` grew from `before` to `after`. A counter missing from either
/// snapshot (nstat failed, or a kernel without it) or going backwards (not one namespace's
/// pair) is left out, so a gap is not read as zero.
pub fn growth(before: &str, after: &str, names: &[&str]) -> BTreeMap<String, u64> {
    let (before, after) = (parse(before), parse(after));
    names
        .iter()
        .filter_map(|n| {
            let grew = after.get(*n)?.checked_sub(*before.get(*n)?)?;
            Some((n.to_string(), grew))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots() {
        let before = "#kernel\nTcpRetransSegs 10 0.0\nTcpExtTCPTimeouts   2   0.0\n";
        let after = "#kernel\nTcpRetransSegs 25 0.0\nTcpExtTCPTimeouts   5   0.0\ngarbage\n";
        assert_eq!(parse(after).len(), 2);
        let g = growth(
            before,
            after,
            &["TcpExtTCPTimeouts", "TcpRetransSegs", "TcpExtTCPSynRetrans"],
        );
        assert_eq!(g.len(), 2);
        assert_eq!(g["TcpExtTCPTimeouts"], 3);
        assert_eq!(g["TcpRetransSegs"], 15);
        assert!(growth("", after, &["TcpRetransSegs"]).is_empty());
        assert!(growth(after, before, &["TcpRetransSegs"]).is_empty());
    }
}
