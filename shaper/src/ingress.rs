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
    clsact,
    config::Settings,
    deploy::Deployment,
    filter::{Filter, Hook, Matcher},
    health::Fault,
    link::{self, GroLimits, Interface, LinkError, apply_limits, plan_limits, restore_limits},
    netlink::{NetlinkError, Socket},
    qdisc,
    record::IngressState,
    runtime,
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

pub struct Ingress {
    iface: Interface,
    settings: Settings,
    /// The IFB's own deployment; taken on teardown.
    deployment: Option<Deployment>,
    state: IngressState,
}

impl Ingress {
    /// The ingress direction of `egress`'s interface as `settings` ask (`--ingress-rate`; `None`
    /// without it), recorded in the interface's state file. What a crashed predecessor set up
    /// for its ingress is cleaned up either way.
    pub fn start(settings: &Settings, egress: &mut Deployment) -> anyhow::Result<Option<Self>> {
        let stale = egress.take_stale_ingress();
        let Some(settings) = settings.for_ingress(&link::ifb_name("ifb4", egress.iface())) else {
            if let Some(stale) = stale {
                clean_stale(egress.iface(), &stale)?;
            }
            return Ok(None);
        };
        egress.record_ingress(Some(IngressState::planned(&settings.iface)))?;
        let iface = egress.iface().clone();
        let ingress = Self::apply(settings, &iface, stale, &mut |state| {
            egress.record_ingress(Some(state.clone()))
        })?;
        Ok(Some(ingress))
    }

    /// Shapes what arrives on `iface` with `settings` (whose `iface` is [`ifb_name`]), after
    /// cleaning up what a crashed predecessor left (`stale`). What it changes on `iface` is
    /// passed to `record` before it is changed, so that a crash at any point leaves a record a
    /// successor can undo. Either completes or undoes its own steps.
    fn apply(
        settings: Settings,
        iface: &Interface,
        stale: Option<IngressState>,
        record: &mut dyn FnMut(&IngressState) -> anyhow::Result<()>,
    ) -> anyhow::Result<Self> {
        let mut sock = Socket::open()?;
        let recorded_gro = stale.as_ref().and_then(|s| s.original_gro);
        if let Some(stale) = &stale {
            clean_stale(iface, stale)?;
        }
        let name = settings.iface.clone();
        if Interface::lookup(&name).is_ok() {
            return Err(IngressError::IfbExists {
                ifb: name,
                iface: iface.name.clone(),
            }
            .into());
        }
        let queues = link::ifb_queues();
        let mtu = iface.mtu(&mut sock)?;
        let ifb = Interface::create_ifb(&mut sock, &name, mtu, queues, None).map_err(|source| {
            IngressError::Ifb {
                ifb: name.clone(),
                source,
            }
        })?;
        let deployment = match Deployment::apply(&settings, ifb.clone()) {
            Ok(d) => d,
            Err(e) => {
                let _ = ifb.delete(&mut sock);
                return Err(e);
            }
        };
        let mut ingress = Self {
            iface: iface.clone(),
            settings,
            deployment: Some(deployment),
            state: IngressState::planned(&name),
        };
        // From here on, Drop undoes what is recorded in `state`.
        let add_clsact =
            qdisc::ingress_slot(&mut sock, iface.ifindex)?.as_deref() != Some("clsact");
        let gro = plan_limits::<GroLimits>(
            &mut sock,
            iface,
            ingress.settings.rate_bps,
            ingress.settings.split_gso,
            recorded_gro,
        );
        ingress.state.clsact_added = add_clsact;
        ingress.state.original_gro = gro.as_ref().and_then(|plan| plan.to_restore());
        record(&ingress.state)?;
        if add_clsact {
            clsact::add_recorded(&mut sock, iface, &mut ingress.state.clsact_added)?;
        }
        add_redirect(&mut sock, iface, &ifb)?;
        if let Some(plan) = gro {
            apply_limits(&mut sock, iface, plan);
        }
        info!(
            "shaping {}'s ingress on {name} ({queues} queues)",
            iface.name
        );
        Ok(ingress)
    }

    /// Checks the redirect and the IFB's own deployment (`Deployment::keep`), putting back
    /// what someone else removed; a change to the recorded set-up goes to `record` first.
    pub fn keep(
        &mut self,
        sock: &mut Socket,
        record: &mut dyn FnMut(&IngressState) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let deployment = self.deployment.as_mut().expect("present until teardown");
        deployment.keep(sock)?;
        if redirect(&self.iface).is_present(sock, None)? {
            return Ok(());
        }
        if qdisc::ingress_slot(sock, self.iface.ifindex)?.as_deref() != Some("clsact") {
            self.state.clsact_added = true;
            record(&self.state)?;
            clsact::add_recorded(sock, &self.iface, &mut self.state.clsact_added)?;
        }
        add_redirect(sock, &self.iface, deployment.iface())?;
        warn!(
            "{}: {} behind shaper's back; added again",
            self.iface.name,
            Fault::Filter {
                what: "the ingress redirect"
            }
        );
        Ok(())
    }

    /// The ingress direction's settings (its rate; the IFB as its interface).
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn deployment_mut(&mut self) -> &mut Deployment {
        self.deployment.as_mut().expect("present until teardown")
    }

    /// Stops the redirect first, lets what the IFB holds leave, then removes the IFB.
    pub fn teardown(mut self) -> anyhow::Result<()> {
        self.undo()
    }

    fn undo(&mut self) -> anyhow::Result<()> {
        let Some(deployment) = self.deployment.take() else {
            return Ok(());
        };
        let mut sock = Socket::open()?;
        if let Err(e) = redirect(&self.iface).remove(&mut sock, self.state.clsact_added) {
            warn!("removing the redirect from {}: {e}", self.iface.name);
        }
        restore_limits(&mut sock, &self.iface, self.state.original_gro);
        let ifb = deployment.iface().clone();
        let drained = deployment.teardown();
        if let Err(e) = ifb.delete(&mut sock) {
            warn!("deleting {}: {e}", ifb.name);
        }
        drained
    }
}

impl Drop for Ingress {
    fn drop(&mut self) {
        if let Err(e) = self.undo() {
            warn!("restoring {}'s ingress: {e:#}", self.iface.name);
        }
    }
}

/// Undoes a crashed shaper's ingress set-up: its redirect, its IFB (with its state file). Its
/// original GRO limits are restored here; `Ingress::apply` takes them as its baseline.
pub(crate) fn clean_stale(iface: &Interface, stale: &IngressState) -> anyhow::Result<()> {
    let sock = &mut Socket::open()?;
    restore_limits(sock, iface, stale.original_gro);
    let _ = redirect(iface).remove(sock, stale.clsact_added);
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
    Filter::matchall(iface.ifindex, Hook::Ingress)
}
