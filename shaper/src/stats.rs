//! The report `shaper stats` prints: for people, and as JSON for scripts.

use serde::Serialize;
use shaper_common::{
    datapath::{DropReason, PassReason},
    rate::DisplayRate,
};

use crate::{bpf::DatapathView, runtime::State};

#[derive(Debug, Serialize)]
pub struct Report {
    pub iface: String,
    pub ifindex: u32,
    pub pid: u32,
    pub rate_bps: u64,
    pub horizon_ns: u64,
    pub attach: String,
    pub uptime_s: u64,
    /// Packets stamped with a departure time (GSO super-packets count once).
    pub packets: u64,
    /// Wire bytes accounted against the rate.
    pub bytes: u64,
    pub dropped: std::collections::BTreeMap<&'static str, u64>,
    pub passed_unshaped: std::collections::BTreeMap<&'static str, u64>,
    pub clock_contended: u64,
    /// How far ahead of now the latest departure is scheduled: the queue, in time.
    pub backlog_ns: u64,
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
            pid: state.pid,
            rate_bps: state.rate_bps,
            horizon_ns: state.horizon_ns,
            attach: format!("{:?}", state.attach).to_lowercase(),
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
            backlog_ns: view.backlog_ns,
        }
    }

    pub fn to_text(&self) -> String {
        let list = |m: &std::collections::BTreeMap<&str, u64>| {
            m.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "shaper on {} (ifindex {}, pid {}, {} attach, up {} s)\n  rate {}  horizon {} ms\n  shaped: {} packets, {} bytes\n  backlog: {:.3} ms scheduled ahead\n  dropped: {}\n  passed unshaped: {}\n  clock contention fallbacks: {}\n",
            self.iface,
            self.ifindex,
            self.pid,
            self.attach,
            self.uptime_s,
            DisplayRate(self.rate_bps),
            self.horizon_ns / 1_000_000,
            self.packets,
            self.bytes,
            self.backlog_ns as f64 / 1e6,
            list(&self.dropped),
            list(&self.passed_unshaped),
            self.clock_contended,
        )
    }
}
