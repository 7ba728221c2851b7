//! `shaper set`: change settings of the shaper running on an interface, in place.

use crate::{
    cmd::live_client,
    live::protocol::{Request, SetOptions},
};

#[derive(Debug, clap::Args)]
pub struct SetArgs {
    /// Interface a `shaper run` is shaping.
    #[arg(long)]
    pub iface: String,
    #[command(flatten)]
    pub options: SetOptions,
}

pub fn run(args: SetArgs) -> anyhow::Result<()> {
    if args.options.is_empty() {
        anyhow::bail!("nothing to set: give at least one setting, e.g. --rate 40mbit");
    }
    live_client::ask(
        &args.iface,
        &Request::Set {
            options: Box::new(args.options),
        },
    )
}
