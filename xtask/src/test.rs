//! `cargo xtask test`: the whole test pyramid in one command.
//!
//! 1. Unit tests and BPF tests (`cargo test`): pure functions on the host, and the data path
//!    loaded into the running kernel through BPF_PROG_TEST_RUN (needs root); then, one at a
//!    time, the BPF tests that depend on real time (`tests/tests/timing`).
//! 2. The parsers' fuzz targets, [`FUZZ_SECONDS`] each (`cargo xtask fuzz` runs them longer);
//!    the OCI image (`cargo xtask image`), built twice alike and read back by skopeo.
//! 3. End to end in a VM on each Debian kernel (6.1: netlink/clsact attach; 6.12: TCX), with
//!    real TCP flows through fq and CAKE side by side: `tests/vm/e2e-*.sh`, each in its own
//!    boot so one failure cannot mask another (`--full` adds those that do not fit CI's time:
//!    [`VM_SCRIPTS`]). Then the bad-input test (`tests/tests/bad_input.rs`, built static) on
//!    each kernel's own verifier and BPF_PROG_TEST_RUN.
//! 4. The lab's own sanity on each kernel (`lab/sanity/*.toml`, one boot): an unconstrained path
//!    carries > 1 Gbit/s, CAKE at 50 Mbit/s measures 47-50, netem delay adds its RTT ± 1 ms.
//!
//! Ends with a `N passed, M failed` line and a non-zero exit if anything failed.

use std::{process::Command, time::Instant};

use anyhow::{Context, Result};

use crate::{
    bootstrap, dist, fuzz, image, lab,
    vm::{self, Kernel, VmSpec},
};

/// The test binary of the BPF tests that depend on real time (tests/tests/timing/main.rs):
/// not in a plain `cargo test`, run on its own.
const TIMING_TESTS: &str = "timing";

/// Seconds each fuzz target runs: enough to pass every seed and reach its shallow bugs again
/// (a million runs or more each).
const FUZZ_SECONDS: u64 = 10;

/// Which runs a VM test is part of. CI's run must finish in 90 minutes on a build machine
/// that may itself be busy (one has run the VM tests 2.4 times slower than an idle one).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Runs {
    /// Every `cargo xtask test` (CI's), on each kernel.
    Always,
    /// Every `cargo xtask test` on this kernel, on each with `--full`: what reads the same on
    /// both kernels (arithmetic, formats, settings) or was shown there.
    On(Kernel),
    /// Only `cargo xtask test --full`.
    Full,
}

impl Runs {
    fn includes(self, kernel: Kernel, full: bool) -> bool {
        match self {
            Runs::Always => true,
            Runs::On(k) => full || k == kernel,
            Runs::Full => full,
        }
    }
}

/// The VM end-to-end scripts, run on every kernel: which runs take each, the script and its
/// arguments.
const VM_SCRIPTS: &[(Runs, &[&str])] = &[
    (Runs::Always, &["tests/vm/e2e-rate.sh"]),
    (Runs::Always, &["tests/vm/e2e-restore.sh"]),
    (Runs::Always, &["tests/vm/e2e-ingress.sh"]),
    (Runs::Always, &["tests/vm/e2e-forward.sh"]),
    // Over IPv6 and IPv4: a dual-stack server is one host to its clients of both families,
    // also after it gains an address.
    (Runs::On(Kernel::V6_12), &["tests/vm/e2e-dualstack.sh"]),
    // `--nat` behind a masquerading router: the LAN machines are the hosts, beside CAKE's nat.
    (Runs::Always, &["tests/vm/e2e-nat.sh"]),
    // `--framing`: DOCSIS, PTM and ATM counted as CAKE counts them, beside CAKE; set in place.
    (Runs::On(Kernel::V6_12), &["tests/vm/e2e-framing.sh"]),
    (Runs::Always, &["tests/vm/e2e-ackfilter.sh"]),
    // `--log-datapath`: each kind of event logged within its rate limit, the rate held; none
    // without it.
    (Runs::On(Kernel::V6_1), &["tests/vm/e2e-logs.sh"]),
    (Runs::Always, &["tests/vm/e2e-accounting.sh"]),
    (Runs::Always, &["tests/vm/e2e-faults.sh"]),
    // `shaper doctor` where every piece is there: TCX on 6.12, the netlink fallback on 6.1.
    (Runs::Always, &["tests/vm/doctor.sh"]),
    (Runs::On(Kernel::V6_12), &["tests/vm/e2e-metrics.sh"]),
    // `shaper tune`: dry run, --apply, --persist (read back by procps' sysctl), --revert.
    (Runs::On(Kernel::V6_1), &["tests/vm/tune.sh"]),
    // Three interfaces in one `shaper run --config`, each at its own rate at once; one deleted
    // and re-created, re-shaped within 1 s; a reload that adds and removes interfaces.
    (Runs::Always, &["tests/vm/e2e-interfaces.sh"]),
    // CPU hogs on every CPU: one flow and 3 hosts x 8 flows, each direction, beside CAKE; at
    // 73 Mbit/s always, at 7 and 220 in the full run.
    (Runs::Always, &["tests/vm/e2e-busy.sh", "73"]),
    (Runs::Full, &["tests/vm/e2e-busy.sh", "7", "220"]),
    // A minute of the soak (docs/notebook/soak.md has the 30-minute runs).
    (Runs::Full, &["tests/vm/soak.sh", "60"]),
    // WireGuard and IP-in-IP tunnels beside CAKE.
    (Runs::Full, &["tests/vm/e2e-tunnels.sh"]),
];

/// The bad-input test in the VM, and the frames it runs per test there: a tenth of the full
/// run, which takes about 25 minutes a kernel under emulation (docs/notebook/bpf-fuzzing.md
/// has its command and results); the host's `cargo test` runs the full count.
const BPF_FUZZ_SCRIPT: &str = "tests/vm/bpf-fuzz.sh";
const BPF_FUZZ_FRAMES: &str = "100000";

#[derive(clap::Args)]
pub struct Options {
    /// Kernels for the VM tests (default: all).
    #[arg(long, value_delimiter = ',')]
    pub kernel: Vec<Kernel>,
    /// Only the unit and BPF tests (no VM).
    #[arg(long)]
    pub no_vm: bool,
    /// Also the VM tests that do not fit CI's time (about 25 minutes more).
    #[arg(long)]
    pub full: bool,
}

struct Outcome {
    name: String,
    passed: bool,
    seconds: f64,
}

pub fn run(o: &Options) -> Result<()> {
    bootstrap::ensure()?;
    let root = crate::workspace_root();
    let mut outcomes = Vec::new();
    let mut record = |name: String, started: Instant, passed: bool| {
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "{} {name} ({seconds:.0} s)",
            if passed { "PASS" } else { "FAIL" }
        );
        outcomes.push(Outcome {
            name,
            passed,
            seconds,
        });
    };

    let started = Instant::now();
    println!("== unit and BPF tests (cargo test)");
    let status = Command::new("cargo")
        .current_dir(&root)
        .args(["test", "--workspace", "--exclude", "shaper-ebpf"])
        .status()?;
    record(
        "unit and BPF_PROG_TEST_RUN tests".into(),
        started,
        status.success(),
    );

    let started = Instant::now();
    println!("== timing-dependent BPF tests (cargo test --test {TIMING_TESTS}, one at a time)");
    // One test at a time: these tests measure the real clock between test runs (a packet's
    // departure against the next one's, a bin's edge with a millisecond of margin), and on a
    // two-core machine a neighbouring test's work is a scheduling delay that moves them.
    let status = Command::new("cargo")
        .current_dir(&root)
        .args(["test", "-p", "shaper-tests", "--test", TIMING_TESTS, "--"])
        .arg("--test-threads=1")
        .status()?;
    record(
        "timing-dependent BPF_PROG_TEST_RUN tests".into(),
        started,
        status.success(),
    );

    println!("== fuzz targets ({FUZZ_SECONDS} s each)");
    let started = Instant::now();
    let passed = match fuzz::run_targets(&[], FUZZ_SECONDS) {
        Ok(outcomes) => outcomes.iter().all(|o| o.crash.is_none()),
        Err(e) => {
            eprintln!("{e:#}");
            false
        }
    };
    record(
        format!("fuzz targets, {FUZZ_SECONDS} s each"),
        started,
        passed,
    );

    println!("== the OCI image (cargo xtask image), read back by skopeo");
    let started = Instant::now();
    let passed = image_reads_back()
        .inspect_err(|e| eprintln!("{e:#}"))
        .is_ok();
    record("OCI image".into(), started, passed);

    if !o.no_vm {
        let kernels = if o.kernel.is_empty() {
            Kernel::ALL.to_vec()
        } else {
            o.kernel.clone()
        };
        let bpf_fuzz = dist::build_bpf_fuzz().inspect_err(|e| eprintln!("{e:#}"));
        for kernel in kernels {
            let scripts = VM_SCRIPTS
                .iter()
                .filter(|(runs, _)| runs.includes(kernel, o.full))
                .filter_map(|(_, c)| c.split_first());
            for (script, args) in scripts {
                let name = [&[*script], args].concat().join(" ");
                println!("== {name} on Linux {kernel}");
                let started = Instant::now();
                let command = std::iter::once(root.join(script).display().to_string())
                    .chain(args.iter().map(|a| a.to_string()))
                    .collect();
                let spec = VmSpec::new(kernel, command);
                let passed = script_passed(&spec, &name);
                record(format!("{name} on {kernel}"), started, passed);
            }
            let script = BPF_FUZZ_SCRIPT;
            println!("== {script} on Linux {kernel}");
            let started = Instant::now();
            let passed = bpf_fuzz.as_ref().is_ok_and(|binary| {
                let command = vec![
                    root.join(script).display().to_string(),
                    BPF_FUZZ_FRAMES.to_string(),
                ];
                let spec = VmSpec {
                    files: vec![binary.clone()],
                    ..VmSpec::new(kernel, command)
                };
                script_passed(&spec, script)
            });
            record(format!("{script} on {kernel}"), started, passed);
            println!("== lab sanity on Linux {kernel}");
            let started = Instant::now();
            let passed = lab::sanity(kernel)
                .inspect_err(|e| eprintln!("{e:#}"))
                .is_ok();
            record(format!("lab sanity on {kernel}"), started, passed);
        }
    }

    let failed: Vec<_> = outcomes.iter().filter(|o| !o.passed).collect();
    println!("\n== summary");
    for o in &outcomes {
        println!(
            "  {} {} ({:.0} s)",
            if o.passed { "ok    " } else { "FAILED" },
            o.name,
            o.seconds
        );
    }
    println!(
        "{} passed, {} failed",
        outcomes.len() - failed.len(),
        failed.len()
    );
    if !failed.is_empty() {
        anyhow::bail!("{} test group(s) failed", failed.len());
    }
    Ok(())
}

/// Runs one VM test script; false (and why, on stderr) when it failed.
fn script_passed(spec: &VmSpec, script: &str) -> bool {
    match run_vm_test(spec, script) {
        Ok(0) => true,
        Ok(code) => {
            eprintln!("{script} exited with {code}");
            false
        }
        Err(e) => {
            eprintln!("{script}: {e:#}");
            false
        }
    }
}

/// Boots the VM for one test script, and boots it once more if the guest kernel crashed.
///
/// Under multi-threaded TCG the guest kernel has crashed while patching its own text: a static
/// key flipped while another vCPU ran the same code (int3 Oopses in `sched_clock_cpu`, and in
/// `netif_receive_skb` with the faulting address inside the patched jump, both on 6.12).
/// `tsc=reliable` removes the clocksource watchdog's flip; clsact's and timestamping's keys
/// still flip in every test's set-up. That is an emulator fault no BPF program can cause (the
/// verifier keeps BPF from writing kernel text); a crash of ours would repeat, and one more
/// boot tells them apart. The crash is printed either way and a second one fails the test.
fn run_vm_test(spec: &VmSpec, script: &str) -> Result<i32> {
    match vm::run(spec) {
        Err(e) if e.is::<vm::GuestCrashed>() => {
            eprintln!("{script}: {e:#}");
            eprintln!("{script}: the VM's kernel crashed; booting it again once");
            vm::run(spec)
        }
        other => other,
    }
}

/// `cargo xtask image` twice: the same digest; and skopeo, as an engine reads it, finds the
/// manifest of that digest and copies every blob out.
fn image_reads_back() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("shaper-image-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let archive = dir.join("image.tar");
    let (_, _, digest) = image::build(Some("localhost/shaper:test"), Some(&archive))?;
    let (_, _, again) = image::build(Some("localhost/shaper:test"), Some(&archive))?;
    anyhow::ensure!(
        digest == again,
        "two builds of one commit: {digest} and {again}"
    );
    let reference = format!("oci-archive:{}", archive.display());
    let raw = Command::new("skopeo")
        .args(["inspect", "--raw", &reference])
        .output()
        .context("running skopeo")?;
    anyhow::ensure!(
        raw.status.success(),
        "skopeo inspect: {}",
        String::from_utf8_lossy(&raw.stderr)
    );
    let read = image::sha256(&raw.stdout);
    anyhow::ensure!(
        read == digest,
        "skopeo read manifest {read}, written {digest}"
    );
    let copied = dir.join("copy");
    let status = Command::new("skopeo")
        .args(["copy", "--quiet", &reference])
        .arg(format!("dir:{}", copied.display()))
        .status()?;
    anyhow::ensure!(status.success(), "skopeo copy failed");
    std::fs::remove_dir_all(&dir)?;
    println!("image {digest}: built twice alike, read back by skopeo");
    Ok(())
}
