//! The Prometheus text exposition format (0.0.4) of a [`Scrape`]: a pure function, so that
//! what a scraper reads is tested on the host, names, escaping and histograms included.
//!
//! Conventions kept: base units (bytes, seconds) named in the metric; counters end in
//! `_total`; every family is one `# HELP`, one `# TYPE` and all its series together; labels
//! are bounded (`interface` and `direction` per shaped direction, `reason` by the data path's
//! fixed reasons, `tin` by the DiffServ mode's tins, `host` only for the opt-in top N).

use std::fmt::{Display, Write};

use super::{
    histogram::Histogram,
    status::{AutorateSample, DirectionSample, Scrape},
};
use crate::stats::{HostRow, Report};

/// The exposition format's media type (the `Content-Type` a scraper expects).
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A sample's value: counts stay exact integers (a float loses bytes beyond 2^53), the rest
/// are floats.
#[derive(Debug, Clone, Copy)]
enum Value {
    Int(u64),
    Float(f64),
}

impl Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Value::Int(v) => write!(f, "{v}"),
            Value::Float(v) => write!(f, "{}", float(v)),
        }
    }
}

/// A float as the format spells it: Go's `+Inf`, `-Inf` and `NaN`, else Rust's shortest
/// round-trip form (never an exponent, which the format would also accept).
fn float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// A label value with `\`, `"` and line feeds escaped, as the format requires.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', r"\\")
        .replace('"', r#"\""#)
        .replace('\n', r"\n")
}

/// A help text with `\` and line feeds escaped (quotes stay as they are there).
fn escape_help(text: &str) -> String {
    text.replace('\\', r"\\").replace('\n', r"\n")
}

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

#[derive(Default)]
struct Writer {
    out: String,
}

impl Writer {
    fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.name());
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: Value) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    /// A histogram's series: cumulative `_bucket`s up to `le="+Inf"`, then `_sum` and
    /// `_count` (which equals the `+Inf` bucket).
    fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &Histogram) {
        let bucket = format!("{name}_bucket");
        for (upper, count) in h.cumulative() {
            let le = upper.map_or_else(|| "+Inf".to_string(), float);
            let with_le: Vec<(&str, &str)> = labels
                .iter()
                .copied()
                .chain([("le", le.as_str())])
                .collect();
            self.sample(&bucket, &with_le, Value::Int(count));
        }
        self.sample(&format!("{name}_sum"), labels, Value::Float(h.sum));
        self.sample(&format!("{name}_count"), labels, Value::Int(h.count()));
    }
}

/// One value per shaped direction.
struct Single {
    name: &'static str,
    kind: Kind,
    help: &'static str,
    value: fn(&DirectionSample) -> Value,
}

/// The families with one series per direction, in the order they are written.
const SINGLES: &[Single] = &[
    Single {
        name: "shaper_rate_bytes_per_second",
        kind: Kind::Gauge,
        help: "The configured wire rate.",
        value: |d| Value::Float(d.report.rate_bps as f64 / 8.0),
    },
    Single {
        name: "shaper_horizon_seconds",
        kind: Kind::Gauge,
        help: "Packets that would depart further ahead than this are dropped.",
        value: |d| Value::Float(d.report.horizon_ns as f64 / 1e9),
    },
    Single {
        name: "shaper_start_time_seconds",
        kind: Kind::Gauge,
        help: "When shaping started, in seconds since the Unix epoch.",
        value: |d| Value::Int(d.started_unix_s),
    },
    Single {
        name: "shaper_packets_total",
        kind: Kind::Counter,
        help: "Packets stamped with a departure time (a GSO super-packet counts once).",
        value: |d| Value::Int(d.report.packets),
    },
    Single {
        name: "shaper_bytes_total",
        kind: Kind::Counter,
        help: "Wire bytes of the stamped packets, as accounted against the rate.",
        value: |d| Value::Int(d.report.bytes),
    },
    Single {
        name: "shaper_sparse_packets_total",
        kind: Kind::Counter,
        help: "Packets of sparse flows, sent at once ahead of the bulk flows.",
        value: |d| Value::Int(d.report.sparse),
    },
    Single {
        name: "shaper_segmented_packets_total",
        kind: Kind::Counter,
        help: "GSO packets sent through the segmenter (their frames are counted when they come back).",
        value: |d| Value::Int(d.report.segmented),
    },
    Single {
        name: "shaper_segment_followers_packets_total",
        kind: Kind::Counter,
        help: "Packets sent through the segmenter behind their flow's frames still in it, to keep their order.",
        value: |d| Value::Int(d.report.segment_followers),
    },
    Single {
        name: "shaper_ecn_marked_packets_total",
        kind: Kind::Counter,
        help: "Packets the AQM CE-marked instead of dropping them.",
        value: |d| Value::Int(d.report.ecn_marked),
    },
    Single {
        name: "shaper_ecn_capable_dropped_packets_total",
        kind: Kind::Counter,
        help: "ECN-capable packets dropped, for any reason (of shaper_dropped_packets_total).",
        value: |d| Value::Int(d.report.ecn_capable_dropped),
    },
    Single {
        name: "shaper_backlog_seconds",
        kind: Kind::Gauge,
        help: "How far ahead of now the latest departure is scheduled: the queue, in time.",
        value: |d| Value::Float(d.report.backlog_ns as f64 / 1e9),
    },
    Single {
        name: "shaper_over_target_frames_total",
        kind: Kind::Counter,
        help: "Frames scheduled further ahead than the AQM's target.",
        value: |d| Value::Int(d.report.over_target_frames),
    },
    Single {
        name: "shaper_clock_contention_fallbacks_total",
        kind: Kind::Counter,
        help: "Clock reservations that lost the race between CPUs too often and fell back to an atomic add.",
        value: |d| Value::Int(d.report.clock_contended),
    },
    Single {
        name: "shaper_calendar_delayed_packets_total",
        kind: Kind::Counter,
        help: "Packets the calendar held past their flow's time (the levels were overbooked).",
        value: |d| Value::Int(d.report.calendar_delayed),
    },
    Single {
        name: "shaper_calendar_refused_packets_total",
        kind: Kind::Counter,
        help: "Priority packets booked behind the others because the calendar's lending was used up.",
        value: |d| Value::Int(d.report.calendar_refused),
    },
    Single {
        name: "shaper_overrun_packets_total",
        kind: Kind::Counter,
        help: "Packets the device sent ahead of the rate beyond the burst allowed (a stall released them together).",
        value: |d| Value::Int(d.report.overrun_packets),
    },
    Single {
        name: "shaper_overrun_seconds_total",
        kind: Kind::Counter,
        help: "Wire time charged to the calendar for packets sent ahead of the rate.",
        value: |d| Value::Float(d.report.overrun_ns as f64 / 1e9),
    },
    Single {
        name: "shaper_ack_filter_seen_packets_total",
        kind: Kind::Counter,
        help: "Pure ACKs the ACK filter examined.",
        value: |d| Value::Int(d.report.ack_filter.seen),
    },
    Single {
        name: "shaper_ack_filter_dropped_packets_total",
        kind: Kind::Counter,
        help: "Pure ACKs the ACK filter dropped as covered by a later ACK.",
        value: |d| Value::Int(d.report.ack_filter.dropped),
    },
    Single {
        name: "shaper_ack_filter_sent_ahead_packets_total",
        kind: Kind::Counter,
        help: "Kept pure ACKs sent at once, ahead of their flow's packets still scheduled.",
        value: |d| Value::Int(d.report.ack_filter.jumped),
    },
    Single {
        name: "shaper_active_hosts",
        kind: Kind::Gauge,
        help: "Hosts the control loop's last tick measured as active.",
        value: |d| Value::Int(d.control.active_hosts),
    },
    Single {
        name: "shaper_bottlenecked_hosts",
        kind: Kind::Gauge,
        help: "Active hosts whose flows waited on their own clocks at the last tick (they would use more).",
        value: |d| Value::Int(d.control.bottlenecked_hosts),
    },
    Single {
        name: "shaper_active_flows",
        kind: Kind::Gauge,
        help: "Flows busy at the last tick, summed over the active hosts (each host's average over its sampling window).",
        value: |d| Value::Float(d.control.active_flows),
    },
    Single {
        name: "shaper_control_ticks_total",
        kind: Kind::Counter,
        help: "Ticks of the control loop.",
        value: |d| Value::Int(d.control.ticks),
    },
    Single {
        name: "shaper_control_tick_failures_total",
        kind: Kind::Counter,
        help: "Ticks that failed (the previous levels stayed in force).",
        value: |d| Value::Int(d.control.failed_ticks),
    },
    Single {
        name: "shaper_control_tick_last_duration_seconds",
        kind: Kind::Gauge,
        help: "How long the control loop's previous tick took, as the data path's levels record it.",
        value: |d| Value::Float(d.report.tick_us.unwrap_or(0) as f64 / 1e6),
    },
    Single {
        name: "shaper_control_tick_max_duration_seconds",
        kind: Kind::Gauge,
        help: "The longest tick of the control loop so far.",
        value: |d| Value::Float(d.report.max_tick_us.unwrap_or(0) as f64 / 1e6),
    },
    Single {
        name: "shaper_control_tick_last_cpu_seconds",
        kind: Kind::Gauge,
        help: "The CPU time the control loop's thread spent in its previous tick.",
        value: |d| Value::Float(d.report.tick_cpu_us.unwrap_or(0) as f64 / 1e6),
    },
    Single {
        name: "shaper_control_tick_max_cpu_seconds",
        kind: Kind::Gauge,
        help: "The most CPU time the control loop's thread spent in one tick so far.",
        value: |d| Value::Float(d.report.max_tick_cpu_us.unwrap_or(0) as f64 / 1e6),
    },
];

/// Families with one series per direction and reason (or tin): a fixed, small set each.
struct ByLabel {
    name: &'static str,
    label: &'static str,
    help: &'static str,
    values: fn(&Report) -> Vec<(&'static str, u64)>,
}

const BY_LABEL: &[ByLabel] = &[
    ByLabel {
        name: "shaper_dropped_packets_total",
        label: "reason",
        help: "Packets dropped, by reason: codel and blue (the AQM), overlimit (a flow beyond its hard limit), horizon.",
        values: |r| r.dropped.iter().map(|(k, v)| (*k, *v)).collect(),
    },
    ByLabel {
        name: "shaper_passed_unshaped_packets_total",
        label: "reason",
        help: "Packets passed without a departure time, by reason.",
        values: |r| r.passed_unshaped.iter().map(|(k, v)| (*k, *v)).collect(),
    },
    ByLabel {
        name: "shaper_ack_filter_kept_packets_total",
        label: "reason",
        help: "Pure ACKs the ACK filter examined and kept, by the rule that kept them.",
        values: |r| r.ack_filter.kept.iter().map(|(k, v)| (*k, *v)).collect(),
    },
    ByLabel {
        name: "shaper_tin_packets_total",
        label: "tin",
        help: "Packets stamped, per DiffServ tin.",
        values: |r| r.tins.iter().map(|t| (t.tin, t.packets)).collect(),
    },
    ByLabel {
        name: "shaper_tin_bytes_total",
        label: "tin",
        help: "Wire bytes stamped, per DiffServ tin.",
        values: |r| r.tins.iter().map(|t| (t.tin, t.bytes)).collect(),
    },
];

/// The data path's scheduled-delay histogram in seconds. Its buckets count delays strictly
/// below their bound, a subset of Prometheus's `le` (at most): every frame counted under a
/// bound was indeed at most that.
fn delay_histogram(report: &Report) -> Histogram {
    Histogram {
        upper_bounds: report
            .delay_hist
            .iter()
            .filter_map(|b| b.below_us)
            .map(|us| us as f64 / 1e6)
            .collect(),
        counts: report.delay_hist.iter().map(|b| b.frames).collect(),
        sum: report.delay_sum_ns as f64 / 1e9,
    }
}

/// The labels of a direction's series, then `extra`.
fn labels<'a>(d: &'a DirectionSample, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    [
        ("interface", d.interface.as_str()),
        ("direction", d.direction.name()),
    ]
    .into_iter()
    .chain(extra.iter().copied())
    .collect()
}

/// Autorate's families, for the directions it follows (none without `--autorate`); the rate
/// it sets is `shaper_rate_bytes_per_second`.
fn autorate_families(w: &mut Writer, scrape: &Scrape) {
    type Of = fn(&AutorateSample) -> Option<Value>;
    let families: [(&str, Kind, &str, Of); 6] = [
        (
            "shaper_autorate_min_rate_bytes_per_second",
            Kind::Gauge,
            "The least rate autorate may set (--autorate MIN..MAX).",
            |s| Some(Value::Float(s.range.min_bps as f64 / 8.0)),
        ),
        (
            "shaper_autorate_max_rate_bytes_per_second",
            Kind::Gauge,
            "The most rate autorate may set (--autorate MIN..MAX).",
            |s| Some(Value::Float(s.range.max_bps as f64 / 8.0)),
        ),
        (
            "shaper_autorate_delay_seconds",
            Kind::Gauge,
            "The last tick's round-trip delay over the reflectors' baseline: the link's queue (absent while no reflector answers).",
            |s| s.delay_s.map(Value::Float),
        ),
        (
            "shaper_autorate_baseline_seconds",
            Kind::Gauge,
            "The least baseline round trip among the reflectors: the path without a queue.",
            |s| s.baseline_s.map(Value::Float),
        ),
        (
            "shaper_autorate_cuts_total",
            Kind::Counter,
            "Times autorate cut the rate for a queue over its threshold.",
            |s| Some(Value::Int(s.cuts)),
        ),
        (
            "shaper_autorate_raises_total",
            Kind::Counter,
            "Times autorate raised the rate of a loaded direction whose delay stayed low.",
            |s| Some(Value::Int(s.raises)),
        ),
    ];
    let followed: Vec<(&DirectionSample, &AutorateSample)> = scrape
        .directions
        .iter()
        .filter_map(|d| d.control.autorate.as_ref().map(|s| (d, s)))
        .collect();
    if followed.is_empty() {
        return;
    }
    for (name, kind, help, value) in families {
        w.family(name, kind, help);
        for (d, status) in &followed {
            if let Some(v) = value(status) {
                w.sample(name, &labels(d, &[]), v);
            }
        }
    }
}

/// The exposition of `scrape`.
pub fn render(scrape: &Scrape) -> String {
    let mut w = Writer::default();
    w.family(
        "shaper_info",
        Kind::Gauge,
        "A shaped direction and its settings (the value is 1); device is where it is shaped.",
    );
    for d in &scrape.directions {
        let r = &d.report;
        let extra = [
            ("device", r.iface.as_str()),
            ("isolation", r.isolation.as_str()),
            ("diffserv", r.diffserv.as_str()),
            ("attach", r.attach.as_str()),
        ];
        w.sample("shaper_info", &labels(d, &extra), Value::Int(1));
    }
    for single in SINGLES {
        w.family(single.name, single.kind, single.help);
        for d in &scrape.directions {
            w.sample(single.name, &labels(d, &[]), (single.value)(d));
        }
    }
    for family in BY_LABEL {
        w.family(family.name, Kind::Counter, family.help);
        for d in &scrape.directions {
            for (value, count) in (family.values)(&d.report) {
                w.sample(
                    family.name,
                    &labels(d, &[(family.label, value)]),
                    Value::Int(count),
                );
            }
        }
    }
    type HistogramOf = fn(&DirectionSample) -> Histogram;
    let histograms: [(&str, &str, HistogramOf); 2] = [
        (
            "shaper_scheduled_delay_seconds",
            "Frames (GSO segments) by scheduled delay: departure minus stamping time, what each waits in fq.",
            |d| delay_histogram(&d.report),
        ),
        (
            "shaper_control_tick_duration_seconds",
            "How long each tick of the control loop took.",
            |d| d.control.duration.clone(),
        ),
    ];
    for (name, help, histogram) in histograms {
        w.family(name, Kind::Histogram, help);
        for d in &scrape.directions {
            w.histogram(name, &labels(d, &[]), &histogram(d));
        }
    }
    autorate_families(&mut w, scrape);
    if scrape.directions.iter().any(|d| !d.top_hosts.is_empty()) {
        type HostValue = fn(&HostRow) -> u64;
        let host_families: [(&str, &str, HostValue); 2] = [
            (
                "shaper_host_bytes_total",
                "Wire bytes of the busiest hosts (--metrics-top-hosts), a host as the isolation mode tells them apart; a host's series ends when it leaves the top or the hosts map.",
                |h| h.bytes,
            ),
            (
                "shaper_host_packets_total",
                "Packets of the busiest hosts (--metrics-top-hosts).",
                |h| h.packets,
            ),
        ];
        for (name, help, value) in host_families {
            w.family(name, Kind::Counter, help);
            for d in &scrape.directions {
                for h in &d.top_hosts {
                    w.sample(name, &labels(d, &[("host", &h.host)]), Value::Int(value(h)));
                }
            }
        }
    }
    w.family(
        "shaper_control_tick_lateness_seconds",
        Kind::Histogram,
        "How late each tick of the control loop started after it was due (ticks are 100 ms apart).",
    );
    w.histogram(
        "shaper_control_tick_lateness_seconds",
        &[],
        &scrape.lateness,
    );
    w.family(
        "shaper_ready",
        Kind::Gauge,
        "1 when every configured direction is shaped and the last health check passed (as /readyz).",
    );
    w.sample("shaper_ready", &[], Value::Int(scrape.ready as u64));
    w.out
}

#[cfg(test)]
mod tests {
    use shaper_common::stats::{DatapathStats, DropReason};

    use super::*;
    use crate::{
        bpf::DatapathView,
        metrics::{Direction, status::ControlSample},
        record::State,
    };

    fn state(iface: &str, diffserv: &str) -> State {
        State {
            rate_bps: 100_000_004,
            diffserv: diffserv.into(),
            started_unix_s: 1_700_000_000,
            ..crate::record::example(iface)
        }
    }

    fn direction(interface: &str, direction: Direction, device: &str) -> DirectionSample {
        let mut stats = DatapathStats {
            shaped_packets: 1_000,
            shaped_bytes: 1_514_000,
            ecn_marked: 7,
            ..Default::default()
        };
        stats.dropped[DropReason::Codel as usize] = 3;
        stats.delay_hist[0] = 10;
        stats.delay_hist[2] = 5;
        stats.delay_hist[15] = 1;
        stats.delay_sum_ns = 2_000_500_000;
        stats.tin_packets[1] = 900;
        let view = DatapathView {
            stats,
            backlog_ns: 1_500_000,
        };
        let mut control = ControlSample {
            ticks: 4,
            active_hosts: 2,
            active_flows: 3.5,
            ..Default::default()
        };
        control.duration.observe(0.0003);
        DirectionSample {
            interface: interface.into(),
            direction,
            started_unix_s: 1_700_000_000,
            report: Report::new(&state(device, "diffserv3"), &view),
            control,
            top_hosts: Vec::new(),
        }
    }

    fn scrape() -> Scrape {
        let mut lateness = Histogram::new(&[0.001, 0.01]);
        lateness.observe(0.0002);
        lateness.observe(0.02);
        Scrape {
            directions: vec![
                direction("eth0", Direction::Egress, "eth0"),
                direction("eth0", Direction::Ingress, "ifb4eth0"),
            ],
            lateness,
            ready: true,
        }
    }

    /// The lines of `text` that are samples of `name` (any labels).
    fn samples<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        text.lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
            })
            .collect()
    }

    #[test]
    fn every_family_has_one_help_and_type_before_all_its_samples() {
        let text = render(&scrape());
        let mut families: Vec<(String, String)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap().to_string();
                assert!(seen.insert(name.clone()), "{name} described twice");
                families.push((name, String::new()));
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                let last = families.last_mut().expect("TYPE after HELP");
                assert_eq!(last.0, name, "TYPE right after its HELP");
                last.1 = kind.to_string();
            } else {
                let (name, kind) = families.last().expect("a sample after its family");
                let metric = line.split(['{', ' ']).next().unwrap();
                let allowed: Vec<String> = match kind.as_str() {
                    "histogram" => ["_bucket", "_sum", "_count"]
                        .iter()
                        .map(|s| format!("{name}{s}"))
                        .collect(),
                    _ => vec![name.clone()],
                };
                assert!(allowed.contains(&metric.to_string()), "{line} under {name}");
                let value = line.rsplit(' ').next().unwrap();
                assert!(
                    value.parse::<f64>().is_ok() || value == "+Inf",
                    "{line}: value"
                );
            }
        }
        for (name, kind) in &families {
            assert!(name.starts_with("shaper_"), "{name}");
            assert_eq!(
                name.ends_with("_total"),
                kind == "counter",
                "{name} ({kind}): counters and only counters end in _total"
            );
        }
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn values_are_the_reports_in_base_units() {
        let text = render(&scrape());
        let egress = r#"{interface="eth0",direction="egress"}"#;
        for expected in [
            format!("shaper_rate_bytes_per_second{egress} 12500000.5"),
            format!("shaper_bytes_total{egress} 1514000"),
            format!("shaper_packets_total{egress} 1000"),
            format!("shaper_backlog_seconds{egress} 0.0015"),
            format!("shaper_ecn_marked_packets_total{egress} 7"),
            format!("shaper_active_flows{egress} 3.5"),
            format!("shaper_control_ticks_total{egress} 4"),
            r#"shaper_dropped_packets_total{interface="eth0",direction="egress",reason="codel"} 3"#.into(),
            r#"shaper_dropped_packets_total{interface="eth0",direction="ingress",reason="horizon"} 0"#.into(),
            r#"shaper_tin_packets_total{interface="eth0",direction="egress",tin="bulk"} 900"#.into(),
            r#"shaper_info{interface="eth0",direction="ingress",device="ifb4eth0",isolation="triple-isolate",diffserv="diffserv3",attach="tcx"} 1"#.into(),
            "shaper_ready 1".into(),
        ] {
            assert!(text.lines().any(|l| l == expected), "missing {expected}\n{text}");
        }
        // A series per reason of the data path, per tin of the mode (diffserv3: three).
        assert_eq!(
            samples(&text, "shaper_dropped_packets_total").len(),
            2 * DropReason::COUNT
        );
        assert_eq!(samples(&text, "shaper_tin_bytes_total").len(), 2 * 3);
    }

    #[test]
    fn histograms_are_cumulative_and_end_at_inf_equal_to_count() {
        let text = render(&scrape());
        let buckets: Vec<(String, u64)> = samples(&text, "shaper_scheduled_delay_seconds_bucket")
            .into_iter()
            .filter(|l| l.contains(r#"direction="egress""#))
            .map(|l| {
                let le = l.split("le=\"").nth(1).unwrap().split('"').next().unwrap();
                (
                    le.to_string(),
                    l.rsplit(' ').next().unwrap().parse().unwrap(),
                )
            })
            .collect();
        assert_eq!(buckets.len(), 16);
        assert_eq!(buckets[0], ("0.000064".to_string(), 10));
        assert_eq!(buckets[1], ("0.000128".to_string(), 10));
        assert_eq!(buckets[2], ("0.000256".to_string(), 15));
        assert_eq!(buckets[14], ("1.048576".to_string(), 15));
        assert_eq!(buckets[15], ("+Inf".to_string(), 16));
        assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1));
        let egress = r#"{interface="eth0",direction="egress"}"#;
        assert!(text.contains(&format!(
            "shaper_scheduled_delay_seconds_count{egress} 16\n"
        )));
        assert!(text.contains(&format!(
            "shaper_scheduled_delay_seconds_sum{egress} 2.0005\n"
        )));
        // The loop's own histograms, with their bounds.
        assert!(text.contains("shaper_control_tick_lateness_seconds_bucket{le=\"0.001\"} 1\n"));
        assert!(text.contains("shaper_control_tick_lateness_seconds_bucket{le=\"+Inf\"} 2\n"));
        assert!(text.contains("shaper_control_tick_lateness_seconds_count 2\n"));
        assert!(text.contains(
            "shaper_control_tick_duration_seconds_bucket{interface=\"eth0\",direction=\"egress\",le=\"0.0005\"} 1
"
        ));
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        assert_eq!(escape_label("a\\b\"c\nd"), r#"a\\b\"c\nd"#);
        assert_eq!(escape_help("a\\b\"c\nd"), r#"a\\b"c\nd"#);
        let mut w = Writer::default();
        w.sample("m", &[("host", "x\"y")], Value::Float(f64::INFINITY));
        w.sample("m", &[], Value::Float(f64::NAN));
        assert_eq!(w.out, "m{host=\"x\\\"y\"} +Inf\nm NaN\n");
    }

    #[test]
    fn autorate_appears_for_the_directions_it_follows() {
        let mut s = scrape();
        assert!(samples(&render(&s), "shaper_autorate_cuts_total").is_empty());
        s.directions[0].control.autorate = Some(AutorateSample {
            range: "10mbit..60mbit".parse().unwrap(),
            delay_s: Some(0.0125),
            baseline_s: None,
            cuts: 3,
            raises: 40,
        });
        let text = render(&s);
        let egress = r#"{interface="eth0",direction="egress"}"#;
        assert_eq!(
            samples(&text, "shaper_autorate_max_rate_bytes_per_second"),
            [format!(
                "shaper_autorate_max_rate_bytes_per_second{egress} 7500000"
            )]
        );
        assert_eq!(
            samples(&text, "shaper_autorate_delay_seconds"),
            [format!("shaper_autorate_delay_seconds{egress} 0.0125")]
        );
        assert_eq!(
            samples(&text, "shaper_autorate_cuts_total"),
            [format!("shaper_autorate_cuts_total{egress} 3")]
        );
        // No reflector has answered yet: no baseline series, its family still declared.
        assert!(samples(&text, "shaper_autorate_baseline_seconds").is_empty());
        assert!(text.contains("# TYPE shaper_autorate_baseline_seconds gauge"));
    }

    #[test]
    fn top_hosts_appear_only_when_asked_for() {
        let mut s = scrape();
        assert!(!render(&s).contains("shaper_host_bytes_total"));
        s.directions[0].top_hosts = vec![HostRow {
            host: "* > 10.0.0.2".into(),
            bytes: 42,
            packets: 1,
            flow_level_bps: None,
            scheduled_ns: 0,
        }];
        let text = render(&s);
        assert!(text.contains(
            "shaper_host_bytes_total{interface=\"eth0\",direction=\"egress\",host=\"* > 10.0.0.2\"} 42\n"
        ));
        assert_eq!(samples(&text, "shaper_host_packets_total").len(), 1);
    }
}
