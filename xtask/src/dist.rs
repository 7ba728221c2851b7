//! The static `shaper` binary: x86_64 musl, BPF object embedded, no dynamic loader; and the
//! lab's `lab-probe`, built the same way for the VM.

use std::{path::PathBuf, process::Command};

use anyhow::{Context, Result, bail};

use crate::{bootstrap, run_status, workspace_root};

pub const TARGET: &str = "x86_64-unknown-linux-musl";

#[derive(clap::Args)]
pub struct Options {}

pub fn run(_o: &Options) -> Result<PathBuf> {
    bootstrap::ensure()?;
    let path = build()?;
    println!("{}", path.display());
    Ok(path)
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
    let root = workspace_root();
    run_status(Command::new("cargo").current_dir(&root).args([
        "build",
        "--quiet",
        "--release",
        "--target",
        TARGET,
        "-p",
        package,
    ]))
    .with_context(|| format!("building the static {package} binary"))?;
    let path = root
        .join("target")
        .join(TARGET)
        .join("release")
        .join(package);
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
