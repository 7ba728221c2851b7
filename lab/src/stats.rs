//! The statistics every report uses: Jain's fairness index, percentiles, the spread of
//! repetitions, and turning iperf3's interval byte counts into a throughput series on a fixed
//! 100 ms grid.

use serde::{Deserialize, Serialize};

/// Jain's fairness index of `xs`: (Σx)² / (n·Σx²); 1 when all are equal, 1/n when one takes
/// everything. None for an empty set or all zeros (nobody got anything: fairness is undefined).
pub fn jain(xs: &[f64]) -> Option<f64> {
    let n = xs.len() as f64;
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    (n > 0.0 && sq > 0.0).then(|| sum * sum / (n * sq))
}

/// The p-th percentile (0-100) by linear interpolation between closest ranks (numpy's
/// default), of samples in any order. None when there are no samples.
pub fn percentile(samples: &[f64], p: f64) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    Some(percentile_sorted(&v, p))
}

fn percentile_sorted(v: &[f64], p: f64) -> f64 {
    let rank = (p.clamp(0.0, 100.0) / 100.0) * (v.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    v[lo] + (v[hi] - v[lo]) * (rank - lo as f64)
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub count: usize,
    /// The low decile: what a path delivers without the emulator's timer lateness.
    #[serde(default)]
    pub p10: Option<f64>,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub mean: Option<f64>,
}

pub fn summary(samples: &[f64]) -> Summary {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let at = |p| (!v.is_empty()).then(|| percentile_sorted(&v, p));
    Summary {
        count: v.len(),
        p10: at(10.0),
        p50: at(50.0),
        p90: at(90.0),
        p99: at(99.0),
        mean: (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64),
    }
}

/// Several repetitions of one measurement: their mean and, when there are two or more, their
/// sample standard deviation (n − 1 in the denominator: the repetitions are a sample of what
/// the set-up would measure, not all of it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub mean: f64,
    pub sd: Option<f64>,
}

/// None when there are no values.
pub fn spread(xs: &[f64]) -> Option<Spread> {
    if xs.is_empty() {
        return None;
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let sd = (xs.len() > 1)
        .then(|| (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt());
    Some(Spread { mean, sd })
}

/// Bytes counted over [start, end) seconds.
#[derive(Debug, Clone, Copy)]
pub struct Interval {
    pub start: f64,
    pub end: f64,
    pub bytes: f64,
}

/// Spreads each interval's bytes over the `bin`-second grid in proportion to the overlap
/// (iperf3's intervals drift off the grid by the connection set-up time), and returns bits/s
/// per bin for `bins` bins from time zero. Intervals outside the grid are clipped.
pub fn binned_bps(intervals: &[Interval], bin: f64, bins: usize) -> Vec<f64> {
    let mut out = vec![0.0; bins];
    for iv in intervals {
        let len = iv.end - iv.start;
        if len <= 0.0 || iv.bytes <= 0.0 {
            continue;
        }
        let first = (iv.start / bin).floor().max(0.0) as usize;
        let last = ((iv.end / bin).ceil().max(0.0) as usize).min(bins);
        for (b, slot) in out.iter_mut().enumerate().take(last).skip(first) {
            let lo = (b as f64 * bin).max(iv.start);
            let hi = ((b + 1) as f64 * bin).min(iv.end);
            if hi > lo {
                *slot += iv.bytes * (hi - lo) / len;
            }
        }
    }
    out.iter().map(|bytes| bytes * 8.0 / bin).collect()
}

/// Mean of the bins whose start lies in [from, to).
pub fn mean_over(series: &[f64], bin: f64, from: f64, to: f64) -> f64 {
    let sel: Vec<f64> = series
        .iter()
        .enumerate()
        .filter(|(i, _)| {
            let t = *i as f64 * bin;
            t >= from - 1e-9 && t < to - 1e-9
        })
        .map(|(_, v)| *v)
        .collect();
    if sel.is_empty() {
        0.0
    } else {
        sel.iter().sum::<f64>() / sel.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn jain_index() {
        assert!(close(jain(&[5.0, 5.0, 5.0]).unwrap(), 1.0));
        assert!(close(jain(&[1.0, 0.0, 0.0, 0.0]).unwrap(), 0.25));
        // The seed: one host with 1 flow vs one with 10, fair per flow: 9.09 vs 90.9.
        assert!(close(
            jain(&[100.0 / 11.0, 1000.0 / 11.0]).unwrap(),
            121.0 / 202.0
        ));
        assert_eq!(jain(&[]), None);
        assert_eq!(jain(&[0.0, 0.0]), None);
    }

    #[test]
    fn percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).rev().collect();
        assert!(close(percentile(&v, 50.0).unwrap(), 50.5));
        assert!(close(percentile(&v, 99.0).unwrap(), 99.01));
        assert!(close(percentile(&v, 0.0).unwrap(), 1.0));
        assert!(close(percentile(&v, 100.0).unwrap(), 100.0));
        assert!(close(percentile(&[7.0], 90.0).unwrap(), 7.0));
        assert_eq!(percentile(&[], 50.0), None);
        let s = summary(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(s.count, 4);
        assert!(close(s.p50.unwrap(), 2.5));
        assert!(close(s.mean.unwrap(), 2.5));
        assert_eq!(summary(&[]).p99, None);
    }

    #[test]
    fn spread_of_repetitions() {
        assert_eq!(spread(&[]), None);
        assert_eq!(
            spread(&[4.0]),
            Some(Spread {
                mean: 4.0,
                sd: None
            })
        );
        let s = spread(&[2.0, 4.0, 9.0]).unwrap();
        assert!(close(s.mean, 5.0));
        // Squares 9 + 1 + 16 over n - 1 = 2.
        assert!(close(s.sd.unwrap(), 13f64.sqrt()));
    }

    #[test]
    fn binning() {
        // 1250 bytes in each of two aligned 100 ms intervals: 100 kbit/s each.
        let ivs = [
            Interval {
                start: 0.0,
                end: 0.1,
                bytes: 1250.0,
            },
            Interval {
                start: 0.1,
                end: 0.2,
                bytes: 1250.0,
            },
        ];
        let b = binned_bps(&ivs, 0.1, 3);
        assert!(close(b[0], 100e3) && close(b[1], 100e3) && close(b[2], 0.0));
        // An interval straddling two bins splits in proportion.
        let b = binned_bps(
            &[Interval {
                start: 0.05,
                end: 0.15,
                bytes: 1000.0,
            }],
            0.1,
            2,
        );
        assert!(close(b[0], 40e3) && close(b[1], 40e3));
        // Clipped at the end of the grid; nothing lost before it.
        let b = binned_bps(
            &[Interval {
                start: 0.15,
                end: 0.35,
                bytes: 2000.0,
            }],
            0.1,
            3,
        );
        assert!(close(b[1], 40e3) && close(b[2], 80e3));
        assert!(close(mean_over(&[1.0, 2.0, 3.0, 4.0], 0.1, 0.1, 0.3), 2.5));
    }
}
