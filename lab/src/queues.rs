//! The queues over a run: the runner samples every qdisc of the bottleneck's and the contender's
//! namespaces every 10 ms (`lab_queues`: `queues.t`, the time of each sample, and for each
//! namespace `queues-<ns>.jsonl`, its `tc -s -j qdisc show` line for line); this keeps the
//! qdiscs of the interfaces the plan reads (`plan::places`) as backlog series, and sums each
//! up while loaded.
//! A standing queue shows where it formed: in the contender, or in the emulated modem when the
//! contender let more through than the link carries.

use std::{collections::BTreeSet, path::Path};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{plan::Place, results::read, stats};

/// One qdisc's backlog over a run.
#[derive(Debug, Serialize, Deserialize)]
pub struct QueueSeries {
    /// The interface's place, as its counters name it: `bottleneck-down`, `contender-server`.
    pub place: String,
    pub dev: String,
    pub kind: String,
    pub handle: String,
    /// Its parent's handle; None for the interface's root, whose backlog includes its
    /// children's.
    pub parent: Option<String>,
    /// The rate its backlog drains at (bits/s), when known: the link's for the modem's token
    /// bucket, the contender's for its qdiscs. None for netem, whose backlog is mostly packets
    /// held for their delay, not waiting for the link.
    pub rate_bps: Option<f64>,
    /// While loaded (a flow runs, warm-up is over), as the loaded latencies.
    pub loaded: QueueSummary,
    /// (time s on the run's clock, backlog bytes, backlog packets) of every sample.
    pub samples: Vec<(f64, u64, u64)>,
}

impl QueueSeries {
    /// What makes a qdisc the same one in every run of a scenario: its place, kind and parent
    /// (the handles of qdiscs added without one differ between runs).
    pub fn key(&self) -> (&str, &str, Option<&str>) {
        (&self.place, &self.kind, self.parent.as_deref())
    }

    /// Bytes as the time they take to drain at the rate (ms).
    pub fn ms(&self, bytes: f64) -> Option<f64> {
        self.rate_bps.map(|rate| ms_at(bytes, rate))
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct QueueSummary {
    pub count: usize,
    pub bytes: Option<Levels>,
    pub packets: Option<Levels>,
    /// The bytes at the rate.
    pub ms: Option<Levels>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Levels {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Levels {
    fn of(xs: &[f64]) -> Option<Levels> {
        Some(Levels {
            p50: stats::percentile(xs, 50.0)?,
            p99: stats::percentile(xs, 99.0)?,
            max: xs.iter().copied().fold(f64::MIN, f64::max),
        })
    }

    fn map(self, f: impl Fn(f64) -> f64) -> Levels {
        Levels {
            p50: f(self.p50),
            p99: f(self.p99),
            max: f(self.max),
        }
    }
}

/// Qdiscs that never hold a packet: the absence of a queue (a veth's default) and the hooks
/// shaper and filters attach to.
const NO_QUEUE: &[&str] = &["noqueue", "clsact", "ingress"];

/// The series of every qdisc on `places`, in their order; `zero` is the run's clock's zero on
/// the wall clock, `loaded` tells a loaded time on the run's clock.
pub fn analyse(
    dir: &Path,
    places: &[Place],
    zero: f64,
    loaded: impl Fn(f64) -> bool,
) -> Vec<QueueSeries> {
    let mut out: Vec<QueueSeries> = Vec::new();
    let Some(times) = read(dir, "queues.t") else {
        return out;
    };
    let namespaces: BTreeSet<&str> = places.iter().map(|p| p.ns.as_str()).collect();
    for ns in namespaces {
        let Some(dumps) = read(dir, &format!("queues-{ns}.jsonl")) else {
            continue;
        };
        // Device names repeat across namespaces (every server's is eth0).
        let here: Vec<&Place> = places.iter().filter(|p| p.ns == ns).collect();
        // Line for line; a sampler cut short leaves a time without its dump.
        for (t, dump) in times.lines().zip(dumps.lines()) {
            let (Ok(t), Ok(Value::Array(qdiscs))) = (t.parse::<f64>(), serde_json::from_str(dump))
            else {
                continue;
            };
            // To 0.1 ms: the JSON stays short, and samples are at least 10 ms apart.
            let t = ((t - zero) * 1e4).round() / 1e4;
            for q in &qdiscs {
                sample(&mut out, &here, t, q);
            }
        }
    }
    out.sort_by_key(|s| places.iter().position(|p| p.name == s.place));
    for s in &mut out {
        s.loaded = summary(s, &loaded);
    }
    out
}

/// Adds one qdisc's backlog at `t` to its series (see `QueueSeries::key`).
fn sample(out: &mut Vec<QueueSeries>, places: &[&Place], t: f64, q: &Value) {
    let (Some(dev), Some(kind)) = (q["dev"].as_str(), q["kind"].as_str()) else {
        return;
    };
    let Some(place) = places.iter().find(|p| p.dev == dev) else {
        return;
    };
    if NO_QUEUE.contains(&kind) {
        return;
    }
    let parent = q["parent"].as_str();
    let point = (
        t,
        q["backlog"].as_u64().unwrap_or(0),
        q["qlen"].as_u64().unwrap_or(0),
    );
    match out
        .iter_mut()
        .find(|s| s.key() == (place.name.as_str(), kind, parent))
    {
        Some(s) => s.samples.push(point),
        None => out.push(QueueSeries {
            place: place.name.clone(),
            dev: dev.into(),
            kind: kind.into(),
            handle: q["handle"].as_str().unwrap_or_default().into(),
            parent: parent.map(String::from),
            rate_bps: place.rate_bps.filter(|_| kind != "netem"),
            loaded: QueueSummary::default(),
            samples: vec![point],
        }),
    }
}

fn ms_at(bytes: f64, rate_bps: f64) -> f64 {
    bytes * 8.0 / rate_bps * 1e3
}

fn summary(s: &QueueSeries, loaded: impl Fn(f64) -> bool) -> QueueSummary {
    let (bytes, packets): (Vec<f64>, Vec<f64>) = s
        .samples
        .iter()
        .filter(|(t, ..)| loaded(*t))
        .map(|&(_, b, p)| (b as f64, p as f64))
        .unzip();
    let bytes = Levels::of(&bytes);
    QueueSummary {
        count: packets.len(),
        ms: bytes
            .zip(s.rate_bps)
            .map(|(b, rate)| b.map(|x| ms_at(x, rate))),
        bytes,
        packets: Levels::of(&packets),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_become_series_per_qdisc() {
        let dir = std::env::temp_dir().join(format!("lab-queues-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dump = |tbf: u64| {
            format!(
                r#"[{{"kind":"netem","handle":"1:","dev":"m-lan","root":true,"backlog":{},"qlen":9}},{{"kind":"tbf","handle":"2:","dev":"m-lan","parent":"1:1","backlog":{tbf},"qlen":{}}},{{"kind":"noqueue","handle":"0:","dev":"lo","root":true,"backlog":0,"qlen":0}},{{"kind":"tbf","handle":"3:","dev":"m-wan","root":true,"backlog":0,"qlen":0}}]"#,
                tbf + 1000,
                tbf / 1000
            )
        };
        let files = [
            ("queues.t", "100.0\n101.0\n102.0\n103.0\n"),
            // The last time has no dump: the sampler was cut short. The server's first dump
            // is its only one.
            (
                "queues-modem.jsonl",
                &format!("{}\n{}\n{}\n", dump(0), dump(125_000), dump(250_000)),
            ),
            ("queues-s-server.t", "100.0\n"),
            (
                "queues-s-server.jsonl",
                r#"[{"kind":"fq","handle":"5348:","dev":"eth0","root":true,"backlog":3000,"qlen":2},{"kind":"clsact","handle":"ffff:","dev":"eth0","parent":"ffff:fff1","backlog":0,"qlen":0}]"#,
            ),
        ];
        for (name, body) in files {
            std::fs::write(dir.join(name), body).unwrap();
        }
        let place = |name: &str, ns: &str, dev: &str, rate: Option<f64>| Place {
            name: name.into(),
            ns: ns.into(),
            dev: dev.into(),
            rate_bps: rate,
        };
        let places = [
            place("bottleneck-down", "modem", "m-lan", Some(100e6)),
            // Another server's eth0, which the samples do not cover.
            place("contender-other", "s-other", "eth0", None),
            place("contender-server", "s-server", "eth0", None),
        ];
        // The run's clock starts at 100; loaded from 1 s on.
        let series = analyse(&dir, &places, 100.0, |t| t >= 1.0);
        std::fs::remove_dir_all(&dir).unwrap();
        let names: Vec<(&str, &str)> = series
            .iter()
            .map(|s| (s.place.as_str(), s.kind.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("bottleneck-down", "netem"),
                ("bottleneck-down", "tbf"),
                ("contender-server", "fq")
            ]
        );
        let (netem, tbf, fq) = (&series[0], &series[1], &series[2]);
        assert_eq!(
            tbf.samples,
            [(0.0, 0, 0), (1.0, 125_000, 125), (2.0, 250_000, 250)]
        );
        assert_eq!(
            (tbf.parent.as_deref(), netem.parent.as_deref()),
            (Some("1:1"), None)
        );
        // Loaded: the samples at 1 and 2 s; 125 kB at 100 Mbit/s is 10 ms.
        let l = &tbf.loaded;
        assert_eq!(l.count, 2);
        assert_eq!(l.bytes.unwrap().p50, 187_500.0);
        assert_eq!(l.bytes.unwrap().max, 250_000.0);
        assert_eq!(l.packets.unwrap().max, 250.0);
        assert_eq!(l.ms.unwrap().max, 20.0);
        assert!((l.ms.unwrap().p99 - 19.9).abs() < 1e-9);
        // netem's backlog is its delay line: no time at the rate.
        assert_eq!((netem.rate_bps, netem.loaded.ms), (None, None));
        assert!(netem.loaded.bytes.is_some());
        // Nothing loaded for fq: its one sample is at 0 s.
        assert_eq!((fq.samples.len(), fq.loaded.count), (1, 0));
        assert_eq!(fq.loaded.bytes, None);
    }
}
