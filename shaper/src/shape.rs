//! Shaping a device's egress: the parts of its deployment, in the order they are applied.
//!
//! 1. The device's GSO limits, lowered at low rates (`link::GsoLimits`), so that what local TCP
//!    builds fits the calendar the data path was configured for before the programs see it.
//! 2. The root qdisc: fq (mq + fq on multi-queue devices), which releases packets at the
//!    departure times the data path stamps.
//! 3. The programs: a TCX link, or (kernels < 6.6) a netlink filter under clsact. Restored in
//!    reverse, they detach before the root qdisc goes back, and what they already scheduled
//!    leaves first ([`MAX_DRAIN`]), so that exiting drops no traffic.
//! 4. The segmenter (`segmenter`), where the rate asks for one; one that cannot be had is
//!    warned about and left out.
//!
//! The ingress direction (`ingress`) is added after these by the caller.

use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use shaper_common::{abi::ShaperConfig, ackfilter::AckFilter, names::program_names};

use crate::{
    bpf::{self, Datapath, Prior},
    config::{Settings, StateParams},
    conntrack,
    deploy::{Context, Deployment, Part, repaired},
    filter::{self, Hook},
    handover::{self, Leaving, Left},
    health::{self, Fault},
    link::{
        DeviceLimits, GsoLimits, Interface, LimitsPlan, apply_limits, plan_limits, restore_limits,
    },
    live,
    netlink::Socket,
    own, probe,
    qdisc::{self, FqParams, Snapshot},
    record::{AttachMode, State},
    runtime::{self, InterfaceLock},
    segmenter::{self, Segmenter},
};

#[derive(Debug, thiserror::Error)]
pub enum ShapeError {
    #[error("attaching to {iface}: {source}")]
    Attach {
        iface: String,
        source: Box<bpf::BpfError>,
    },
}

/// Longest wait at exit for already-scheduled packets to leave before fq is replaced.
const MAX_DRAIN: Duration = Duration::from_secs(3);

/// Shapes `iface`'s egress with `settings`, taking over (and in the end restoring) what a
/// predecessor recorded for it: one that crashed, or one that left it shaped (`handover`),
/// whose programs this one replaces in place and whose flow state it carries on.
pub fn apply(settings: &Settings, iface: Interface) -> anyhow::Result<Deployment> {
    apply_with(settings, iface, Datapath::load)
}

/// [`apply`] with the data path from `datapath` (a spare loaded ahead, `spares`), given the
/// map sizing; a predecessor's maps, when it left them, are loaded instead.
pub fn apply_with(
    settings: &Settings,
    iface: Interface,
    datapath: impl FnOnce(&StateParams) -> Result<Datapath, bpf::BpfError>,
) -> anyhow::Result<Deployment> {
    let lock = InterfaceLock::acquire(&iface)?;
    let stale = runtime::read_state(&iface).unwrap_or_else(|e| {
        warn!("ignoring unreadable state: {e}");
        None
    });
    let left = Left::find(&iface);
    let mut sock = Socket::open()?;
    let link_header_bytes = match settings.link_header_bytes {
        Some(bytes) => bytes,
        None => iface.link_header_bytes(&mut sock)?,
    };
    let frame_bytes = iface.mtu(&mut sock)? + link_header_bytes;
    let gso = plan_limits::<GsoLimits>(
        &mut sock,
        &iface,
        settings.sizing_rate_bps(),
        settings.split_gso,
        stale.as_ref().and_then(|s| s.original_gso),
    );
    let largest_packet = match &gso {
        Some(plan) => plan.wanted.largest_packet_bytes(frame_bytes),
        None => GsoLimits::UNKNOWN.largest_packet_bytes(frame_bytes),
    };
    let loading = Instant::now();
    let (mut datapath, carried) = match &left {
        Some(left) => Datapath::load_carrying(&settings.state, left)?,
        None => (datapath(&settings.state)?, false),
    };
    info!(
        "{}: data path loaded in {} ms{}",
        iface.name,
        loading.elapsed().as_millis(),
        if carried {
            ", with the flow state the previous shaper left"
        } else {
            ""
        }
    );
    datapath.configure(&settings.datapath_config(
        frame_bytes,
        link_header_bytes,
        largest_packet,
    ))?;
    conntrack::apply(
        &mut datapath,
        settings.nat,
        settings.behind_bottleneck,
        &iface.name,
    )?;
    // Before any packet meets it: the machine is one host from the first.
    own::apply(&mut datapath, &own::addresses(&mut sock)?, &iface.name)?;

    let current = qdisc::snapshot(&mut sock, iface.ifindex, &iface.name)?;
    let (original, clsact_added) = match &stale {
        Some(prev) => {
            if prev.kept {
                info!(
                    "{}: taking over from the shaper (pid {}) that left it shaped",
                    iface.name, prev.pid
                );
            } else {
                warn!(
                    "a previous shaper (pid {}) did not exit cleanly on {}; taking over its state",
                    prev.pid, iface.name
                );
            }
            (prev.original.clone(), prev.clsact_added)
        }
        None => (current.clone(), false),
    };
    let mode = if probe::has_tcx() {
        AttachMode::Tcx
    } else {
        AttachMode::Netlink
    };
    let header = State {
        pid: std::process::id(),
        iface: iface.name.clone(),
        ifindex: iface.ifindex,
        rate_bps: settings.rate_bps,
        horizon_ns: settings.horizon_ns,
        isolation: settings.isolation.name().to_string(),
        diffserv: settings.diffserv.name().to_string(),
        started_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        starting: true,
        kept: false,
        attach: mode,
        clsact_added: false,
        original: Snapshot::default(),
        original_gso: None,
        ingress: None,
        segmenter: None,
        maps: datapath.map_ids()?,
    };
    let parts: Vec<Box<dyn Part>> = vec![
        Box::new(Limits::new(
            gso,
            stale.as_ref().and_then(|s| s.original_gso),
        )),
        Box::new(RootQdisc {
            installed: qdisc::is_installed(&current),
            original,
            fq: settings.fq,
        }),
        Box::new(Programs {
            mode,
            clsact_added,
            settings: settings.clone(),
            frame_bytes,
            link_header_bytes,
            left,
        }),
    ];
    let mut deployment = Deployment::apply(iface, settings, datapath, lock, header, stale, parts)?;
    info!("shaping {} ({mode:?} attach)", settings.describe());
    add_segmenter(&mut deployment, settings);
    // Shaping: what the predecessor pinned for this (links not taken, with their programs)
    // goes.
    handover::clear(deployment.iface());
    Ok(deployment)
}

/// Applies `settings` to a running deployment in place (`Deployment::change`); a segmenter
/// that the new rate needs and the old one did not is started, as at start.
pub fn change(deployment: &mut Deployment, settings: &Settings) -> anyhow::Result<()> {
    // Autorate changes the rates ten times a second: those are its to log.
    let rates_alone = live::change::differences(deployment.settings(), settings).is_ok_and(|d| {
        d.iter()
            .all(|d| matches!(d.setting, "rate" | "ingress-rate"))
    });
    deployment.change(settings)?;
    if deployment.state().segmenter.is_none() {
        add_segmenter(deployment, settings);
    }
    if rates_alone {
        debug!("now shaping {}", settings.describe());
    } else {
        info!("now shaping {}", settings.describe());
    }
    Ok(())
}

/// Adds the segmenter where the settings and the rate ask for one, taking up a predecessor's;
/// a predecessor's that is not wanted any more is removed.
fn add_segmenter(deployment: &mut Deployment, settings: &Settings) {
    let prior = deployment.take_stale_segmenter();
    let wanted = settings
        .segmenter
        .then(|| GsoLimits::split_segs(settings.sizing_rate_bps()))
        .flatten();
    // The segmenter's IFB is an Ethernet device and its packets cross it as Ethernet frames: a
    // device that carries IP alone keeps TCP's lowered GSO limits only (forwarded super-packets
    // leave whole there).
    let carries_ip_alone = deployment.datapath().config().link_header_bytes == 0;
    let wanted = wanted.filter(|_| !carries_ip_alone);
    let Some(split_segs) = wanted else {
        if let Some(prior) = prior
            && let Err(e) = segmenter::clean_stale(deployment.iface(), &prior)
        {
            warn!("removing the previous shaper's segmenter: {e:#}");
        }
        return;
    };
    let segmenter = Segmenter::new(deployment.iface(), split_segs, prior);
    if let Err(e) = deployment.add(Box::new(segmenter)) {
        // Shaping goes on, with coarser bursts of forwarded super-packets, as with a device
        // that refuses lower GSO limits.
        warn!(
            "{}: GSO packets built elsewhere (forwarded, GRO) will leave as whole bursts: {e:#}",
            deployment.iface().name
        );
    }
}

/// A device's GSO or GRO limits, lowered to the plan and put back on restore.
pub struct Limits<L> {
    plan: Option<LimitsPlan<L>>,
    /// What restore writes back (`None`: the device's own were left alone).
    original: Option<L>,
}

impl<L: DeviceLimits> Limits<L> {
    /// Lowers the limits to `plan`; without a plan (the device's limits unreadable) only
    /// restores `recorded`, what a crashed predecessor recorded.
    pub fn new(plan: Option<LimitsPlan<L>>, recorded: Option<L>) -> Self {
        let original = match &plan {
            Some(plan) => plan.to_restore(),
            None => recorded,
        };
        Self { plan, original }
    }

    /// What restoring puts back, for the record.
    pub fn original(&self) -> Option<L> {
        self.original
    }

    /// Sets the planned limits (a device that refuses is warned about: it is shaped anyway).
    pub fn apply(&mut self, sock: &mut Socket, iface: &Interface) {
        if let Some(plan) = self.plan.take() {
            apply_limits(sock, iface, plan);
        }
    }

    pub fn restore(&self, sock: &mut Socket, iface: &Interface) {
        restore_limits(sock, iface, self.original);
    }

    /// Plans the limits for a new rate from the device's own (what restore puts back), for
    /// [`Limits::apply`] after the caller records [`Limits::original`].
    pub fn replan(&mut self, sock: &mut Socket, iface: &Interface, rate_bps: u64, split: bool) {
        let plan = plan_limits::<L>(sock, iface, rate_bps, split, self.original);
        if let Some(plan) = &plan {
            self.original = self.original.or(plan.to_restore());
        }
        self.plan = plan;
    }
}

impl Part for Limits<GsoLimits> {
    fn record(&self, state: &mut State) {
        state.original_gso = self.original;
    }

    fn apply(&mut self, cx: &mut Context) -> anyhow::Result<()> {
        Limits::apply(self, cx.sock, cx.iface);
        Ok(())
    }

    fn restore(&mut self, cx: &mut Context) -> anyhow::Result<()> {
        if !cx.gone {
            Limits::restore(self, cx.sock, cx.iface);
        }
        Ok(())
    }

    fn change(&mut self, cx: &mut Context, settings: &Settings) -> anyhow::Result<()> {
        self.replan(
            cx.sock,
            cx.iface,
            settings.sizing_rate_bps(),
            settings.split_gso,
        );
        cx.record(self)?;
        Limits::apply(self, cx.sock, cx.iface);
        Ok(())
    }
}

/// fq (or mq + fq) at the root, in place of what was there.
struct RootQdisc {
    /// What was there before shaper (before a crashed predecessor, when one is taken over).
    original: Snapshot,
    /// The root already is shaper's (a crashed predecessor's).
    installed: bool,
    fq: FqParams,
}

impl RootQdisc {
    fn install(&self, sock: &mut Socket, iface: &Interface) -> anyhow::Result<()> {
        let queues = iface.num_tx_queues(sock)?;
        qdisc::install(sock, iface.ifindex, &iface.name, queues, &self.fq)?;
        Ok(())
    }
}

impl Part for RootQdisc {
    fn record(&self, state: &mut State) {
        state.original = self.original.clone();
    }

    fn apply(&mut self, cx: &mut Context) -> anyhow::Result<()> {
        if !self.installed {
            self.install(cx.sock, cx.iface)?;
        }
        Ok(())
    }

    fn restore(&mut self, cx: &mut Context) -> anyhow::Result<()> {
        if !cx.gone {
            qdisc::restore(cx.sock, cx.iface.ifindex, &cx.iface.name, &self.original)?;
        }
        Ok(())
    }

    /// fq's limits, where they follow the rate: changed on the qdiscs that are there.
    fn change(&mut self, cx: &mut Context, settings: &Settings) -> anyhow::Result<()> {
        if settings.fq != self.fq {
            let queues = cx.iface.num_tx_queues(cx.sock)?;
            qdisc::change_fq(
                cx.sock,
                cx.iface.ifindex,
                &cx.iface.name,
                queues,
                &settings.fq,
            )?;
            self.fq = settings.fq;
        }
        Ok(())
    }

    fn keep(&mut self, cx: &mut Context) -> anyhow::Result<()> {
        let qdiscs = qdisc::list(cx.sock, cx.iface.ifindex)?;
        if let Some(fault) = health::qdisc_fault(&qdiscs) {
            // The original recorded at start is still what restoring puts back.
            self.install(cx.sock, cx.iface)?;
            repaired(cx.iface, &fault, "fq re-installed");
        }
        Ok(())
    }
}

/// The data path's programs, attached to the device, and their configuration.
struct Programs {
    mode: AttachMode,
    /// shaper added clsact for the netlink filters (and removes it on restore).
    clsact_added: bool,
    settings: Settings,
    /// The frame size the data path's configuration was computed for.
    frame_bytes: u32,
    /// The link-layer header of the packets (`Settings::link_header_bytes`, else the
    /// device's): fixed while it runs.
    link_header_bytes: u32,
    /// What a predecessor pinned (its TCX links), for `apply` to take over.
    left: Option<Left>,
}

impl Programs {
    /// Recomputes the data path's configuration for a new frame size, keeping the segmenter's
    /// part of it.
    fn reconfigure(&mut self, cx: &mut Context, frame_bytes: u32) -> anyhow::Result<()> {
        let limits = cx.iface.gso_limits(cx.sock).unwrap_or(GsoLimits::UNKNOWN);
        let current = cx.datapath.config();
        let config = ShaperConfig {
            split_gso_segs: current.split_gso_segs,
            segmenter_ifindex: current.segmenter_ifindex,
            ..self.settings.datapath_config(
                frame_bytes,
                self.link_header_bytes,
                limits.largest_packet_bytes(frame_bytes),
            )
        };
        cx.datapath.configure(&config)?;
        conntrack::apply(
            cx.datapath,
            self.settings.nat,
            self.settings.behind_bottleneck,
            &cx.iface.name,
        )?;
        self.frame_bytes = frame_bytes;
        Ok(())
    }

    /// Attaches the ACK filter's observer of the data direction when the settings filter ACKs
    /// and it is not attached yet. Once attached it stays until exit: with the filter off it
    /// only records what arrives.
    fn observe_ingress(&mut self, cx: &mut Context) -> anyhow::Result<()> {
        if self.settings.ack_filter == AckFilter::Off
            || cx.datapath.attached_id(Hook::Ingress)?.is_some()
        {
            return Ok(());
        }
        self.attach(cx, Hook::Ingress)
    }

    /// Attaches the program at `hook`: in place of a predecessor's where one is attached (one
    /// that left the interface shaped, or a crashed run's netlink filter), atomically, so that
    /// no packet passes between the two; anew otherwise.
    fn attach(&mut self, cx: &mut Context, hook: Hook) -> anyhow::Result<()> {
        let prior = match self.mode {
            AttachMode::Tcx => self
                .left
                .as_ref()
                .and_then(|left| left.take_link(hook))
                .map(Prior::Link),
            AttachMode::Netlink => prior_filter(cx, hook)?.map(|handle| Prior::Filter { handle }),
        };
        let name = &cx.iface.name;
        let attached = match (prior, hook) {
            (Some(prior), _) => cx.datapath.take_over(hook, name, prior),
            (None, Hook::Egress) => cx.datapath.attach_egress(name, self.mode),
            (None, Hook::Ingress) => cx.datapath.attach_ingress(name, self.mode),
        };
        attached.map_err(|source| ShapeError::Attach {
            iface: name.clone(),
            source: Box::new(source),
        })?;
        Ok(())
    }
}

/// The handle of shaper's netlink filter at `hook` (at [`bpf::NETLINK_PRIORITY`]), left by a
/// predecessor.
fn prior_filter(cx: &mut Context, hook: Hook) -> anyhow::Result<Option<u32>> {
    Ok(filter::list(cx.sock, cx.iface.ifindex, hook)?
        .into_iter()
        // The kernel lists the priority's head too: the filter is the one with a program.
        .find(|f| {
            f.priority == u32::from(bpf::NETLINK_PRIORITY)
                && f.kind == "bpf"
                && f.program_id.is_some()
        })
        .map(|f| f.handle))
}

impl Part for Programs {
    fn record(&self, state: &mut State) {
        state.attach = self.mode;
        state.clsact_added = self.clsact_added;
    }

    fn apply(&mut self, cx: &mut Context) -> anyhow::Result<()> {
        if self.mode == AttachMode::Netlink {
            cx.ensure_clsact(self, |p| &mut p.clsact_added)?;
        }
        self.attach(cx, Hook::Egress)?;
        self.observe_ingress(cx)?;
        if self.mode == AttachMode::Netlink
            && self.settings.ack_filter == AckFilter::Off
            && prior_filter(cx, Hook::Ingress)?.is_some()
        {
            // A predecessor's observer, which these settings do not want.
            bpf::remove_stale_filter_at(&cx.iface.name, Hook::Ingress);
        }
        let name = &cx.iface.name;
        // Shaping works without it; only a stall's clump then goes uncharged.
        if let Err(e) = cx
            .datapath
            .watch_dequeue(cx.iface.ifindex, self.settings.behind_bottleneck)
        {
            warn!(
                "not watching {name} for packets leaving ahead of the rate (a stall's clump goes uncharged): {e}"
            );
        }
        Ok(())
    }

    fn restore(&mut self, cx: &mut Context) -> anyhow::Result<()> {
        let detached = cx.datapath.detach();
        if cx.gone {
            // The device took its links and filters along: detaching from it can only fail.
            return Ok(());
        }
        drain(cx.datapath);
        if self.clsact_added
            && let Err(e) = qdisc::delete_clsact(cx.sock, cx.iface.ifindex)
        {
            warn!("removing clsact from {}: {e}", cx.iface.name);
        }
        Ok(detached?)
    }

    /// The data path's configuration, recomputed with the device's GSO limits as they now are
    /// (the limits part changed them first).
    fn change(&mut self, cx: &mut Context, settings: &Settings) -> anyhow::Result<()> {
        self.settings = settings.clone();
        self.reconfigure(cx, self.frame_bytes)?;
        self.observe_ingress(cx)
    }

    fn hand_over(&mut self, cx: &mut Context, leaving: &Leaving) -> anyhow::Result<()> {
        cx.datapath.leave(leaving, self.mode)?;
        Ok(())
    }

    fn keep(&mut self, cx: &mut Context) -> anyhow::Result<()> {
        let frame_bytes = cx.iface.mtu(cx.sock)? + self.link_header_bytes;
        if frame_bytes != self.frame_bytes {
            let fault = Fault::Mtu {
                was: self.frame_bytes,
                now: frame_bytes,
            };
            self.reconfigure(cx, frame_bytes)?;
            repaired(cx.iface, &fault, "configuration recomputed");
        }
        for hook in [Hook::Egress, Hook::Ingress] {
            let Some(id) = cx.datapath.attached_id(hook)? else {
                continue;
            };
            if health::is_attached(cx.sock, cx.iface, self.mode, hook, id)? {
                continue;
            }
            if self.mode == AttachMode::Netlink {
                // Someone deleted clsact, and the filters with it.
                cx.ensure_clsact(self, |p| &mut p.clsact_added)?;
            }
            cx.datapath
                .reattach(hook, &cx.iface.name, self.mode)
                .map_err(|source| ShapeError::Attach {
                    iface: cx.iface.name.clone(),
                    source: Box::new(source),
                })?;
            let program = match hook {
                Hook::Egress => program_names::EGRESS,
                Hook::Ingress => program_names::INGRESS,
            };
            repaired(cx.iface, &Fault::Detached { program }, "attached again");
        }
        Ok(())
    }
}

/// Waits until the departure clock has passed, so fq is empty when it is replaced.
fn drain(datapath: &Datapath) {
    let deadline = Instant::now() + MAX_DRAIN;
    while Instant::now() < deadline {
        match datapath.snapshot() {
            Ok(view) if view.backlog_ns > 0 => std::thread::sleep(
                Duration::from_nanos(view.backlog_ns).min(Duration::from_millis(50))
                    + Duration::from_millis(1),
            ),
            _ => break,
        }
    }
}
