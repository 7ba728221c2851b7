//! `shaper reload`: the shaper running on an interface reads its `--config` file again and
//! applies what differs, in place (what SIGHUP does, with the outcome printed).

use crate::{cmd::live_client, live::protocol::Request};

#[derive(Debug, clap::Args)]
pub struct ReloadArgs {
    /// Interface a `shaper run --config FILE` is shaping.
    #[arg(long)]
    pub iface: String,
}

pub fn run(args: ReloadArgs) -> anyhow::Result<()> {
    live_client::ask(&args.iface, &Request::Reload {})
}
