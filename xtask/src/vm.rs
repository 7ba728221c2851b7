//! `cargo xtask vm`: boot a Debian kernel in qemu and run one command in it.
//!
//! The host kernel lacks sch_fq, CAKE and netem, so everything that needs them runs here. The
//! VM is a kernel, an initramfs (see `initramfs`) and a serial console: it boots in seconds,
//! streams the command's output, and exits with its status. Results can be brought back
//! through `--out DIR`: whatever the command writes to `$SHAPER_OUT` is tarred onto a raw
//! virtio disk at the end and unpacked into DIR on the host.

use std::os::unix::process::CommandExt as _;
use std::{
    collections::VecDeque,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicU32, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

pub use crate::kernel::Kernel;
use crate::{
    bootstrap, dist,
    initramfs::{self, EXIT_MARKER, RUN_DIR},
    kernel, run_status, workspace_root,
};

/// The emulated CPU under TCG. The plain qemu64 model is the fastest: with `max` or a modern
/// model the guest kernel picks AVX copy and checksum routines that TCG emulates slowly (veth
/// with fq, 4 TCP flows: 6.7 Gbit/s with qemu64, 1.7 with max, 1.5 with Skylake-Client).
const DEFAULT_CPU: &str = "qemu64";

#[derive(clap::Args)]
pub struct Options {
    /// Debian kernel to boot: 6.1 or 6.12.
    #[arg(long, default_value = "6.12")]
    pub kernel: Kernel,
    /// Host directory that receives what the command writes to $SHAPER_OUT.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Give up (and fail) after this many seconds.
    #[arg(long, default_value_t = 1800)]
    pub timeout: u64,
    /// Virtual CPUs.
    #[arg(long, default_value_t = 2)]
    pub smp: u32,
    /// Memory in MiB.
    #[arg(long, default_value_t = 2048)]
    pub mem: u32,
    /// More host files to copy next to SCRIPT (into /shaper/run).
    #[arg(long = "file")]
    pub files: Vec<PathBuf>,
    /// SCRIPT [ARGS]: a host file (copied in and run) or a command on the VM's PATH.
    #[arg(last = true, required = true, value_name = "SCRIPT")]
    pub command: Vec<String>,
}

pub struct VmSpec {
    pub kernel: Kernel,
    pub command: Vec<String>,
    pub files: Vec<PathBuf>,
    pub env: Vec<(String, String)>,
    pub out_dir: Option<PathBuf>,
    pub timeout: Duration,
    pub smp: u32,
    pub mem_mb: u32,
}

impl VmSpec {
    pub fn new(kernel: Kernel, command: Vec<String>) -> Self {
        VmSpec {
            kernel,
            command,
            files: Vec::new(),
            env: Vec::new(),
            out_dir: None,
            timeout: Duration::from_secs(1800),
            smp: 2,
            mem_mb: 2048,
        }
    }
}

pub fn run_cli(o: &Options) -> Result<()> {
    bootstrap::ensure()?;
    let spec = VmSpec {
        kernel: o.kernel,
        command: o.command.clone(),
        files: o.files.clone(),
        env: Vec::new(),
        out_dir: o.out.clone(),
        timeout: Duration::from_secs(o.timeout),
        smp: o.smp,
        mem_mb: o.mem,
    };
    let code = run(&spec)?;
    std::process::exit(code);
}

/// Boots the VM, runs the command, returns its exit status. Errors on a kernel panic, a
/// timeout, or a VM that stopped without reporting a status.
pub fn run(spec: &VmSpec) -> Result<i32> {
    static RUNS: AtomicU32 = AtomicU32::new(0);
    let root = workspace_root();
    let _one_at_a_time = exclusive_machine()?;
    let kernel = kernel::fetch(spec.kernel)?;
    let shaper = dist::build()?;
    let lab_probe = dist::build_lab_probe()?;
    let work = root.join("target/vm");
    std::fs::create_dir_all(&work)?;
    let id = format!(
        "{}-{}-{}",
        spec.kernel,
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    );

    let (command, files) = vm_command(spec)?;
    let cpio = work.join(format!("initramfs-{id}.cpio"));
    let disk = work.join(format!("out-{id}.img"));
    let _cleanup = Cleanup(vec![cpio.clone(), disk.clone()]);
    initramfs::build(
        &initramfs::Contents {
            kernel: &kernel,
            shaper: &shaper,
            lab_probe: &lab_probe,
            repo: &root,
            files: &files,
            command: &command,
            env: &spec.env,
            results_disk: spec.out_dir.is_some(),
        },
        &cpio,
    )?;

    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args([
        "-nodefaults",
        "-no-reboot",
        "-display",
        "none",
        "-monitor",
        "none",
        "-serial",
        "stdio",
    ]);
    // TCG by default: it works everywhere this project is built and is what the benchmarks
    // were measured with. SHAPER_VM_CPU picks the emulated CPU model.
    let cpu = std::env::var("SHAPER_VM_CPU").unwrap_or_else(|_| DEFAULT_CPU.to_string());
    match std::env::var("SHAPER_VM_ACCEL").as_deref() {
        Ok("kvm") => qemu.args(["-accel", "kvm", "-cpu", "host"]),
        _ => qemu.args(["-accel", "tcg,thread=multi", "-cpu", &cpu]),
    };
    qemu.arg("-m").arg(spec.mem_mb.to_string());
    qemu.arg("-smp").arg(spec.smp.to_string());
    qemu.arg("-kernel").arg(&kernel.vmlinuz);
    qemu.arg("-initrd").arg(&cpio);
    // tsc=reliable: TCG's TSC follows the host's monotonic clock on every vCPU, but the
    // clocksource watchdog, comparing it with the HPET while a vCPU thread is starved, finds it
    // "unstable" and switches; the switch patches kernel text (a static key) while the other
    // vCPU runs it, which under multi-threaded TCG has crashed the guest (an int3 Oops in
    // sched_clock_cpu, 12 s into a lab run on 6.12).
    qemu.arg("-append")
        .arg("console=ttyS0 quiet panic=-1 oops=panic random.trust_cpu=on tsc=reliable");
    if spec.out_dir.is_some() {
        std::fs::File::create(&disk)?.set_len(1 << 30)?;
        qemu.arg("-drive")
            .arg(format!("file={},format=raw,if=virtio", disk.display()));
    }
    let status = console(&mut qemu, spec.timeout);

    if let Some(out) = &spec.out_dir {
        // Whatever the VM checkpointed before a crash is unpacked too: a long lab run that
        // loses its guest keeps the runs it finished.
        match unpack_results(&disk, out) {
            Ok(false) if status.is_ok() => {
                bail!("the VM wrote no results to its disk (see the console above)")
            }
            Err(e) if status.is_ok() => return Err(e),
            // A guest that died mid-write leaves a torn tar; its death is the error to report.
            Err(e) => eprintln!("vm: salvaging results after the failure: {e:#}"),
            Ok(_) => {}
        }
    }
    status
}

/// The guest kernel died (panic, oops, double fault): the run's own fault or the emulator's,
/// the caller decides whether to boot again. Other errors (timeouts, qemu missing) are not this.
#[derive(Debug)]
pub struct GuestCrashed(pub String);

impl std::fmt::Display for GuestCrashed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the VM's kernel panicked; console tail:\n{}", self.0)
    }
}

impl std::error::Error for GuestCrashed {}

/// Unpacks the results disk (a tar the guest writes) into OUT; false when the guest wrote
/// nothing (an all-zero start: no disk, or it died before its first checkpoint).
fn unpack_results(disk: &Path, out: &Path) -> Result<bool> {
    std::fs::create_dir_all(out)?;
    let mut head = [0u8; 512];
    std::io::Read::read_exact(&mut std::fs::File::open(disk)?, &mut head)?;
    if head.iter().all(|&b| b == 0) {
        return Ok(false);
    }
    run_status(Command::new("tar").arg("-xf").arg(disk).arg("-C").arg(out))
        .context("unpacking the VM's results")?;
    Ok(true)
}

/// VMs on this machine run one at a time: two TCG guests sharing the host's cores would
/// measure each other, not the network. The lock is released when the returned file closes.
fn exclusive_machine() -> Result<std::fs::File> {
    let path = std::env::temp_dir().join("shaper-vm.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)?;
    if file.try_lock().is_err() {
        eprintln!("vm: waiting for another VM run on this machine to finish");
        file.lock()
            .with_context(|| format!("locking {}", path.display()))?;
    }
    Ok(file)
}

/// Rewrites the command for the VM: a first word naming a host file is copied into the VM.
fn vm_command(spec: &VmSpec) -> Result<(Vec<String>, Vec<PathBuf>)> {
    let mut command = spec.command.clone();
    let mut files = spec.files.clone();
    let first = command
        .first()
        .context("no command to run in the VM")?
        .clone();
    let path = Path::new(&first);
    if path.is_file() {
        let name = path
            .file_name()
            .context("script without a name")?
            .to_string_lossy();
        command[0] = format!("{RUN_DIR}/{name}");
        files.push(path.to_path_buf());
    } else if first.contains('/') {
        bail!("{first}: no such file");
    }
    let mut names = std::collections::HashSet::new();
    for f in &files {
        anyhow::ensure!(f.is_file(), "{}: no such file", f.display());
        anyhow::ensure!(
            names.insert(f.file_name().map(|n| n.to_owned())),
            "two files named {:?} for the VM",
            f.file_name().unwrap_or_default()
        );
    }
    Ok((command, files))
}

/// Runs qemu, streaming its serial console, until the exit marker, a panic or the timeout.
fn console(qemu: &mut Command, timeout: Duration) -> Result<i32> {
    // The guest dies with this process: a run interrupted (a signal, a killed test suite) must
    // not leave a VM running, unlocked, beside the next one.
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        qemu.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = qemu
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting qemu-system-x86_64")?;
    let stdout = child.stdout.take().context("qemu stdout")?;
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut buf = Vec::new();
        while reader.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
            let line = String::from_utf8_lossy(&buf)
                .trim_end_matches(['\r', '\n'])
                .to_string();
            if tx.send(line).is_err() {
                break;
            }
            buf.clear();
        }
    });

    let deadline = Instant::now() + timeout;
    let mut tail = VecDeque::new();
    let mut status = None;
    let mut panicked = false;
    let mut out = std::io::stdout();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(code) = line
                    .strip_prefix(EXIT_MARKER)
                    .and_then(|r| r.strip_suffix("@@"))
                {
                    status = code.trim().parse::<i32>().ok();
                    continue;
                }
                panicked |= line.contains("Kernel panic - not syncing");
                if status.is_some() && line.contains("reboot: Power down") {
                    continue;
                }
                let _ = writeln!(out, "{line}");
                tail.push_back(line);
                if tail.len() > 40 {
                    tail.pop_front();
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "the VM timed out after {} s; console tail:\n{}",
                    timeout.as_secs(),
                    join(&tail)
                );
            }
        }
    }
    let _ = child.wait();
    match status {
        Some(code) if !panicked => Ok(code),
        _ if panicked => Err(GuestCrashed(join(&tail)).into()),
        _ => bail!(
            "the VM stopped without reporting the command's status; console tail:\n{}",
            join(&tail)
        ),
    }
}

fn join(lines: &VecDeque<String>) -> String {
    lines
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Removes the run's temporary files however the run ends.
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}
