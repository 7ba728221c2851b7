//! `cargo xtask demo`: shape a veth link and print the rate unshaped, shaped, and after.
//!
//! Runs on this machine when its kernel has sch_fq (root and iperf3 needed, which bootstrap
//! installs), otherwise in the test VM.

use std::{path::Path, process::Command};

use anyhow::{Context, Result};

use crate::{
    bootstrap, dist,
    vm::{self, Kernel, VmSpec},
};

const SCRIPT: &str = "tests/vm/demo.sh";

#[derive(clap::Args)]
pub struct Options {
    /// Rate to shape to.
    #[arg(long, default_value = "100mbit")]
    pub rate: String,
    /// Kernel for the VM (when the host kernel lacks sch_fq).
    #[arg(long, default_value = "6.12")]
    pub kernel: Kernel,
    /// Use the VM even if this kernel could run the demo.
    #[arg(long)]
    pub vm: bool,
}

pub fn run(o: &Options) -> Result<()> {
    bootstrap::ensure()?;
    let root = crate::workspace_root();
    let script = root.join(SCRIPT);
    if !o.vm && host_has_fq() {
        let shaper = dist::build()?;
        let bin_dir = shaper.parent().context("dist binary has no directory")?;
        let path = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let status = Command::new("sh")
            .arg(&script)
            .arg(&o.rate)
            .env("PATH", path)
            .status()?;
        anyhow::ensure!(status.success(), "the demo failed");
        return Ok(());
    }
    println!(
        "this kernel has no sch_fq: running the demo in a VM with Linux {}",
        o.kernel
    );
    let spec = VmSpec::new(o.kernel, vec![script.display().to_string(), o.rate.clone()]);
    let code = vm::run(&spec)?;
    anyhow::ensure!(code == 0, "the demo failed in the VM (exit {code})");
    Ok(())
}

/// Whether this kernel has the fq qdisc, built in or as a module.
fn host_has_fq() -> bool {
    if Path::new("/sys/module/sch_fq").exists() {
        return true;
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let modules = Path::new("/lib/modules").join(release.trim());
    ["modules.builtin", "modules.dep"]
        .iter()
        .any(|f| std::fs::read_to_string(modules.join(f)).is_ok_and(|t| t.contains("/sch_fq.ko")))
}
