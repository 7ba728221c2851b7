//! Autorate on a shaped interface (`--autorate`, `--ingress-autorate`): every control tick,
//! the round trips the reflectors answered (`reflectors`) and what each direction carried
//! become each direction's next rate (`shaper_common::autorate`), which the run applies in
//! place as `shaper set --rate` would.
//!
//! The rates the user asked for (`--rate`, `--ingress-rate`, `shaper set --rate`) are where
//! each direction starts: a later change that asks for another rate restarts it from there,
//! one that changes anything else leaves it where autorate took it.

use std::{collections::HashMap, net::IpAddr};

use shaper_common::{
    autorate::{Baseline, Delay, Direction, Range, Step},
    rate::DisplayRate,
};
use tracing::{debug, info, warn};

use crate::{
    config::Settings,
    metrics::{Direction as Way, status::AutorateSample},
    reflectors::Prober,
};

/// Ticks without an answer from any reflector before it is said (10 s).
const SILENT_WARN_TICKS: u32 = 100;

/// One direction as autorate follows it.
struct Followed {
    way: Way,
    direction: Direction,
    /// The rate last asked for, to tell a new one from a change of something else.
    requested_bps: u64,
    /// The rate last logged at info (cuts are; a run of raises is, once it ends).
    logged_bps: u64,
    cuts: u64,
    raises: u64,
}

impl Followed {
    fn new(way: Way, range: Range, requested_bps: u64) -> Self {
        let direction = Direction::new(range, requested_bps);
        Self {
            way,
            logged_bps: direction.rate_bps(),
            direction,
            requested_bps,
            cuts: 0,
            raises: 0,
        }
    }

    /// Takes the range and rate of `settings` (this direction's), adopting its rate when it is
    /// a new one.
    fn reconfigure(&mut self, range: Range, requested_bps: u64) {
        let adopt = (requested_bps != self.requested_bps).then_some(requested_bps);
        self.direction.reconfigure(range, adopt);
        self.requested_bps = requested_bps;
    }
}

pub struct Autorate {
    iface: String,
    prober: Prober,
    reflectors: Vec<IpAddr>,
    threshold_ns: u64,
    baselines: HashMap<IpAddr, Baseline>,
    egress: Option<Followed>,
    ingress: Option<Followed>,
    last_delay_ns: Option<u64>,
    silent_ticks: u32,
}

impl Autorate {
    /// Autorate for `settings`' interface (index `ifindex`), if either direction asks for it.
    pub fn start(settings: &Settings, ifindex: u32) -> anyhow::Result<Option<Self>> {
        let followed = |way| wanted(settings, way).map(|(r, rate)| Followed::new(way, r, rate));
        let (egress, ingress) = (followed(Way::Egress), followed(Way::Ingress));
        if egress.is_none() && ingress.is_none() {
            return Ok(None);
        }
        let prober = start_prober(settings, ifindex)?;
        info!(
            "{}: autorate from round trips to {}, a queue over {} ms",
            settings.iface,
            list(&settings.autorate_reflectors),
            settings.autorate_threshold_ns as f64 / 1e6
        );
        Ok(Some(Self {
            iface: settings.iface.clone(),
            prober,
            reflectors: settings.autorate_reflectors.clone(),
            threshold_ns: settings.autorate_threshold_ns,
            baselines: HashMap::new(),
            egress,
            ingress,
            last_delay_ns: None,
            silent_ticks: 0,
        }))
    }

    /// Follows `settings` (validated, about to be applied) in `slot`: new reflectors restart
    /// the probes, new ranges and asked-for rates are taken; autorate turned off in both
    /// directions is `None`, turned on a new one. On an error `slot` is as it was.
    pub fn reconfigure(
        slot: &mut Option<Self>,
        settings: &Settings,
        ifindex: u32,
    ) -> anyhow::Result<()> {
        let on = [Way::Egress, Way::Ingress]
            .iter()
            .any(|&way| wanted(settings, way).is_some());
        let this = match slot.as_mut() {
            Some(this) if on => this,
            _ => {
                *slot = Self::start(settings, ifindex)?;
                return Ok(());
            }
        };
        if settings.autorate_reflectors != this.reflectors {
            this.prober = start_prober(settings, ifindex)?;
            this.reflectors = settings.autorate_reflectors.clone();
            this.baselines.clear();
        }
        this.threshold_ns = settings.autorate_threshold_ns;
        for (slot, way) in [
            (&mut this.egress, Way::Egress),
            (&mut this.ingress, Way::Ingress),
        ] {
            match (slot.as_mut(), wanted(settings, way)) {
                (Some(f), Some((range, rate))) => f.reconfigure(range, rate),
                (_, wanted) => *slot = wanted.map(|(range, rate)| Followed::new(way, range, rate)),
            }
        }
        Ok(())
    }

    /// `requested` with each followed direction's rate where autorate has taken it, unless
    /// `requested` asks for a new one (which `reconfigure` then adopts).
    pub fn overlay(&self, requested: &Settings) -> Settings {
        let mut s = requested.clone();
        if let Some(f) = &self.egress
            && s.rate_bps == f.requested_bps
        {
            s.rate_bps = f.direction.rate_bps();
        }
        if let (Some(f), Some(i)) = (&self.ingress, s.ingress.as_deref_mut())
            && i.rate_bps == f.requested_bps
        {
            i.rate_bps = f.direction.rate_bps();
        }
        s
    }

    /// One tick: `carried_*` is what each direction carried during it (bits/s; `None` when its
    /// control loop has nothing to say). Returns `running` at the new rates when either changed.
    pub fn tick(
        &mut self,
        running: &Settings,
        carried_egress: Option<f64>,
        carried_ingress: Option<f64>,
    ) -> Option<Settings> {
        let mut delays: Vec<u64> = self
            .prober
            .take()
            .into_iter()
            .map(|s| {
                let rtt_ns = s.rtt.as_nanos().min(u64::MAX as u128) as u64;
                self.baselines
                    .entry(s.reflector)
                    .or_default()
                    .sample(rtt_ns)
            })
            .collect();
        let delay = Delay::of(&mut delays);
        self.last_delay_ns = match delay {
            Delay::Over(ns) => Some(ns),
            Delay::Unknown => None,
        };
        self.silent_ticks = match delay {
            Delay::Unknown => self.silent_ticks.saturating_add(1),
            Delay::Over(_) => 0,
        };
        if self.silent_ticks == SILENT_WARN_TICKS {
            warn!(
                "{}: autorate: no answer from {} for 10 s; the rates stay where they are",
                self.iface,
                list(&self.reflectors)
            );
        }
        let mut next = running.clone();
        let mut changed = false;
        let (iface, threshold_ns) = (&self.iface, self.threshold_ns);
        for (followed, carried, rate) in [
            (
                self.egress.as_mut(),
                carried_egress,
                Some(&mut next.rate_bps),
            ),
            (
                self.ingress.as_mut(),
                carried_ingress,
                next.ingress.as_deref_mut().map(|i| &mut i.rate_bps),
            ),
        ] {
            let (Some(f), Some(carried), Some(rate)) = (followed, carried, rate) else {
                continue;
            };
            let was = f.direction.rate_bps();
            let step = f.direction.tick(carried, delay, threshold_ns);
            let now = f.direction.rate_bps();
            match step {
                Step::Cut => {
                    f.cuts += 1;
                    f.logged_bps = now;
                    info!(
                        "{iface}: autorate {}: cut to {} (carried {}, a queue of {:.1} ms)",
                        f.way.name(),
                        DisplayRate(now),
                        DisplayRate(carried as u64),
                        self.last_delay_ns.unwrap_or(0) as f64 / 1e6
                    );
                }
                Step::Raised => {
                    f.raises += 1;
                    debug!(
                        "{iface}: autorate {}: raised to {}",
                        f.way.name(),
                        DisplayRate(now)
                    );
                }
                Step::Held if f.logged_bps != now => {
                    f.logged_bps = now;
                    info!(
                        "{iface}: autorate {}: raised to {}",
                        f.way.name(),
                        DisplayRate(now)
                    );
                }
                Step::Held => {}
            }
            if now != was {
                *rate = now;
                changed = true;
            }
        }
        changed.then_some(next)
    }

    /// What the metrics show of `way`, if autorate follows it.
    pub fn status(&self, way: Way) -> Option<AutorateSample> {
        let f = match way {
            Way::Egress => self.egress.as_ref(),
            Way::Ingress => self.ingress.as_ref(),
        }?;
        Some(AutorateSample {
            range: f.direction.range,
            delay_s: self.last_delay_ns.map(|ns| ns as f64 / 1e9),
            baseline_s: self
                .baselines
                .values()
                .filter_map(Baseline::ns)
                .min()
                .map(|ns| ns as f64 / 1e9),
            cuts: f.cuts,
            raises: f.raises,
        })
    }
}

/// `way`'s autorate range and the rate asked for it, if `settings` follow it.
fn wanted(settings: &Settings, way: Way) -> Option<(Range, u64)> {
    let s = match way {
        Way::Egress => settings,
        Way::Ingress => settings.ingress.as_deref()?,
    };
    s.autorate.map(|r| (r, s.rate_bps))
}

fn start_prober(settings: &Settings, ifindex: u32) -> anyhow::Result<Prober> {
    Prober::start(
        &settings.iface,
        ifindex,
        settings.autorate_reflectors.clone(),
    )
    .map_err(|e| {
        anyhow::anyhow!(
            "{}: autorate's probes (raw ICMP sockets bound to it): {e}",
            settings.iface
        )
    })
}

fn list(addrs: &[IpAddr]) -> String {
    addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
