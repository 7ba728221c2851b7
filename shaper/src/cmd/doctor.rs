//! `shaper doctor`: checks this host (and an interface) for what shaper needs and what helps
//! it; exits non-zero when a check failed.

use std::process::ExitCode;

use crate::doctor::{gather, verdict};

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Also check this interface: its qdiscs, queues, offloads and any shaper on it.
    #[arg(long)]
    pub iface: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let facts = gather::gather(args.iface.as_deref());
    let report = verdict::judge(&facts);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_text());
    }
    Ok(if report.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
