//! `shaper reload`: the shaper running on an interface reads its `--config` file again and
//! applies what differs, in place (what SIGHUP does, with the outcome printed). A shaper of
//! several interfaces (`[[interface]]` sections) reloads them all, whichever one is named:
//! added ones are shaped, removed ones restored, changed ones changed in place.

use crate::{cmd::live_client, live::protocol::Request};

#[derive(Debug, clap::Args)]
pub struct ReloadArgs {
    /// Interface a `shaper run --config FILE` is shaping (any one of its interfaces: the whole
    /// file is read again).
    #[arg(long)]
    pub iface: String,
}

pub fn run(args: ReloadArgs) -> anyhow::Result<()> {
    live_client::ask(&args.iface, &Request::Reload {})
}
