//! The report `shaper stats` prints: for people, and as JSON for scripts.

use std::net::{Ipv4Addr, Ipv6Addr};

use serde::Serialize;
use shaper_common::{
    abi::{FlowKey, FlowState, HostRate, HostState, Levels},
    ackfilter::KeepReason,
    diffserv::Diffserv,
    edt::{NS_PER_BYTE_SHIFT, NSEC_PER_SEC},
    isolation::SELF_HOST,
    rate::DisplayRate,
    stats::{DELAY_BUCKETS, DropReason, PassReason, delay_bucket_upper_ns, quantile_bucket},
};

use crate::{
    bpf::{BpfError, DatapathView, MapReader},
    record::State,
};

#[derive(Debug, Serialize)]
pub struct Report {
    pub iface: String,
    pub ifindex: u32,
    pub pid: u32,
    pub rate_bps: u64,
    pub horizon_ns: u64,
    pub isolation: String,
    pub attach: String,
    /// The programs attached at the interface's egress, by kernel id (with TCX, others' too):
    /// a new one after each takeover.
    pub egress_programs: Vec<u32>,
    /// The process exited leaving the interface shaped for the next one (`handover`): the data
    /// path runs at the last levels, with no control loop.
    pub kept: bool,
    pub uptime_s: u64,
    /// Packets stamped with a departure time (GSO super-packets count once).
    pub packets: u64,
    /// Wire bytes accounted against the rate.
    pub bytes: u64,
    pub dropped: std::collections::BTreeMap<&'static str, u64>,
    pub passed_unshaped: std::collections::BTreeMap<&'static str, u64>,
    pub clock_contended: u64,
    /// Packets the calendar held past their flow's time (levels were overbooked).
    pub calendar_delayed: u64,
    /// Priority packets (sparse flows', hosts' going ahead, prioritised tins') that booked
    /// behind the others because the calendar's lending was used up.
    pub calendar_refused: u64,
    /// Packets the device sent ahead of the rate, beyond two calendar bins of burst (a stall
    /// released them together), and the wire time (ns) charged to the calendar for them.
    pub overrun_packets: u64,
    pub overrun_ns: u64,
    /// How far ahead of now the latest departure is scheduled: the queue, in time.
    pub backlog_ns: u64,
    /// Packets the AQM CE-marked.
    pub ecn_marked: u64,
    /// Packets of sparse flows, sent at once ahead of the bulk flows.
    pub sparse: u64,
    /// GSO packets built elsewhere sent through the segmenter (their frames are counted in
    /// `packets` when they come back), and the segmenter's IFB.
    pub segmented: u64,
    /// Packets sent through the segmenter behind their flow's frames, to keep their order.
    pub segment_followers: u64,
    pub segmenter_ifb: Option<String>,
    /// Frames by scheduled delay (departure minus stamping time): what each waited in fq.
    pub delay_hist: Vec<DelayBucket>,
    /// The histogram's frames' scheduled delays added up (ns).
    pub delay_sum_ns: u64,
    /// The median and 99th percentile of that delay, as the upper bound of their bucket (µs).
    pub delay_p50_us: Option<u64>,
    pub delay_p99_us: Option<u64>,
    /// Frames scheduled further ahead than the AQM's target (of the histogram's frames).
    pub over_target_frames: u64,
    /// ECN-capable packets dropped (any reason): the AQM marks them instead.
    pub ecn_capable_dropped: u64,
    pub diffserv: String,
    /// Packets and bytes per DiffServ tin of the mode.
    pub tins: Vec<TinRow>,
    /// The ACK filter: pure ACKs examined, dropped, and kept by rule.
    pub ack_filter: AckFilterRow,
    /// The IFB device the ingress direction is shaped on (`--ingress-rate`), whose report is
    /// `shaper stats --iface IF --ingress`.
    pub ingress_ifb: Option<String>,
    /// The control loop's previous tick and its longest so far (µs); its interval is 100 ms.
    pub tick_us: Option<u64>,
    pub max_tick_us: Option<u64>,
    /// The CPU time the control loop's thread spent in its previous tick and the most in one
    /// tick so far (µs): a tick far longer than its CPU time waited for a CPU.
    pub tick_cpu_us: Option<u64>,
    pub max_tick_cpu_us: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct AckFilterRow {
    pub seen: u64,
    pub dropped: u64,
    pub kept: std::collections::BTreeMap<&'static str, u64>,
    /// Kept ACKs sent at once, ahead of their flow's packets still scheduled.
    pub jumped: u64,
}

#[derive(Debug, Serialize)]
pub struct TinRow {
    pub tin: &'static str,
    pub packets: u64,
    pub bytes: u64,
}

/// Frames whose scheduled delay was below `below_us` (and at or above the previous bucket's).
#[derive(Debug, Serialize)]
pub struct DelayBucket {
    /// `None` for the last, open-ended bucket.
    pub below_us: Option<u64>,
    pub frames: u64,
}

/// The upper bound (µs) of the bucket holding the `per_mille` quantile of the frames.
fn quantile_us(hist: &[u64; DELAY_BUCKETS], per_mille: u64) -> Option<u64> {
    let upper = delay_bucket_upper_ns(quantile_bucket(hist, per_mille)?);
    Some(if upper == u64::MAX {
        u64::MAX
    } else {
        upper / 1_000
    })
}

impl Report {
    pub fn new(state: &State, view: &DatapathView) -> Self {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Self {
            iface: state.iface.clone(),
            ifindex: state.ifindex,
            ingress_ifb: state.ingress.as_ref().map(|i| i.ifb.clone()),
            pid: state.pid,
            rate_bps: state.rate_bps,
            horizon_ns: state.horizon_ns,
            isolation: state.isolation.clone(),
            attach: format!("{:?}", state.attach).to_lowercase(),
            egress_programs: Vec::new(),
            kept: state.kept,
            uptime_s: now.saturating_sub(state.started_unix_s),
            packets: view.stats.shaped_packets,
            bytes: view.stats.shaped_bytes,
            dropped: DropReason::ALL
                .iter()
                .map(|r| (r.name(), view.stats.dropped[*r as usize]))
                .collect(),
            passed_unshaped: PassReason::ALL
                .iter()
                .map(|r| (r.name(), view.stats.passed[*r as usize]))
                .collect(),
            clock_contended: view.stats.clock_contended,
            calendar_delayed: view.stats.calendar_delayed,
            calendar_refused: view.stats.calendar_refused,
            overrun_packets: view.stats.overrun_packets,
            overrun_ns: view.stats.overrun_ns,
            backlog_ns: view.backlog_ns,
            ecn_marked: view.stats.ecn_marked,
            sparse: view.stats.sparse,
            segmented: view.stats.segmented,
            segment_followers: view.stats.segment_followers,
            segmenter_ifb: state.segmenter.as_ref().map(|s| s.ifb.clone()),
            delay_hist: view
                .stats
                .delay_hist
                .iter()
                .enumerate()
                .map(|(i, &frames)| DelayBucket {
                    below_us: Some(delay_bucket_upper_ns(i))
                        .filter(|&u| u != u64::MAX)
                        .map(|u| u / 1_000),
                    frames,
                })
                .collect(),
            delay_sum_ns: view.stats.delay_sum_ns,
            delay_p50_us: quantile_us(&view.stats.delay_hist, 500),
            delay_p99_us: quantile_us(&view.stats.delay_hist, 990),
            over_target_frames: view.stats.over_target,
            ecn_capable_dropped: view.stats.ecn_capable_dropped,
            ack_filter: AckFilterRow {
                seen: view.stats.ack_seen,
                dropped: view.stats.ack_dropped,
                kept: KeepReason::ALL
                    .iter()
                    .map(|r| (r.name(), view.stats.ack_kept[*r as usize]))
                    .collect(),
                jumped: view.stats.ack_jumped,
            },
            tick_us: None,
            max_tick_us: None,
            tick_cpu_us: None,
            max_tick_cpu_us: None,
            diffserv: state.diffserv.clone(),
            tins: Diffserv::parse(&state.diffserv)
                .unwrap_or_default()
                .tins()
                .iter()
                .enumerate()
                .map(|(i, t)| TinRow {
                    tin: t.name,
                    packets: view.stats.tin_packets[i],
                    bytes: view.stats.tin_bytes[i],
                })
                .collect(),
        }
    }

    /// The report of the direction `state` describes, read from its maps now: its counters,
    /// and the control loop's timing from the levels it last wrote (when their map is known).
    pub fn read(state: &State, maps: &MapReader) -> Result<Self, BpfError> {
        let mut report = Self::new(state, &maps.view()?);
        if let Some(levels) = maps.levels()? {
            report.set_tick(&levels);
        }
        Ok(report)
    }

    /// The control loop's timing, from the levels it last wrote.
    fn set_tick(&mut self, levels: &Levels) {
        self.tick_us = Some(levels.tick_ns / 1_000);
        self.max_tick_us = Some(levels.max_tick_ns / 1_000);
        self.tick_cpu_us = Some(levels.tick_cpu_ns / 1_000);
        self.max_tick_cpu_us = Some(levels.max_tick_cpu_ns / 1_000);
    }

    pub fn to_text(&self) -> String {
        let list = |m: &std::collections::BTreeMap<&str, u64>| {
            m.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "shaper on {} (ifindex {}, pid {}{}, {} attach, up {} s)\n  rate {}  isolation {}  horizon {} ms\n  shaped: {} packets, {} bytes ({} sparse)\n{}  backlog: {:.3} ms scheduled ahead; scheduled delay p50 < {}, p99 < {}, {} of the frames beyond the AQM target\n  dropped: {} ({} of them ECN-capable)\n  ECN marked: {}\n  tins ({}): {}\n  ACK filter: {} pure ACKs seen, {} dropped; kept: {}; sent ahead of their flow: {}\n  passed unshaped: {}\n  clock contention fallbacks: {}, calendar delays: {}, lending refused: {}\n  sent ahead of the rate (a stall): {} packets, {:.1} ms of wire time charged\n{}{}",
            self.iface,
            self.ifindex,
            self.pid,
            if self.kept {
                ", which exited leaving it shaped for the next shaper: no control loop"
            } else {
                ""
            },
            self.attach,
            self.uptime_s,
            DisplayRate(self.rate_bps),
            self.isolation,
            self.horizon_ns / 1_000_000,
            self.packets,
            self.bytes,
            self.sparse,
            match &self.segmenter_ifb {
                Some(ifb) => format!(
                    "  segmented: {} super-packets split into frames on {ifb} before shaping, {} \
                     packets sent behind their flow's frames\n",
                    self.segmented, self.segment_followers
                ),
                None => String::new(),
            },
            self.backlog_ns as f64 / 1e6,
            show_us(self.delay_p50_us),
            show_us(self.delay_p99_us),
            self.over_target_frames,
            list(&self.dropped),
            self.ecn_capable_dropped,
            self.ecn_marked,
            self.diffserv,
            self.tins
                .iter()
                .map(|t| format!("{} {} packets", t.tin, t.packets))
                .collect::<Vec<_>>()
                .join(", "),
            self.ack_filter.seen,
            self.ack_filter.dropped,
            list(&self.ack_filter.kept),
            self.ack_filter.jumped,
            list(&self.passed_unshaped),
            self.clock_contended,
            self.calendar_delayed,
            self.calendar_refused,
            self.overrun_packets,
            self.overrun_ns as f64 / 1e6,
            match &self.ingress_ifb {
                Some(ifb) => format!(
                    "  ingress: shaped on {ifb} (shaper stats --iface {} --ingress)\n",
                    self.iface
                ),
                None => String::new(),
            },
            match (
                self.tick_us,
                self.max_tick_us,
                self.tick_cpu_us,
                self.max_tick_cpu_us
            ) {
                (Some(t), Some(m), Some(c), Some(mc)) => format!(
                    "  control loop: last tick {:.1} ms ({:.1} ms CPU), longest {:.1} ms, most CPU {:.1} ms (interval 100 ms)\n",
                    t as f64 / 1e3,
                    c as f64 / 1e3,
                    m as f64 / 1e3,
                    mc as f64 / 1e3
                ),
                _ => String::new(),
            },
        )
    }
}

fn show_us(us: Option<u64>) -> String {
    match us {
        None => "-".into(),
        Some(u64::MAX) => "inf".into(),
        Some(us) if us >= 1_000 => format!("{:.1} ms", us as f64 / 1e3),
        Some(us) => format!("{us} us"),
    }
}

/// One host (the outer fairness level) in `shaper stats --hosts`.
#[derive(Debug, Serialize)]
pub struct HostRow {
    pub host: String,
    pub bytes: u64,
    pub packets: u64,
    /// The level its flows are paced at (what the control plane wrote last), if any.
    pub flow_level_bps: Option<u64>,
    /// How far ahead its latest departure is scheduled (its queue, in time).
    pub scheduled_ns: u64,
}

/// One flow in `shaper stats --flows`.
#[derive(Debug, Serialize)]
pub struct FlowRow {
    pub flow: String,
    pub bytes: u64,
    pub packets: u64,
    /// How far ahead its clock is (its queue, in time).
    pub scheduled_ns: u64,
    /// The AQM's signal count in the flow's current episode (0: never or fully decayed).
    pub aqm_count: u32,
    /// BLUE's drop probability for the flow (0 to 1).
    pub blue_p_drop: f64,
}

/// The `top` hosts by bytes.
pub fn host_rows(
    hosts: Vec<(FlowKey, HostState)>,
    rates: &[(FlowKey, HostRate)],
    now_ns: u64,
    top: usize,
) -> Vec<HostRow> {
    let mut rows: Vec<HostRow> = hosts
        .into_iter()
        .map(|(k, h)| HostRow {
            host: describe_key(&k),
            bytes: h.bytes,
            packets: h.packets,
            flow_level_bps: rates
                .iter()
                .find(|(rk, _)| *rk == k)
                .map(|(_, r)| rate_of(r.flow_ns_per_byte_fp)),
            scheduled_ns: h.latest_depart_ns.saturating_sub(now_ns),
        })
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.bytes));
    rows.truncate(top);
    rows
}

/// The `top` flows by bytes.
pub fn flow_rows(flows: Vec<(FlowKey, FlowState)>, now_ns: u64, top: usize) -> Vec<FlowRow> {
    let mut rows: Vec<FlowRow> = flows
        .into_iter()
        .map(|(k, f)| FlowRow {
            flow: describe_key(&k),
            bytes: f.bytes,
            packets: f.packets,
            scheduled_ns: f.clock_ns.saturating_sub(now_ns),
            aqm_count: f.aqm.count,
            blue_p_drop: f.aqm.p_drop as f64 / (1u64 << 32) as f64,
        })
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.bytes));
    rows.truncate(top);
    rows
}

pub fn host_table(rows: &[HostRow]) -> String {
    let mut out = format!(
        "{:<44} {:>14} {:>10} {:>14} {:>12}\n",
        "host", "bytes", "packets", "flow level", "queue ms"
    );
    for r in rows {
        let level = r
            .flow_level_bps
            .map(|b| DisplayRate(b).to_string())
            .unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "{:<44} {:>14} {:>10} {:>14} {:>12.3}\n",
            r.host,
            r.bytes,
            r.packets,
            level,
            r.scheduled_ns as f64 / 1e6
        ));
    }
    out
}

pub fn flow_table(rows: &[FlowRow]) -> String {
    let mut out = format!(
        "{:<72} {:>14} {:>10} {:>12}\n",
        "flow", "bytes", "packets", "queue ms"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<72} {:>14} {:>10} {:>12.3}\n",
            r.flow,
            r.bytes,
            r.packets,
            r.scheduled_ns as f64 / 1e6
        ));
    }
    out
}

/// Bits per second of a pace in ns per byte (fixed point).
fn rate_of(ns_per_byte_fp: u64) -> u64 {
    if ns_per_byte_fp == 0 {
        return 0;
    }
    ((8 * NSEC_PER_SEC as u128) << NS_PER_BYTE_SHIFT).div_ceil(ns_per_byte_fp as u128) as u64
}

/// A key as a person reads it: the fields the isolation mode uses, `*` for the others, `self`
/// for the machine's own addresses (`isolation::SELF_HOST`).
pub fn describe_key(k: &FlowKey) -> String {
    let addr = |a: &[u32; 4]| -> String {
        match (*a, k.family) {
            (SELF_HOST, _) => "self".into(),
            ([0, 0, 0, 0], _) => "*".into(),
            (_, 4) => Ipv4Addr::from(a[0].to_ne_bytes()).to_string(),
            (_, 6) => {
                let mut bytes = [0u8; 16];
                for (i, w) in a.iter().enumerate() {
                    bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
                }
                Ipv6Addr::from(bytes).to_string()
            }
            _ => "*".into(),
        }
    };
    if *k
        == (FlowKey {
            tin: k.tin,
            ..FlowKey::default()
        })
    {
        return "(all traffic)".into();
    }
    let (src, dst) = (addr(&k.src), addr(&k.dst));
    let overflow = if k.overflow != 0 { " (overflow)" } else { "" };
    match k.proto {
        0 => format!("{src} > {dst}{overflow}"),
        6 | 17 => format!(
            "{src}:{} > {dst}:{} {}{overflow}",
            k.src_port,
            k.dst_port,
            if k.proto == 6 { "tcp" } else { "udp" }
        ),
        p => format!("{src} > {dst} proto {p}{overflow}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_like_addresses() {
        let k = FlowKey {
            src: [u32::from_ne_bytes([10, 0, 0, 1]), 0, 0, 0],
            dst: [u32::from_ne_bytes([10, 2, 0, 1]), 0, 0, 0],
            src_port: 40000,
            dst_port: 5201,
            proto: 6,
            family: 4,
            overflow: 0,
            tin: 0,
        };
        assert_eq!(describe_key(&k), "10.0.0.1:40000 > 10.2.0.1:5201 tcp");
        let host = FlowKey {
            dst: k.dst,
            family: 4,
            ..Default::default()
        };
        assert_eq!(describe_key(&host), "* > 10.2.0.1");
        assert_eq!(describe_key(&FlowKey::default()), "(all traffic)");
        let machine = FlowKey {
            src: SELF_HOST,
            ..Default::default()
        };
        assert_eq!(describe_key(&machine), "self > *");
        let pair = FlowKey {
            dst: [0, 0, 0, u32::from_ne_bytes([0, 0, 0, 1])],
            family: 6,
            ..machine
        };
        assert_eq!(describe_key(&pair), "self > ::1");
        assert_eq!(
            rate_of(shaper_common::edt::ns_per_byte_fp(100_000_000)),
            100_000_000
        );
    }
}
