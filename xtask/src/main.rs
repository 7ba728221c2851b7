//! Project tasks: `cargo xtask <task>`. Every task installs what it needs first (see `bootstrap`),
//! so a fresh clone goes from nothing to a result with one command.

mod bootstrap;
mod cpio;
mod demo;
mod dist;
mod fuzz;
mod image;
mod initramfs;
mod k8s;
mod kernel;
mod lab;
mod test;
mod vm;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "shaper project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the toolchain pieces and packages the project needs (idempotent).
    Bootstrap(bootstrap::Options),
    /// Build the static `shaper` binary (x86_64 musl, BPF object embedded).
    Dist(dist::Options),
    /// Build the OCI image of the static binary, as an OCI archive (reproducible; prints its
    /// digest).
    Image(image::Options),
    /// Boot a Debian kernel in qemu and run SCRIPT inside it with ip, tc, iperf3, ping and shaper.
    Vm(vm::Options),
    /// Run the whole test suite: unit, BPF (BPF_PROG_TEST_RUN) and VM end-to-end tests.
    Test(test::Options),
    /// Fuzz the parsers (rates, durations, sizes, the config file, TCP options, DSCPs).
    Fuzz(fuzz::Options),
    /// Shape a link in the VM and print the measured rate unshaped vs shaped.
    Demo(demo::Options),
    /// Run scenarios against shaper, CAKE and no shaping; write results and reports.
    Lab(lab::Options),
    /// Check the Kubernetes manifests (deploy/kubernetes) against a real API server.
    K8s(k8s::Options),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Bootstrap(o) => bootstrap::run(&o),
        Task::Dist(o) => dist::run(&o).map(|_| ()),
        Task::Image(o) => image::run(&o),
        Task::Vm(o) => vm::run_cli(&o),
        Task::Test(o) => test::run(&o),
        Task::Fuzz(o) => fuzz::run(&o),
        Task::Demo(o) => demo::run(&o),
        Task::Lab(o) => lab::run(&o),
        Task::K8s(o) => k8s::run(&o),
    }
}

/// The repository's root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is inside the workspace")
        .to_path_buf()
}

/// Where downloads and built artefacts that outlive `target/` go: `$XDG_CACHE_HOME/shaper`
/// or `~/.cache/shaper` (`SHAPER_CACHE` overrides).
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SHAPER_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"));
    base.join("shaper")
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs a command, returns its stdout; on failure the error carries its stderr.
pub fn run_quiet(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", describe(cmd)))?;
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            describe(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command with inherited output; fails on a non-zero exit.
pub fn run_status(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {}", describe(cmd)))?;
    if !status.success() {
        bail!("{} failed ({status})", describe(cmd));
    }
    Ok(())
}
