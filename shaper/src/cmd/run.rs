//! `shaper run`: shape an interface until SIGINT/SIGTERM, then restore it.

use std::{path::PathBuf, time::Duration};

use tokio::signal::unix::{SignalKind, signal};
use tracing::debug;

use crate::{
    config::{CliConfig, Settings},
    deploy::Deployment,
    link::Interface,
    probe,
};

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Interface to shape (egress).
    #[arg(long)]
    pub iface: Option<String>,
    /// Wire rate, in tc/systemd units: 100mbit, 1gbit, 1995M, 12.5MBps, 500kbit.
    #[arg(long)]
    pub rate: Option<String>,
    /// Departures scheduled further ahead than this are dropped (e.g. 2s, 500ms).
    #[arg(long)]
    pub horizon: Option<String>,
    /// Bytes added to every frame before accounting (CAKE's `overhead`); may be negative.
    #[arg(long, allow_hyphen_values = true)]
    pub overhead: Option<i32>,
    /// Minimum accounted frame size in bytes (CAKE's `mpu`).
    #[arg(long)]
    pub mpu: Option<u32>,
    /// TOML file with the same settings; command-line options win.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// How often the control loop wakes. Nothing in it is per-packet; later it computes fair shares.
const CONTROL_INTERVAL: Duration = Duration::from_millis(100);

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let cli = CliConfig {
        iface: args.iface,
        rate: args.rate,
        horizon: args.horizon,
        overhead: args.overhead,
        mpu: args.mpu,
    };
    let settings = Settings::resolve(cli, args.config.as_deref())?;
    probe::require_privileges()?;
    probe::require_btf()?;
    let iface = Interface::lookup(&settings.iface)?;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let deployment = Deployment::apply(&settings, iface)?;
    let served = runtime.block_on(serve(&deployment));
    let restored = deployment.teardown();
    served.and(restored)
}

async fn serve(deployment: &Deployment) -> anyhow::Result<()> {
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut tick = tokio::time::interval(CONTROL_INTERVAL);
    loop {
        tokio::select! {
            _ = sigterm.recv() => return Ok(()),
            _ = sigint.recv() => return Ok(()),
            _ = tick.tick() => {
                if let Ok(view) = deployment.datapath().snapshot() {
                    debug!(backlog_ns = view.backlog_ns, packets = view.stats.shaped_packets, "tick");
                }
            }
        }
    }
}
