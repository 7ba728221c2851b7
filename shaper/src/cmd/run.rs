//! `shaper run`: shape an interface until SIGINT/SIGTERM, then restore it.

use std::{path::PathBuf, time::Instant};

use tokio::signal::unix::{Signal, SignalKind, signal};
use tracing::{debug, info, warn};

use crate::{
    config::{Options, Settings},
    control::{self, Controller},
    deploy::Deployment,
    health, ingress,
    link::Interface,
    metrics::{self, Direction, status::Monitor},
    netlink::Socket,
    probe, shape,
};

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub options: Options,
    /// TOML file with the same settings; command-line options win.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let settings = Settings::resolve(args.options, args.config.as_deref())?;
    probe::require_privileges()?;
    probe::require_btf()?;
    let iface = Interface::lookup(&settings.iface)?;
    let monitor = Monitor::default();
    // Bound before the interface is touched, so that an address in use fails the start; served
    // from here on, so that /readyz says "not yet" while shaper starts.
    if let Some(addr) = settings.metrics {
        let listener = std::net::TcpListener::bind(addr)
            .map_err(|e| anyhow::anyhow!("metrics endpoint {addr}: {e}"))?;
        metrics::http::spawn(
            listener,
            monitor.clone(),
            settings.metrics_top_hosts as usize,
        )?;
        info!("metrics at http://{addr}/metrics");
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Listening before the start, so that a stop asked for while starting ends in a restore,
    // not in the default action (death half-way).
    let stop = {
        let _runtime = runtime.enter();
        StopSignals::listen()?
    };
    let mut deployment = shape::apply(&settings, iface)?;
    ingress::start(&settings, &mut deployment)?;

    let served = runtime.block_on(serve(&mut deployment, stop, &monitor));
    monitor.stopping();
    // The parts go in reverse: the ingress first (its redirect, then its IFB), then the rest.
    let restored = deployment.teardown();
    served.and(restored)
}

/// SIGINT and SIGTERM, each kept from its arrival until `serve` sees it.
struct StopSignals {
    term: Signal,
    int: Signal,
}

impl StopSignals {
    fn listen() -> std::io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }
}

/// Runs each direction's control loop, and keeps what shaper installed in place, until SIGINT
/// or SIGTERM, or until the interface (or the IFB) goes away.
async fn serve(
    deployment: &mut Deployment,
    stop: StopSignals,
    monitor: &Monitor,
) -> anyhow::Result<()> {
    let StopSignals {
        term: mut sigterm,
        int: mut sigint,
    } = stop;
    let controller = |s: &Settings| Controller::new(s.rate_bps, s.isolation, s.diffserv);
    let mut egress_control = controller(deployment.settings());
    let mut ingress_control = deployment.nested_mut().map(|i| controller(i.settings()));
    let mut tick = tokio::time::interval(control::INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut check = tokio::time::interval(health::INTERVAL);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sock = Socket::open()?;
    let mut failed_checks = 0;
    publish(monitor, deployment, true);
    loop {
        tokio::select! {
            _ = sigterm.recv() => return Ok(()),
            _ = sigint.recv() => return Ok(()),
            due = tick.tick() => {
                monitor.tick_started(due.elapsed());
                control_tick(deployment, &mut egress_control, Direction::Egress, monitor);
                if let (Some(i), Some(c)) = (deployment.nested_mut(), ingress_control.as_mut()) {
                    control_tick(i, c, Direction::Ingress, monitor);
                }
            }
            _ = check.tick() => {
                let kept = deployment.keep(&mut sock);
                publish(monitor, deployment, kept.is_ok());
                match kept {
                    Ok(()) => failed_checks = 0,
                    Err(e) if e.is::<health::Lost>() => return Err(e),
                    Err(e) => {
                        failed_checks += 1;
                        if failed_checks >= health::MAX_FAILED_CHECKS {
                            return Err(e.context("keeping shaper in place failed repeatedly"));
                        }
                        warn!("keeping shaper in place (will retry): {e:#}");
                    }
                }
            }
        }
    }
}

/// One control loop step. A failed tick keeps the previous levels in force; the next retries.
fn control_tick(
    deployment: &mut Deployment,
    controller: &mut Controller,
    direction: Direction,
    monitor: &Monitor,
) {
    let started = Instant::now();
    let result = controller.tick(deployment.datapath_mut());
    monitor.ticked(direction, result.as_ref().ok(), started.elapsed());
    match result {
        Ok(summary) => debug!(iface = %deployment.iface().name, ?summary, "tick"),
        Err(e) => warn!("control loop on {}: {e}", deployment.iface().name),
    }
}

/// Tells the monitor what is shaped (each direction's state file: its maps and settings) and
/// whether the last health check passed.
fn publish(monitor: &Monitor, deployment: &mut Deployment, passed: bool) {
    let interface = deployment.iface().name.clone();
    let mut states = vec![(Direction::Egress, deployment.state().clone())];
    if let Some(ingress) = deployment.nested_mut() {
        states.push((Direction::Ingress, ingress.state().clone()));
    }
    monitor.checked(&interface, states, passed);
}
