//! A histogram as Prometheus reads one: counts per bucket under fixed upper bounds, the last
//! bucket open-ended (`+Inf`), and the sum of what was observed.

/// Counts per bucket (not cumulative: the exposition adds them up), `counts.len()` being
/// `upper_bounds.len() + 1`, the last for everything above the last bound.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// Bucket upper bounds in the metric's unit, increasing.
    pub upper_bounds: Vec<f64>,
    pub counts: Vec<u64>,
    pub sum: f64,
}

impl Histogram {
    pub fn new(upper_bounds: &[f64]) -> Self {
        debug_assert!(upper_bounds.windows(2).all(|w| w[0] < w[1]));
        Self {
            upper_bounds: upper_bounds.to_vec(),
            counts: vec![0; upper_bounds.len() + 1],
            sum: 0.0,
        }
    }

    /// Counts `value` in the first bucket whose bound it does not exceed (Prometheus's `le`).
    pub fn observe(&mut self, value: f64) {
        let bucket = self
            .upper_bounds
            .iter()
            .position(|&b| value <= b)
            .unwrap_or(self.upper_bounds.len());
        self.counts[bucket] += 1;
        self.sum += value;
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// (upper bound, observations at or below it) per bucket, `None` standing for `+Inf`.
    pub fn cumulative(&self) -> impl Iterator<Item = (Option<f64>, u64)> + '_ {
        let bounds = self.upper_bounds.iter().map(|&b| Some(b)).chain([None]);
        bounds.zip(self.counts.iter().scan(0u64, |total, &n| {
            *total += n;
            Some(*total)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them() {
        let mut h = Histogram::new(&[0.001, 0.01]);
        for v in [0.0005, 0.001, 0.002, 5.0] {
            h.observe(v);
        }
        assert_eq!(h.counts, vec![2, 1, 1]);
        assert_eq!(h.count(), 4);
        assert!((h.sum - 5.0035).abs() < 1e-12);
        let c: Vec<_> = h.cumulative().collect();
        assert_eq!(c, vec![(Some(0.001), 2), (Some(0.01), 3), (None, 4)]);
    }
}
