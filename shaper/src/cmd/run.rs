//! `shaper run`: shape an interface until SIGINT/SIGTERM, then restore it.

use std::{path::PathBuf, time::Instant};

use shaper_common::rate::DisplayRate;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tracing::{debug, info, warn};

use crate::{
    config::{Options, Settings},
    control::{self, Controller},
    deploy::Deployment,
    health, ingress,
    link::Interface,
    live::{
        self,
        protocol::{Request, Response},
        server::ControlSocket,
        source::Source,
    },
    metrics::{self, Direction, status::Monitor},
    netlink::Socket,
    notify, probe, runtime, shape,
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
    let (source, settings) = Source::start(args.options, args.config.as_deref())?;
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
    // not in the default action (death half-way); a reload asked for meanwhile waits.
    let signals = {
        let _runtime = runtime.enter();
        Signals::listen()?
    };
    let mut deployment = shape::apply(&settings, iface)?;
    ingress::start(&settings, &mut deployment)?;

    let path = runtime::control_socket_path(deployment.iface());
    let served = {
        let _runtime = runtime.enter();
        ControlSocket::bind(&path)
    }
    .map_err(|e| anyhow::anyhow!("control socket {}: {e}", path.display()))
    .and_then(|control| {
        let live = Live { source, control };
        runtime.block_on(serve(&mut deployment, signals, live, &monitor))
    });
    monitor.stopping();
    notify::stopping();
    // The parts go in reverse: the ingress first (its redirect, then its IFB), then the rest.
    let restored = deployment.teardown();
    served.and(restored)
}

/// SIGINT and SIGTERM (stop), SIGHUP (reload), each kept from its arrival until `serve` sees
/// it.
struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl Signals {
    fn listen() -> std::io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

/// What live changes need: where the settings come from, and the socket requests arrive on.
struct Live {
    source: Source,
    control: ControlSocket,
}

/// Runs each direction's control loop, keeps what shaper installed in place and applies live
/// changes (`shaper set`, `shaper reload`, SIGHUP) between ticks, until SIGINT or SIGTERM, or
/// until the interface (or the IFB) goes away.
async fn serve(
    deployment: &mut Deployment,
    signals: Signals,
    live: Live,
    monitor: &Monitor,
) -> anyhow::Result<()> {
    let Signals {
        term: mut sigterm,
        int: mut sigint,
        hup: mut sighup,
    } = signals;
    let Live {
        mut source,
        mut control,
    } = live;
    let controller = |s: &Settings| Controller::new(s.rate_bps, s.isolation, s.diffserv);
    let mut tick = tokio::time::interval(control::INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut loops = Loops {
        egress: controller(deployment.settings()),
        ingress: deployment.nested_mut().map(|i| controller(i.settings())),
        tick,
    };
    let mut check = tokio::time::interval(health::INTERVAL);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sock = Socket::open()?;
    let mut failed_checks = 0;
    publish(monitor, deployment, true);
    notify::ready(&status(deployment));
    loop {
        tokio::select! {
            _ = sigterm.recv() => return Ok(()),
            _ = sigint.recv() => return Ok(()),
            _ = sighup.recv() => {
                let request = Request::Reload {};
                // Logged; a signal has no one to answer.
                let _ = answer(deployment, &mut source, &request, &mut loops, monitor);
            }
            Some(pending) = control.next() => {
                let response = answer(deployment, &mut source, &pending.request, &mut loops, monitor);
                pending.answer(response);
            }
            due = loops.tick.tick() => {
                monitor.tick_started(due.elapsed());
                control_tick(deployment, &mut loops.egress, Direction::Egress, monitor);
                if let (Some(i), Some(c)) = (deployment.nested_mut(), loops.ingress.as_mut()) {
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

/// Each direction's control loop, and their clock.
struct Loops {
    egress: Controller,
    ingress: Option<Controller>,
    tick: tokio::time::Interval,
}

/// Applies `request` (`change`), logs the outcome and tells the monitor; the answer for the
/// client.
fn answer(
    deployment: &mut Deployment,
    source: &mut Source,
    request: &Request,
    loops: &mut Loops,
    monitor: &Monitor,
) -> Response {
    let what = match request {
        Request::Set { .. } => "set",
        Request::Reload {} => "reload",
    };
    if matches!(request, Request::Reload {}) {
        notify::reloading();
    }
    let response = match change(deployment, source, request, loops) {
        Ok(changes) => {
            let changed = if changes.is_empty() {
                "nothing differed".into()
            } else {
                changes.join(", ")
            };
            info!("{what}: {changed}");
            Response::Changed { changes }
        }
        Err(e) => {
            warn!("{what} refused: {e:#}");
            Response::Error {
                message: format!("{e:#}"),
            }
        }
    };
    publish(monitor, deployment, true);
    if matches!(request, Request::Reload {}) {
        notify::ready(&status(deployment));
    }
    response
}

/// What `systemctl status` shows while shaper runs.
fn status(deployment: &Deployment) -> String {
    let settings = deployment.settings();
    let mut status = format!(
        "shaping {} at {}",
        deployment.iface().name,
        DisplayRate(settings.rate_bps)
    );
    if let Some(ingress) = settings.ingress.as_deref() {
        status.push_str(&format!(", ingress at {}", DisplayRate(ingress.rate_bps)));
    }
    status
}

/// Applies what `request` asks for in place. The new settings are resolved (validated as at
/// start) and compared with the running ones first, so that a bad value, or a difference that
/// needs a restart, changes nothing. The control loops take the new policy and tick at once,
/// so that the hosts' levels follow a new rate within a tick. Returns what changed.
fn change(
    deployment: &mut Deployment,
    source: &mut Source,
    request: &Request,
    loops: &mut Loops,
) -> anyhow::Result<Vec<String>> {
    let (next, settings) = source.next(request)?;
    let differences = live::change::differences(deployment.settings(), &settings)?;
    if !differences.is_empty() {
        shape::change(deployment, &settings)
            .map_err(|e| e.context("applying the change failed part-way; run `shaper set` or `shaper reload` again, or restart"))?;
        loops
            .egress
            .set_policy(settings.rate_bps, settings.isolation, settings.diffserv);
        if let (Some(c), Some(i)) = (loops.ingress.as_mut(), settings.ingress.as_deref()) {
            c.set_policy(i.rate_bps, i.isolation, i.diffserv);
        }
        loops.tick.reset_immediately();
    }
    *source = next;
    Ok(differences.iter().map(ToString::to_string).collect())
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
