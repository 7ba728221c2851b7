//! The machine the lab's plans run on. The lab writes plans and reads what comes back; booting
//! a kernel with the tools a plan calls (ip, tc, iperf3, ping, shaper, lab-probe) is the
//! caller's. `cargo xtask lab` passes the project's qemu VM (xtask/src/lab.rs).

use std::{path::PathBuf, time::Duration};

use anyhow::Result;

/// One boot's work: run `command` with `files` beside it, bring back what it wrote.
pub struct Job {
    /// The command line run in the guest (its paths are guest paths).
    pub command: Vec<String>,
    /// Host files copied into [`Machine::files_dir`] under their file names.
    pub files: Vec<PathBuf>,
    /// Host directory that receives what the command wrote to `$SHAPER_OUT`, including what it
    /// saved before a crash.
    pub out_dir: PathBuf,
    /// The boot fails once it has run this long.
    pub timeout: Duration,
}

/// How a boot ended, when it ended by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boot {
    /// The command exited with this status.
    Exited(i32),
    /// The guest's kernel died (panic, oops): the lab decides whether to boot again.
    Crashed,
}

pub trait Machine {
    /// Fails unless `kernel` names a kernel this machine boots (e.g. "6.12").
    fn check_kernel(&self, kernel: &str) -> Result<()>;
    /// Installs what a boot needs; idempotent, called before the first boot.
    fn prepare(&self) -> Result<()>;
    /// Where a [`Job`]'s files are in the guest.
    fn files_dir(&self) -> &str;
    /// Boots `kernel` and runs `job`. Errors (a timeout, a missing tool) are not a crash.
    fn boot(&self, kernel: &str, job: &Job) -> Result<Boot>;
}
