//! What the data path costs in CPU: the kernel's own run-time statistics of shaper's programs,
//! sampled over a window. CAKE's cost hides in the qdisc (and its root lock); ours is measured
//! per program, so an operator can tell the shaper's share of a busy CPU from the stack's.
//!
//! The kernel counts a program's runs and time only while someone holds a `BPF_ENABLE_STATS`
//! descriptor (two clock reads per run: not free, so never left on). A program entered by a
//! tail call is not counted on its own: its time is in the program that called it, so the
//! programs attached to the hooks carry the whole data path.

use std::{thread::sleep, time::Duration};

use aya::{
    programs::{ProgramError, loaded_programs},
    sys::{Stats, enable_stats},
};
use serde::Serialize;

/// One program's counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub id: u32,
    pub name: String,
    pub runs: u64,
    pub run_time_ns: u64,
}

/// One program's cost over a window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProgramCost {
    pub name: String,
    pub id: u32,
    pub runs: u64,
    pub runs_per_s: f64,
    pub ns_per_run: f64,
    /// Share of one CPU's time spent in the program (and what it tail-calls).
    pub cpu_percent: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CostReport {
    pub window_s: f64,
    /// Programs that ran in the window; tail-called ones are counted in their callers.
    pub programs: Vec<ProgramCost>,
    pub total_cpu_percent: f64,
}

/// Counters of the loaded programs that use the map `map_id` (one shaper instance's).
pub fn sample(map_id: u32) -> Result<Vec<Sample>, ProgramError> {
    let mut samples = Vec::new();
    for info in loaded_programs() {
        let info = info?;
        let uses_map = info.map_ids()?.is_some_and(|ids| ids.contains(&map_id));
        if uses_map {
            samples.push(Sample {
                id: info.id(),
                name: info.name_as_str().unwrap_or("?").to_string(),
                runs: info.run_count(),
                run_time_ns: info.run_time().as_nanos() as u64,
            });
        }
    }
    Ok(samples)
}

/// Enables the kernel's run-time statistics for `window`, and reports what shaper's programs
/// (those using `map_id`) cost in it.
pub fn measure(map_id: u32, window: Duration) -> anyhow::Result<CostReport> {
    let _enabled = enable_stats(Stats::RunTime)
        .map_err(|e| anyhow::anyhow!("enabling BPF run-time statistics: {e}"))?;
    let before = sample(map_id)?;
    if before.is_empty() {
        anyhow::bail!("no loaded BPF program uses map {map_id}: is shaper still running?");
    }
    sleep(window);
    let after = sample(map_id)?;
    Ok(report(&before, &after, window))
}

/// The difference between two samples: programs that ran in between, costliest first.
pub fn report(before: &[Sample], after: &[Sample], window: Duration) -> CostReport {
    let window_s = window.as_secs_f64();
    let mut programs: Vec<ProgramCost> = after
        .iter()
        .filter_map(|a| {
            let b = before.iter().find(|b| b.id == a.id)?;
            let runs = a.runs.checked_sub(b.runs).filter(|r| *r > 0)?;
            let ns = a.run_time_ns.saturating_sub(b.run_time_ns) as f64;
            Some(ProgramCost {
                name: a.name.clone(),
                id: a.id,
                runs,
                runs_per_s: runs as f64 / window_s,
                ns_per_run: ns / runs as f64,
                cpu_percent: 100.0 * ns / 1e9 / window_s,
            })
        })
        .collect();
    programs.sort_by(|x, y| y.cpu_percent.total_cmp(&x.cpu_percent));
    let total_cpu_percent = programs.iter().map(|p| p.cpu_percent).sum();
    CostReport {
        window_s,
        programs,
        total_cpu_percent,
    }
}

impl CostReport {
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "data path cost over {:.1} s (a tail-called program is counted in its caller):\n",
            self.window_s
        );
        if self.programs.is_empty() {
            out.push_str("  no packets: no program ran\n");
        }
        for p in &self.programs {
            out.push_str(&format!(
                "  {:<20} {:>10.0} runs/s {:>8.0} ns/run {:>6.2} % of a CPU\n",
                p.name, p.runs_per_s, p.ns_per_run, p.cpu_percent
            ));
        }
        out.push_str(&format!(
            "  total {:.2} % of a CPU\n",
            self.total_cpu_percent
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(id: u32, runs: u64, run_time_ns: u64) -> Sample {
        Sample {
            id,
            name: format!("p{id}"),
            runs,
            run_time_ns,
        }
    }

    #[test]
    fn the_window_is_the_difference_costliest_first() {
        let before = [s(1, 100, 50_000), s(2, 10, 1_000), s(3, 5, 500)];
        // 3 did not run (tail-called); 4 was loaded during the window.
        let after = [
            s(1, 1_100, 550_000),
            s(2, 3_010, 3_001_000),
            s(3, 5, 500),
            s(4, 9, 9),
        ];
        let r = report(&before, &after, Duration::from_millis(500));
        let names: Vec<&str> = r.programs.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["p2", "p1"]);
        assert_eq!(r.programs[0].runs, 3_000);
        assert_eq!(r.programs[0].runs_per_s, 6_000.0);
        assert_eq!(r.programs[0].ns_per_run, 1_000.0);
        // 3 ms of 0.5 s.
        assert!((r.programs[0].cpu_percent - 0.6).abs() < 1e-9);
        assert_eq!(r.programs[1].ns_per_run, 500.0);
        assert!((r.total_cpu_percent - 0.7).abs() < 1e-9);
    }

    #[test]
    fn counters_that_went_back_are_not_a_cost() {
        // A program unloaded and its id reused by another: fewer runs than before.
        let r = report(
            &[s(1, 100, 1_000)],
            &[s(1, 10, 100)],
            Duration::from_secs(1),
        );
        assert!(r.programs.is_empty());
        assert!(r.to_text().contains("no program ran"));
    }
}
