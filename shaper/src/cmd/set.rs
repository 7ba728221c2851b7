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
    /// Wire rate, as for `shaper run`.
    #[arg(long)]
    pub rate: Option<String>,
    /// The ingress direction's rate (only while it is shaped: adding or removing it needs a
    /// restart).
    #[arg(long)]
    pub ingress_rate: Option<String>,
    #[arg(long)]
    pub horizon: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    pub overhead: Option<i32>,
    #[arg(long)]
    pub mpu: Option<u32>,
    #[arg(long)]
    pub isolation: Option<String>,
    #[arg(long)]
    pub rtt: Option<String>,
    /// Mark ECN-capable packets instead of dropping them.
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    pub ecn: Option<bool>,
    #[arg(long)]
    pub diffserv: Option<String>,
    /// Clear the DSCP after classifying.
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    pub wash: Option<bool>,
    #[arg(long)]
    pub fwmark: Option<String>,
    #[arg(long)]
    pub ack_filter: Option<String>,
}

fn on_off(text: &str) -> Result<bool, String> {
    match text {
        "on" | "true" | "yes" => Ok(true),
        "off" | "false" | "no" => Ok(false),
        _ => Err(format!("{text:?}: use on or off")),
    }
}

pub fn run(args: SetArgs) -> anyhow::Result<()> {
    let options = SetOptions {
        rate: args.rate,
        ingress_rate: args.ingress_rate,
        horizon: args.horizon,
        overhead: args.overhead,
        mpu: args.mpu,
        isolation: args.isolation,
        rtt: args.rtt,
        ecn: args.ecn,
        diffserv: args.diffserv,
        wash: args.wash,
        fwmark: args.fwmark,
        ack_filter: args.ack_filter,
    };
    if options.is_empty() {
        anyhow::bail!("nothing to set: give at least one setting, e.g. --rate 40mbit");
    }
    live_client::ask(
        &args.iface,
        &Request::Set {
            options: Box::new(options),
        },
    )
}
