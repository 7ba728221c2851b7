//! Putting shaper on an interface and taking it off again. A deployment is an ordered list of
//! parts, each something shaper installs (the device's GSO limits, the root qdisc, the programs,
//! the segmenter, the ingress direction's IFB and redirect), with its own `apply`, `restore`,
//! repair (`keep`) and record. Which parts an interface gets, and in which order, is `shape`'s.
//!
//! - What a part records (what restoring it needs: the state from before its change) is in the
//!   interface's state file before the part changes anything, so that a crash at any point
//!   leaves a successor, or `shaper reset`, what it needs to put the interface back. The state
//!   file is derived from the parts' records.
//! - Parts are applied in order and restored in reverse, so a part may rely on those before it.
//! - Applying either completes or leaves the interface as it found it: a part that fails
//!   restores what of it was done, then every earlier part is restored.
//! - Teardown (also run on drop, e.g. after a panic) restores every applied part. A device that
//!   went away took what was on it along: parts then skip what they had there.

use tracing::{info, warn};

use crate::{
    bpf::Datapath,
    clsact,
    config::Settings,
    handover::{self, Leaving},
    health::{self, Fault},
    link::Interface,
    netlink::Socket,
    record::{IngressState, SegmenterState, State},
    runtime::{self, InterfaceLock},
};

/// Something shaper installs on an interface.
pub trait Part {
    /// Writes into `state` what restoring this part needs. Written to the state file before
    /// `apply`, and again (`Context::record`) before the part changes what it records.
    fn record(&self, state: &mut State);

    /// Makes the change. On failure `restore` is called for whatever of it was done.
    fn apply(&mut self, cx: &mut Context) -> anyhow::Result<()>;

    /// Undoes what `apply` did, all of it or part: a step that fails does not stop the others.
    fn restore(&mut self, cx: &mut Context) -> anyhow::Result<()>;

    /// Checks that the part is still in place and puts back what someone else changed (each
    /// repair logged by [`repaired`]). An error is a check or repair that failed, to be tried
    /// again at the next check.
    fn keep(&mut self, _cx: &mut Context) -> anyhow::Result<()> {
        Ok(())
    }

    /// Changes what of the part depends on the settings to `settings`, in place: nothing is
    /// re-installed or detached (`live::change` decided that the difference allows it). A part
    /// whose record changes writes it first (`Context::record`).
    fn change(&mut self, _cx: &mut Context, _settings: &Settings) -> anyhow::Result<()> {
        Ok(())
    }

    /// Leaves the part in place for the next shaper process (`handover`) instead of restoring
    /// it, pinning in `leaving` what would otherwise go with this process. Most parts stay by
    /// themselves.
    fn hand_over(&mut self, _cx: &mut Context, _leaving: &Leaving) -> anyhow::Result<()> {
        Ok(())
    }

    /// The deployment on a device this part created (the ingress direction's IFB), which has
    /// its own control loop.
    fn deployment_mut(&mut self) -> Option<&mut Deployment> {
        None
    }
}

/// What a part works on: the interface, its data path, and the record of the whole deployment.
pub struct Context<'a> {
    pub sock: &'a mut Socket,
    pub iface: &'a Interface,
    pub datapath: &'a mut Datapath,
    /// The device went away: there is nothing left on it to restore.
    pub gone: bool,
    state: &'a mut State,
}

impl Context<'_> {
    /// Writes `part`'s record to the state file, before the part changes what it records.
    pub fn record(&mut self, part: &dyn Part) -> anyhow::Result<()> {
        part.record(self.state);
        runtime::write_state(self.iface, self.state)?;
        Ok(())
    }

    /// Puts clsact on the interface for `part` unless it has one; the part's flag `added` says
    /// it added clsact (and removes it on restore), recorded before clsact is added.
    pub fn ensure_clsact<P: Part>(
        &mut self,
        part: &mut P,
        added: fn(&mut P) -> &mut bool,
    ) -> anyhow::Result<()> {
        let (iface, state) = (self.iface, &mut *self.state);
        clsact::ensure_recorded(self.sock, iface, &mut |now| {
            *added(part) = now;
            part.record(state);
            runtime::write_state(iface, state).map_err(Into::into)
        })?;
        Ok(())
    }
}

/// Logs a repair: what someone else changed, and what shaper did about it.
pub fn repaired(iface: &Interface, fault: &Fault, action: &str) {
    warn!("{}: {fault} behind shaper's back; {action}", iface.name);
}

/// How [`Deployment::hand_over`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handed {
    /// Left shaped, its state pinned for the next process.
    Left,
    /// Leaving failed part-way, and the interface was restored instead.
    Restored,
}

pub struct Deployment {
    iface: Interface,
    settings: Settings,
    datapath: Datapath,
    /// The state file's own fields, before the parts write theirs.
    header: State,
    /// The state file's content: the header with every part's record.
    state: State,
    parts: Vec<Box<dyn Part>>,
    /// How many of `parts` (from the first) have been applied.
    applied: usize,
    /// What a previous, crashed shaper recorded, for the parts added later to clean up.
    stale: Option<State>,
    _lock: InterfaceLock,
    torn_down: bool,
    /// The device went away: there is nothing left on it to restore.
    gone: bool,
}

impl Deployment {
    /// Applies `parts` to `iface` in order, `header` and their records written to the state
    /// file first (with `starting` set until all are applied). Either completes or restores
    /// every part it applied.
    pub fn apply(
        iface: Interface,
        settings: &Settings,
        datapath: Datapath,
        lock: InterfaceLock,
        header: State,
        stale: Option<State>,
        parts: Vec<Box<dyn Part>>,
    ) -> anyhow::Result<Self> {
        let mut deployment = Self {
            iface,
            settings: settings.clone(),
            datapath,
            state: header.clone(),
            header: State {
                starting: true,
                ..header
            },
            parts,
            applied: 0,
            stale,
            _lock: lock,
            torn_down: false,
            gone: false,
        };
        if let Err(e) = deployment.save() {
            // Nothing changed yet; nothing to restore.
            deployment.torn_down = true;
            runtime::remove_state(&deployment.iface);
            return Err(e);
        }
        let mut sock = Socket::open()?;
        while deployment.applied < deployment.parts.len() {
            // Counted before it is applied: a part that fails restores what of it was done.
            deployment.applied += 1;
            let at = deployment.applied - 1;
            if let Err(e) = deployment.with_part(&mut sock, at, |part, cx| part.apply(cx)) {
                // Drop restores every part applied, in reverse, and removes the state file.
                drop(deployment);
                return Err(e);
            }
        }
        deployment.header.starting = false;
        // From here on, Drop undoes everything if writing the state fails.
        deployment.save()?;
        Ok(deployment)
    }

    /// Adds `part` after the others, recorded first. A part that fails is restored and left
    /// out; the others stay.
    pub fn add(&mut self, part: Box<dyn Part>) -> anyhow::Result<()> {
        debug_assert_eq!(self.applied, self.parts.len());
        self.parts.push(part);
        if let Err(e) = self.save() {
            self.parts.pop();
            return Err(e);
        }
        self.applied += 1;
        let mut sock = Socket::open()?;
        let at = self.applied - 1;
        if let Err(e) = self.with_part(&mut sock, at, |part, cx| part.apply(cx)) {
            if let Err(undo) = self.with_part(&mut sock, at, |part, cx| part.restore(cx)) {
                warn!("restoring {}: {undo:#}", self.iface.name);
            }
            self.parts.pop();
            self.applied -= 1;
            self.save()?;
            return Err(e);
        }
        Ok(())
    }

    /// Runs `f` on part `at` with the context of this deployment.
    fn with_part<T>(
        &mut self,
        sock: &mut Socket,
        at: usize,
        f: impl FnOnce(&mut dyn Part, &mut Context) -> T,
    ) -> T {
        let mut cx = Context {
            sock,
            iface: &self.iface,
            datapath: &mut self.datapath,
            gone: self.gone,
            state: &mut self.state,
        };
        f(self.parts[at].as_mut(), &mut cx)
    }

    /// Writes the state file: the header and the parts' records.
    fn save(&mut self) -> anyhow::Result<()> {
        let mut state = self.header.clone();
        for part in &self.parts {
            part.record(&mut state);
        }
        self.state = state;
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

    /// The state file's content: what `shaper stats` reads to find the maps.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// What a predecessor (crashed, or leaving the interface shaped) recorded for the ingress
    /// direction, once: for the part added later to take up or clean up.
    pub fn take_stale_ingress(&mut self) -> Option<IngressState> {
        self.stale.as_mut().and_then(|s| s.ingress.take())
    }

    /// The same for the segmenter.
    pub fn take_stale_segmenter(&mut self) -> Option<SegmenterState> {
        self.stale.as_mut().and_then(|s| s.segmenter.take())
    }

    pub fn datapath(&self) -> &Datapath {
        &self.datapath
    }

    pub fn datapath_mut(&mut self) -> &mut Datapath {
        &mut self.datapath
    }

    /// The deployment on a device one of the parts created (the ingress direction's IFB).
    pub fn nested_mut(&mut self) -> Option<&mut Deployment> {
        self.parts.iter_mut().find_map(|p| p.deployment_mut())
    }

    /// Applies `settings` in place, part by part in order (the GSO limits before the data
    /// path's configuration, which is computed from them), then writes them to the state file.
    /// A part that fails stops the change there and the error is returned: the parts before it
    /// run with the new settings, the others with the old.
    pub fn change(&mut self, settings: &Settings) -> anyhow::Result<()> {
        let mut sock = Socket::open()?;
        for at in 0..self.applied {
            self.with_part(&mut sock, at, |part, cx| part.change(cx, settings))?;
        }
        self.settings = settings.clone();
        self.header.rate_bps = settings.rate_bps;
        self.header.horizon_ns = settings.horizon_ns;
        self.header.isolation = settings.isolation.name().to_string();
        self.header.diffserv = settings.diffserv.name().to_string();
        self.save()
    }

    pub fn teardown(mut self) -> anyhow::Result<()> {
        self.undo()
    }

    /// Leaves the interface shaped for the next shaper process (`handover`): the parts, the
    /// last first, leave what they installed in place; the state file stays, as the successor's
    /// record of what to put back in the end. If leaving fails part-way, the interface is
    /// restored instead: it is never left half.
    pub fn hand_over(mut self) -> anyhow::Result<Handed> {
        let left = self.leave();
        match left {
            Ok(()) => {
                self.torn_down = true;
                info!("{} left shaped for the next shaper", self.iface.name);
                Ok(Handed::Left)
            }
            Err(e) => {
                warn!(
                    "could not leave {} to the next shaper ({e:#}); restoring it",
                    self.iface.name
                );
                self.undo().map(|()| Handed::Restored)
            }
        }
    }

    fn leave(&mut self) -> anyhow::Result<()> {
        let leaving = handover::prepare(&self.iface)?;
        let mut sock = Socket::open()?;
        for at in (0..self.applied).rev() {
            self.with_part(&mut sock, at, |part, cx| part.hand_over(cx, &leaving))?;
        }
        self.header.kept = true;
        self.save()
    }

    /// Lets the interface go: [`Deployment::teardown`], after checking that the device is still
    /// the one shaped. One that went away (or was re-created under its name, a new device that
    /// is not shaper's to touch) took what was on it: only what shaper had elsewhere (an IFB,
    /// the state file) is removed.
    pub fn release(mut self) -> anyhow::Result<()> {
        if health::link_fault(&self.iface).is_some() {
            self.gone = true;
        }
        self.undo()
    }

    /// Restores the applied parts in reverse, then removes the state file.
    fn undo(&mut self) -> anyhow::Result<()> {
        if std::mem::replace(&mut self.torn_down, true) {
            return Ok(());
        }
        let mut sock = Socket::open()?;
        let mut first_error = None;
        for at in (0..self.applied).rev() {
            if let Err(e) = self.with_part(&mut sock, at, |part, cx| part.restore(cx)) {
                match first_error {
                    None => first_error = Some(e),
                    Some(_) => warn!("restoring {}: {e:#}", self.iface.name),
                }
            }
        }
        self.applied = 0;
        runtime::remove_state(&self.iface);
        // Pins a predecessor left, or a hand-over of ours that failed, would keep its links.
        handover::clear(&self.iface);
        if let Some(e) = first_error {
            return Err(e);
        }
        if !self.gone {
            info!("{} restored", self.iface.name);
        }
        Ok(())
    }

    /// Checks that what shaper installed is still in place and puts back what someone else
    /// changed (`health`), part by part. A device that went away is a `health::Lost` error: the
    /// caller ends the run, and teardown then removes what shaper had elsewhere (an IFB, the
    /// state file). Any other error is a check or repair that failed, to be tried again.
    pub fn keep(&mut self, sock: &mut Socket) -> anyhow::Result<()> {
        if let Some(fault) = health::link_fault(&self.iface) {
            self.gone = true;
            return Err(health::Lost {
                iface: self.iface.name.clone(),
                fault,
            }
            .into());
        }
        for at in 0..self.applied {
            self.with_part(sock, at, |part, cx| part.keep(cx))?;
        }
        Ok(())
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        if let Err(e) = self.undo() {
            warn!("restoring {}: {e:#}", self.iface.name);
        }
    }
}
