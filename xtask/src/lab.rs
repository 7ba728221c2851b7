//! `cargo xtask lab`: the lab crate (`lab/`, shaper-lab) run on the project's VM.

use anyhow::Result;
use shaper_lab::{Boot, Job, Machine};

use crate::{
    bootstrap,
    initramfs::RUN_DIR,
    vm::{self, GuestCrashed, Kernel, VmSpec},
};

pub use shaper_lab::Options;

/// The qemu VM of `cargo xtask vm`, booting one of the Debian kernels.
pub struct Vm;

impl Machine for Vm {
    fn check_kernel(&self, kernel: &str) -> Result<()> {
        parse(kernel).map(|_| ())
    }

    fn prepare(&self) -> Result<()> {
        bootstrap::ensure()
    }

    fn files_dir(&self) -> &str {
        RUN_DIR
    }

    fn boot(&self, kernel: &str, job: &Job) -> Result<Boot> {
        let spec = VmSpec {
            files: job.files.clone(),
            out_dir: Some(job.out_dir.clone()),
            timeout: job.timeout,
            ..VmSpec::new(parse(kernel)?, job.command.clone())
        };
        match vm::run(&spec) {
            Ok(code) => Ok(Boot::Exited(code)),
            Err(e) if e.is::<GuestCrashed>() => Ok(Boot::Crashed),
            Err(e) => Err(e),
        }
    }
}

fn parse(kernel: &str) -> Result<Kernel> {
    kernel.parse().map_err(anyhow::Error::msg)
}

pub fn run(o: &Options) -> Result<()> {
    shaper_lab::run(o, &Vm)
}

/// The lab's own sanity on `kernel` (`cargo xtask test`).
pub fn sanity(kernel: Kernel) -> Result<()> {
    shaper_lab::sanity::run(&kernel.to_string(), &Vm)
}
