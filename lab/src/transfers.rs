//! The transfers probe's results: lab-probe's line per transfer (see `lab-probe transfers`)
//! and the namespaces' TCP counters taken around it (see `nstat`), to one `TransfersResult`
//! per probe; and the pooled numbers the table shows.

use std::{collections::BTreeMap, path::Path};

use serde::{Deserialize, Serialize};

use super::{
    nstat,
    results::read,
    scenario::{FlowDirection, Transfers},
    stats::{self, Summary},
};

/// The counters whose growth each side's namespace reports while the transfers run.
const COUNTERS: &[&str] = &[
    RTO,
    "TcpRetransSegs",
    "TcpExtTCPLossProbes",
    "TcpExtTCPSynRetrans",
];
/// Retransmission timeouts: every time a sender's RTO timer fired (SYNs' included).
const RTO: &str = "TcpExtTCPTimeouts";
/// Failure messages kept in the JSON; the rest are counted only.
const MAX_FAILURES: usize = 20;

#[derive(Debug, Serialize, Deserialize)]
pub struct TransfersResult {
    pub id: String,
    pub host: String,
    pub server: String,
    pub direction: FlowDirection,
    /// As the scenario asked.
    pub count: u32,
    pub concurrency: u32,
    pub min_bytes: u64,
    pub max_bytes: u64,
    /// When they were due to start and to be cut off, on the run's clock.
    pub start_s: f64,
    pub stop_s: f64,
    pub started: u64,
    pub completed: u64,
    /// Errors and transfers past lab-probe's timeout.
    pub failed: u64,
    /// Still running when the probe's time was up: neither completed nor failed.
    pub unfinished: u64,
    /// From the start of connect() to the last byte, of the completed ones.
    pub completion_ms: Summary,
    /// Retransmission timeouts while the transfers ran, in the namespace of the side that
    /// sends their data (the server's for downloads, the host's for uploads). The namespace's
    /// every connection counts, so a bulk flow from the same side adds its own.
    pub rtos: Option<u64>,
    /// The transfers' own retransmission timeouts: the sum over their connections of what the
    /// sending side's kernel counted for each (`tcpi_total_rto`, Linux 6.7 and later, as
    /// lab-probe reports it). None where the kernel does not count them per connection.
    #[serde(default)]
    pub own_rtos: Option<u64>,
    /// The growth of `COUNTERS` in each side's namespace ("host", "server") while the
    /// transfers ran; a side is missing when its snapshots are.
    pub counters: BTreeMap<String, BTreeMap<String, u64>>,
    /// The first failures, as lab-probe gave them.
    pub failures: Vec<String>,
    /// (end on the run's clock in s, bytes, completion ms) of every completed transfer.
    pub samples: Vec<(f64, u64, f64)>,
    /// Why the probe's results are missing or partial.
    pub error: Option<String>,
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Completed,
    Failed(String),
    Unfinished,
}

/// One of lab-probe's lines, `[WALL] transfer I: BYTES bytes in MS ms` (or `failed after MS
/// ms: WHY`, or `unfinished after MS ms`).
#[derive(Debug, PartialEq)]
struct Line {
    wall: f64,
    index: u64,
    bytes: u64,
    ms: f64,
    outcome: Outcome,
}

fn parse_line(l: &str) -> Option<Line> {
    let (wall, rest) = l.strip_prefix('[')?.split_once("] transfer ")?;
    let (index, rest) = rest.split_once(": ")?;
    let (bytes, rest) = rest.split_once(" bytes ")?;
    let ms = |s: &str| s.strip_suffix(" ms")?.parse::<f64>().ok();
    let (ms, outcome) = if let Some(t) = rest.strip_prefix("in ") {
        (ms(t)?, Outcome::Completed)
    } else if let Some(t) = rest.strip_prefix("failed after ") {
        let (t, why) = t.split_once(": ").unwrap_or((t, ""));
        (ms(t)?, Outcome::Failed(why.to_string()))
    } else {
        (
            ms(rest.strip_prefix("unfinished after ")?)?,
            Outcome::Unfinished,
        )
    };
    Some(Line {
        wall: wall.parse().ok()?,
        index: index.parse().ok()?,
        bytes: bytes.parse().ok()?,
        ms,
        outcome,
    })
}

/// `lab-probe: transfer to PEER: N rto`, what lab-probe reports of a finished transfer's
/// connection: (PEER, N).
fn rto_line(l: &str) -> Option<(&str, u64)> {
    let (peer, n) = l
        .strip_prefix("lab-probe: transfer to ")?
        .strip_suffix(" rto")?
        .rsplit_once(": ")?;
    Some((peer, n.parse().ok()?))
}

/// The timeouts of the transfers `text` reports to `peer`; None when it reports none (the
/// kernel does not count them per connection, or nothing finished).
fn own_rtos(text: &str, peer: &str) -> Option<u64> {
    text.lines()
        .filter_map(rto_line)
        .filter(|(p, _)| *p == peer)
        .map(|(_, n)| n)
        .reduce(|a, b| a + b)
}

/// The raw files of one transfers probe: `<id>.transfers` (lab-probe's output),
/// `<id>.{host,server}-{before,after}.nstat`, and the server's log (`server_log`), where
/// lab-probe's server reports each download's timeouts; `addrs` are the host's and the server's
/// addresses (host, server), as each side sees the other.
pub fn analyse(
    dir: &Path,
    t: &Transfers,
    zero: f64,
    server_log: &str,
    addrs: (&str, &str),
) -> TransfersResult {
    let text = read(dir, &format!("{}.transfers", t.id));
    let mut r = TransfersResult {
        id: t.id.clone(),
        host: t.host.clone(),
        server: t.server.clone(),
        direction: t.direction,
        count: t.count,
        concurrency: t.concurrency,
        min_bytes: t.min_bytes,
        max_bytes: t.max_bytes,
        start_s: t.start,
        stop_s: t.stop,
        started: 0,
        completed: 0,
        failed: 0,
        unfinished: 0,
        completion_ms: Summary::default(),
        rtos: None,
        own_rtos: None,
        counters: BTreeMap::new(),
        failures: Vec::new(),
        samples: Vec::new(),
        error: None,
    };
    let text = text.unwrap_or_default();
    let mut times = Vec::new();
    for l in text.lines() {
        if let Some(e) = l.strip_prefix("lab-probe: ")
            && rto_line(l).is_none()
        {
            r.error.get_or_insert_with(|| e.to_string());
        }
        let Some(line) = parse_line(l) else {
            continue;
        };
        r.started += 1;
        match line.outcome {
            Outcome::Completed => {
                r.completed += 1;
                times.push(line.ms);
                r.samples.push((line.wall - zero, line.bytes, line.ms));
            }
            Outcome::Failed(why) => {
                r.failed += 1;
                if r.failures.len() < MAX_FAILURES {
                    r.failures.push(format!(
                        "transfer {} ({} bytes) after {:.0} ms: {why}",
                        line.index, line.bytes, line.ms
                    ));
                }
            }
            Outcome::Unfinished => r.unfinished += 1,
        }
    }
    r.completion_ms = stats::summary(&times);
    if r.error.is_none() && !text.contains(" transfers statistics ---") {
        // Killed by the runner's watchdog, or never started.
        r.error = Some(if text.is_empty() {
            "no output from lab-probe transfers".into()
        } else {
            "lab-probe transfers did not finish (no statistics line)".into()
        });
    }
    for side in ["host", "server"] {
        let snapshot = |when: &str| read(dir, &format!("{}.{side}-{when}.nstat", t.id));
        if let (Some(before), Some(after)) = (snapshot("before"), snapshot("after")) {
            let grew = nstat::growth(&before, &after, COUNTERS);
            if !grew.is_empty() {
                r.counters.insert(side.to_string(), grew);
            }
        }
    }
    let sender = match t.direction {
        FlowDirection::Download => "server",
        FlowDirection::Upload => "host",
    };
    r.rtos = r.counters.get(sender).and_then(|c| c.get(RTO)).copied();
    // The sending side reports: the server a download's, lab-probe transfers an upload's.
    r.own_rtos = match t.direction {
        FlowDirection::Download => own_rtos(&read(dir, server_log).unwrap_or_default(), addrs.0),
        FlowDirection::Upload => own_rtos(&text, addrs.1),
    };
    r
}

/// A run's transfers probes taken together, as the table shows them.
#[derive(Debug, PartialEq)]
pub struct Pooled {
    pub count: u64,
    pub completed: u64,
    pub failed: u64,
    pub unfinished: u64,
    pub completion_ms: Summary,
    /// None when a probe's counters are missing.
    pub rtos: Option<u64>,
    /// None when a probe's kernel did not count them.
    pub own_rtos: Option<u64>,
}

pub fn pooled(list: &[TransfersResult]) -> Option<Pooled> {
    if list.is_empty() {
        return None;
    }
    let times: Vec<f64> = list
        .iter()
        .flat_map(|t| t.samples.iter().map(|s| s.2))
        .collect();
    Some(Pooled {
        count: list.iter().map(|t| u64::from(t.count)).sum(),
        completed: list.iter().map(|t| t.completed).sum(),
        failed: list.iter().map(|t| t.failed).sum(),
        unfinished: list.iter().map(|t| t.unfinished).sum(),
        completion_ms: stats::summary(&times),
        rtos: list.iter().map(|t| t.rtos).sum(),
        own_rtos: list.iter().map(|t| t.own_rtos).sum(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_uploads_timeouts_come_with_its_lines_and_are_no_error() {
        let dir = std::env::temp_dir().join(format!("lab-transfers-up-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("a.1.transfers"),
            "[101.0] transfer 0: 12 bytes in 10.0 ms\n\
             lab-probe: transfer to 10.1.1.2: 1 rto\n\
             [102.0] transfer 1: 12 bytes in 10.0 ms\n\
             lab-probe: transfer to 10.1.1.2: 0 rto\n\
             \n--- 10.1.1.2 transfers statistics ---\n",
        )
        .unwrap();
        let up = analyse(
            &dir,
            &transfers(FlowDirection::Upload),
            100.0,
            "probe-server-s-server.log",
            ("10.2.1.2", "10.1.1.2"),
        );
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!((up.completed, up.own_rtos), (2, Some(1)));
        assert_eq!(up.error, None);
        assert_eq!(
            rto_line("lab-probe: transfer to fd01:1::2: 3 rto"),
            Some(("fd01:1::2", 3))
        );
        assert_eq!(rto_line("lab-probe: transfer: broken pipe"), None);
    }

    #[test]
    fn lines() {
        assert_eq!(
            parse_line("[1795394521.508878] transfer 17: 54321 bytes in 123.456 ms"),
            Some(Line {
                wall: 1795394521.508878,
                index: 17,
                bytes: 54321,
                ms: 123.456,
                outcome: Outcome::Completed
            })
        );
        let l = parse_line(
            "[1.5] transfer 3: 10 bytes failed after 30000.000 ms: Connection reset by peer (os error 104)",
        )
        .unwrap();
        assert_eq!(
            l.outcome,
            Outcome::Failed("Connection reset by peer (os error 104)".into())
        );
        assert_eq!(l.ms, 30000.0);
        let l = parse_line("[1.5] transfer 4: 10 bytes unfinished after 99.5 ms").unwrap();
        assert_eq!((l.outcome, l.ms), (Outcome::Unfinished, 99.5));
        for bad in [
            "",
            "LAB-PROBE transfers 10.1.1.2 port 5199: 3 downloads of 1-2 bytes, 1 at a time, for at most 5 s",
            "[1.5] transfer x: 10 bytes in 1 ms",
            "[1.5] transfer 4: 10 bytes in 1",
            "[1.5] transfer 4: 10 bytes vanished",
            "1000 transfers started, 998 completed, 1 failed, 1 unfinished",
        ] {
            assert_eq!(parse_line(bad), None, "{bad:?}");
        }
    }

    fn transfers(direction: FlowDirection) -> Transfers {
        Transfers {
            id: "a.1".into(),
            host: "a".into(),
            server: "server".into(),
            direction,
            family: super::super::scenario::Family::Ipv4,
            count: 4,
            min_bytes: 10,
            max_bytes: 20,
            concurrency: 1,
            start: 1.0,
            stop: 10.0,
        }
    }

    #[test]
    fn a_probe_and_its_counters() {
        let dir = std::env::temp_dir().join(format!("lab-transfers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = [
            (
                "a.1.transfers",
                "LAB-PROBE transfers 10.1.1.2 port 5199: 4 downloads of 10-20 bytes, 1 at a time, for at most 9 s\n\
                 [101.0] transfer 0: 12 bytes in 10.0 ms\n\
                 [102.0] transfer 1: 20 bytes failed after 500.0 ms: timed out\n\
                 [103.0] transfer 2: 15 bytes in 30.0 ms\n\
                 [104.0] transfer 3: 11 bytes unfinished after 5.0 ms\n\
                 \n--- 10.1.1.2 transfers statistics ---\n\
                 4 transfers started, 2 completed, 1 failed, 1 unfinished\n",
            ),
            (
                "a.1.server-before.nstat",
                "#kernel\nTcpExtTCPTimeouts 1\nTcpRetransSegs 5\nTcpExtTCPLossProbes 0\nTcpExtTCPSynRetrans 0\n",
            ),
            (
                "a.1.server-after.nstat",
                "#kernel\nTcpExtTCPTimeouts 4\nTcpRetransSegs 9\nTcpExtTCPLossProbes 2\nTcpExtTCPSynRetrans 0\n",
            ),
            ("a.1.host-before.nstat", "#kernel\nTcpExtTCPTimeouts 0\n"),
            // The server's reports: two of this host's downloads, one of another host's.
            (
                "probe-server-s-server.log",
                "lab-probe: echoing UDP and TCP on port 5201\n\
                 lab-probe: transfer to 10.2.1.2: 0 rto\n\
                 lab-probe: transfer to 10.2.2.2: 5 rto\n\
                 lab-probe: transfer to 10.2.1.2: 2 rto\n",
            ),
            ("a.1.host-after.nstat", "#kernel\nTcpExtTCPTimeouts 1\n"),
        ];
        for (name, body) in files {
            std::fs::write(dir.join(name), body).unwrap();
        }
        let addrs = ("10.2.1.2", "10.1.1.2");
        let log = "probe-server-s-server.log";
        let r = analyse(&dir, &transfers(FlowDirection::Download), 100.0, log, addrs);
        let up = analyse(&dir, &transfers(FlowDirection::Upload), 100.0, log, addrs);
        let missing = analyse(
            &dir.join("nothing"),
            &transfers(FlowDirection::Download),
            0.0,
            log,
            addrs,
        );
        std::fs::remove_dir_all(&dir).unwrap();

        assert_eq!(
            (r.started, r.completed, r.failed, r.unfinished),
            (4, 2, 1, 1)
        );
        assert_eq!(r.completion_ms.p50, Some(20.0));
        assert_eq!(r.samples, vec![(1.0, 12, 10.0), (3.0, 15, 30.0)]);
        assert_eq!(
            r.failures,
            vec!["transfer 1 (20 bytes) after 500 ms: timed out"]
        );
        assert_eq!(r.error, None);
        // Downloads: the server sends, and its namespace's RTOs count; its own reports say
        // which were the transfers'.
        assert_eq!(r.rtos, Some(3));
        assert_eq!(r.own_rtos, Some(2));
        assert_eq!(r.counters["server"]["TcpRetransSegs"], 4);
        // Uploads: the host sends. Its snapshots lack some counters: those are left out.
        assert_eq!(up.rtos, Some(1));
        assert_eq!(up.counters["host"].len(), 1);
        // lab-probe transfers reported none of its uploads (a kernel that does not count them).
        assert_eq!(up.own_rtos, None);
        assert_eq!(
            missing.error.as_deref(),
            Some("no output from lab-probe transfers")
        );

        assert_eq!(missing.rtos, None);
        let p = pooled(&[r, up]).unwrap();
        assert_eq!((p.count, p.completed, p.failed, p.unfinished), (8, 4, 2, 2));
        assert_eq!(p.completion_ms.count, 4);
        assert_eq!(p.rtos, Some(4));
        assert_eq!(p.own_rtos, None);
        assert_eq!(pooled(&[missing]).unwrap().rtos, None);
        assert_eq!(pooled(&[]), None);
    }
}
