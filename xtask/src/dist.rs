//! The static `shaper` binary: x86_64 musl, BPF object embedded, no dynamic loader, with its
//! man pages and shell completions beside it; and, built the same way for the VM, the lab's
//! `lab-probe` and the bad-input test.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use crate::{bootstrap, run_quiet, workspace_root};

pub const TARGET: &str = "x86_64-unknown-linux-musl";

/// One static, non-PIE executable (`file`: "statically linked"), so that it runs unchanged in
/// the test VM, in a scratch container image, or on any x86_64 Linux.
const STATIC_RUSTFLAGS: &[&str] = &[
    "-C",
    "target-feature=+crt-static",
    "-C",
    "relocation-model=static",
];

/// The flags of a static build: [`STATIC_RUSTFLAGS`], and the checkout's and cargo's own
/// directories named the same wherever they are, so that a commit builds the same bytes in
/// any clone (the image's digest, `image`, depends on it).
fn static_rustflags() -> String {
    let mut flags: Vec<String> = STATIC_RUSTFLAGS.iter().map(|f| f.to_string()).collect();
    let mut remap = |from: &std::path::Path, to: &str| {
        flags.push(format!("--remap-path-prefix={}={to}", from.display()));
    };
    remap(&workspace_root(), "/shaper");
    if let Some(home) = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
    {
        remap(&home, "/cargo");
    }
    flags.join("\x1f")
}

/// The bad-input test's static build, as the VM scripts find it (tests/vm/bpf-fuzz.sh).
pub const BPF_FUZZ_BINARY: &str = "bpf-fuzz";

#[derive(clap::Args)]
pub struct Options {
    /// Build the bad-input test (tests/tests/bad_input.rs: BPF_PROG_TEST_RUN on random and
    /// mutated frames) instead, for `cargo xtask vm --file PATH -- tests/vm/bpf-fuzz.sh`.
    #[arg(long)]
    pub bpf_fuzz: bool,
}

pub fn run(o: &Options) -> Result<PathBuf> {
    bootstrap::ensure()?;
    let path = if o.bpf_fuzz {
        build_bpf_fuzz()?
    } else {
        let binary = build()?;
        write_manuals(&binary)?;
        binary
    };
    // The binary's path alone on stdout, for `$(cargo xtask dist)`.
    println!("{}", path.display());
    Ok(path)
}

/// Writes the man pages (`man/`) and shell completions (`completions/`) beside `binary`, from
/// its command-line definition, by shaper's `manuals` example (xtask cannot link the shaper
/// library: building it needs the BPF toolchain that xtask installs).
fn write_manuals(binary: &Path) -> Result<()> {
    let dir = binary.parent().context("a binary without a directory")?;
    let manuals = cargo_static(
        &["build", "-p", "shaper", "--example", "manuals"],
        "manuals",
    )
    .context("building the man page and completion writer")?;
    run_quiet(Command::new(manuals).arg(dir))?;
    eprintln!(
        "man pages in {}, shell completions in {}",
        dir.join("man").display(),
        dir.join("completions").display()
    );
    Ok(())
}

/// Builds the release binary and checks that it is statically linked.
pub fn build() -> Result<PathBuf> {
    build_static("shaper")
}

/// The lab's request/response probe (`lab-probe/`), built the same way for the VM.
pub fn build_lab_probe() -> Result<PathBuf> {
    build_static("lab-probe")
}

/// Builds PACKAGE's binary of the same name for the static musl target and checks that it
/// needs no dynamic loader: the VM and scratch containers have none.
fn build_static(package: &str) -> Result<PathBuf> {
    cargo_static(&["build", "-p", package], package)
        .with_context(|| format!("building the static {package} binary"))
}

/// The bad-input test as a static binary, copied to [`BPF_FUZZ_BINARY`] beside the release
/// binaries: cargo names a test binary by a hash, and the VM copies files in by name.
pub fn build_bpf_fuzz() -> Result<PathBuf> {
    let built = cargo_static(
        &[
            "test",
            "-p",
            "shaper-tests",
            "--test",
            "bad_input",
            "--no-run",
        ],
        "bad_input",
    )
    .context("building the static bad-input test")?;
    let path = built
        .parent()
        .and_then(Path::parent)
        .context("a test binary outside cargo's deps directory")?
        .join(BPF_FUZZ_BINARY);
    std::fs::copy(&built, &path)
        .with_context(|| format!("copying {} to {}", built.display(), path.display()))?;
    Ok(path)
}

/// Runs `cargo ARGS` for the static musl target in release mode and returns the executable it
/// built for the target named `name`, where cargo says it put it (`CARGO_TARGET_DIR` moves
/// it), once checked to be static.
fn cargo_static(args: &[&str], name: &str) -> Result<PathBuf> {
    let out = Command::new("cargo")
        .current_dir(workspace_root())
        .env("CARGO_ENCODED_RUSTFLAGS", static_rustflags())
        .args(args)
        .args([
            "--quiet",
            "--release",
            "--target",
            TARGET,
            "--message-format=json",
        ])
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo")?;
    if !out.status.success() {
        bail!("cargo {} failed ({})", args.join(" "), out.status);
    }
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .with_context(|| format!("cargo built no executable named {name}"))?;
    let elf = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    if has_interpreter(&elf)? {
        bail!(
            "{} is dynamically linked (it has a PT_INTERP program header)",
            path.display()
        );
    }
    Ok(path)
}

/// Whether an ELF64 little-endian file asks for a dynamic loader.
fn has_interpreter(elf: &[u8]) -> Result<bool> {
    const PT_INTERP: u32 = 3;
    if elf.len() < 64 || &elf[..4] != b"\x7fELF" || elf[4] != 2 {
        bail!("not an ELF64 file");
    }
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[32..40].try_into()?) as usize;
    let (phentsize, phnum) = (u16_at(54), u16_at(56));
    for i in 0..phnum {
        let off = phoff + i * phentsize;
        let p_type =
            u32::from_le_bytes(elf.get(off..off + 4).context("truncated ELF")?.try_into()?);
        if p_type == PT_INTERP {
            return Ok(true);
        }
    }
    Ok(false)
}
