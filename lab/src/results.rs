//! From one run's raw files (iperf3 JSON, ping -D output, tc and shaper counters, queue
//! samples, /proc/stat) to its `RunResult`, the per-run JSON the reports are built from.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use shaper_common::stats::quantile_bucket;

use super::{
    joins::{self, Join},
    plan,
    queues::{self, QueueSeries},
    scenario::{Contender, Flow, FlowDirection, ProbeKind, Protocol, Scenario},
    stats::{self, Interval, Summary},
    transfers::{self, TransfersResult},
};

/// The resolution of every time series.
pub const BIN: f64 = 0.1;
/// After a flow stops its queue drains; pings this soon after are not idle.
const DRAIN: f64 = 1.0;

#[derive(Debug, Serialize, Deserialize)]
pub struct RunResult {
    pub scenario: String,
    pub scenario_hash: String,
    pub description: String,
    pub contender: String,
    pub kind: String,
    pub repetition: u32,
    /// Position in the `lab run` that produced it, so reports keep the run order.
    #[serde(default)]
    pub run_index: usize,
    /// "ok" or "failed".
    pub status: String,
    /// Why the run failed, or what went wrong at its end (a shaper exiting with an error).
    pub message: String,
    pub kernel: String,
    pub git_commit: String,
    /// The host's 1-minute load average before and after the VM ran: the VM is emulated
    /// (TCG), so anything else busy on the host slows it and shows in its numbers.
    #[serde(default)]
    pub host_load: (f64, f64),
    /// The share of the host's CPU used by anything but the VM during this run.
    #[serde(default)]
    pub host_others_cpu: Option<f64>,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub bin_s: f64,
    pub hosts: Vec<HostResult>,
    pub flows: Vec<FlowResult>,
    pub download: DirectionResult,
    pub upload: DirectionResult,
    /// Jain's index of the hosts' mean throughputs (both directions) after warm-up.
    pub jain_hosts: Option<f64>,
    /// Jain's index of every connection's mean throughput while it ran, after warm-up.
    pub jain_flows: Option<f64>,
    pub latency: Latency,
    /// The transfers probes' results, for scenarios that have some.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transfers: Vec<TransfersResult>,
    /// Hosts that started while others loaded the link, and how soon they had their share.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub joins: Vec<Join>,
    /// How often the queues were sampled (s; 0: not at all), and the backlog of every qdisc
    /// of the bottleneck and the contender over the run.
    #[serde(default)]
    pub queue_interval_s: f64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queues: Vec<QueueSeries>,
    pub retransmits: u64,
    /// Packets dropped by the bottleneck's qdiscs and by the contender's (its qdiscs and, for
    /// shaper, its own drops).
    pub drops_bottleneck: u64,
    pub drops_contender: u64,
    /// ECN marks by the contender (its qdiscs', and shaper's own).
    pub marks_contender: u64,
    /// CPU time the VM's CPUs were busy during the run, and that as a share of all CPU time.
    pub cpu_busy_s: f64,
    pub cpu_busy_share: f64,
    /// `tc -s -j qdisc show` of the bottleneck's and the contender's interfaces.
    pub qdisc: BTreeMap<String, Value>,
    /// `shaper stats --json` where shaper ran.
    pub shaper: BTreeMap<String, Value>,
}

impl RunResult {
    /// The queue sampler's period as written (10, 12.5).
    pub fn queue_interval_ms(&self) -> f64 {
        (self.queue_interval_s * 1e6).round() / 1e3
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct HostResult {
    pub name: String,
    pub mean_bps: f64,
    pub series_bps: Vec<f64>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct FlowResult {
    pub id: String,
    pub host: String,
    #[serde(default)]
    pub server: String,
    pub direction: FlowDirection,
    pub protocol: Protocol,
    pub cc: Option<String>,
    /// Whether its connections asked for ECN (None: the kernel's default, they do not).
    #[serde(default)]
    pub ecn: Option<bool>,
    #[serde(default)]
    pub dscp: Option<u8>,
    pub parallel: u32,
    /// When it really started, on the run's clock (0 = the flows' zero).
    pub started_s: f64,
    /// When it was due to stop, on the same clock.
    pub stopped_s: f64,
    pub mean_bps: f64,
    pub connections_mean_bps: Vec<f64>,
    pub retransmits: u64,
    /// UDP only: datagrams lost and sent.
    pub lost_packets: Option<u64>,
    pub packets: Option<u64>,
    pub series_bps: Vec<f64>,
    /// The same per 100 ms of its own life, from its start (iperf3's own intervals, not the
    /// run's grid): how its first moments went, without a grid sample that it only partly
    /// covers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub own_series_bps: Vec<f64>,
    pub error: Option<String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct DirectionResult {
    pub flows: usize,
    pub mean_bps: f64,
    /// The contender's rate in this direction, or the bottleneck's.
    pub reference_bps: Option<f64>,
    pub utilisation: Option<f64>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Latency {
    /// ICMP echo round trips (ms) with no flow running.
    pub ping_idle: Summary,
    /// ... and with flows running, after warm-up.
    pub ping_loaded: Summary,
    /// Median loaded minus median idle (ms).
    pub induced_ms: Option<f64>,
    pub ping_lost: u64,
    pub ping_sent: u64,
    /// TCP's smoothed RTT (ms) as the senders' kernels saw it, sampled every 100 ms.
    pub tcp_rtt: Summary,
    /// (time s, rtt ms) of every ping, for plots.
    pub ping_samples: Vec<(f64, f64)>,
    /// The request/response probes' round trips by kind (`udp-rr`, `tcp-rr`), for the kinds
    /// the scenario has.
    #[serde(default)]
    pub rr: BTreeMap<String, ProbeLatency>,
}

/// The round trips of one kind of probe over a run, split as the ping fields are.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ProbeLatency {
    pub idle: Summary,
    pub loaded: Summary,
    /// Median loaded minus median idle (ms).
    pub induced_ms: Option<f64>,
    pub lost: u64,
    pub sent: u64,
    /// (time s, rtt ms) of every reply.
    pub samples: Vec<(f64, f64)>,
}

pub struct Context<'a> {
    pub scenario: &'a Scenario,
    pub contender: &'a Contender,
    pub repetition: u32,
    pub run_index: usize,
    pub dir: PathBuf,
    pub kernel: String,
    pub git_commit: String,
    pub host_load: (f64, f64),
    /// The host's CPU samples taken while the VM ran.
    pub host_samples: &'a [super::hostload::Sample],
}

pub(super) fn read(dir: &Path, name: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(name)).ok()
}

fn read_f64(dir: &Path, name: &str) -> Option<f64> {
    read(dir, name)?.trim().parse().ok()
}

fn json(dir: &Path, name: &str) -> Option<Value> {
    serde_json::from_str(&read(dir, name)?).ok()
}

pub fn analyse(c: &Context) -> Result<RunResult> {
    let s = c.scenario;
    let dir = &c.dir;
    let status_text =
        read(dir, "status").unwrap_or_else(|| "failed\nno status: the run did not finish".into());
    let mut lines = status_text.lines();
    let status = lines.next().unwrap_or("failed").trim().to_string();
    let message = lines.collect::<Vec<_>>().join(" ").trim().to_string();
    let mut r = RunResult {
        scenario: s.name.clone(),
        scenario_hash: s.hash.clone(),
        description: s.description.clone(),
        contender: c.contender.name.clone(),
        kind: c.contender.kind.as_str().into(),
        repetition: c.repetition,
        run_index: c.run_index,
        status,
        message,
        kernel: c.kernel.clone(),
        git_commit: c.git_commit.clone(),
        host_load: c.host_load,
        host_others_cpu: None,
        duration_s: s.duration,
        warmup_s: s.warmup,
        bin_s: BIN,
        hosts: Vec::new(),
        flows: Vec::new(),
        download: DirectionResult::default(),
        upload: DirectionResult::default(),
        jain_hosts: None,
        jain_flows: None,
        latency: Latency::default(),
        transfers: Vec::new(),
        joins: Vec::new(),
        queue_interval_s: s.queue_interval,
        queues: Vec::new(),
        retransmits: 0,
        drops_bottleneck: 0,
        drops_contender: 0,
        marks_contender: 0,
        cpu_busy_s: 0.0,
        cpu_busy_share: 0.0,
        qdisc: BTreeMap::new(),
        shaper: BTreeMap::new(),
    };
    if r.status != "ok" {
        return Ok(r);
    }
    let t0 = read_f64(dir, "t0").context("no t0 in a finished run")?;
    let zero = t0 + read_f64(dir, "idle").unwrap_or(0.0);
    r.host_others_cpu = super::hostload::others_share(c.host_samples, t0, zero + s.duration);
    let bins = (s.duration / BIN).ceil() as usize;
    let (from, to) = (s.warmup, s.duration);

    let mut connection_means = Vec::new();
    let mut tcp_rtts = Vec::new();
    for f in &s.flows {
        let fr = flow(dir, f, zero, bins, from, &mut tcp_rtts);
        connection_means.extend(fr.connections_mean_bps.iter().copied());
        r.retransmits += fr.retransmits;
        r.flows.push(fr);
    }
    for h in &s.hosts {
        let mut series = vec![0.0; bins];
        let mine: Vec<&FlowResult> = r.flows.iter().filter(|f| &f.host == h).collect();
        if mine.is_empty() {
            continue;
        }
        for f in &mine {
            for (a, b) in series.iter_mut().zip(&f.series_bps) {
                *a += b;
            }
        }
        r.hosts.push(HostResult {
            name: h.clone(),
            mean_bps: stats::mean_over(&series, BIN, from, to),
            series_bps: series,
        });
    }
    r.joins = joins::analyse(&r.flows, s.duration);
    r.jain_hosts = stats::jain(&r.hosts.iter().map(|h| h.mean_bps).collect::<Vec<_>>());
    r.jain_flows = stats::jain(&connection_means);
    for (dir_kind, slot) in [
        (FlowDirection::Download, &mut r.download),
        (FlowDirection::Upload, &mut r.upload),
    ] {
        let flows: Vec<&FlowResult> = r.flows.iter().filter(|f| f.direction == dir_kind).collect();
        // The mean of what all of them carried together over the window (flows that start or
        // stop inside it count for the time they ran, not at their own mean).
        let mut total = vec![0.0; bins];
        for f in &flows {
            for (a, b) in total.iter_mut().zip(&f.series_bps) {
                *a += b;
            }
        }
        let mean_bps = stats::mean_over(&total, BIN, from, to);
        let reference_bps = s.reference_rate(c.contender, dir_kind);
        *slot = DirectionResult {
            flows: flows.len(),
            mean_bps,
            reference_bps,
            utilisation: reference_bps
                .filter(|_| !flows.is_empty())
                .map(|rate| mean_bps / rate),
        };
    }

    r.latency = latency(dir, s, &r.flows, zero, tcp_rtts);
    r.transfers = s
        .transfers
        .iter()
        .map(|t| {
            let host = plan::host_addr(s, &t.host, t.family);
            let server = plan::server_addr(s, &t.server, t.family);
            let log = plan::probe_server_log(&t.server);
            transfers::analyse(dir, t, zero, &log, (&host, &server))
        })
        .collect();
    r.queues = queues::analyse(dir, &plan::places(s, c.contender), zero, |t| {
        classify(t, &r.flows, s.warmup, s.duration) == Some(true)
    });
    cpu(dir, &mut r);
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".json") else {
            continue;
        };
        if let Some(place) = stem.strip_prefix("qdisc-") {
            let v = json(dir, &name).unwrap_or(Value::Null);
            let drops = sum_key(&top_level(&v), "drops");
            if place.starts_with("bottleneck") {
                r.drops_bottleneck += drops;
            } else {
                r.drops_contender += drops;
                r.marks_contender += sum_key(&v, "ecn_mark");
            }
            r.qdisc.insert(place.to_string(), v);
        } else if let Some(place) = stem.strip_prefix("shaper-") {
            let v = json(dir, &name)
                .unwrap_or_else(|| Value::String(read(dir, &name).unwrap_or_default()));
            let (drops, marks) = shaper_counters(&v);
            r.drops_contender += drops;
            r.marks_contender += marks;
            r.shaper.insert(place.to_string(), v);
        }
    }
    Ok(r)
}

/// The qdiscs of a `tc -j qdisc show` array without their nested detail (so a child's drops
/// inside a parent's counters are not counted twice).
fn top_level(v: &Value) -> Value {
    match v {
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|q| {
                    let drops = q.get("drops").cloned().unwrap_or(Value::Null);
                    serde_json::json!({ "drops": drops })
                })
                .collect(),
        ),
        _ => Value::Null,
    }
}

/// Drops and ECN marks from `shaper stats --json`. shaper drops and marks in BPF, before the
/// qdisc under it sees the packet, so tc's counters miss them: `dropped` maps each reason to
/// its count, `ecn_marked` is absent in binaries older than the AQM (none marked).
fn shaper_counters(v: &Value) -> (u64, u64) {
    let drops = v["dropped"]
        .as_object()
        .map(|m| m.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0);
    (drops, v["ecn_marked"].as_u64().unwrap_or(0))
}

/// The `per_mille` / 1000 quantile of the scheduled delay (departure minus stamping time) of
/// every frame shaper stamped in these runs, pooled over the runs and over every place and
/// direction it shaped, as the upper bound of the histogram bucket holding it (ms): the queue
/// each frame waited in fq, which a ping beside it does not see (sparse flows leave at once).
/// `None` where shaper did not run or stamped nothing. Buckets double from 64 µs, so the bound
/// is at most twice the true value; the last bucket is open (infinity).
pub fn scheduled_delay_ms(runs: &[&RunResult], per_mille: u64) -> Option<f64> {
    // Every binary writes the same buckets, so they pool by position.
    let mut bounds: Vec<Option<u64>> = Vec::new();
    let mut counts: Vec<u64> = Vec::new();
    let hists = shaper_reports(runs).filter_map(|v| v["delay_hist"].as_array());
    for hist in hists {
        for (i, b) in hist.iter().enumerate() {
            if counts.len() <= i {
                bounds.push(b["below_us"].as_u64());
                counts.push(0);
            }
            counts[i] += b["frames"].as_u64().unwrap_or(0);
        }
    }
    let i = quantile_bucket(&counts, per_mille)?;
    Some(bounds[i].map_or(f64::INFINITY, |us| us as f64 / 1e3))
}

/// Every `shaper stats --json` the runs saved, over their places and directions.
fn shaper_reports<'a>(runs: &'a [&RunResult]) -> impl Iterator<Item = &'a Value> {
    runs.iter().flat_map(|r| r.shaper.values())
}

/// The share of shaper's frames scheduled beyond its AQM's target, pooled like
/// [`scheduled_delay_ms`]; `None` without frames, or from binaries that do not count them.
pub fn over_target_share(runs: &[&RunResult]) -> Option<f64> {
    let (mut over, mut frames) = (0, 0);
    for v in shaper_reports(runs) {
        let Some(n) = v["over_target_frames"].as_u64() else {
            continue;
        };
        over += n;
        frames += v["delay_hist"]
            .as_array()
            .map_or(0, |h| h.iter().filter_map(|b| b["frames"].as_u64()).sum());
    }
    (frames > 0).then(|| over as f64 / frames as f64)
}

fn sum_key(v: &Value, key: &str) -> u64 {
    match v {
        Value::Object(m) => m
            .iter()
            .map(|(k, x)| {
                if k == key {
                    x.as_u64().unwrap_or(0)
                } else {
                    sum_key(x, key)
                }
            })
            .sum(),
        Value::Array(a) => a.iter().map(|x| sum_key(x, key)).sum(),
        _ => 0,
    }
}

/// iperf3's per-stream intervals of one JSON report, keyed by socket.
fn stream_intervals(report: &Value, offset: f64) -> BTreeMap<i64, Vec<(Interval, Option<f64>)>> {
    let mut out: BTreeMap<i64, Vec<(Interval, Option<f64>)>> = BTreeMap::new();
    for iv in report["intervals"].as_array().into_iter().flatten() {
        for st in iv["streams"].as_array().into_iter().flatten() {
            let (Some(start), Some(end), Some(bytes)) = (
                st["start"].as_f64(),
                st["end"].as_f64(),
                st["bytes"].as_f64(),
            ) else {
                continue;
            };
            let socket = st["socket"].as_i64().unwrap_or(0);
            let rtt_ms = st["rtt"].as_f64().map(|us| us / 1000.0);
            out.entry(socket).or_default().push((
                Interval {
                    start: start + offset,
                    end: end + offset,
                    bytes,
                },
                rtt_ms,
            ));
        }
    }
    out
}

fn flow(
    dir: &Path,
    f: &Flow,
    zero: f64,
    bins: usize,
    warmup: f64,
    tcp_rtts: &mut Vec<f64>,
) -> FlowResult {
    let started = read_f64(dir, &format!("{}.t", f.id))
        .map(|t| t - zero)
        .unwrap_or(f.start);
    let client = json(dir, &format!("{}.json", f.id)).unwrap_or(Value::Null);
    let server = json(dir, &format!("{}.server.json", f.id)).unwrap_or(Value::Null);
    // Throughput is what the receiver got; retransmits and RTT are the sender's view.
    let (receiver, sender) = match f.direction {
        FlowDirection::Download => (&client, &server),
        FlowDirection::Upload => (&server, &client),
    };
    let error = [&client, &server]
        .iter()
        .find_map(|v| v["error"].as_str().map(String::from))
        .or_else(|| {
            client.is_null().then(|| {
                read(dir, &format!("{}.err", f.id)).unwrap_or_else(|| "no iperf3 report".into())
            })
        });
    let streams = stream_intervals(receiver, started);
    let mut series = vec![0.0; bins];
    let own_bins = ((f.stop - f.start) / BIN).ceil() as usize;
    let mut own_series = vec![0.0; own_bins];
    let mut connections_mean_bps = Vec::new();
    // Each connection's mean over the part of its life after warm-up.
    let from = warmup.max(started);
    let to = (started + (f.stop - f.start)).min(bins as f64 * BIN);
    for ivs in streams.values() {
        let ivs: Vec<Interval> = ivs.iter().map(|(iv, _)| *iv).collect();
        let own: Vec<Interval> = ivs
            .iter()
            .map(|iv| Interval {
                start: iv.start - started,
                end: iv.end - started,
                bytes: iv.bytes,
            })
            .collect();
        for (a, b) in own_series
            .iter_mut()
            .zip(stats::binned_bps(&own, BIN, own_bins))
        {
            *a += b;
        }
        let s = stats::binned_bps(&ivs, BIN, bins);
        for (a, b) in series.iter_mut().zip(&s) {
            *a += b;
        }
        if to > from {
            connections_mean_bps.push(stats::mean_over(&s, BIN, from, to));
        }
    }
    if f.protocol == Protocol::Tcp {
        for ivs in stream_intervals(sender, started).values() {
            tcp_rtts.extend(
                ivs.iter()
                    .filter(|(iv, _)| iv.start >= warmup)
                    .filter_map(|(_, rtt)| *rtt),
            );
        }
    }
    let end = &sender["end"];
    let retransmits = end["sum_sent"]["retransmits"].as_u64().unwrap_or(0);
    let (lost_packets, packets) = if f.protocol == Protocol::Udp {
        let sum = &receiver["end"]["sum"];
        (sum["lost_packets"].as_u64(), sum["packets"].as_u64())
    } else {
        (None, None)
    };
    FlowResult {
        id: f.id.clone(),
        host: f.host.clone(),
        server: f.server.clone(),
        direction: f.direction,
        protocol: f.protocol,
        cc: f.cc.clone(),
        ecn: f.ecn,
        dscp: f.dscp,
        parallel: f.parallel,
        started_s: started,
        stopped_s: started + (f.stop - f.start),
        mean_bps: if to > from {
            stats::mean_over(&series, BIN, from, to)
        } else {
            0.0
        },
        connections_mean_bps,
        retransmits,
        lost_packets,
        packets,
        series_bps: series,
        own_series_bps: own_series,
        error,
    }
}

/// `[1795394521.508878] 64 bytes from 10.9.0.2: icmp_seq=2 ttl=64 time=0.360 ms`, as
/// `ping -D` prints it (lab-probe prints its replies the same way), and its closing
/// `N packets transmitted, M received, ...`: (wall clock, rtt ms) samples, sent, lost.
fn ping_samples(text: &str) -> (Vec<(f64, f64)>, u64, u64) {
    let mut samples = Vec::new();
    let (mut sent, mut received) = (0, 0);
    for l in text.lines() {
        if let (Some(ts), Some(rtt)) = (
            l.strip_prefix('[').and_then(|r| r.split(']').next()),
            l.split("time=").nth(1),
        ) && let (Ok(ts), Ok(rtt)) = (
            ts.parse::<f64>(),
            rtt.trim_end_matches("ms").trim().parse::<f64>(),
        ) {
            samples.push((ts, rtt));
        }
        if l.contains("packets transmitted") {
            let n: Vec<u64> = l
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|w| w.parse().ok())
                .collect();
            if n.len() >= 2 {
                (sent, received) = (n[0], n[1]);
            }
        }
    }
    (samples, sent, sent.saturating_sub(received))
}

/// Whether a ping at `t` (run clock) counts as loaded (Some(true): a flow runs and warm-up is
/// over), idle (Some(false): no flow runs or drains) or neither.
pub fn classify(t: f64, flows: &[FlowResult], warmup: f64, duration: f64) -> Option<bool> {
    let active = flows.iter().any(|f| t >= f.started_s && t < f.stopped_s);
    let draining = flows
        .iter()
        .any(|f| t >= f.started_s && t < f.stopped_s + DRAIN);
    if active {
        (t >= warmup && t < duration).then_some(true)
    } else {
        (!draining).then_some(false)
    }
}

fn latency(
    dir: &Path,
    s: &Scenario,
    flows: &[FlowResult],
    zero: f64,
    tcp_rtts: Vec<f64>,
) -> Latency {
    let mut by_kind: BTreeMap<ProbeKind, ProbeLatency> = ProbeKind::ALL
        .into_iter()
        .filter(|k| s.probes.iter().any(|p| p.kind == *k))
        .map(|k| (k, probe_latency(dir, s, k, flows, zero)))
        .collect();
    // Pings keep the fields they always had, so older results and reports still read.
    let ping = by_kind.remove(&ProbeKind::Ping).unwrap_or_default();
    Latency {
        ping_idle: ping.idle,
        ping_loaded: ping.loaded,
        induced_ms: ping.induced_ms,
        ping_lost: ping.lost,
        ping_sent: ping.sent,
        tcp_rtt: stats::summary(&tcp_rtts),
        ping_samples: ping.samples,
        rr: by_kind
            .into_iter()
            .map(|(k, l)| (k.as_str().to_string(), l))
            .collect(),
    }
}

/// Every probe of one kind, its raw output in `<probe id>.<kind>`.
fn probe_latency(
    dir: &Path,
    s: &Scenario,
    kind: ProbeKind,
    flows: &[FlowResult],
    zero: f64,
) -> ProbeLatency {
    let mut all = Vec::new();
    let (mut idle, mut loaded) = (Vec::new(), Vec::new());
    let (mut sent, mut lost) = (0, 0);
    for p in s.probes.iter().filter(|p| p.kind == kind) {
        let text = read(dir, &format!("{}.{}", p.id, kind.as_str())).unwrap_or_default();
        let (samples, n, l) = ping_samples(&text);
        sent += n;
        lost += l;
        for (ts, rtt) in samples {
            let t = ts - zero;
            all.push((t, rtt));
            match classify(t, flows, s.warmup, s.duration) {
                Some(true) => loaded.push(rtt),
                Some(false) => idle.push(rtt),
                None => {}
            }
        }
    }
    let idle = stats::summary(&idle);
    let loaded = stats::summary(&loaded);
    ProbeLatency {
        induced_ms: loaded.p50.zip(idle.p50).map(|(l, i)| l - i),
        idle,
        loaded,
        lost,
        sent,
        samples: all,
    }
}

impl RunResult {
    /// The round-trip times of the pings sent under load (`classify`), as `ping_loaded`
    /// summarises them.
    pub fn loaded_pings(&self) -> impl Iterator<Item = f64> + '_ {
        self.latency.ping_samples.iter().filter_map(|&(t, rtt)| {
            (classify(t, &self.flows, self.warmup_s, self.duration_s) == Some(true)).then_some(rtt)
        })
    }

    /// How evenly the hosts shared one direction: the least a host got over the most (1 is
    /// even), each host's flows that way added up. None with fewer than two hosts in it.
    pub fn host_share(&self, direction: FlowDirection) -> Option<f64> {
        let mut per_host: BTreeMap<&str, f64> = BTreeMap::new();
        for f in self.flows.iter().filter(|f| f.direction == direction) {
            *per_host.entry(f.host.as_str()).or_default() += f.mean_bps;
        }
        if per_host.len() < 2 {
            return None;
        }
        let (lo, hi) = per_host
            .values()
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), &v| {
                (lo.min(v), hi.max(v))
            });
        (hi > 0.0).then(|| lo / hi)
    }
}

/// CPU time from two /proc/stat `cpu` lines (USER_HZ = 100).
fn cpu(dir: &Path, r: &mut RunResult) {
    let parse = |name| -> Option<Vec<f64>> {
        let l = read(dir, name)?;
        Some(
            l.split_whitespace()
                .skip(1)
                .filter_map(|w| w.parse().ok())
                .collect(),
        )
    };
    if let (Some(a), Some(b)) = (parse("cpu.before"), parse("cpu.after"))
        && a.len() >= 8
        && b.len() >= 8
    {
        let total: f64 = (0..8).map(|i| b[i] - a[i]).sum();
        let idle = (b[3] - a[3]) + (b[4] - a[4]);
        r.cpu_busy_s = (total - idle) / 100.0;
        r.cpu_busy_share = if total > 0.0 {
            (total - idle) / total
        } else {
            0.0
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_lines() {
        let text = "PING 10.0.0.10 (10.0.0.10) 56(84) bytes of data.\n\
            [1795394521.420959] 64 bytes from 10.0.0.10: icmp_seq=1 ttl=64 time=2.28 ms\n\
            [1795394521.508878] 64 bytes from 10.0.0.10: icmp_seq=2 ttl=64 time=0.360 ms\n\
            \n--- 10.0.0.10 ping statistics ---\n\
            3 packets transmitted, 2 received, 33.3333% packet loss, time 416ms\n";
        let (s, sent, lost) = ping_samples(text);
        assert_eq!(
            s,
            vec![(1795394521.420959, 2.28), (1795394521.508878, 0.36)]
        );
        assert_eq!((sent, lost), (3, 1));
        // lab-probe's output.
        let text = "LAB-PROBE udp-rr 10.1.1.2 port 5200: 64-byte requests every 0.01 s for 23 s\n\
            [1795424446.270509] 64 bytes from 10.1.1.2: seq=0 time=0.352 ms\n\
            [1795424446.280209] 64 bytes from fd01:1::2: seq=1 time=12.028 ms\n\
            \n--- 10.1.1.2 udp-rr statistics ---\n\
            4 packets transmitted, 2 received, 50.0000% packet loss, 1 late\n";
        let (s, sent, lost) = ping_samples(text);
        assert_eq!(
            s,
            vec![(1795424446.270509, 0.352), (1795424446.280209, 12.028)]
        );
        assert_eq!((sent, lost), (4, 2));
    }

    /// A finished download run with two connections (one twice as fast as the other), built
    /// by hand in the runner's layout.
    #[test]
    fn analyse_a_run() {
        let text = r#"
            duration = "2s"
            warmup = "1s"
            [topology]
            hosts = ["a"]
            [[contender]]
            name = "cake"
            kind = "cake"
            on = [{ at = "server", rate = "10mbit" }]
            [[flow]]
            host = "a"
            direction = "download"
            parallel = 2
            [[probe]]
            host = "a"
            kind = "ping"
            [[probe]]
            host = "a"
            kind = "udp-rr"
            [[probe]]
            host = "a"
            kind = "transfers"
            count = 1
            size = "10kb"
            direction = "download"
        "#;
        let s = crate::scenario::parse(text, "t", text.as_bytes()).unwrap();
        let dir = std::env::temp_dir().join(format!("lab-analyse-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let interval = |socket: u32, t: f64, bytes: u32| {
            format!(
                r#"{{"socket":{socket},"start":{t},"end":{},"bytes":{bytes},"rtt":20000}}"#,
                t + 0.1
            )
        };
        let intervals: Vec<String> = (0..20)
            .map(|i| {
                let t = i as f64 / 10.0;
                format!(
                    r#"{{"streams":[{},{}]}}"#,
                    interval(5, t, 25000),
                    interval(6, t, 50000)
                )
            })
            .collect();
        let client = format!(r#"{{"intervals":[{}],"end":{{}}}}"#, intervals.join(","));
        let server = format!(
            r#"{{"intervals":[{}],"end":{{"sum_sent":{{"retransmits":7}}}}}}"#,
            intervals.join(",")
        );
        let files = [
            ("status", "ok\n".to_string()),
            ("t0", "100.0".into()),
            ("idle", "2".into()),
            ("a.0.t", "102.0".into()),
            ("a.0.json", client),
            ("a.0.server.json", server),
            (
                "a.0.ping",
                "[101.0] 64 bytes from x: icmp_seq=1 ttl=64 time=1.0 ms\n\
                 [103.5] 64 bytes from x: icmp_seq=2 ttl=64 time=9.0 ms\n"
                    .into(),
            ),
            (
                "qdisc-contender-server.json",
                r#"[{"kind":"fq","drops":4}]"#.into(),
            ),
            (
                "shaper-contender-server.json",
                r#"{"dropped":{"codel":6,"horizon":1},"ecn_marked":9}"#.into(),
            ),
            (
                "a.1.udp-rr",
                "[101.0] 64 bytes from x: seq=0 time=0.5 ms\n\
                 [103.5] 64 bytes from x: seq=1 time=4.5 ms\n\
                 3 packets transmitted, 2 received, 33.3333% packet loss, 0 late\n"
                    .into(),
            ),
            (
                "a.2.transfers",
                "[103.0] transfer 0: 10240 bytes in 20.0 ms\n".into(),
            ),
            // Queue samples idle (101 s) and loaded (103.5 s); 12.5 kB at 10 Mbit/s is 10 ms.
            ("queues.t", "101.0\n103.5\n".into()),
            (
                "queues-s-server.jsonl",
                "[{\"kind\":\"cake\",\"handle\":\"8001:\",\"dev\":\"eth0\",\"root\":true,\"backlog\":0,\"qlen\":0}]\n\
                 [{\"kind\":\"cake\",\"handle\":\"8001:\",\"dev\":\"eth0\",\"root\":true,\"backlog\":12500,\"qlen\":9}]\n"
                    .into(),
            ),
            ("cpu.before", "cpu 100 0 100 800 0 0 0 0 0 0".into()),
            ("cpu.after", "cpu 150 0 150 900 0 0 0 0 0 0".into()),
        ];
        for (name, body) in files {
            std::fs::write(dir.join(name), body).unwrap();
        }
        let r = analyse(&Context {
            scenario: &s,
            contender: &s.contenders[0],
            repetition: 1,
            run_index: 0,
            dir: dir.clone(),
            kernel: "k".into(),
            git_commit: "c".into(),
            host_load: (0.0, 0.0),
            host_samples: &[],
        })
        .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-6 * b.max(1.0);
        // 75 kB per 100 ms = 6 Mbit/s, of 10: 60 %.
        assert!(close(r.download.mean_bps, 6e6), "{}", r.download.mean_bps);
        assert!(close(r.download.utilisation.unwrap(), 0.6));
        assert!(close(r.flows[0].connections_mean_bps[0], 2e6));
        assert!(close(r.jain_flows.unwrap(), 0.9));
        assert_eq!(r.retransmits, 7);
        assert_eq!(r.latency.ping_idle.p50, Some(1.0));
        assert_eq!(r.latency.ping_loaded.p50, Some(9.0));
        assert_eq!(r.latency.induced_ms, Some(8.0));
        assert_eq!(r.latency.tcp_rtt.p50, Some(20.0));
        assert_eq!(r.latency.rr.len(), 1);
        let rr = &r.latency.rr["udp-rr"];
        assert_eq!((rr.idle.p50, rr.loaded.p50), (Some(0.5), Some(4.5)));
        assert_eq!((rr.induced_ms, rr.sent, rr.lost), (Some(4.0), 3, 1));
        assert!(close(r.cpu_busy_s, 1.0) && close(r.cpu_busy_share, 0.5));
        // On the run's clock; lab-probe's statistics line is missing, and says so.
        let t = &r.transfers[0];
        assert_eq!((t.completed, t.samples[0].0), (1, 1.0));
        assert!(t.error.as_deref().unwrap().contains("did not finish"));
        // The qdisc under shaper and shaper itself.
        assert_eq!((r.drops_contender, r.marks_contender), (11, 9));
        assert_eq!(r.shaper.len(), 1);
        // The contender's queue, sampled on the run's clock, summed up while loaded.
        let q = &r.queues[0];
        assert_eq!(
            (q.place.as_str(), q.kind.as_str()),
            ("contender-server", "cake")
        );
        assert_eq!(q.samples, [(-1.0, 0, 0), (1.5, 12500, 9)]);
        assert_eq!(q.loaded.ms.map(|l| l.max), Some(10.0));
    }

    #[test]
    fn counters() {
        let v: Value = serde_json::from_str(
            r#"[{"kind":"cake","drops":3,"tins":[{"drops":3,"ecn_mark":2}]},{"kind":"fq","drops":1}]"#,
        )
        .unwrap();
        assert_eq!(sum_key(&top_level(&v), "drops"), 4);
        assert_eq!(sum_key(&v, "ecn_mark"), 2);
    }

    #[test]
    fn shaper_stats() {
        // Abridged `shaper stats --json` of a binary with the AQM.
        let v: Value = serde_json::from_str(
            r#"{"iface":"eth0","rate_bps":100000000,"packets":81234,
                "dropped":{"blue":2,"codel":17,"horizon":0,"overlimit":5},
                "passed_unshaped":{"malformed":0,"non_ip":3},
                "ecn_marked":412,"delay_hist":[{"le_us":1000,"packets":80000}]}"#,
        )
        .unwrap();
        assert_eq!(shaper_counters(&v), (24, 412));
        // Before the AQM: no ecn_marked.
        let old: Value =
            serde_json::from_str(r#"{"dropped":{"horizon":3},"passed_unshaped":{}}"#).unwrap();
        assert_eq!(shaper_counters(&old), (3, 0));
        // What the runner keeps when stats failed: the error text.
        assert_eq!(shaper_counters(&Value::String("Error: ...".into())), (0, 0));
    }
}
