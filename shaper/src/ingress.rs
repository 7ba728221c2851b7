//! Ingress shaping (`--ingress-rate`). Nothing queues on a device's receive path, so traffic
//! arriving on the interface is redirected (a `matchall` filter with a `mirred` action on its
//! clsact ingress) to an IFB device, where the same data path stamps it on egress and fq paces
//! it; the IFB hands every packet back to the interface's receive path as it leaves. This is
//! how CAKE shapes ingress too (sqm-scripts' `ifb4<iface>`), and it works alike on kernels with
//! and without TCX. The redirect sits at the lowest priority, so shaper's own ingress program
//! (the ACK filter's view of the data direction) and anyone else's filters see a packet first.
//!
//! At low ingress rates the interface's GRO limit is lowered, as the GSO limits are for egress:
//! GRO builds super-packets from the frames that arrive, one super-packet gets one departure
//! time, and fq releases it to the hosts behind the router in one burst, which TCP answers with
//! one ACK (see `link::GroLimits`).

use tracing::{info, warn};

use crate::{
    config::Settings,
    conntrack,
    deploy::{Context, Deployment, Handed, Part},
    filter::{Filter, Matcher},
    handover::{self, Leaving},
    health::Fault,
    link::{self, GroLimits, INGRESS_IFB, Interface, LinkError, plan_limits, restore_limits},
    netlink::{NetlinkError, Socket},
    record::{IngressState, State},
    runtime,
    shape::{self, Limits},
};

#[derive(Debug, thiserror::Error)]
pub enum IngressError {
    #[error(
        "{ifb} already exists and is not a leftover of shaper on {iface}; ingress shaping needs that name for its IFB device (remove it: ip link del {ifb})"
    )]
    IfbExists { ifb: String, iface: String },
    #[error(
        "creating the IFB device {ifb}: {source} (ingress shaping needs IFB: modprobe ifb, or a kernel with CONFIG_IFB)"
    )]
    Ifb { ifb: String, source: LinkError },
    #[error(
        "redirecting {iface}'s ingress to {ifb}: {source} (needs the matchall classifier and the mirred action: CONFIG_NET_CLS_MATCHALL, CONFIG_NET_ACT_MIRRED)"
    )]
    Redirect {
        iface: String,
        ifb: String,
        source: NetlinkError,
    },
}

/// The ingress direction, a part of its interface's deployment: the IFB with its own deployment,
/// the redirect to it, and the interface's GRO limits.
pub struct Ingress {
    /// The IFB's settings (the ingress rate).
    settings: Settings,
    state: IngressState,
    gro: Limits<GroLimits>,
    /// The IFB, once created (what restore removes).
    ifb: Option<Interface>,
    /// The IFB's own deployment; taken on restore.
    deployment: Option<Deployment>,
    /// The IFB is a predecessor's, to take up rather than create.
    take_up: bool,
}

/// Adds the ingress direction to `egress` as `settings` ask (`--ingress-rate`; nothing without
/// it). A predecessor's IFB is taken up when the settings still want it (its own deployment
/// taken over as the egress one is); otherwise what it set up is removed.
pub fn start(settings: &Settings, egress: &mut Deployment) -> anyhow::Result<()> {
    let stale = egress.take_stale_ingress();
    // The redirect hands the IFB packets as the interface received them.
    let header = egress.datapath().config().link_header_bytes;
    let wanted = settings.for_ingress(&INGRESS_IFB.name(egress.iface()), header);
    let take_up = match (&stale, &wanted) {
        (Some(stale), Some(wanted)) => stale.ifb == wanted.iface && is_ifb(&stale.ifb)?,
        _ => false,
    };
    if let Some(stale) = &stale
        && !take_up
    {
        clean_stale(egress.iface(), stale)?;
    }
    let Some(settings) = wanted else {
        return Ok(());
    };
    let gro = plan_limits::<GroLimits>(
        &mut Socket::open()?,
        egress.iface(),
        settings.sizing_rate_bps(),
        settings.split_gso,
        stale.as_ref().and_then(|s| s.original_gro),
    );
    let state = match stale.filter(|_| take_up) {
        Some(prior) => IngressState {
            original_gro: None,
            ..prior
        },
        None => IngressState::planned(&settings.iface),
    };
    let ingress = Ingress {
        state,
        settings,
        gro: Limits::new(gro, None),
        ifb: None,
        deployment: None,
        take_up,
    };
    egress.add(Box::new(ingress))
}

/// Whether `name` is an IFB device.
fn is_ifb(name: &str) -> anyhow::Result<bool> {
    let Ok(ifb) = Interface::lookup(name) else {
        return Ok(false);
    };
    Ok(ifb.kind(&mut Socket::open()?).is_ok_and(|k| k == "ifb"))
}

impl Part for Ingress {
    fn record(&self, state: &mut State) {
        state.ingress = Some(IngressState {
            original_gro: self.gro.original(),
            ..self.state.clone()
        });
    }

    /// Creates the IFB and shapes it, then redirects `iface`'s ingress to it. A device that
    /// already holds the IFB's name is refused, unless it is a predecessor's IFB to take up:
    /// then it stays, with its fq and its redirect, and its own deployment is taken over.
    fn apply(&mut self, cx: &mut Context) -> anyhow::Result<()> {
        let name = self.settings.iface.clone();
        if std::mem::take(&mut self.take_up) {
            let ifb = Interface::lookup(&name)?;
            self.ifb = Some(ifb.clone());
            self.deployment = Some(shape::apply(&self.settings, ifb.clone())?);
            if !redirect(cx.iface).is_present(cx.sock, None)? {
                cx.ensure_clsact(self, |i| &mut i.state.clsact_added)?;
                add_redirect(cx.sock, cx.iface, &ifb)?;
            }
            self.gro.apply(cx.sock, cx.iface);
            info!("{}: took up the ingress shaping on {name}", cx.iface.name);
            return Ok(());
        }
        if Interface::lookup(&name).is_ok() {
            return Err(IngressError::IfbExists {
                ifb: name,
                iface: cx.iface.name.clone(),
            }
            .into());
        }
        let queues = link::ifb_queues();
        let mtu = cx.iface.mtu(cx.sock)?;
        let ifb = Interface::create_ifb(cx.sock, &name, mtu, queues, None).map_err(|source| {
            IngressError::Ifb {
                ifb: name.clone(),
                source,
            }
        })?;
        self.ifb = Some(ifb.clone());
        let egress = &*cx.datapath;
        self.deployment = Some(shape::apply_with(&self.settings, ifb.clone(), |state| {
            conntrack::load_replies_side(egress, &ifb, state)
        })?);
        cx.ensure_clsact(self, |i| &mut i.state.clsact_added)?;
        add_redirect(cx.sock, cx.iface, &ifb)?;
        self.gro.apply(cx.sock, cx.iface);
        info!(
            "shaping {}'s ingress on {name} ({queues} queues)",
            cx.iface.name
        );
        Ok(())
    }

    /// Stops the redirect first, puts the GRO limits back, lets what the IFB holds leave, then
    /// removes the IFB.
    fn restore(&mut self, cx: &mut Context) -> anyhow::Result<()> {
        let Some(ifb) = self.ifb.take() else {
            return Ok(());
        };
        // The redirect (and clsact for it) comes after the IFB's deployment.
        if !cx.gone && self.deployment.is_some() {
            if let Err(e) = redirect(cx.iface).remove(cx.sock, self.state.clsact_added) {
                warn!("removing the redirect from {}: {e}", cx.iface.name);
            }
            self.gro.restore(cx.sock, cx.iface);
        }
        let drained = self.deployment.take().map_or(Ok(()), Deployment::teardown);
        if let Err(e) = ifb.delete(cx.sock) {
            warn!("deleting {}: {e}", ifb.name);
        }
        drained
    }

    /// Checks the IFB's own deployment (`Deployment::keep`) and the redirect, putting back what
    /// someone else removed.
    fn keep(&mut self, cx: &mut Context) -> anyhow::Result<()> {
        let (Some(deployment), Some(ifb)) = (self.deployment.as_mut(), self.ifb.clone()) else {
            return Ok(());
        };
        deployment.keep(cx.sock)?;
        if redirect(cx.iface).is_present(cx.sock, None)? {
            return Ok(());
        }
        cx.ensure_clsact(self, |i| &mut i.state.clsact_added)?;
        add_redirect(cx.sock, cx.iface, &ifb)?;
        warn!(
            "{}: {} behind shaper's back; added again",
            cx.iface.name,
            Fault::Filter {
                what: "the ingress redirect"
            }
        );
        Ok(())
    }

    /// The ingress rate's GRO limits, then the IFB's own deployment (`shape::change`).
    fn change(&mut self, cx: &mut Context, settings: &Settings) -> anyhow::Result<()> {
        // `live::change` refuses adding or removing the direction.
        let header = cx.datapath.config().link_header_bytes;
        let Some(ingress) = settings.for_ingress(&self.settings.iface, header) else {
            return Ok(());
        };
        self.gro.replan(
            cx.sock,
            cx.iface,
            ingress.sizing_rate_bps(),
            ingress.split_gso,
        );
        cx.record(self)?;
        self.gro.apply(cx.sock, cx.iface);
        if let Some(deployment) = self.deployment.as_mut() {
            shape::change(deployment, &ingress)?;
        }
        self.settings = ingress;
        Ok(())
    }

    /// The IFB, its redirect and its fq stay; its own deployment is left as the egress one is.
    fn hand_over(&mut self, _cx: &mut Context, _leaving: &Leaving) -> anyhow::Result<()> {
        match self.deployment.take() {
            Some(deployment) => match deployment.hand_over()? {
                Handed::Left => Ok(()),
                // The egress side then restores too: never half left.
                Handed::Restored => anyhow::bail!("the IFB could not be left, and was restored"),
            },
            None => Ok(()),
        }
    }

    fn deployment_mut(&mut self) -> Option<&mut Deployment> {
        self.deployment.as_mut()
    }
}

/// Undoes a predecessor's ingress set-up: its redirect, its IFB (with its state file). Its
/// original GRO limits are restored here; [`start`] takes them as its baseline.
pub(crate) fn clean_stale(iface: &Interface, stale: &IngressState) -> anyhow::Result<()> {
    let sock = &mut Socket::open()?;
    restore_limits(sock, iface, stale.original_gro);
    let _ = redirect(iface).remove(sock, stale.clsact_added);
    if let Ok(ifb) = Interface::lookup(&stale.ifb) {
        // What its predecessor left pinned for a successor (the IFB's own links).
        handover::clear(&ifb);
    }
    runtime::delete_leftover_ifb(sock, &stale.ifb);
    Ok(())
}

fn add_redirect(sock: &mut Socket, iface: &Interface, ifb: &Interface) -> anyhow::Result<()> {
    redirect(iface)
        .add_redirect(sock, Matcher::All, ifb.ifindex)
        .map_err(|source| IngressError::Redirect {
            iface: iface.name.clone(),
            ifb: ifb.name.clone(),
            source,
        })?;
    Ok(())
}

/// The redirect: the last filter of the interface's ingress.
fn redirect(iface: &Interface) -> Filter {
    INGRESS_IFB.redirect(iface)
}
