//! `cargo xtask fuzz [--seconds N] [TARGET...]`: the parsers' fuzz targets (`fuzz/`, one per
//! parser; each target's header says what it checks), run with cargo-fuzz on the nightly
//! toolchain for N seconds each. A target starts from its seeds (`fuzz/seeds/TARGET`, real
//! inputs) and the corpus earlier runs grew (`fuzz/corpus/TARGET`, not committed), with its
//! dictionary (`fuzz/dicts/TARGET.dict`) when it has one. Any crash fails the task, naming the
//! input that caused it (`fuzz/artifacts/TARGET/`); libFuzzer's output is in `fuzz/logs/`.

use std::{
    fs,
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, Result, bail};

use crate::{bootstrap, run_quiet, run_status};

const NIGHTLY: &str = "+nightly";

#[derive(clap::Args)]
pub struct Options {
    /// Seconds to run each target.
    #[arg(long, default_value_t = 600)]
    pub seconds: u64,
    /// Targets to run (default: all of them).
    pub targets: Vec<String>,
}

/// One target's run.
pub struct Outcome {
    pub target: String,
    pub runs: u64,
    pub seconds: f64,
    /// CPU time the fuzzer used: below `seconds` when the machine is shared, or when it was
    /// stopped for a while (the time limit is wall-clock).
    pub cpu_seconds: f64,
    /// Inputs in its corpus at the end (seeds included).
    pub corpus: u64,
    /// The input that crashed it, if one did.
    pub crash: Option<String>,
    /// It ended on a timeout that did not recur when its input ran alone: the fuzzer was
    /// stopped or starved, and ran for less than it was given.
    pub stalled: bool,
}

pub fn run(o: &Options) -> Result<()> {
    bootstrap::ensure()?;
    let outcomes = run_targets(&o.targets, o.seconds)?;
    let crashed = outcomes.iter().filter(|o| o.crash.is_some()).count();
    if crashed > 0 {
        bail!("{crashed} fuzz target(s) crashed");
    }
    Ok(())
}

/// Builds the targets and runs each of `targets` (all when empty) for `seconds`, printing a
/// summary line per target. An error is a failure to build or start them, not a crash.
pub fn run_targets(targets: &[String], seconds: u64) -> Result<Vec<Outcome>> {
    let root = crate::workspace_root();
    let fuzz_dir = root.join("fuzz");
    // Without a sanitizer: the targets and the parsers they call are safe Rust, where
    // AddressSanitizer finds nothing that bounds and overflow checks (on in these builds) do
    // not; it would only slow every execution.
    run_status(cargo_fuzz(&root).args(["build", "--sanitizer", "none"]))
        .context("building the fuzz targets")?;
    let targets = if targets.is_empty() {
        run_quiet(cargo_fuzz(&root).arg("list"))?
            .lines()
            .map(str::to_string)
            .collect()
    } else {
        targets.to_vec()
    };
    let logs = fuzz_dir.join("logs");
    fs::create_dir_all(&logs)?;
    let mut outcomes = Vec::new();
    for target in &targets {
        let outcome = run_target(
            &root,
            &fuzz_dir,
            target,
            seconds,
            &logs.join(format!("{target}.log")),
        )?;
        print_summary(&outcome);
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

fn cargo_fuzz(root: &Path) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root).args([NIGHTLY, "fuzz"]);
    cmd
}

fn run_target(
    root: &Path,
    fuzz_dir: &Path,
    target: &str,
    seconds: u64,
    log: &Path,
) -> Result<Outcome> {
    let corpus = fuzz_dir.join("corpus").join(target);
    fs::create_dir_all(&corpus)?;
    let mut cmd = cargo_fuzz(root);
    cmd.args(["run", "--sanitizer", "none", target])
        .arg(&corpus);
    let seeds = fuzz_dir.join("seeds").join(target);
    if seeds.is_dir() {
        cmd.arg(&seeds);
    }
    // An input that takes seconds is a hang: a parser's work is linear in its input.
    cmd.args([
        "--",
        &format!("-max_total_time={seconds}"),
        "-timeout=10",
        "-print_final_stats=1",
    ]);
    let dict = fuzz_dir.join("dicts").join(format!("{target}.dict"));
    if dict.is_file() {
        cmd.arg(format!("-dict={}", dict.display()));
    }
    let output = fs::File::create(log)?;
    let started = Instant::now();
    let cpu_before = children_cpu_seconds();
    let status = cmd
        .stdin(Stdio::null())
        .stdout(output.try_clone()?)
        .stderr(output)
        .status()
        .with_context(|| format!("cannot run cargo fuzz for {target}"))?;
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_seconds = children_cpu_seconds() - cpu_before;
    let text = fs::read_to_string(log).unwrap_or_default();
    let mut crash = (!status.success()).then(|| failing_input(&text, &status, log));
    // libFuzzer times an input by the wall clock, so a fuzzer stopped or starved for a while
    // on a shared machine blames whatever input it was running then. Such an input runs again
    // alone before it fails the target: a real hang recurs.
    let stalled = match crash.as_deref() {
        Some(input) if is_timeout(input) => {
            let recurs = !cargo_fuzz(root)
                .args([
                    "run",
                    "--sanitizer",
                    "none",
                    target,
                    input,
                    "--",
                    "-timeout=10",
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()?
                .success();
            if !recurs {
                crash = None;
            }
            !recurs
        }
        _ => false,
    };
    if crash.is_some() {
        print_failure(&text);
    }
    Ok(Outcome {
        target: target.to_string(),
        runs: after(&text, "stat::number_of_executed_units:")
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0),
        // libFuzzer's own count (it leaves out building and loading the corpus).
        seconds: after(&text, " runs in ")
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(elapsed),
        cpu_seconds,
        corpus: after(&text, " corp: ")
            .and_then(|v| v.split('/').next()?.parse().ok())
            .unwrap_or(0),
        crash,
        stalled,
    })
}

/// The input that made a target fail, as libFuzzer saved it.
fn failing_input(text: &str, status: &std::process::ExitStatus, log: &Path) -> String {
    after(text, "Test unit written to ")
        .map(|path| path.trim().to_string())
        .unwrap_or_else(|| format!("no input saved ({status}), see {}", log.display()))
}

/// Prints what made a target fail: the panic's message, or libFuzzer's own (a timeout, memory).
fn print_failure(text: &str) {
    let lines: Vec<_> = text.lines().collect();
    let from = lines
        .iter()
        .position(|l| {
            ["panicked at", "ALARM:", "ERROR: libFuzzer"]
                .iter()
                .any(|m| l.contains(m))
        })
        .unwrap_or(lines.len().saturating_sub(20));
    for line in lines[from..]
        .iter()
        .take_while(|l| !l.starts_with("stack backtrace"))
        .take(12)
    {
        eprintln!("  {line}");
    }
}

fn is_timeout(input: &str) -> bool {
    Path::new(input)
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("timeout-"))
}

/// User and system time of the children this process has waited for, and of theirs (cargo
/// waits for the fuzzer).
fn children_cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        usage
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// The rest of the last line of `text` that has `marker`, after it.
fn after<'a>(text: &'a str, marker: &str) -> Option<&'a str> {
    text.lines()
        .rev()
        .find_map(|l| l.split_once(marker).map(|(_, rest)| rest))
}

fn print_summary(o: &Outcome) {
    let verdict = match &o.crash {
        Some(input) => format!("CRASH: {input}"),
        None if o.stalled => "ok, but stalled: a timeout that did not recur alone ended it".into(),
        None => "ok".into(),
    };
    println!(
        "fuzz {}: {} runs in {:.0} s ({:.0}/s; {:.0} s of CPU), corpus {} inputs: {verdict}",
        o.target,
        o.runs,
        o.seconds,
        o.runs as f64 / o.seconds.max(1e-9),
        o.cpu_seconds,
        o.corpus,
    );
}
