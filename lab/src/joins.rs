//! Hosts that join a loaded link: how long a host that starts sending while others already
//! share the link takes to reach its share of it.
//!
//! A host *joins* in a direction when its first flow there starts while at least one other
//! host's flows in that direction have run for a second already (past their slow start) and go
//! on for at least a second after it. Its *share* is an equal part of what every host active
//! in that direction carried together over its steady window, from a second after it started
//! to the first stop among them: the max-min fair share when everyone is bulk, which is what a
//! host-fair contender must give it. It has *reached* its share at the end of the first 100 ms
//! of its own life (iperf3's intervals from its start, not the run's grid, which would cut its
//! first moments into a partial sample) in which it received at least `REACHED` of the share:
//! 100, 200, 300 ms.

use serde::{Deserialize, Serialize};

use super::results::{BIN, FlowResult};
use super::scenario::FlowDirection;
use super::stats;

/// The part of its share a joining host must receive in one sample to count as there: the
/// 100 ms samples of a TCP flow at its share move by a few percent with the phase of its
/// window, so an exact share would read as never reached.
pub const REACHED: f64 = 0.9;
/// How long flows run before they are taken as settled, and the joining host's settling time
/// before its steady window starts (s).
const SETTLE: f64 = 1.0;
/// Flows of the joining host that started this close to its first count as its start.
const STARTED_WITH: f64 = 0.2;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Join {
    pub host: String,
    pub direction: FlowDirection,
    /// When its first flow in the direction started, on the run's clock.
    pub started_s: f64,
    /// Hosts sending in the direction over its steady window, itself included.
    pub hosts: usize,
    /// An equal share of what they carried together over the steady window (bit/s).
    pub share_bps: f64,
    /// Its own mean over the steady window, as a fraction of the share.
    pub steady_ratio: f64,
    /// From its start to the end of the first sample at `REACHED` of the share (s); None if no
    /// sample before its steady window ended got there.
    pub reached_s: Option<f64>,
}

/// The joins of a run: its flows, the duration they were cut at.
pub fn analyse(flows: &[FlowResult], duration: f64) -> Vec<Join> {
    let mut out = Vec::new();
    for direction in [FlowDirection::Download, FlowDirection::Upload] {
        let here: Vec<&FlowResult> = flows
            .iter()
            .filter(|f| f.direction == direction && f.error.is_none())
            .collect();
        let mut hosts: Vec<&str> = here.iter().map(|f| f.host.as_str()).collect();
        hosts.sort_unstable();
        hosts.dedup();
        // When each host's flows in this direction start and stop (the first start, the last
        // stop: a host is sending between them).
        let spans: Vec<(&str, f64, f64)> = hosts
            .iter()
            .map(|h| {
                let mine = here.iter().filter(|f| f.host == *h);
                let start = mine
                    .clone()
                    .map(|f| f.started_s)
                    .fold(f64::INFINITY, f64::min);
                let stop = mine.map(|f| f.stopped_s).fold(0.0, f64::max).min(duration);
                (*h, start, stop)
            })
            .collect();
        for &(host, start, stop) in &spans {
            let from = start + SETTLE;
            let others: Vec<&(&str, f64, f64)> = spans
                .iter()
                .filter(|(h, s, e)| *h != host && *s <= start - SETTLE && *e >= from)
                .collect();
            if others.is_empty() {
                continue;
            }
            // The steady window ends when the first of them stops: after that the share
            // changes.
            let to = others.iter().map(|(_, _, e)| *e).fold(stop, f64::min);
            if to - from < SETTLE {
                continue;
            }
            let series = |h: &str| {
                let mut sum = vec![0.0; here.iter().map(|f| f.series_bps.len()).max().unwrap_or(0)];
                for f in here.iter().filter(|f| f.host == h) {
                    for (a, b) in sum.iter_mut().zip(&f.series_bps) {
                        *a += b;
                    }
                }
                sum
            };
            let total: f64 = std::iter::once(host)
                .chain(others.iter().map(|(h, _, _)| *h))
                .map(|h| stats::mean_over(&series(h), BIN, from, to))
                .sum();
            let mine = series(host);
            let n = others.len() + 1;
            let share_bps = total / n as f64;
            if share_bps <= 0.0 {
                continue;
            }
            // Its first moments on its own clock: the flows that started with it, each per
            // 100 ms from its start.
            let mut own: Vec<f64> = Vec::new();
            for f in here
                .iter()
                .filter(|f| f.host == host && f.started_s - start < STARTED_WITH)
            {
                own.resize(own.len().max(f.own_series_bps.len()), 0.0);
                for (a, b) in own.iter_mut().zip(&f.own_series_bps) {
                    *a += b;
                }
            }
            let last = (((to - start) / BIN).ceil() as usize).min(own.len());
            let reached_s = (0..last)
                .find(|&i| own[i] >= REACHED * share_bps)
                .map(|i| (i + 1) as f64 * BIN);
            out.push(Join {
                host: host.to_string(),
                direction,
                started_s: start,
                hosts: n,
                share_bps,
                steady_ratio: stats::mean_over(&mine, BIN, from, to) / share_bps,
                reached_s,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Protocol;

    /// A flow with a constant rate (Mbit/s) between two times, on a 10 s run's grid.
    fn flow(host: &str, direction: FlowDirection, series: Vec<f64>, start: f64) -> FlowResult {
        FlowResult {
            id: format!("{host}.0"),
            host: host.into(),
            server: "server".into(),
            direction,
            protocol: Protocol::Tcp,
            cc: None,
            ecn: None,
            dscp: None,
            parallel: 1,
            started_s: start,
            stopped_s: 10.0,
            mean_bps: 0.0,
            connections_mean_bps: Vec::new(),
            retransmits: 0,
            lost_packets: None,
            packets: None,
            own_series_bps: series
                .iter()
                .skip((start / BIN).round() as usize)
                .map(|m| m * 1e6)
                .collect(),
            series_bps: series.iter().map(|m| m * 1e6).collect(),
            error: None,
        }
    }

    /// 100 bins: `before` Mbit/s until `at` s, then `after`.
    fn steps(at: f64, before: f64, after: f64) -> Vec<f64> {
        (0..100)
            .map(|i| {
                if (i as f64) * BIN < at - 1e-9 {
                    before
                } else {
                    after
                }
            })
            .collect()
    }

    #[test]
    fn a_late_host_reaches_its_share_when_its_sample_does() {
        let d = FlowDirection::Download;
        // a and b share 90 Mbit/s; c starts at 5.0 s, gets 10 in its first sample, 28 in its
        // second, 30 from then on, while a and b come down to 30.
        let mut c = steps(5.0, 0.0, 30.0);
        c[50] = 10.0;
        c[51] = 28.0;
        let flows = [
            flow("a", d, steps(5.0, 45.0, 30.0), 0.0),
            flow("b", d, steps(5.0, 45.0, 30.0), 0.0),
            flow("c", d, c, 5.0),
        ];
        let joins = analyse(&flows, 10.0);
        assert_eq!(joins.len(), 1, "only c joins: a and b started together");
        let j = &joins[0];
        assert_eq!((j.host.as_str(), j.hosts), ("c", 3));
        assert!((j.share_bps - 30e6).abs() < 1.0);
        assert!((j.steady_ratio - 1.0).abs() < 1e-9);
        // 28 >= 0.9 x 30: its second 100 ms.
        assert!((j.reached_s.unwrap() - 0.2).abs() < 1e-9);
    }

    #[test]
    fn a_starved_host_never_reaches_it_and_other_directions_do_not_count() {
        let d = FlowDirection::Download;
        let flows = [
            flow("a", d, steps(5.0, 90.0, 85.0), 0.0),
            flow("c", d, steps(5.0, 0.0, 5.0), 5.0),
            // An upload from c started at 0 s: no one else uploads, so it joins nothing, and
            // it does not make c's download a settled one.
            flow("c", FlowDirection::Upload, steps(0.0, 1.0, 1.0), 0.0),
        ];
        let joins = analyse(&flows, 10.0);
        assert_eq!(joins.len(), 1);
        assert_eq!(joins[0].reached_s, None);
        assert!((joins[0].share_bps - 45e6).abs() < 1.0);
        assert!((joins[0].steady_ratio - 5.0 / 45.0).abs() < 1e-9);
    }

    #[test]
    fn hosts_starting_together_are_not_joins() {
        let d = FlowDirection::Upload;
        let flows = [
            flow("a", d, steps(0.0, 0.0, 50.0), 0.5),
            flow("b", d, steps(0.0, 0.0, 50.0), 0.0),
        ];
        assert!(analyse(&flows, 10.0).is_empty());
    }
}
