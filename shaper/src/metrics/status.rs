//! What `shaper run` publishes for its metrics endpoint, and the scrape built from it.
//!
//! The run loop writes here after each tick and each health check, holding the lock only to
//! copy a few numbers in; the server thread copies them out and reads the data path's maps
//! without the lock, so a scrape never holds a tick back. It reads them through descriptors of
//! this process's own (`Datapath::reader`), never by id: opening a map by id takes
//! CAP_SYS_ADMIN, which shaper runs without.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use super::{Direction, histogram::Histogram};
use crate::{
    bpf::{self, BpfError, MapReader},
    control::TickSummary,
    record::State,
    stats::{self, HostRow, Report},
};

/// Bucket bounds (s) of the control loop's tick durations and lateness: from well under its
/// usual cost to beyond its 100 ms interval, where ticks start to be missed.
const TICK_BUCKETS_S: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// A control loop that has not ticked for this long is stuck: `/healthz` fails. Fifty
/// intervals, so that a busy machine's scheduling delays do not read as a dead loop.
pub const STALLED_AFTER: Duration = Duration::from_secs(5);

/// One direction's control loop, as the run loop reports it.
#[derive(Debug, Clone)]
pub struct ControlSample {
    pub ticks: u64,
    pub failed_ticks: u64,
    pub active_hosts: u64,
    pub bottlenecked_hosts: u64,
    pub active_flows: f64,
    /// Tick durations (s).
    pub duration: Histogram,
    /// Where autorate follows the direction, what it saw last.
    pub autorate: Option<AutorateSample>,
}

impl Default for ControlSample {
    fn default() -> Self {
        Self {
            ticks: 0,
            failed_ticks: 0,
            active_hosts: 0,
            bottlenecked_hosts: 0,
            active_flows: 0.0,
            duration: Histogram::new(TICK_BUCKETS_S),
            autorate: None,
        }
    }
}

/// What autorate saw last of a direction it follows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AutorateSample {
    pub range: shaper_common::autorate::Range,
    /// The last tick's delay over the baseline (s), if a reflector answered.
    pub delay_s: Option<f64>,
    /// The least baseline among the reflectors (s).
    pub baseline_s: Option<f64>,
    pub cuts: u64,
    pub raises: u64,
}

/// A shaped direction as published: its state file's content, its control loop.
#[derive(Debug, Clone)]
struct Published {
    interface: String,
    direction: Direction,
    state: State,
    control: ControlSample,
}

/// The maps of a shaped direction, as this process holds them.
#[derive(Debug, Clone)]
struct Held {
    interface: String,
    direction: Direction,
    maps: Arc<MapReader>,
}

#[derive(Debug)]
struct Shared {
    directions: Vec<Published>,
    /// What scrapes and health checks read each published direction through (`holds`).
    held: Vec<Held>,
    /// The interfaces to shape that are present now (`configured`), and whether each one's
    /// last health check passed: ready when every one of them did.
    wanted: BTreeSet<String>,
    passed: BTreeMap<String, bool>,
    /// Shaping ends: never ready again.
    stopping: bool,
    /// Every interface was left to the next shaper and the process waits to be stopped
    /// (`--when-replaced wait`): never ready again, and alive without ticking.
    replaced: bool,
    /// How late ticks started (s).
    lateness: Histogram,
    last_tick: Option<Instant>,
}

impl Shared {
    /// Why `/readyz` fails now; `None` when ready.
    fn unready(&self) -> Option<&'static str> {
        if self.replaced {
            Some(
                "replaced: every interface was left to the next shaper; this process holds none and waits to be stopped",
            )
        } else if self.stopping {
            Some("stopping")
        } else if self.wanted.is_empty()
            || !self
                .wanted
                .iter()
                .all(|i| self.passed.get(i).copied().unwrap_or(false))
        {
            Some("not shaping every configured direction")
        } else {
            None
        }
    }

    fn find(&mut self, interface: &str, direction: Direction) -> Option<&mut Published> {
        self.directions
            .iter_mut()
            .find(|p| p.interface == interface && p.direction == direction)
    }

    /// The maps held for `interface`'s `direction`.
    fn maps(&self, interface: &str, direction: Direction) -> Option<Arc<MapReader>> {
        self.held
            .iter()
            .find(|h| h.interface == interface && h.direction == direction)
            .map(|h| h.maps.clone())
    }
}

/// The handle the run loop writes through and the server reads through.
#[derive(Debug, Clone)]
pub struct Monitor {
    shared: Arc<Mutex<Shared>>,
}

impl Default for Monitor {
    fn default() -> Self {
        Self {
            shared: Arc::new(Mutex::new(Shared {
                directions: Vec::new(),
                held: Vec::new(),
                wanted: BTreeSet::new(),
                passed: BTreeMap::new(),
                stopping: false,
                replaced: false,
                lateness: Histogram::new(TICK_BUCKETS_S),
                last_tick: None,
            })),
        }
    }
}

/// Everything one `/metrics` answer shows, read at one moment.
#[derive(Debug)]
pub struct Scrape {
    pub directions: Vec<DirectionSample>,
    pub lateness: Histogram,
    pub ready: bool,
}

#[derive(Debug)]
pub struct DirectionSample {
    /// The configured interface (an ingress direction's too, though it is shaped on an IFB).
    pub interface: String,
    pub direction: Direction,
    pub started_unix_s: u64,
    /// What `shaper stats --json` reports for this direction.
    pub report: Report,
    pub control: ControlSample,
    /// The busiest hosts by bytes (`--metrics-top-hosts`; empty when 0).
    pub top_hosts: Vec<HostRow>,
}

impl Monitor {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        // A panic elsewhere while holding the lock leaves plain numbers behind: still readable.
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The interfaces to shape that are present now: `/readyz` waits for each of them.
    pub fn configured(&self, interfaces: impl IntoIterator<Item = String>) {
        self.lock().wanted = interfaces.into_iter().collect();
    }

    /// `interface`'s `direction` is read through `maps` from now on, until it is forgotten.
    pub fn holds(&self, interface: &str, direction: Direction, maps: Arc<MapReader>) {
        let mut shared = self.lock();
        shared
            .held
            .retain(|h| !(h.interface == interface && h.direction == direction));
        shared.held.push(Held {
            interface: interface.to_string(),
            direction,
            maps,
        });
    }

    /// `interface`'s directions shaped with their state files' content (maps, settings), and
    /// whether the health check that just ran on it passed. Directions keep their control
    /// loop's numbers.
    pub fn checked(&self, interface: &str, states: Vec<(Direction, State)>, passed: bool) {
        let mut shared = self.lock();
        let directions: Vec<Published> = states
            .into_iter()
            .map(|(direction, state)| Published {
                interface: interface.to_string(),
                direction,
                state,
                control: shared
                    .directions
                    .iter()
                    .find(|p| p.interface == interface && p.direction == direction)
                    .map(|p| p.control.clone())
                    .unwrap_or_default(),
            })
            .collect();
        let passed = passed && !directions.is_empty();
        shared.directions.retain(|p| p.interface != interface);
        shared.directions.extend(directions);
        shared.passed.insert(interface.to_string(), passed);
    }

    /// `interface` is no longer shaped (let go, or restored): its maps are let go too.
    pub fn forget(&self, interface: &str) {
        let mut shared = self.lock();
        shared.directions.retain(|p| p.interface != interface);
        shared.held.retain(|h| h.interface != interface);
        shared.passed.remove(interface);
    }

    /// Shaping ends: not ready any more (the interfaces are being restored).
    pub fn stopping(&self) {
        self.lock().stopping = true;
    }

    /// Every interface was left to the next shaper, and the process waits to be stopped.
    pub fn replaced(&self) {
        self.lock().replaced = true;
    }

    /// A tick of the control loop started `lateness` after it was due.
    pub fn tick_started(&self, lateness: Duration) {
        let mut shared = self.lock();
        shared.lateness.observe(lateness.as_secs_f64());
        shared.last_tick = Some(Instant::now());
    }

    /// `direction`'s control loop ticked in `took`; `summary` is `None` when the tick failed.
    pub fn ticked(
        &self,
        interface: &str,
        direction: Direction,
        summary: Option<&TickSummary>,
        took: Duration,
    ) {
        let mut shared = self.lock();
        let Some(p) = shared.find(interface, direction) else {
            return;
        };
        let c = &mut p.control;
        c.ticks += 1;
        c.duration.observe(took.as_secs_f64());
        match summary {
            Some(s) => {
                c.active_hosts = s.active_hosts as u64;
                c.bottlenecked_hosts = s.bottlenecked_hosts as u64;
                c.active_flows = s.active_flows;
            }
            None => c.failed_ticks += 1,
        }
    }

    /// What autorate saw last on `interface`'s `direction`.
    pub fn autorate(&self, interface: &str, direction: Direction, status: AutorateSample) {
        if let Some(p) = self.lock().find(interface, direction) {
            p.control.autorate = Some(status);
        }
    }

    /// `interface`'s `direction` is shaped at `rate_bps` now (autorate changed it).
    pub fn rate(&self, interface: &str, direction: Direction, rate_bps: u64) {
        if let Some(p) = self.lock().find(interface, direction) {
            p.state.rate_bps = rate_bps;
        }
    }

    /// `Ok` when every interface to shape is shaped and its last health check passed; why not
    /// otherwise.
    pub fn ready(&self) -> Result<(), &'static str> {
        self.lock().unready().map_or(Ok(()), Err)
    }

    /// `Ok` while the process does its job: every shaped direction's maps are readable and the
    /// control loop ticks. Before shaping has started there is nothing to read yet: alive. A
    /// process that was replaced and waits to be stopped has nothing to read or tick: alive.
    pub fn health(&self) -> Result<(), String> {
        let (directions, last_tick) = {
            let shared = self.lock();
            // As in a scrape, a direction is read once its maps are held.
            let directions: Vec<_> = shared
                .directions
                .iter()
                .filter_map(|p| {
                    Some((
                        p.state.iface.clone(),
                        shared.maps(&p.interface, p.direction)?,
                    ))
                })
                .collect();
            let last_tick = shared.last_tick.filter(|_| !shared.replaced);
            (directions, last_tick)
        };
        for (iface, maps) in &directions {
            maps.view()
                .map_err(|e| format!("the maps of {iface} are unreadable: {e}"))?;
        }
        match last_tick {
            Some(t) if t.elapsed() > STALLED_AFTER => Err(format!(
                "the control loop has not ticked for {:.1} s",
                t.elapsed().as_secs_f64()
            )),
            _ => Ok(()),
        }
    }

    /// The numbers of every shaped direction now, with its `top_hosts` busiest hosts.
    pub fn scrape(&self, top_hosts: usize) -> Result<Scrape, BpfError> {
        let (published, lateness, ready) = {
            let shared = self.lock();
            let published: Vec<_> = shared
                .directions
                .iter()
                .map(|p| (p.clone(), shared.maps(&p.interface, p.direction)))
                .collect();
            (
                published,
                shared.lateness.clone(),
                shared.unready().is_none(),
            )
        };
        // A direction is read once its maps are held: the run loop hands them over when it
        // shapes the interface, before it first publishes it.
        let directions = published
            .into_iter()
            .filter_map(|(p, maps)| Some(sample(p, &*maps?, top_hosts)))
            .collect::<Result<_, _>>()?;
        Ok(Scrape {
            directions,
            lateness,
            ready,
        })
    }
}

/// A direction's report read from its maps, as `shaper stats` reads it.
fn sample(p: Published, maps: &MapReader, top_hosts: usize) -> Result<DirectionSample, BpfError> {
    let report = Report::read(&p.state, maps)?;
    let top_hosts = if top_hosts == 0 {
        Vec::new()
    } else {
        let now = bpf::monotonic_now_ns();
        stats::host_rows(maps.hosts()?, &maps.host_rates()?, now, top_hosts)
    };
    Ok(DirectionSample {
        interface: p.interface,
        direction: p.direction,
        started_unix_s: p.state.started_unix_s,
        report,
        control: p.control,
        top_hosts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(iface: &str) -> State {
        crate::record::example(iface)
    }

    #[test]
    fn ready_when_every_configured_interface_is_shaped_and_passed() {
        let m = Monitor::default();
        assert!(m.ready().is_err(), "nothing configured yet");
        m.configured(["s0".to_string(), "s1".to_string()]);
        m.checked("s0", vec![(Direction::Egress, state("s0"))], true);
        assert!(m.ready().is_err(), "s1 is not shaped");
        m.checked("s1", vec![(Direction::Egress, state("s1"))], true);
        assert_eq!(m.ready(), Ok(()));
        // Each interface's directions are its own: a tick of s1's is not s0's.
        m.ticked("s1", Direction::Egress, None, Duration::ZERO);
        let failed = |i: &str| {
            m.lock()
                .directions
                .iter()
                .find(|p| p.interface == i)
                .unwrap()
                .control
                .failed_ticks
        };
        assert_eq!((failed("s0"), failed("s1")), (0, 1));
        m.checked("s1", vec![(Direction::Egress, state("s1"))], false);
        assert!(m.ready().is_err(), "s1 failed its check");
        // s1 let go (gone, and no longer configured): ready on s0 alone.
        m.forget("s1");
        m.configured(["s0".to_string()]);
        assert_eq!(m.ready(), Ok(()));
        assert_eq!(m.lock().directions.len(), 1);
        m.stopping();
        assert_eq!(m.ready(), Err("stopping"));
    }

    #[test]
    fn a_replaced_process_is_alive_and_not_ready_without_ticking() {
        let m = Monitor::default();
        m.configured(["s0".to_string()]);
        m.checked("s0", vec![(Direction::Egress, state("s0"))], true);
        m.forget("s0");
        m.configured([]);
        // Its last tick long past: a control loop that stopped ticking is dead...
        m.lock().last_tick = Some(Instant::now() - 2 * STALLED_AFTER);
        assert!(m.health().is_err());
        // ...but one with nothing left to shape, waiting to be stopped, is not.
        m.replaced();
        assert_eq!(m.health(), Ok(()));
        let why = m.ready().unwrap_err();
        assert!(why.starts_with("replaced: "), "{why}");
        // Nothing is read: no direction is left.
        assert!(m.scrape(0).unwrap().directions.is_empty());
    }
}
