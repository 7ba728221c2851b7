//! `shaper stats`: the counters of the shaper running on an interface.

use crate::{
    bpf,
    link::Interface,
    probe,
    runtime::{self, RuntimeError},
    stats::Report,
};

#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    /// Interface a `shaper run` is shaping.
    #[arg(long)]
    pub iface: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: StatsArgs) -> anyhow::Result<()> {
    probe::require_privileges()?;
    let iface = Interface::lookup(&args.iface)?;
    let state =
        runtime::read_state(&iface)?.ok_or_else(|| RuntimeError::NotRunning(args.iface.clone()))?;
    if !runtime::process_alive(state.pid) {
        anyhow::bail!(
            "shaper (pid {}) on {} is no longer running; its state is stale (a new `shaper run` will clean it up)",
            state.pid,
            args.iface
        );
    }
    let view = bpf::view_by_ids(&state.maps)?;
    let report = Report::new(&state, &view);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_text());
    }
    Ok(())
}
