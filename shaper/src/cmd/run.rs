//! `shaper run`: shape interfaces until SIGINT/SIGTERM, then restore them.
//!
//! One process supervises every interface it shapes, each with its own deployment, control
//! loops, control socket and live-change source; they share the clock, the health checks and
//! the metrics endpoint. Which interfaces, with which settings, is `interfaces::Plan`'s:
//!
//! - Without `[[interface]]` sections (the command line's one interface), as ever: an interface
//!   that cannot be shaped ends the start with an error, and one that goes away ends the run.
//! - With sections, the interfaces follow the system (`linkwatch`): one that appears, or comes
//!   to match, is shaped; one that goes away is let go (what shaper had elsewhere removed) and
//!   shaped again when it comes back. One that cannot be shaped, or whose repairs keep failing,
//!   is reported and restored, and is tried again only when it changes (a new device of the name,
//!   or new settings); the others keep running. The run ends only by a signal, or when the
//!   process itself fails (its metrics endpoint, its netlink sockets).
//!
//! On exit every interface is restored, each as it was found; with `--keep`, or on SIGUSR2,
//! every interface is left shaped instead, for the next `shaper run` to take over
//! (`handover`). A `shaper run --replace` started meanwhile asks for each interface it shapes
//! in turn: that one is left shaped and never taken back, and a process with none left ends,
//! or with `--when-replaced wait` waits, holding nothing, to be stopped.

use std::{
    collections::{BTreeMap, BTreeSet},
    future::poll_fn,
    path::PathBuf,
    sync::Arc,
    task::Poll,
    time::Instant,
};

use shaper_common::rate::DisplayRate;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tracing::{debug, error, info, warn};

use crate::{
    autorate::Autorate,
    bpf::MapReader,
    config::{Options, Settings},
    control::{self, Controller},
    deploy::{Deployment, Handed},
    handover::{self, AfterRequest, WhenReplaced},
    health, ingress,
    interfaces::{Link, Plan},
    link::Interface,
    linkwatch,
    live::{
        self,
        protocol::{Request, Response},
        server::{ControlSocket, Pending},
        source::Source,
    },
    metrics::{self, Direction, status::Monitor},
    netlink::{Socket, Subscription},
    notify, own, priority, probe, runtime, shape,
    spares::Spares,
};

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub options: Options,
    /// TOML file with the same settings, and optionally `[[interface]]` sections to shape
    /// several interfaces; command-line options win.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// On SIGTERM or SIGINT, exit leaving every interface shaped (fq, the programs and the
    /// flow state in place, at the last levels) for the next `shaper run` to take over without
    /// a gap, as for an upgrade or a rolling update. Needs bpffs at /sys/fs/bpf. Without it,
    /// exit restores every interface; SIGUSR2 always exits leaving them shaped.
    #[arg(long)]
    pub keep: bool,
    /// Take over from a shaper already running on an interface this run shapes: it is asked
    /// to leave the interface shaped (as on SIGUSR2), and this process takes up its programs
    /// and flow state in place, as for a rolling update where the new process starts first.
    /// Needs what --keep needs.
    #[arg(long)]
    pub replace: bool,
    /// What this process does once a `shaper run --replace` has taken over every interface it
    /// shaped.
    #[arg(long, value_enum, value_name = "ACTION", default_value_t = WhenReplaced::Exit)]
    pub when_replaced: WhenReplaced,
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let plan = Plan::load(args.options, args.config.as_deref())?;
    probe::require_privileges()?;
    probe::require_btf()?;
    if args.keep || args.replace {
        handover::require_bpffs()?;
    }
    if let Some(name) = plan.single_iface() {
        Interface::lookup(&name)?;
    }
    let monitor = Monitor::default();
    let process = plan.process();
    // Bound before any interface is touched, so that an address in use fails the start; served
    // from here on, so that /readyz says "not yet" while shaper starts.
    if let Some(addr) = process.metrics {
        let listener = metrics::http::listen(addr)
            .map_err(|e| anyhow::anyhow!("metrics endpoint {addr}: {e}"))?;
        metrics::http::spawn(
            listener,
            monitor.clone(),
            process.metrics_top_hosts as usize,
        )?;
        info!("metrics at http://{addr}/metrics");
    }

    // This thread runs the control loop; the metrics and event threads, started above, stay
    // at the process's priority.
    match priority::raise_this_thread() {
        Ok(nice) => info!("control loop at nice {nice}"),
        Err(e) => warn!(
            "control loop left at the process's priority (nice {} wanted): {e}",
            priority::CONTROL_NICE
        ),
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
    let mut supervisor = Supervisor {
        follow: plan.has_sections(),
        plan,
        replace: args.replace,
        when_replaced: args.when_replaced,
        given: BTreeSet::new(),
        shaped: Vec::new(),
        failed: BTreeMap::new(),
        monitor: monitor.clone(),
        sock: Socket::open()?,
        spares: Spares::default(),
        own: own::Own::new(),
    };
    let served = runtime.block_on(supervisor.serve(signals));
    monitor.stopping();
    notify::stopping();
    let leave = match &served {
        Ok(Stop::Leave) => true,
        Ok(Stop::Asked) => args.keep,
        // Nothing is left to end.
        Ok(Stop::Replaced) => false,
        // A failing process restores what it shaped: its successor may never come.
        Err(_) => false,
    };
    let ended = {
        let _runtime = runtime.enter();
        if leave {
            supervisor.leave_all()
        } else {
            supervisor.restore_all()
        }
    };
    served.and(ended)
}

/// Why `serve` returned.
enum Stop {
    /// SIGINT or SIGTERM: restore, or leave with `--keep`.
    Asked,
    /// SIGUSR2: leave every interface shaped for the next process.
    Leave,
    /// Every interface was handed over on request (`Request::Leave`): nothing is left to end.
    Replaced,
}

/// SIGINT and SIGTERM (stop), SIGUSR2 (stop, leaving the interfaces shaped), SIGHUP (reload),
/// each kept from its arrival until `serve` sees it.
struct Signals {
    term: Signal,
    int: Signal,
    usr2: Signal,
    hup: Signal,
}

impl Signals {
    fn listen() -> std::io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            usr2: signal(SignalKind::user_defined2())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

/// One shaped interface: what is installed, its control loops, where its settings come from
/// and the socket its live changes arrive on.
struct Shaped {
    deployment: Deployment,
    /// Each direction's maps for the metrics endpoint, held from the start.
    maps: Vec<(Direction, Arc<MapReader>)>,
    source: Source,
    control: ControlSocket,
    egress: Controller,
    ingress: Option<Controller>,
    /// `--autorate`/`--ingress-autorate`: the rates follow the link.
    autorate: Option<Autorate>,
    failed_checks: u32,
}

impl Shaped {
    fn name(&self) -> &str {
        &self.deployment.iface().name
    }
}

/// The interfaces of one run.
struct Supervisor {
    plan: Plan,
    /// The interfaces follow the system (the plan has sections); otherwise the one interface's
    /// failures end the run.
    follow: bool,
    /// Ask a shaper running on an interface to leave it to this process (`--replace`).
    replace: bool,
    /// What this process does once another has taken every interface (`--when-replaced`).
    when_replaced: WhenReplaced,
    /// Interfaces left to another process at its request: not shaped again by this one.
    given: BTreeSet<String>,
    shaped: Vec<Shaped>,
    /// Interfaces that could not be shaped, with the device and settings tried: not tried
    /// again until either changes.
    failed: BTreeMap<String, (u32, Settings)>,
    monitor: Monitor,
    sock: Socket,
    /// Data paths loaded ahead, so that an interface that appears is shaped at once (only
    /// while the interfaces follow the system).
    spares: Spares,
    /// The machine's addresses every shaped data path was last given (each is also given the
    /// set of the moment it is shaped): a check that reads the same set writes nothing.
    own: own::Own,
}

impl Supervisor {
    /// Shapes what the plan asks for, then runs every interface's control loops, keeps what
    /// shaper installed in place, follows the system's interfaces and applies live changes
    /// (`shaper set`, `shaper reload`, SIGHUP) between ticks, until SIGINT or SIGTERM.
    async fn serve(&mut self, signals: Signals) -> anyhow::Result<Stop> {
        let Signals {
            term: mut sigterm,
            int: mut sigint,
            usr2: mut sigusr2,
            hup: mut sighup,
        } = signals;
        // Subscribed before the first look, so that no change falls between the two.
        let mut watcher = if self.follow {
            Some(Subscription::open(linkwatch::GROUPS)?)
        } else {
            None
        };
        let mut addresses = Subscription::open(own::GROUPS).map_err(|e| {
            anyhow::anyhow!("subscribing to the machine's address notifications (netlink): {e}")
        })?;
        self.reconcile()?;
        notify::ready(&self.status());
        let mut tick = tokio::time::interval(control::INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut check = tokio::time::interval(health::INTERVAL);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = sigterm.recv() => return Ok(Stop::Asked),
                _ = sigint.recv() => return Ok(Stop::Asked),
                _ = sigusr2.recv() => return Ok(Stop::Leave),
                _ = sighup.recv() => {
                    // Logged; a signal has no one to answer.
                    let _ = self.answer(None, &Request::Reload {});
                }
                (at, pending) = next_request(&mut self.shaped) => {
                    let response = self.answer(Some(at), &pending.request);
                    let next = handover::after_request(
                        self.shaped.len(),
                        self.given.len(),
                        self.when_replaced,
                    );
                    if next == AfterRequest::Serve {
                        pending.answer(response);
                        continue;
                    }
                    // The last answer reaches its client before the process ends or waits.
                    pending.answer_written(response).await;
                    if next == AfterRequest::Exit {
                        info!("every interface was left to the next shaper; exiting");
                        return Ok(Stop::Replaced);
                    }
                    // Holding nothing from here on: no interface followed, none reloaded.
                    drop(watcher.take());
                    self.monitor.replaced();
                    notify::replaced();
                    info!(
                        "every interface was left to the next shaper; waiting for SIGTERM or SIGINT (--when-replaced wait)"
                    );
                    loop {
                        tokio::select! {
                            _ = sigterm.recv() => return Ok(Stop::Replaced),
                            _ = sigint.recv() => return Ok(Stop::Replaced),
                            _ = sigusr2.recv() => return Ok(Stop::Replaced),
                            _ = sighup.recv() => {
                                info!("nothing to reload: every interface was left to the next shaper");
                            }
                        }
                    }
                }
                due = tick.tick() => {
                    self.monitor.tick_started(due.elapsed());
                    for shaped in &mut self.shaped {
                        control_ticks(shaped, &self.monitor);
                    }
                }
                changed = linkwatch_changed(&mut watcher) => {
                    changed.map_err(|e| anyhow::anyhow!("watching the interfaces: {e}"))?;
                    self.reconcile()?;
                }
                changed = addresses.changed() => {
                    changed.map_err(|e| anyhow::anyhow!("watching the machine's addresses: {e}"))?;
                    self.own_addresses_changed();
                }
                _ = check.tick() => self.check()?,
            }
        }
    }

    /// Shapes the interfaces the plan wants that are not shaped, and lets go of the shaped ones
    /// it no longer wants or whose device went away. Returns what it did, one line each.
    /// Without sections, the one interface failing to shape is the error.
    fn reconcile(&mut self) -> anyhow::Result<Vec<String>> {
        let mut done = Vec::new();
        let (links, mut wanted) = self.wanted_now()?;
        wanted.retain(|name, _| !self.given.contains(name));
        if !self.follow && wanted.is_empty() {
            // The one interface went away (its health check ends the run) or never was.
            if self.shaped.is_empty() {
                let name = self.plan.single_iface().unwrap_or_default();
                Interface::lookup(&name)?;
            }
            return Ok(done);
        }
        // Let go: no longer wanted, or no longer the device that was shaped.
        let mut at = self.shaped.len();
        while at > 0 {
            at -= 1;
            let s = &self.shaped[at];
            let current = links.iter().find(|l| l.name == s.name());
            let same_device = current.is_some_and(|l| l.ifindex == s.deployment.iface().ifindex);
            if !wanted.contains_key(s.name()) || !same_device {
                let name = s.name().to_string();
                match self.let_go(at) {
                    Ok(()) if same_device => done.push(format!("{name}: restored")),
                    Ok(()) => done.push(format!("{name}: gone, let go")),
                    Err(e) => done.push(format!("{name}: restoring failed: {e:#}")),
                }
            }
        }
        self.failed.retain(|name, _| wanted.contains_key(name));
        for (name, layer) in &wanted {
            if let Some(s) = self.shaped.iter_mut().find(|s| s.name() == name) {
                if let Some(line) = follow_section(&self.plan, &self.monitor, s, layer) {
                    done.push(line);
                }
                continue;
            }
            let Some(link) = links.iter().find(|l| &l.name == name) else {
                continue;
            };
            let resolved = Source::with_file(
                self.plan.command_line().clone(),
                self.plan.path(),
                layer.clone(),
            );
            let (source, settings) = match resolved {
                Ok(r) => r,
                // Validated when the file was read; still, not a reason to stop the others.
                Err(e) => {
                    error!("{name}: {e}");
                    continue;
                }
            };
            if self
                .failed
                .get(name)
                .is_some_and(|(ifindex, tried)| *ifindex == link.ifindex && *tried == settings)
            {
                continue;
            }
            let started = Instant::now();
            let spares = self.follow.then_some(&mut self.spares);
            match shape_one(source, &settings, spares, self.replace) {
                Ok(mut shaped) => {
                    self.failed.remove(name);
                    publish(&self.monitor, &mut shaped, true);
                    done.push(format!(
                        "{name}: shaped in {} ms ({})",
                        started.elapsed().as_millis(),
                        settings.describe()
                    ));
                    self.shaped.push(shaped);
                }
                Err(e) if !self.follow => return Err(e),
                Err(e) => {
                    error!(
                        "{name} cannot be shaped (left as it is; tried again when it changes): {e:#}"
                    );
                    done.push(format!("{name}: cannot be shaped: {e:#}"));
                    self.failed
                        .insert(name.clone(), (link.ifindex, settings.clone()));
                }
            }
        }
        if self.follow {
            // A spare for each map sizing the wanted interfaces use.
            let sizings: Vec<_> = wanted
                .values()
                .filter_map(|layer| {
                    Source::with_file(
                        self.plan.command_line().clone(),
                        self.plan.path(),
                        layer.clone(),
                    )
                    .ok()
                })
                .map(|(_, settings)| settings.state)
                .collect();
            self.spares.keep_only(&sizings);
            for sizing in &sizings {
                self.spares.prepare(sizing);
            }
        }
        self.monitor.configured(wanted.into_keys());
        for line in &done {
            info!("{line}");
        }
        Ok(done)
    }

    /// The system's links now, and the settings the plan wants for each of them it names.
    fn wanted_now(&mut self) -> anyhow::Result<(Vec<Link>, BTreeMap<String, Options>)> {
        let links = linkwatch::links(&mut self.sock)?;
        let default_route = if self.plan.follows_default_route() {
            linkwatch::default_route_devices(&mut self.sock, &links)?
        } else {
            Default::default()
        };
        let wanted = self.plan.wanted(&links, &default_route);
        Ok((links, wanted))
    }

    /// Restores (or, if its device went away, lets go of) the interface at `at`.
    fn let_go(&mut self, at: usize) -> anyhow::Result<()> {
        self.take_out(at).release()
    }

    /// Takes interface `at` out of the run: no longer reported, its control socket closed;
    /// its deployment, for the caller to end.
    fn take_out(&mut self, at: usize) -> Deployment {
        let Shaped {
            deployment,
            control,
            ..
        } = self.shaped.remove(at);
        self.monitor.forget(&deployment.iface().name);
        drop(control);
        deployment
    }

    /// The health checks of every interface. Without sections, the interface going away, or
    /// its repairs failing repeatedly, ends the run; with them, that interface is let go (and
    /// shaped again when it comes back).
    fn check(&mut self) -> anyhow::Result<()> {
        let mut gone = Vec::new();
        for (at, s) in self.shaped.iter_mut().enumerate() {
            let kept = s.deployment.keep(&mut self.sock);
            publish(&self.monitor, s, kept.is_ok());
            match kept {
                Ok(()) => s.failed_checks = 0,
                Err(e) if e.is::<health::Lost>() => {
                    if !self.follow {
                        return Err(e);
                    }
                    info!("{e}; letting it go until it comes back");
                    gone.push((at, None));
                }
                Err(e) => {
                    s.failed_checks += 1;
                    if s.failed_checks < health::MAX_FAILED_CHECKS {
                        warn!(
                            "keeping shaper in place on {} (will retry): {e:#}",
                            s.name()
                        );
                        continue;
                    }
                    let e = e.context(format!(
                        "keeping shaper in place on {} failed repeatedly",
                        s.name()
                    ));
                    if !self.follow {
                        return Err(e);
                    }
                    error!("{e:#}; restoring it (tried again when it changes)");
                    let settings = s.deployment.settings().clone();
                    gone.push((at, Some((s.deployment.iface().ifindex, settings))));
                }
            }
        }
        for (at, failed) in gone.into_iter().rev() {
            let name = self.shaped[at].name().to_string();
            if let Err(e) = self.let_go(at) {
                warn!("restoring {name}: {e:#}");
            }
            if let Some(failed) = failed {
                self.failed.insert(name, failed);
            }
        }
        // A backstop for a notification missed: the same looks the watchers trigger.
        self.own_addresses_changed();
        if self.follow {
            self.reconcile()?;
        }
        Ok(())
    }

    /// Gives every data path the machine's own addresses as they are now, when they changed. A
    /// failure is logged and leaves the data paths with the addresses they had, until the next
    /// change or check.
    fn own_addresses_changed(&mut self) {
        let own = match own::addresses(&mut self.sock) {
            Ok(own) => own,
            Err(e) => {
                warn!("reading the machine's addresses: {e}");
                return;
            }
        };
        if own == self.own {
            return;
        }
        let mut all_given = true;
        for s in &mut self.shaped {
            let name = s.name().to_string();
            let deployment = &mut s.deployment;
            let mut result = own::apply(deployment.datapath_mut(), &own, &name);
            if let Some(ingress) = deployment.nested_mut() {
                result = result.and(own::apply(ingress.datapath_mut(), &own, &name));
            }
            if let Err(e) = result {
                warn!("{name}: giving the data path the machine's addresses: {e}");
                all_given = false;
            }
        }
        if all_given {
            self.own = own;
        }
    }

    /// Applies `request` (from interface `at`'s socket, or a signal), logs the outcome and
    /// tells the monitor; the answer for the client.
    fn answer(&mut self, at: Option<usize>, request: &Request) -> Response {
        let (what, outcome) = match (request, at) {
            (Request::Leave {}, Some(at)) => return self.give_away(at),
            (Request::Leave {}, None) => {
                return Response::Error {
                    message: "leave needs an interface".into(),
                };
            }
            (Request::Set { .. }, Some(at)) => ("set", self.set(at, request)),
            (Request::Set { .. }, None) => {
                return Response::Error {
                    message: "set needs an interface".into(),
                };
            }
            (Request::Reload {}, _) => {
                notify::reloading();
                let outcome = self.reload();
                notify::ready(&self.status());
                ("reload", outcome)
            }
        };
        let response = match outcome {
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
        for s in &mut self.shaped {
            publish(&self.monitor, s, true);
        }
        response
    }

    /// Leaves interface `at` shaped for the process that asked (`Request::Leave`), for good.
    fn give_away(&mut self, at: usize) -> Response {
        if let Err(e) = handover::require_bpffs() {
            warn!("asked to leave {}: {e}", self.shaped[at].name());
            return Response::Error {
                message: e.to_string(),
            };
        }
        let deployment = self.take_out(at);
        let name = deployment.iface().name.clone();
        self.given.insert(name.clone());
        let message = match deployment.hand_over() {
            Ok(Handed::Left) => {
                info!("{name}: left to the next shaper at its request");
                return Response::Left {
                    pid: std::process::id(),
                };
            }
            Ok(Handed::Restored) => "it could not be left shaped, and was restored".to_string(),
            Err(e) => format!("leaving it failed: {e:#}"),
        };
        error!("{name}: asked to leave it: {message}");
        Response::Error { message }
    }

    /// `shaper set` on interface `at`.
    fn set(&mut self, at: usize, request: &Request) -> anyhow::Result<Vec<String>> {
        let shaped = &mut self.shaped[at];
        let (next, settings) = shaped.source.next(request)?;
        change(shaped, next, &settings, &self.monitor)
    }

    /// Reads the file again and applies the difference: an interface no longer wanted is
    /// restored, a new one shaped, a changed one changed in place (each shaped one's `shaper
    /// set` overrides dropped). A file that does not validate changes nothing; a change one
    /// interface refuses is reported with its name, and the others are still applied.
    fn reload(&mut self) -> anyhow::Result<Vec<String>> {
        let path = self
            .plan
            .path()
            .ok_or(live::source::SourceError::NoConfigFile)?;
        let plan = Plan::load(self.plan.command_line().clone(), Some(path))?;
        if plan.has_sections() != self.plan.has_sections() {
            anyhow::bail!(
                "the file {} [[interface]] sections now: restart `shaper run` to go from one interface to several or back; nothing was changed",
                if plan.has_sections() { "has" } else { "has no" }
            );
        }
        if plan.process() != self.plan.process() {
            anyhow::bail!(
                "metrics and metrics-top-hosts cannot change while shaper runs (the process set up its endpoint once); nothing was changed. Restart `shaper run` with the new settings"
            );
        }
        if !plan.has_sections() && plan.single_iface() != self.plan.single_iface() {
            anyhow::bail!(
                "iface cannot change while shaper runs; nothing was changed. Restart `shaper run` with the new settings"
            );
        }
        self.plan = plan;
        let (_, wanted) = self.wanted_now()?;
        if !self.follow {
            // One interface: its changes and refusals as they are, without its name.
            let Some(s) = self.shaped.first_mut() else {
                return Ok(Vec::new());
            };
            let layer = wanted.into_values().next().unwrap_or_default();
            let (next, settings) = s.source.reloaded(layer)?;
            return change(s, next, &settings, &self.monitor);
        }
        let mut done = Vec::new();
        let mut refused = Vec::new();
        for s in &mut self.shaped {
            let Some(layer) = wanted.get(s.name()) else {
                continue;
            };
            let name = s.name().to_string();
            let outcome = s
                .source
                .reloaded(layer.clone())
                .map_err(anyhow::Error::from)
                .and_then(|(next, settings)| change(s, next, &settings, &self.monitor));
            match outcome {
                Ok(changes) => done.extend(changes.into_iter().map(|c| format!("{name}: {c}"))),
                Err(e) => refused.push(format!("{name}: {e:#}")),
            }
        }
        // New settings may make a failed interface worth trying again: `reconcile` compares.
        done.extend(self.reconcile()?);
        if refused.is_empty() {
            Ok(done)
        } else {
            let applied = if done.is_empty() {
                String::new()
            } else {
                format!("; applied: {}", done.join("; "))
            };
            anyhow::bail!("refused: {}{applied}", refused.join("; "))
        }
    }

    /// What `systemctl status` shows while shaper runs: each interface and its rates.
    fn status(&self) -> String {
        if self.shaped.is_empty() {
            return "no configured interface is present yet".into();
        }
        let each: Vec<String> = self
            .shaped
            .iter()
            .map(|s| {
                let settings = s.deployment.settings();
                let mut status = format!("{} at {}", s.name(), DisplayRate(settings.rate_bps));
                if let Some(ingress) = settings.ingress.as_deref() {
                    status.push_str(&format!(", ingress at {}", DisplayRate(ingress.rate_bps)));
                }
                status
            })
            .collect();
        format!("shaping {}", each.join("; "))
    }

    /// Leaves every interface shaped for the next process (`Deployment::hand_over`; one that
    /// cannot be left is restored); the first error is returned, the others logged.
    fn leave_all(&mut self) -> anyhow::Result<()> {
        self.end_all("leaving", |d| d.hand_over().map(drop))
    }

    /// Restores every interface, the last shaped first; the first error is returned, the others
    /// logged.
    fn restore_all(&mut self) -> anyhow::Result<()> {
        // The parts go in reverse: the ingress first (its redirect, then its IFB), then the
        // rest.
        self.end_all("restoring", Deployment::teardown)
    }

    /// Ends every interface's deployment with `end`, the last shaped first, each after its
    /// control socket is closed.
    fn end_all(
        &mut self,
        what: &str,
        end: fn(Deployment) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let mut first = None;
        while let Some(Shaped {
            deployment,
            control,
            ..
        }) = self.shaped.pop()
        {
            drop(control);
            let name = deployment.iface().name.clone();
            if let Err(e) = end(deployment) {
                match first {
                    None => first = Some(e),
                    Some(_) => warn!("{what} {name}: {e:#}"),
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// Changes `shaped` in place when the section that names it is another one now (the
/// default route moved to it, say), `layer` being its new file layer: as a reload would,
/// its `shaper set` overrides dropped. A change it refuses is reported, and it keeps its
/// settings. Returns what happened, if anything.
fn follow_section(
    plan: &Plan,
    monitor: &Monitor,
    shaped: &mut Shaped,
    layer: &Options,
) -> Option<String> {
    let resolve = |layer: &Options| {
        Source::with_file(plan.command_line().clone(), plan.path(), layer.clone())
            .ok()
            .map(|(_, settings)| settings)
    };
    if resolve(shaped.source.file()) == resolve(layer) {
        return None;
    }
    let name = shaped.name().to_string();
    let outcome = shaped
        .source
        .reloaded(layer.clone())
        .map_err(anyhow::Error::from)
        .and_then(|(next, settings)| change(shaped, next, &settings, monitor));
    Some(match outcome {
        Ok(changes) => format!(
            "{name}: now named by another section: {}",
            changes.join(", ")
        ),
        Err(e) => {
            error!("{name}: now named by another section, whose settings it refuses: {e:#}");
            format!("{name}: refused another section's settings: {e:#}")
        }
    })
}

/// Shapes the interface `settings` name (with a spare data path if there are `spares`), and
/// opens its control socket.
fn shape_one(
    source: Source,
    settings: &Settings,
    spares: Option<&mut Spares>,
    replace: bool,
) -> anyhow::Result<Shaped> {
    let iface = Interface::lookup(&settings.iface)?;
    if replace {
        handover::ask_to_leave(&iface)?;
    }
    let mut deployment = match spares {
        Some(spares) => shape::apply_with(settings, iface, |state| spares.take(state))?,
        None => shape::apply(settings, iface)?,
    };
    // A failure from here on drops the deployment, which restores the interface.
    ingress::start(settings, &mut deployment)?;
    let path = runtime::control_socket_path(deployment.iface());
    let control = ControlSocket::bind(&path)
        .map_err(|e| anyhow::anyhow!("control socket {}: {e}", path.display()))?;
    // A data path a predecessor left has hosts already: the loops take them up.
    let controller = |d: &Deployment| -> anyhow::Result<Controller> {
        let s = d.settings();
        let mut controller = Controller::new(s.rate_bps, s.isolation, s.diffserv);
        controller.resume(d.datapath())?;
        Ok(controller)
    };
    let mut maps = vec![(Direction::Egress, Arc::new(deployment.datapath().reader()?))];
    if let Some(ingress) = deployment.nested_mut() {
        maps.push((Direction::Ingress, Arc::new(ingress.datapath().reader()?)));
    }
    let autorate = Autorate::start(settings, deployment.iface().ifindex)?;
    Ok(Shaped {
        egress: controller(&deployment)?,
        ingress: deployment.nested_mut().map(|i| controller(i)).transpose()?,
        autorate,
        maps,
        deployment,
        source,
        control,
        failed_checks: 0,
    })
}

/// The next request on any interface's socket, with the interface's place. Cancel-safe, as
/// each socket's `next` is.
async fn next_request(shaped: &mut [Shaped]) -> (usize, Pending) {
    poll_fn(|cx| {
        for (at, s) in shaped.iter_mut().enumerate() {
            if let Poll::Ready(Some(pending)) = s.control.poll_next(cx) {
                return Poll::Ready((at, pending));
            }
        }
        Poll::Pending
    })
    .await
}

/// The watcher's next change; never, without a watcher.
async fn linkwatch_changed(watcher: &mut Option<Subscription>) -> std::io::Result<()> {
    match watcher {
        Some(w) => w.changed().await,
        None => std::future::pending().await,
    }
}

/// Applies `settings` (from `next`) to `shaped` in place. The settings were resolved (validated
/// as at start) and are compared with the running ones first, so that a bad value, or a
/// difference that needs a restart, changes nothing. The control loops take the new policy and
/// tick at once, so that the hosts' levels follow a new rate within a tick. Returns what
/// changed.
fn change(
    shaped: &mut Shaped,
    next: Source,
    settings: &Settings,
    monitor: &Monitor,
) -> anyhow::Result<Vec<String>> {
    // Where autorate has taken a rate and the change does not ask for another, it stays.
    let applied = match &shaped.autorate {
        Some(a) => a.overlay(settings),
        None => settings.clone(),
    };
    let settings = &applied;
    let differences = live::change::differences(shaped.deployment.settings(), settings)?;
    let ifindex = shaped.deployment.iface().ifindex;
    Autorate::reconfigure(&mut shaped.autorate, settings, ifindex)?;
    if !differences.is_empty() {
        apply(shaped, settings, monitor)
            .map_err(|e| e.context("applying the change failed part-way; run `shaper set` or `shaper reload` again, or restart"))?;
        control_ticks(shaped, monitor);
    }
    shaped.source = next;
    Ok(differences.iter().map(ToString::to_string).collect())
}

/// One step of each of `shaped`'s control loops, then of its autorate.
fn control_ticks(shaped: &mut Shaped, monitor: &Monitor) {
    let Shaped {
        deployment,
        egress,
        ingress,
        ..
    } = shaped;
    let name = deployment.iface().name.clone();
    let carried_egress = control_tick(&name, deployment, egress, Direction::Egress, monitor);
    let carried_ingress = match (deployment.nested_mut(), ingress.as_mut()) {
        (Some(i), Some(c)) => control_tick(&name, i, c, Direction::Ingress, monitor),
        _ => None,
    };
    follow_autorate(shaped, carried_egress, carried_ingress, monitor);
}

/// One control loop step; returns what the direction carried. A failed tick keeps the previous
/// levels in force; the next retries.
fn control_tick(
    interface: &str,
    deployment: &mut Deployment,
    controller: &mut Controller,
    direction: Direction,
    monitor: &Monitor,
) -> Option<f64> {
    let started = Instant::now();
    let result = controller.tick(deployment.datapath_mut());
    monitor.ticked(
        interface,
        direction,
        result.as_ref().ok(),
        started.elapsed(),
    );
    match result {
        // A tick skipped as too soon after the last (epoch 0) measured nothing.
        Ok(summary) => {
            debug!(iface = %deployment.iface().name, ?summary, "tick");
            (summary.epoch != 0).then_some(summary.carried_bps)
        }
        Err(e) => {
            warn!("control loop on {}: {e}", deployment.iface().name);
            None
        }
    }
}

/// Autorate's step after the control loops': its new rates applied in place, the control
/// loops' policies with them.
fn follow_autorate(
    shaped: &mut Shaped,
    carried_egress: Option<f64>,
    carried_ingress: Option<f64>,
    monitor: &Monitor,
) {
    let Some(autorate) = shaped.autorate.as_mut() else {
        return;
    };
    let name = shaped.deployment.iface().name.clone();
    let next = autorate.tick(
        shaped.deployment.settings(),
        carried_egress,
        carried_ingress,
    );
    for way in [Direction::Egress, Direction::Ingress] {
        if let Some(status) = autorate.status(way) {
            monitor.autorate(&name, way, status);
        }
    }
    let Some(next) = next else {
        return;
    };
    // A failure leaves the rates as they were; the next tick tries again.
    if let Err(e) = apply(shaped, &next, monitor) {
        warn!("{name}: autorate's new rate: {e:#}");
    }
}

/// Applies `settings` to `shaped`'s deployment in place, and their policies to its control
/// loops and the metrics.
fn apply(shaped: &mut Shaped, settings: &Settings, monitor: &Monitor) -> anyhow::Result<()> {
    shape::change(&mut shaped.deployment, settings)?;
    let name = shaped.name().to_string();
    shaped
        .egress
        .set_policy(settings.rate_bps, settings.isolation, settings.diffserv);
    monitor.rate(&name, Direction::Egress, settings.rate_bps);
    if let (Some(c), Some(i)) = (shaped.ingress.as_mut(), settings.ingress.as_deref()) {
        c.set_policy(i.rate_bps, i.isolation, i.diffserv);
        monitor.rate(&name, Direction::Ingress, i.rate_bps);
    }
    Ok(())
}

/// Tells the monitor what is shaped on `shaped`'s interface (each direction's state file: its
/// maps and settings) and whether its last health check passed.
fn publish(monitor: &Monitor, shaped: &mut Shaped, passed: bool) {
    let interface = shaped.name().to_string();
    for (direction, maps) in &shaped.maps {
        monitor.holds(&interface, *direction, maps.clone());
    }
    let mut states = vec![(Direction::Egress, shaped.deployment.state().clone())];
    if let Some(ingress) = shaped.deployment.nested_mut() {
        states.push((Direction::Ingress, ingress.state().clone()));
    }
    monitor.checked(&interface, states, passed);
}
