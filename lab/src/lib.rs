//! The lab: run scenarios against shaper, CAKE and no shaping, side by side, and report.
//! `cargo xtask lab` is its command line. See docs/lab.md for the scenario format and what is
//! measured.
//!
//! `lab run` checks every scenario file, writes one plan per (scenario, contender) (see
//! `plan`), boots one [`Machine`] (the caller's: `cargo xtask lab` passes the project's VM)
//! that runs them all through `lab/runner.sh`, then turns the raw files that come back into
//! per-run JSON (`results`, with `queues` for the sampled backlogs), a table, Markdown and PNG
//! plots (`report`, `plot`). `lab report DIR` regenerates the lab section of
//! docs/lab-results.md from a run.

mod dscp;
mod hostload;
mod joins;
mod machine;
mod nstat;
mod plan;
mod plot;
mod queues;
mod report;
mod results;
pub mod sanity;
mod scenario;
mod stats;
mod transfers;
mod units;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context, Result, bail, ensure};

pub use machine::{Boot, Job, Machine};
pub use results::RunResult;

#[derive(clap::Args)]
pub struct Options {
    #[command(subcommand)]
    command: LabCommand,
}

#[derive(clap::Subcommand)]
enum LabCommand {
    /// Run scenarios in one VM boot, each under every selected contender; print the table and
    /// write per-run JSON, a Markdown report and PNG plots.
    Run(RunOptions),
    /// Check scenario files without running them (and print the plans with --plans).
    Check {
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// Print the generated plan of every contender.
        #[arg(long)]
        plans: bool,
    },
    /// Regenerate the lab section of docs/lab-results.md (and docs/lab/*.png) from a run's
    /// output directory.
    Report {
        #[arg(value_name = "DIR")]
        dir: PathBuf,
        /// The Markdown file to update between `<!-- lab:begin -->` and `<!-- lab:end -->`.
        #[arg(long, default_value = "docs/lab-results.md")]
        doc: PathBuf,
    },
}

#[derive(clap::Args, Clone)]
pub struct RunOptions {
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Contenders to run, by kind (shaper, cake, fq_codel, fq, none) or by name (default: all
    /// of each scenario's).
    #[arg(long, value_delimiter = ',')]
    pub compare: Vec<String>,
    /// Debian kernel to boot: 6.1 or 6.12.
    #[arg(long, default_value = "6.12")]
    pub kernel: String,
    /// Output directory (default: target/lab/run-<unix time>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Override every scenario's repetitions.
    #[arg(long)]
    pub repetitions: Option<u32>,
    /// Override every scenario's `queue_interval` (e.g. 10ms; 0s: never sample): to see where
    /// a shipped scenario's queues stand without a copy of it.
    #[arg(long, value_name = "DURATION")]
    pub queue_interval: Option<String>,
    /// Another shaper build (a static binary, e.g. an earlier commit's `cargo xtask dist`) to
    /// measure beside this tree's in the same boot: every shaper contender also runs as
    /// NAME@baseline with it.
    #[arg(long, value_name = "BINARY")]
    pub baseline: Option<PathBuf>,
}

/// Runs one `lab` command; `lab run` boots `machine`.
pub fn run(o: &Options, machine: &dyn Machine) -> Result<()> {
    match &o.command {
        LabCommand::Run(r) => run_lab(r, machine).map(|_| ()),
        LabCommand::Check { files, plans } => check(files, *plans),
        LabCommand::Report { dir, doc } => {
            let root = workspace_root();
            report::update_doc(dir, &root.join(doc), &root.join("docs/lab"))
        }
    }
}

/// The repository's root: the lab's scenarios, its runner and its default paths
/// (docs/lab-results.md, target/lab/) are in it.
fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the lab is inside the workspace")
}

fn load_all(files: &[PathBuf]) -> Result<Vec<scenario::Scenario>> {
    let mut out: Vec<scenario::Scenario> = Vec::new();
    for f in files {
        let s = scenario::load(f)?;
        ensure!(
            out.iter().all(|o| o.name != s.name),
            "two scenarios are named {:?}",
            s.name
        );
        out.push(s);
    }
    Ok(out)
}

fn check(files: &[PathBuf], plans: bool) -> Result<()> {
    for s in load_all(files)? {
        println!(
            "{}: ok ({} hosts, {} flows, {} probes, contenders: {})",
            s.name,
            s.hosts.len(),
            s.flows.len(),
            s.probes.len() + s.transfers.len(),
            s.contenders
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        if plans {
            for c in &s.contenders {
                println!("{}", plan::generate(&s, c));
            }
        }
    }
    Ok(())
}

/// The scenarios with what `lab run`'s options override in every one of them.
fn with_overrides(
    mut scenarios: Vec<scenario::Scenario>,
    o: &RunOptions,
) -> Result<Vec<scenario::Scenario>> {
    if let Some(n) = o.repetitions {
        ensure!(
            (1..=100).contains(&n),
            "--repetitions must be between 1 and 100"
        );
        for s in &mut scenarios {
            s.repetitions = n;
        }
    }
    if let Some(v) = &o.queue_interval {
        let seconds = units::seconds(v)
            .and_then(scenario::checked_queue_interval)
            .with_context(|| format!("--queue-interval {v}"))?;
        for s in &mut scenarios {
            s.queue_interval = seconds;
        }
    }
    if o.baseline.is_some() {
        for s in &mut scenarios {
            let baselines: Vec<_> = s
                .contenders
                .iter()
                .filter(|c| c.kind == scenario::Kind::Shaper)
                .map(|c| scenario::Contender {
                    name: format!("{}@baseline", c.name),
                    binary: Some(BASELINE_FILE.to_string()),
                    ..c.clone()
                })
                .collect();
            s.contenders.extend(baselines);
        }
    }
    Ok(scenarios)
}

/// The baseline build's name beside the plans in the VM (`RunOptions::baseline`).
const BASELINE_FILE: &str = "shaper-baseline";

/// Seconds a run takes beyond its duration: topology, the idle lead-in, teardown.
const RUN_OVERHEAD_S: f64 = 15.0;

/// Runs the lab on `machine`; returns the results of every run (failed ones included) and the
/// output dir.
pub fn run_lab(o: &RunOptions, machine: &dyn Machine) -> Result<(Vec<RunResult>, PathBuf)> {
    machine.check_kernel(&o.kernel).context("--kernel")?;
    let scenarios = with_overrides(load_all(&o.files)?, o)?;
    let mut work: Vec<(&scenario::Scenario, &scenario::Contender)> = Vec::new();
    for s in &scenarios {
        let chosen = s.selected(&o.compare);
        if chosen.is_empty() {
            eprintln!(
                "lab: {}: no contender matches --compare {} (it has {})",
                s.name,
                o.compare.join(","),
                s.contenders
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        work.extend(chosen.into_iter().map(|c| (s, c)));
    }
    ensure!(
        !work.is_empty(),
        "nothing to run: no contender matches --compare"
    );
    machine.prepare()?;

    let root = workspace_root();
    let out = match &o.out {
        Some(d) => d.clone(),
        None => root.join(format!(
            "target/lab/run-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_secs()
        )),
    };
    let plans_dir = out.join("plans");
    let raw = out.join("raw");
    for d in [&plans_dir, &raw] {
        if d.exists() {
            std::fs::remove_dir_all(d).with_context(|| format!("clearing {}", d.display()))?;
        }
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let mut files = Vec::new();
    let mut seconds = 0.0;
    for (i, (s, c)) in work.iter().enumerate() {
        let path = plans_dir.join(plan_name(i));
        std::fs::write(&path, plan::generate(s, c))?;
        files.push(path);
        seconds += (s.duration + RUN_OVERHEAD_S) * s.repetitions as f64;
    }
    if let Some(b) = &o.baseline {
        let copy = plans_dir.join(BASELINE_FILE);
        std::fs::copy(b, &copy).with_context(|| format!("--baseline {}", b.display()))?;
        files.push(copy);
    }
    let manifest_path = plans_dir.join("manifest");
    files.push(manifest_path.clone());
    let command = std::env::args().collect::<Vec<_>>();
    let command = format!(
        "cargo xtask {}",
        command.get(1..).unwrap_or_default().join(" ")
    );
    std::fs::write(out.join("command.txt"), format!("{command}\n"))?;

    println!(
        "lab: {} runs, about {:.0} min in the VM (Linux {}); results in {}",
        work.iter().map(|(s, _)| s.repetitions).sum::<u32>(),
        seconds / 60.0,
        o.kernel,
        out.display()
    );
    let guest_dir = machine.files_dir();
    let mut job = Job {
        command: vec![
            root.join("lab/runner.sh").display().to_string(),
            format!("{guest_dir}/manifest"),
        ],
        files,
        out_dir: raw.clone(),
        timeout: Duration::ZERO,
    };
    // The tree as it is when the VM starts is what is measured.
    let git_commit = git_commit(root);
    let load_before = host_load();
    let sampler = hostload::start();
    // Every run still to run, in the order the boot runs them; a guest crash ends a boot, and
    // the next boot resumes after the run it hit.
    let mut pending = run_order(&work);
    let max_crashes = crash_budget(pending.len());
    let mut crashes = 0;
    let mut crashed_once = Vec::new();
    let outcome = loop {
        let mut manifest = String::new();
        let mut seconds = 0.0;
        for &(i, rep) in &pending {
            let (s, c) = work[i];
            manifest.push_str(&format!(
                "{guest_dir}/{} {} {} {rep} {}\n",
                plan_name(i),
                s.name,
                c.name,
                s.duration.ceil()
            ));
            seconds += s.duration + RUN_OVERHEAD_S;
        }
        std::fs::write(&manifest_path, &manifest)?;
        // Generous: TCG is slow to set topologies up, and a stuck run is killed by the runner.
        job.timeout = Duration::from_secs_f64(seconds * 2.0 + 300.0);
        match machine.boot(&o.kernel, &job) {
            Ok(Boot::Crashed) => {
                crashes += 1;
                if crashes > max_crashes {
                    let lost = give_up(&raw, &work, &pending, crashes)?;
                    eprintln!(
                        "lab: the VM's kernel crashed {crashes} times; {lost} run(s) not run \
                         (reported as failed), reporting the rest"
                    );
                    break Ok(0);
                }
                pending = after_crash(&raw, &work, &pending, &mut crashed_once)?;
                if pending.is_empty() {
                    break Ok(0);
                }
                eprintln!(
                    "lab: the VM's kernel crashed (crash {crashes} of at most \
                     {max_crashes}); booting again for the {} run(s) left",
                    pending.len()
                );
            }
            Ok(Boot::Exited(code)) => break Ok(code),
            Err(e) => break Err(e),
        }
    };
    let host_samples = sampler.finish();
    let code = outcome?;
    let host_load = (load_before, self::host_load());
    if code != 0 {
        eprintln!("lab: the in-VM runner exited with {code}; reporting what it left");
    }
    ensure!(
        raw.join("lab").is_dir(),
        "the VM brought no results back (nothing under {}): its results disk did not work",
        raw.display()
    );

    let kernel = std::fs::read_to_string(raw.join("lab/kernel"))
        .map(|k| k.trim().to_string())
        .unwrap_or_else(|_| o.kernel.clone());
    let mut all = Vec::new();
    for (s, c) in &work {
        for rep in 1..=s.repetitions {
            let dir = run_dir(&raw, s, c, rep);
            let r = results::analyse(&results::Context {
                scenario: s,
                contender: c,
                repetition: rep,
                run_index: all.len(),
                dir,
                kernel: kernel.clone(),
                git_commit: git_commit.clone(),
                host_load,
                host_samples: &host_samples,
            })
            .with_context(|| format!("analysing {} / {} / {rep}", s.name, c.name))?;
            let path = out
                .join("results")
                .join(&s.name)
                .join(format!("{}-{rep}.json", c.name));
            write_json(&path, &r)?;
            all.push(r);
        }
    }
    report::write_run_report(&out, &all, &command)?;
    Ok((all, out))
}

/// Guest crashes one `lab run` of `runs` runs survives (each costs a boot; a run hit twice is
/// failed) before giving up on the runs left: the emulated guest dies on its own about once in
/// 15-40 runs (an `int3` oops in code the kernel was patching, a double fault in the slab
/// allocator, under CAKE as under shaper), so a long lab gets one boot more per 10 runs; a
/// kernel that keeps dying beyond that is the finding.
fn crash_budget(runs: usize) -> u32 {
    u32::try_from(runs / 10).unwrap_or(u32::MAX).max(2)
}

/// Out of crashes: every pending run without a status is recorded as failed, not run, so the
/// runs that finished are still analysed and reported. Returns how many were lost.
fn give_up(
    raw: &Path,
    work: &[(&scenario::Scenario, &scenario::Contender)],
    pending: &[(usize, u32)],
    crashes: u32,
) -> Result<usize> {
    let mut lost = 0;
    for &(i, rep) in pending {
        let (s, c) = work[i];
        let dir = run_dir(raw, s, c, rep);
        if dir.join("status").is_file() {
            continue;
        }
        // A run the crash interrupted left part of its files; none of them is a result.
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        record_failed(
            &dir,
            &format!(
                "not run: the VM's kernel crashed {crashes} times during this lab (see the \
                 console), more than it is given boots for"
            ),
        )?;
        lost += 1;
    }
    Ok(lost)
}

fn plan_name(i: usize) -> String {
    format!("plan-{i:03}.sh")
}

/// The runs of every (scenario, contender) in `work`, as (index into `work`, repetition): a
/// scenario's contenders take turns, repetition by repetition, so that a slow stretch of the
/// emulator (they come and go over minutes) falls on every contender alike rather than on
/// whichever ran all its repetitions then.
fn run_order(work: &[(&scenario::Scenario, &scenario::Contender)]) -> Vec<(usize, u32)> {
    let mut runs = Vec::new();
    let mut start = 0;
    while start < work.len() {
        let s = work[start].0;
        let end = start
            + work[start..]
                .iter()
                .take_while(|(t, _)| t.name == s.name)
                .count();
        for rep in 1..=s.repetitions {
            runs.extend((start..end).map(|i| (i, rep)));
        }
        start = end;
    }
    runs
}

/// After a guest crash: the first pending run without a status is the one the crash hit. The
/// first time a run is hit, the next boot runs it again: the emulated guest dies on its own
/// now and then (an `int3` oops in code the kernel was patching, under TCG), and a lab sanity
/// check that lost its only run to that failed the whole test suite. Hit twice, it is recorded
/// as failed (a kernel that dies on the same run is the finding), and the next boot runs the
/// ones after it. `crashed_once` remembers the runs hit so far.
fn after_crash(
    raw: &Path,
    work: &[(&scenario::Scenario, &scenario::Contender)],
    pending: &[(usize, u32)],
    crashed_once: &mut Vec<(usize, u32)>,
) -> Result<Vec<(usize, u32)>> {
    let Some(hit) = pending.iter().position(|&(i, rep)| {
        let (s, c) = work[i];
        !run_dir(raw, s, c, rep).join("status").is_file()
    }) else {
        return Ok(Vec::new());
    };
    let (i, rep) = pending[hit];
    let (s, c) = work[i];
    let dir = run_dir(raw, s, c, rep);
    if !crashed_once.contains(&(i, rep)) {
        crashed_once.push((i, rep));
        // What the interrupted run left must not mix with its rerun's results.
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        eprintln!(
            "lab: {} / {} / repetition {rep}: the VM's kernel crashed; running it again",
            s.name, c.name
        );
        return Ok(pending[hit..].to_vec());
    }
    record_failed(
        &dir,
        "the VM's kernel crashed during this run, twice (see the console); the lab booted \
         again for the runs after it",
    )?;
    eprintln!(
        "lab: {} / {} / repetition {rep}: the VM's kernel crashed again",
        s.name, c.name
    );
    Ok(pending[hit + 1..].to_vec())
}

/// Records a run the VM did not finish as failed, with `reason`, as the runner records the
/// runs it fails (`status`: the verdict, then why).
fn record_failed(dir: &Path, reason: &str) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("status"), format!("failed\n{reason}\n"))?;
    Ok(())
}

/// Where the VM leaves one run's raw results.
fn run_dir(raw: &Path, s: &scenario::Scenario, c: &scenario::Contender, rep: u32) -> PathBuf {
    raw.join("lab")
        .join(&s.name)
        .join(&c.name)
        .join(rep.to_string())
}

fn write_json(path: &Path, v: &impl serde::Serialize) -> Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(v)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// The commit results were measured at, marked `-dirty` when the tree had changes.
fn git_commit(root: &Path) -> String {
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&["status", "--porcelain"]).is_some_and(|s| !s.is_empty());
    if dirty { format!("{head}-dirty") } else { head }
}

/// The host's 1-minute load average (0 when unknown).
fn host_load() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Reads every per-run JSON under DIR/results.
pub fn load_results(dir: &Path) -> Result<Vec<RunResult>> {
    let base = dir.join("results");
    let mut out = Vec::new();
    let scenarios = std::fs::read_dir(&base).with_context(|| {
        format!(
            "{}: no results here (is it a `lab run` output directory?)",
            base.display()
        )
    })?;
    for s in scenarios.flatten() {
        for f in std::fs::read_dir(s.path())?.flatten() {
            let p = f.path();
            if p.extension().is_some_and(|e| e == "json") {
                let text = std::fs::read_to_string(&p)?;
                out.push(
                    serde_json::from_str(&text)
                        .with_context(|| format!("reading {}", p.display()))?,
                );
            }
        }
    }
    if out.is_empty() {
        bail!("{}: no results", base.display());
    }
    out.sort_by_key(|r: &RunResult| r.run_index);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contenders_take_turns_repetition_by_repetition() {
        let dir = workspace_root().join("lab/scenarios");
        let mut a = scenario::load(&dir.join("bulk-latency-ecn.toml")).unwrap();
        let mut b = scenario::load(&dir.join("low-rate-tso.toml")).unwrap();
        a.repetitions = 2;
        b.repetitions = 3;
        let work: Vec<_> = [(&a, 0), (&a, 1), (&b, 0)]
            .into_iter()
            .map(|(s, c)| (s, &s.contenders[c]))
            .collect();
        assert_eq!(
            run_order(&work),
            [(0, 1), (1, 1), (0, 2), (1, 2), (2, 1), (2, 2), (2, 3)]
        );
    }

    #[test]
    fn a_baseline_runs_every_shaper_contender_again_with_its_own_binary() {
        let dir = workspace_root().join("lab/scenarios");
        let o = RunOptions {
            files: vec![dir.join("bulk-latency.toml")],
            compare: vec![],
            kernel: "6.12".into(),
            out: None,
            repetitions: None,
            queue_interval: None,
            baseline: Some(PathBuf::from("/tmp/shaper-old")),
        };
        let plain = load_all(&o.files).unwrap();
        let scenarios = with_overrides(load_all(&o.files).unwrap(), &o).unwrap();
        let shapers = |s: &scenario::Scenario| {
            s.contenders
                .iter()
                .filter(|c| c.kind == scenario::Kind::Shaper)
                .count()
        };
        let (before, after) = (&plain[0], &scenarios[0]);
        assert!(shapers(before) > 0);
        assert_eq!(shapers(after), 2 * shapers(before));
        assert_eq!(
            after.contenders.len(),
            before.contenders.len() + shapers(before)
        );
        for c in before
            .contenders
            .iter()
            .filter(|c| c.kind == scenario::Kind::Shaper)
        {
            let twin = after
                .contenders
                .iter()
                .find(|b| b.name == format!("{}@baseline", c.name))
                .unwrap();
            assert_eq!(twin.binary.as_deref(), Some(BASELINE_FILE));
            assert_eq!(twin.options, c.options);
            let plan = plan::generate(after, twin);
            assert!(
                plan.contains(&format!("LAB_SHAPER_BIN={BASELINE_FILE}\nlab_shaper ")),
                "{plan}"
            );
            assert!(!plan::generate(after, c).contains("LAB_SHAPER_BIN"));
        }
        // `--compare shaper` picks both builds.
        assert_eq!(
            after.selected(&["shaper".to_string()]).len(),
            2 * shapers(before)
        );
    }

    #[test]
    fn run_options_override_every_scenario_and_reject_bad_values() {
        let dir = workspace_root().join("lab/scenarios");
        let files = vec![
            dir.join("diffserv-tins.toml"),
            dir.join("low-rate-tso.toml"),
        ];
        let options = |repetitions, queue_interval: &str| RunOptions {
            files: files.clone(),
            compare: vec![],
            kernel: "6.12".into(),
            out: None,
            repetitions,
            queue_interval: Some(queue_interval.to_string()),
            baseline: None,
        };
        let o = options(Some(3), "10ms");
        let scenarios = with_overrides(load_all(&o.files).unwrap(), &o).unwrap();
        assert_eq!(scenarios.len(), 2);
        for s in &scenarios {
            assert_eq!(s.repetitions, 3);
            assert!(
                (s.queue_interval - 0.01).abs() < 1e-9,
                "{}",
                s.queue_interval
            );
        }
        let o = options(None, "0s");
        let scenarios = with_overrides(load_all(&o.files).unwrap(), &o).unwrap();
        assert!(scenarios.iter().all(|s| s.queue_interval == 0.0));
        for (repetitions, interval, says) in [
            (None, "5ms", "--queue-interval 5ms"),
            (None, "11s", "--queue-interval 11s"),
            (None, "soon", "--queue-interval soon"),
            (Some(0), "10ms", "--repetitions must be between 1 and 100"),
        ] {
            let o = options(repetitions, interval);
            let err = with_overrides(load_all(&o.files).unwrap(), &o).unwrap_err();
            assert!(format!("{err:#}").contains(says), "{err:#}");
        }
    }

    /// A lab of two contenders whose boot crashed during its second run: the first finished
    /// (`ok`), the second left half its files. Returns the scenario and the raw results' dir.
    fn lab_crashed_in_second_run(tag: &str) -> (scenario::Scenario, PathBuf) {
        let dir = workspace_root().join("lab/scenarios");
        let s = scenario::load(&dir.join("bulk-latency-ecn.toml")).unwrap();
        let raw = std::env::temp_dir().join(format!("shaper-{tag}-{}", std::process::id()));
        let done = run_dir(&raw, &s, &s.contenders[0], 1);
        std::fs::create_dir_all(&done).unwrap();
        std::fs::write(done.join("status"), "ok\n").unwrap();
        let hit = run_dir(&raw, &s, &s.contenders[1], 1);
        std::fs::create_dir_all(&hit).unwrap();
        std::fs::write(hit.join("log"), "half a run\n").unwrap();
        (s, raw)
    }

    #[test]
    fn a_run_a_crash_hits_runs_again_once_then_fails() {
        let (s, raw) = lab_crashed_in_second_run("after-crash");
        let work = vec![(&s, &s.contenders[0]), (&s, &s.contenders[1])];
        let hit_dir = run_dir(&raw, &s, &s.contenders[1], 1);
        let pending = [(0, 1), (1, 1), (0, 2), (1, 2)];
        let mut crashed_once = Vec::new();
        let first = after_crash(&raw, &work, &pending, &mut crashed_once).unwrap();
        let cleared = !hit_dir.exists();
        let second = after_crash(&raw, &work, &first, &mut crashed_once).unwrap();
        let hit = std::fs::read_to_string(hit_dir.join("status"));
        std::fs::remove_dir_all(&raw).unwrap();
        assert_eq!(first, [(1, 1), (0, 2), (1, 2)], "run again");
        assert!(
            cleared,
            "the interrupted run's files are gone before its rerun"
        );
        assert_eq!(second, [(0, 2), (1, 2)], "hit twice: failed, the rest run");
        assert!(hit.unwrap().starts_with("failed\n"));
    }

    #[test]
    fn out_of_crashes_the_runs_left_are_failed_and_the_finished_kept() {
        let (s, raw) = lab_crashed_in_second_run("give-up");
        let work = vec![(&s, &s.contenders[0]), (&s, &s.contenders[1])];
        let done = run_dir(&raw, &s, &s.contenders[0], 1);
        let hit = run_dir(&raw, &s, &s.contenders[1], 1);
        let lost = give_up(&raw, &work, &[(0, 1), (1, 1), (0, 2)], 5).unwrap();
        let status = |d: &Path| std::fs::read_to_string(d.join("status")).unwrap();
        let kept = status(&done);
        let failed = [
            status(&hit),
            status(&run_dir(&raw, &s, &s.contenders[0], 2)),
        ];
        let half_gone = !hit.join("log").exists();
        std::fs::remove_dir_all(&raw).unwrap();
        assert_eq!(lost, 2);
        assert_eq!(kept, "ok\n", "a finished run is kept");
        assert!(failed.iter().all(|f| f.starts_with("failed\nnot run")));
        assert!(
            half_gone,
            "an interrupted run's files are not taken for results"
        );
    }

    #[test]
    fn a_long_lab_gets_more_boots() {
        assert_eq!(crash_budget(1), 2);
        assert_eq!(crash_budget(46), 4);
        assert_eq!(crash_budget(200), 20);
    }
}
