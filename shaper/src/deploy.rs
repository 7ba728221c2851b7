//! Putting shaper on an interface and taking it off again.
//!
//! `apply` either completes or leaves the interface exactly as it found it: every step that
//! changes the system has its undo run on the failure of any later step. `teardown` (also run
//! on drop, e.g. after a panic) detaches first, lets what is already scheduled leave, then
//! restores the original qdiscs, so exiting drops no traffic.

use std::time::{Duration, Instant};

use tracing::{info, warn};

use shaper_common::{abi::ShaperConfig, ackfilter::AckFilter, names::program_names};

use crate::{
    bpf::{self, Datapath},
    clsact,
    config::Settings,
    filter::Hook,
    health::{self, Fault},
    link::{GsoLimits, Interface, apply_limits, plan_limits, restore_limits},
    netlink::Socket,
    probe,
    qdisc::{self, Snapshot},
    record::{AttachMode, IngressState, SegmenterState, State},
    runtime::{self, InterfaceLock},
    segmenter::{self, Segmenter},
};

#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    #[error("attaching to {iface}: {source}")]
    Attach {
        iface: String,
        source: Box<bpf::BpfError>,
    },
}

/// Longest wait at exit for already-scheduled packets to leave before fq is replaced.
const MAX_DRAIN: Duration = Duration::from_secs(3);

pub struct Deployment {
    iface: Interface,
    settings: Settings,
    /// The frame size the data path's configuration was computed for.
    frame_bytes: u32,
    datapath: Datapath,
    state: State,
    /// What a previous, crashed shaper had set up for the ingress direction (to clean up).
    stale_ingress: Option<IngressState>,
    segmenter: Option<Segmenter>,
    _lock: InterfaceLock,
    torn_down: bool,
    /// The device went away: there is nothing left on it to restore.
    gone: bool,
}

impl Deployment {
    pub fn apply(settings: &Settings, iface: Interface) -> anyhow::Result<Self> {
        let lock = InterfaceLock::acquire(&iface)?;
        let stale = runtime::read_state(&iface).unwrap_or_else(|e| {
            warn!("ignoring unreadable state: {e}");
            None
        });
        let mut sock = Socket::open()?;
        let frame_bytes = iface.frame_bytes(&mut sock)?;
        let gso = plan_limits::<GsoLimits>(
            &mut sock,
            &iface,
            settings.rate_bps,
            settings.split_gso,
            stale.as_ref().and_then(|s| s.original_gso),
        );
        let largest_packet = match &gso {
            Some(plan) => plan.wanted.largest_packet_bytes(frame_bytes),
            None => GsoLimits::UNKNOWN.largest_packet_bytes(frame_bytes),
        };
        if let Some(seg) = stale.as_ref().and_then(|s| s.segmenter.as_ref()) {
            segmenter::clean_stale(&iface, seg)?;
        }
        let mut datapath = Datapath::load(&settings.state)?;
        datapath.configure(&settings.datapath_config(frame_bytes, largest_packet))?;

        let current = qdisc::snapshot(&mut sock, iface.ifindex, &iface.name)?;
        let (original, mut clsact_added) = match &stale {
            Some(prev) => {
                warn!(
                    "a previous shaper (pid {}) did not exit cleanly on {}; taking over its state",
                    prev.pid, iface.name
                );
                if prev.attach == AttachMode::Netlink {
                    bpf::remove_stale_filter(&iface.name);
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
        let add_clsact = mode == AttachMode::Netlink && !current.clsact;
        let state = State {
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
            attach: mode,
            clsact_added: clsact_added || add_clsact,
            original,
            original_gso: match &gso {
                Some(plan) => plan.to_restore(),
                None => stale.as_ref().and_then(|s| s.original_gso),
            },
            ingress: None,
            segmenter: None,
            maps: datapath.map_ids()?,
        };
        // Recorded before anything changes, so a crash at any later point leaves a successor
        // what it needs to restore the interface.
        runtime::write_state(&iface, &state)?;
        let rollback = |sock: &mut Socket, clsact_added| {
            rollback(sock, &iface, &state.original, clsact_added);
            restore_limits(sock, &iface, state.original_gso);
            runtime::remove_state(&iface);
        };

        if !qdisc::is_installed(&current) {
            let queues = iface.num_tx_queues(&mut sock)?;
            if let Err(e) =
                qdisc::install(&mut sock, iface.ifindex, &iface.name, queues, &settings.fq)
            {
                rollback(&mut sock, clsact_added);
                return Err(e.into());
            }
        }
        if add_clsact {
            if let Err(e) = clsact::ensure(&mut sock, &iface) {
                rollback(&mut sock, clsact_added);
                return Err(e.into());
            }
            clsact_added = true;
        }
        let attached = datapath.attach_egress(&iface.name, mode).and_then(|()| {
            if settings.ack_filter == AckFilter::Off {
                Ok(())
            } else {
                datapath.attach_ingress(&iface.name, mode)
            }
        });
        if let Err(source) = attached {
            let _ = datapath.detach();
            rollback(&mut sock, clsact_added);
            return Err(DeployError::Attach {
                iface: iface.name.clone(),
                source: Box::new(source),
            }
            .into());
        }
        if let Some(plan) = gso {
            apply_limits(&mut sock, &iface, plan);
        }
        // Shaping works without it; only a stall's clump then goes uncharged.
        if let Err(e) = datapath.watch_dequeue(iface.ifindex) {
            warn!(
                "not watching {} for packets leaving late (a stall's clump goes uncharged): {e}",
                iface.name
            );
        }

        let mut deployment = Self {
            iface,
            settings: settings.clone(),
            frame_bytes,
            datapath,
            state: State {
                starting: false,
                ..state
            },
            stale_ingress: stale.and_then(|s| s.ingress),
            segmenter: None,
            _lock: lock,
            torn_down: false,
            gone: false,
        };
        // From here on, Drop undoes everything if writing the state fails.
        runtime::write_state(&deployment.iface, &deployment.state)?;
        info!("shaping {} ({:?} attach)", settings.describe(), mode);
        if settings.segmenter
            && let Some(split_segs) = GsoLimits::split_segs(settings.rate_bps)
        {
            deployment.start_segmenter(split_segs)?;
        }
        Ok(deployment)
    }

    /// Puts the segmenter in place, recorded in the state file before it exists. One that
    /// cannot be had is warned about: shaping goes on, with coarser bursts of forwarded
    /// super-packets, as with a device that refuses lower GSO limits.
    fn start_segmenter(&mut self, split_segs: u32) -> anyhow::Result<()> {
        self.state.segmenter = Some(SegmenterState::planned(&self.iface));
        runtime::write_state(&self.iface, &self.state)?;
        let (iface, state) = (&self.iface, &mut self.state);
        let started = Segmenter::start(iface, &mut self.datapath, split_segs, &mut |seg| {
            state.segmenter = Some(seg.clone());
            runtime::write_state(iface, state).map_err(Into::into)
        });
        match started {
            Ok(seg) => {
                self.state.segmenter = Some(seg.state().clone());
                self.segmenter = Some(seg);
            }
            Err(e) => {
                warn!(
                    "{}: GSO packets built elsewhere (forwarded, GRO) will leave as whole bursts: {e:#}",
                    self.iface.name
                );
                self.state.segmenter = None;
            }
        }
        runtime::write_state(&self.iface, &self.state)?;
        Ok(())
    }

    pub fn iface(&self) -> &Interface {
        &self.iface
    }

    /// The settings this deployment was applied with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The ingress set-up a crashed predecessor left, once (`ingress::Ingress::start` cleans it up).
    pub fn take_stale_ingress(&mut self) -> Option<IngressState> {
        self.stale_ingress.take()
    }

    /// Records the ingress set-up in the state file, so a successor can undo it after a crash.
    pub fn record_ingress(&mut self, ingress: Option<IngressState>) -> anyhow::Result<()> {
        self.state.ingress = ingress;
        runtime::write_state(&self.iface, &self.state)?;
        Ok(())
    }

    pub fn datapath(&self) -> &Datapath {
        &self.datapath
    }

    pub fn datapath_mut(&mut self) -> &mut Datapath {
        &mut self.datapath
    }

    pub fn teardown(mut self) -> anyhow::Result<()> {
        self.undo()
    }

    fn undo(&mut self) -> anyhow::Result<()> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        if let Some(seg) = self.segmenter.take() {
            seg.stop(&mut self.datapath);
        }
        if self.gone {
            // Its qdiscs, filters and links went with the device.
            let _ = self.datapath.detach();
            runtime::remove_state(&self.iface);
            return Ok(());
        }
        let detached = self.datapath.detach();
        self.drain();
        let mut sock = Socket::open()?;
        let restored = qdisc::restore(
            &mut sock,
            self.iface.ifindex,
            &self.iface.name,
            &self.state.original,
        );
        if self.state.clsact_added
            && let Err(e) = qdisc::delete_clsact(&mut sock, self.iface.ifindex)
        {
            warn!("removing clsact from {}: {e}", self.iface.name);
        }
        restore_limits(&mut sock, &self.iface, self.state.original_gso);
        runtime::remove_state(&self.iface);
        detached?;
        restored?;
        info!("{} restored", self.iface.name);
        Ok(())
    }

    /// Checks that what shaper installed is still in place and puts back what someone else
    /// changed (`health`). A device that went away is a `health::Lost` error: the caller ends
    /// the run, and teardown then removes what shaper had elsewhere (an IFB, the state file).
    /// Any other error is a check or repair that failed, to be tried again.
    pub fn keep(&mut self, sock: &mut Socket) -> anyhow::Result<()> {
        if let Some(fault) = health::link_fault(&self.iface) {
            self.gone = true;
            return Err(health::Lost {
                iface: self.iface.name.clone(),
                fault,
            }
            .into());
        }
        let frame_bytes = self.iface.frame_bytes(sock)?;
        if frame_bytes != self.frame_bytes {
            let fault = Fault::Mtu {
                was: self.frame_bytes,
                now: frame_bytes,
            };
            self.reconfigure(sock, frame_bytes)?;
            repaired(&self.iface, &fault, "configuration recomputed");
        }
        let qdiscs = qdisc::list(sock, self.iface.ifindex)?;
        if let Some(fault) = health::qdisc_fault(&qdiscs) {
            let queues = self.iface.num_tx_queues(sock)?;
            qdisc::install(
                sock,
                self.iface.ifindex,
                &self.iface.name,
                queues,
                &self.settings.fq,
            )?;
            repaired(&self.iface, &fault, "fq re-installed");
        }
        for hook in [Hook::Egress, Hook::Ingress] {
            let Some(id) = self.datapath.attached_id(hook)? else {
                continue;
            };
            if health::is_attached(sock, &self.iface, self.state.attach, hook, id)? {
                continue;
            }
            if self.state.attach == AttachMode::Netlink {
                self.restore_clsact(sock)?;
            }
            self.datapath
                .reattach(hook, &self.iface.name, self.state.attach)
                .map_err(|source| DeployError::Attach {
                    iface: self.iface.name.clone(),
                    source: Box::new(source),
                })?;
            let program = match hook {
                Hook::Egress => program_names::EGRESS,
                Hook::Ingress => program_names::INGRESS,
            };
            repaired(&self.iface, &Fault::Detached { program }, "attached again");
        }
        self.keep_segmenter(sock)
    }

    /// Recomputes the data path's configuration for a new frame size, keeping the segmenter's
    /// part of it.
    fn reconfigure(&mut self, sock: &mut Socket, frame_bytes: u32) -> anyhow::Result<()> {
        let limits = self.iface.gso_limits(sock).unwrap_or(GsoLimits::UNKNOWN);
        let current = self.datapath.config();
        let config = ShaperConfig {
            split_gso_segs: current.split_gso_segs,
            segmenter_ifindex: current.segmenter_ifindex,
            ..self
                .settings
                .datapath_config(frame_bytes, limits.largest_packet_bytes(frame_bytes))
        };
        self.datapath.configure(&config)?;
        self.frame_bytes = frame_bytes;
        Ok(())
    }

    /// Puts clsact back for a netlink filter (someone deleted it, and shaper's filters with
    /// it); recorded first, so that shaper removes what it added.
    fn restore_clsact(&mut self, sock: &mut Socket) -> anyhow::Result<()> {
        if qdisc::ingress_slot(sock, self.iface.ifindex)?.as_deref() == Some("clsact") {
            return Ok(());
        }
        self.state.clsact_added = true;
        runtime::write_state(&self.iface, &self.state)?;
        clsact::add_recorded(sock, &self.iface, &mut self.state.clsact_added)?;
        Ok(())
    }

    /// The segmenter's filter is put back; a segmenter whose IFB is gone is started anew.
    fn keep_segmenter(&mut self, sock: &mut Socket) -> anyhow::Result<()> {
        let Some(seg) = self.segmenter.as_mut() else {
            return Ok(());
        };
        let Some(fault) = seg.fault(sock, &self.datapath)? else {
            return Ok(());
        };
        if let Fault::Filter { .. } = fault {
            let (iface, state) = (&self.iface, &mut self.state);
            seg.restore_filter(sock, &self.datapath, &mut |seg| {
                state.segmenter = Some(seg.clone());
                runtime::write_state(iface, state).map_err(Into::into)
            })?;
            repaired(&self.iface, &fault, "filter added again");
            return Ok(());
        }
        let split_segs = self.datapath.config().split_gso_segs;
        if let Some(seg) = self.segmenter.take() {
            seg.stop(&mut self.datapath);
        }
        self.start_segmenter(split_segs)?;
        repaired(&self.iface, &fault, "segmenter started again");
        Ok(())
    }

    /// Waits until the departure clock has passed, so fq is empty when it is replaced.
    fn drain(&self) {
        let deadline = Instant::now() + MAX_DRAIN;
        while Instant::now() < deadline {
            match self.datapath.snapshot() {
                Ok(view) if view.backlog_ns > 0 => std::thread::sleep(
                    Duration::from_nanos(view.backlog_ns).min(Duration::from_millis(50))
                        + Duration::from_millis(1),
                ),
                _ => break,
            }
        }
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        if let Err(e) = self.undo() {
            warn!("restoring {}: {e:#}", self.iface.name);
        }
    }
}

fn repaired(iface: &Interface, fault: &Fault, action: &str) {
    warn!("{}: {fault} behind shaper's back; {action}", iface.name);
}

/// Best-effort undo of a partial `apply`.
fn rollback(sock: &mut Socket, iface: &Interface, original: &Snapshot, clsact_added: bool) {
    if clsact_added {
        let _ = qdisc::delete_clsact(sock, iface.ifindex);
    }
    if let Err(e) = qdisc::restore(sock, iface.ifindex, &iface.name, original) {
        warn!("rolling back {}: {e}", iface.name);
    }
}
