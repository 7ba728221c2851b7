//! The command line: every subcommand and its options, as `main` parses them and as the man
//! pages and shell completions (`examples/manuals.rs`) describe them.

use clap::{Parser, Subcommand};

use crate::cmd;

/// What `--version` prints after the name: the crate's version and the commit it was built
/// from (`-dirty` when the tree had changes; `unknown` without git), from `build.rs`.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("SHAPER_GIT_COMMIT"),
    ")"
);

/// A CAKE-class traffic shaper on eBPF: EDT stamping in BPF, pacing by fq.
#[derive(Parser)]
#[command(name = "shaper", version = VERSION)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Shape an interface until interrupted (SIGINT/SIGTERM), then restore it.
    Run(Box<cmd::run::RunArgs>),
    /// Show the counters of the shaper running on an interface.
    Stats(cmd::stats::StatsArgs),
    /// Change settings of the shaper running on an interface in place (its qdisc and programs
    /// stay, fq keeps its packets); prints what changed. A setting that cannot change in place
    /// is refused, and nothing changes.
    Set(Box<cmd::set::SetArgs>),
    /// Make the shaper running on an interface read its --config file again and apply what
    /// differs in place (as SIGHUP does); prints what changed.
    Reload(cmd::reload::ReloadArgs),
    /// Remove everything shaper installed on an interface (e.g. after `kill -9`), putting back
    /// what was there before it when that is on record.
    Reset(cmd::reset::ResetArgs),
    /// Check that this host (and with --iface, an interface) has what shaper needs, and the
    /// settings that help it; each check passes, warns or fails with a remedy. Exits 1 when a
    /// check failed.
    Doctor(cmd::doctor::DoctorArgs),
    /// Show the host settings advised for a machine sending through a shaper (fq as the
    /// default qdisc, BBR, a bounded unsent queue per socket) and what would change; --apply
    /// sets them, --persist keeps them across reboots, --revert undoes both.
    Tune(cmd::tune::TuneArgs),
}
