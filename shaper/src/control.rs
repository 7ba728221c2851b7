//! The control loop: every interval, read what each host did, compute max-min fair levels and
//! write them for the data path (docs/design.md, "Fairness").
//!
//! 100 ms is a few RTTs on the paths shaper targets and the order of CoDel's interval: short
//! enough that a newcomer converges within two ticks, long enough that a tick's byte counts
//! hold thousands of packets at 10 Mbit/s and up, so the rates it measures are not noise.
//! Hosts that send fewer packets than that are measured over several ticks (`sampling`).

use std::{collections::HashMap, time::Duration};

use serde::Serialize;
use shaper_common::{
    abi::{FlowKey, HostRate, Levels, ShaperConfig, host_flags},
    diffserv::{Diffserv, dscp},
    edt,
    isolation::{Isolation, fields, side_identity},
};
use tracing::trace;

use crate::{
    bpf::{BpfError, Datapath, monotonic_now_ns},
    fairness::{Member, TinUsage, flow_level, tin_capacities, triple_isolate_weights, water_level},
    sampling::{HostSample, HostWindow},
};

pub const INTERVAL: Duration = Duration::from_millis(100);

/// Ticks a host may stay idle before its levels are forgotten (it comes back as a newcomer),
/// once it has left the plan (see [`crate::sampling`]).
const FORGET_AFTER_IDLE_TICKS: usize = 2;

/// Ticks a host may stay silent (10 s) before its entry in the data path's hosts map is
/// removed. Forgotten, it already comes back as a newcomer; its entry would otherwise stay
/// until the LRU map is full (`max-hosts`, 65,536 by default), and every tick walks the whole
/// map: a server that had seen 65,536 clients read them all ten times a second, and kept a
/// window for each. Removed, a host that comes back gets a zeroed entry, as after an eviction.
const REMOVE_AFTER_SILENT_TICKS: u32 = 100;

/// The levels for one interval.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// (host allocation, flow level) per sampled host, bits per second.
    pub hosts: Vec<(f64, f64)>,
    /// The host level: what a bottlenecked host of weight 1 gets.
    pub level_bps: f64,
    /// What a host seen for the first time gets until the next interval.
    pub new_host_bps: f64,
}

/// Max-min fair levels for `hosts` sharing `rate_bps`.
pub fn plan(rate_bps: f64, hosts: &[HostSample]) -> Plan {
    let capacity = rate_bps;
    let members: Vec<Member> = hosts
        .iter()
        .map(|h| Member {
            weight: h.weight,
            demand_bps: (!h.bottlenecked()).then_some(h.rate_bps),
        })
        .collect();
    let level = water_level(capacity, &members);
    let mut with_newcomer = members.clone();
    with_newcomer.push(Member {
        weight: 1.0,
        demand_bps: None,
    });
    let new_host_bps = water_level(capacity, &with_newcomer).min(rate_bps);
    let hosts = hosts
        .iter()
        .map(|h| {
            let allocation = (level * h.weight).min(capacity);
            let flows = flow_level(
                allocation,
                h.unbacklogged_bps,
                h.backlogged_flows,
                h.active_flows,
            );
            (allocation, flows)
        })
        .collect();
    Plan {
        hosts,
        level_bps: level,
        new_host_bps,
    }
}

/// Summary of the last tick, for `shaper stats` and logs.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TickSummary {
    pub epoch: u64,
    pub active_hosts: usize,
    pub bottlenecked_hosts: usize,
    /// Flows busy during the tick, summed over the active hosts (each host's average over its
    /// sampling window, so not a whole number).
    pub active_flows: f64,
    pub level_bps: u64,
    pub new_host_bps: u64,
    /// What the active hosts carried (bits/s of wire rate), each over its sampling window.
    pub carried_bps: f64,
}

/// A host in the data path's map, as the control loop follows it.
struct Seen {
    window: HostWindow,
    /// Factor on the host's flow level (see [`next_boost`]).
    boost: f64,
    /// Whether its levels are written (until it has been idle long enough to be forgotten).
    measured: bool,
    /// Ticks since its last packet (not bounded by its window).
    silent_ticks: u32,
    /// The epoch of the last tick that found it in the hosts map.
    epoch: u64,
}

impl Default for Seen {
    fn default() -> Self {
        Self {
            window: HostWindow::default(),
            boost: 1.0,
            measured: false,
            silent_ticks: 0,
            epoch: 0,
        }
    }
}

/// The hosts the control loop follows: an index by key into slots that stay in place, so that
/// the slot a tick finds a host in serves the rest of the tick without another lookup, and
/// the index's entries stay small when it grows or sheds the ones removed (a flood of spoofed
/// sources churns hundreds a tick). A slot not in the index is free.
#[derive(Default)]
struct Followed {
    index: HashMap<FlowKey, usize>,
    slots: Vec<Seen>,
    free: Vec<usize>,
}

impl Followed {
    /// The slot of `key`, a new host's (`Seen::default`) if it was not followed.
    fn slot(&mut self, key: FlowKey) -> usize {
        let Self { index, slots, free } = self;
        *index.entry(key).or_insert_with(|| match free.pop() {
            Some(slot) => {
                slots[slot] = Seen::default();
                slot
            }
            None => {
                slots.push(Seen::default());
                slots.len() - 1
            }
        })
    }

    /// Follows `key` as `seen` from now on.
    fn insert(&mut self, key: FlowKey, seen: Seen) {
        let slot = self.slot(key);
        self.slots[slot] = seen;
    }

    fn remove(&mut self, key: &FlowKey) {
        if let Some(slot) = self.index.remove(key) {
            self.free.push(slot);
        }
    }

    /// Keeps the hosts for which `keep` holds.
    fn retain(&mut self, mut keep: impl FnMut(&FlowKey, &Seen) -> bool) {
        let Self { index, slots, free } = self;
        index.retain(|key, slot| {
            let kept = keep(key, &slots[*slot]);
            if !kept {
                free.push(*slot);
            }
            kept
        });
    }

    /// Gives back the memory of slots a flood left behind: once fewer than a quarter of them
    /// are followed, the followed ones move into slots sized for twice their number (room to
    /// grow before the next reallocation, and no repacking while the count hovers). Moves
    /// slots: only between ticks, when no slot number is held.
    fn compact(&mut self) {
        let followed = self.index.len();
        if self.slots.len() <= COMPACT_FROM_SLOTS || followed * 4 >= self.slots.len() {
            return;
        }
        let mut slots = Vec::with_capacity(followed * 2);
        for slot in self.index.values_mut() {
            slots.push(std::mem::take(&mut self.slots[*slot]));
            *slot = slots.len() - 1;
        }
        self.slots = slots;
        self.free = Vec::new();
        self.index.shrink_to(followed * 2);
    }

    /// Bytes held for following hosts (slots, the free list and the index's entries).
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Seen>()
            + self.free.capacity() * std::mem::size_of::<usize>()
            + self.index.capacity() * std::mem::size_of::<(FlowKey, usize)>()
    }
}

/// Below this many slots, `Followed` is not worth repacking.
const COMPACT_FROM_SLOTS: usize = 1024;

/// Largest factor by which a host's flow level may exceed its fair value.
const MAX_BOOST: f64 = 1.5;

/// Share of its allocation a host may carry without its boost growing.
const BOOST_DEADBAND: f64 = 0.98;

/// Share of its allocation from which a host counts as carrying all of it: its guard, not its
/// flows' pace, holds it, so its boost is more than it needs.
const BOOST_FULL: f64 = 0.995;

/// Factor per tick by which a boost that is more than its host needs returns towards 1.
const BOOST_DECAY: f64 = 0.97;

/// The next factor on a bottlenecked host's flow level, from its share of its allocation
/// carried (over enough of its bytes, [`HostWindow::carried_rate_bps`]). A flow paced at
/// exactly its share rarely achieves it: each time its next packet comes late (a TCP Small
/// Queues completion, a scheduling delay, a push by the calendar) the wire time is lost, and a
/// single flow loses more than ten that cover for each other. So a host that is bottlenecked
/// here but carried less than its allocation gets its flows paced faster, by the square root
/// of the shortfall per tick (damped), up to [`MAX_BOOST`]; the host's guard clock still holds
/// it to its allocation, so the boost only recovers lost time. A host at or above its
/// allocation, or no longer bottlenecked, returns towards 1.
///
/// A host that carries its whole allocation lets its boost decay: its guard holds it there,
/// and the boost beyond what it needs only decides which of its flows the guard serves first.
/// Held instead, a boost grown while TCP flows started stayed for good, and the one flow that
/// never backs off (unresponsive UDP beside four TCP flows) took its boosted level, 1.1-1.2
/// times its share, from its host's TCP flows.
pub fn next_boost(boost: f64, carried: f64, bottlenecked: bool) -> f64 {
    if !bottlenecked || carried <= 0.0 {
        return 1.0;
    }
    if (BOOST_FULL..=1.0).contains(&carried) {
        return (boost * BOOST_DECAY).clamp(1.0, MAX_BOOST);
    }
    if (BOOST_DEADBAND..=1.0).contains(&carried) {
        // Close enough: measurement noise must not ratchet the boost up.
        return boost.clamp(1.0, MAX_BOOST);
    }
    (boost / carried.sqrt()).clamp(1.0, MAX_BOOST)
}

pub struct Controller {
    rate_bps: u64,
    isolation: Isolation,
    diffserv: Diffserv,
    epoch: u64,
    last_ns: u64,
    seen: Followed,
    /// The previous tick's duration and the longest so far (`Levels::tick_ns`).
    tick_ns: u64,
    max_tick_ns: u64,
    /// The CPU time of the previous tick and the most of any so far (`Levels::tick_cpu_ns`).
    tick_cpu_ns: u64,
    max_tick_cpu_ns: u64,
}

impl Controller {
    pub fn new(rate_bps: u64, isolation: Isolation, diffserv: Diffserv) -> Self {
        Self {
            rate_bps,
            isolation,
            diffserv,
            epoch: 0,
            last_ns: monotonic_now_ns(),
            seen: Followed::default(),
            tick_ns: 0,
            max_tick_ns: 0,
            tick_cpu_ns: 0,
            max_tick_cpu_ns: 0,
        }
    }

    /// The previous tick's wall time and the CPU time its thread spent in it, in ns (zero
    /// before the first tick).
    pub fn last_tick_ns(&self) -> (u64, u64) {
        (self.tick_ns, self.tick_cpu_ns)
    }

    /// Takes up a data path that already has hosts (one a predecessor left, `handover`): its
    /// epochs go on from the last one written, so no host's record of an epoch is met again;
    /// each host's window starts from its counters now, so that what it sent before is not
    /// read as one tick's demand; and hosts whose levels are written are followed as measured
    /// (their rates are removed when they go, as this loop's own are), at the boost those
    /// levels carry.
    pub fn resume(&mut self, dp: &Datapath) -> Result<(), BpfError> {
        self.epoch = self.epoch.max(dp.levels()?.epoch);
        let rates: HashMap<FlowKey, HostRate> = dp.host_rates()?.into_iter().collect();
        for (key, state) in dp.hosts()? {
            let rate = rates.get(&key);
            self.seen.insert(
                key,
                Seen {
                    window: HostWindow::since(state),
                    measured: rate.is_some(),
                    boost: rate.map_or(1.0, |r| r.boost(dp.config()).clamp(1.0, MAX_BOOST)),
                    ..Seen::default()
                },
            );
        }
        Ok(())
    }

    /// Shares `rate_bps` by these modes from the next tick on. What it follows of each host
    /// (windows, boosts) stays: a host keyed anew by another isolation mode falls silent and is
    /// forgotten as any other.
    pub fn set_policy(&mut self, rate_bps: u64, isolation: Isolation, diffserv: Diffserv) {
        self.rate_bps = rate_bps;
        self.isolation = isolation;
        self.diffserv = diffserv;
    }

    pub fn tick(&mut self, dp: &mut Datapath) -> Result<TickSummary, BpfError> {
        let now = monotonic_now_ns();
        let dt_s = now.saturating_sub(self.last_ns) as f64 / 1e9;
        if dt_s < 0.01 {
            return Ok(TickSummary::default());
        }
        let cpu_start = thread_cpu_ns();
        self.last_ns = now;
        self.epoch += 1;

        let epoch = self.epoch;
        let mut unrated: Vec<FlowKey> = Vec::new();
        // The hosts with a sample, and the slot each is followed in.
        let mut active: Vec<(FlowKey, HostSample)> = Vec::new();
        let mut active_slots: Vec<usize> = Vec::new();
        let mut silent: Vec<FlowKey> = Vec::new();
        let hosts = dp.hosts()?;
        self.seen
            .index
            .reserve(hosts.len().saturating_sub(self.seen.index.len()));
        for (key, state) in hosts {
            // A host seen for the first time was created during this tick: its counters are
            // all this tick's.
            let slot = self.seen.slot(key);
            let seen = &mut self.seen.slots[slot];
            if seen.epoch == epoch {
                // A key the read returned twice (the map churned under it) counts once.
                continue;
            }
            seen.epoch = epoch;
            seen.window.record(state, dt_s);
            seen.silent_ticks = match seen.window.idle_ticks() {
                0 => 0,
                _ => seen.silent_ticks.saturating_add(1),
            };
            if let Some(sample) = seen.window.sample() {
                active.push((key, sample));
                active_slots.push(slot);
            } else if seen.silent_ticks >= REMOVE_AFTER_SILENT_TICKS {
                silent.push(key);
                if seen.measured {
                    unrated.push(key);
                }
            } else if seen.measured && seen.window.idle_ticks() >= FORGET_AFTER_IDLE_TICKS {
                // Forgotten: it comes back at the newcomer level. Its window restarts from its
                // counters now, so that its return is not read as everything it ever sent.
                unrated.push(key);
                seen.measured = false;
                seen.boost = 1.0;
                seen.window = HostWindow::since(state);
            }
        }
        // Hosts the data path evicted (not in the map this tick): an entry created again starts
        // from zero counters. Only a host whose levels were written has a rate to remove: a
        // flood of spoofed sources evicts hundreds of hosts a tick that never had one.
        self.seen.retain(|key, seen| {
            if seen.epoch == epoch {
                return true;
            }
            if seen.measured {
                unrated.push(*key);
            }
            false
        });
        dp.remove_host_rates(&unrated)?;
        dp.remove_hosts(&silent)?;
        for key in silent {
            self.seen.remove(&key);
        }
        // Tins first (each tin's hosts are levelled within what the tin may use), then hosts,
        // then flows.
        let tins = self.diffserv.tins();
        let tin_of = |key: &FlowKey| (key.tin as usize).min(tins.len() - 1);
        let best_effort = tins[self.diffserv.tin_of(dscp::CS0) as usize].priority;
        let mut usage: Vec<TinUsage> = tins
            .iter()
            .map(|t| TinUsage {
                threshold_bps: self.rate_bps as f64 * t.threshold_num as f64
                    / t.threshold_den as f64,
                priority: t.priority,
                rate_bps: 0.0,
                bottlenecked: false,
                active: false,
                above_best_effort: t.priority > best_effort,
            })
            .collect();
        for (key, sample) in &active {
            let u = &mut usage[tin_of(key)];
            u.rate_bps += sample.rate_bps;
            u.bottlenecked |= sample.bottlenecked();
            u.active = true;
        }
        let capacities = tin_capacities(self.rate_bps as f64, &usage);
        let config = *dp.config();
        let mut levels = Levels {
            epoch: self.epoch,
            tick_ns: self.tick_ns,
            max_tick_ns: self.max_tick_ns,
            tick_cpu_ns: self.tick_cpu_ns,
            max_tick_cpu_ns: self.max_tick_cpu_ns,
            ..Default::default()
        };
        let mut rates: Vec<(FlowKey, HostRate)> = Vec::with_capacity(active.len());
        let mut summary = TickSummary {
            epoch: self.epoch,
            ..Default::default()
        };
        let mut group: Vec<(FlowKey, HostSample)> = Vec::with_capacity(active.len());
        let mut group_slots: Vec<usize> = Vec::with_capacity(active.len());
        for t in 0..tins.len() {
            group.clear();
            group_slots.clear();
            for ((key, sample), slot) in active.iter().zip(&active_slots) {
                if tin_of(key) == t {
                    group.push((*key, *sample));
                    group_slots.push(*slot);
                }
            }
            if self.isolation == Isolation::TripleIsolate {
                apply_triple_isolate_weights(&mut group);
            }
            let samples: Vec<HostSample> = group.iter().map(|(_, s)| *s).collect();
            let plan = plan(capacities[t], &samples);
            // Going ahead of the calendar's bookings pushes the later packets of the hosts
            // that made them: only bottlenecked hosts have any. Without one, hosts that go
            // ahead only go ahead of each other, and each is held by nothing but its guard
            // (the whole rate for a host not bottlenecked, or new, while nobody else is).
            let ahead = samples.iter().any(HostSample::bottlenecked);
            self.apply(&config, &group, &group_slots, &plan, ahead, &mut rates);
            levels.set_newcomer(&config, t, edt::ns_per_byte_fp(plan.new_host_bps as u64));
            if ahead {
                levels.newcomers_ahead_tins |= 1 << t;
            }
            if usage[t].goes_first() {
                levels.priority_tins |= 1 << t;
            }
            summary.active_hosts += samples.len();
            summary.bottlenecked_hosts += samples.iter().filter(|s| s.bottlenecked()).count();
            summary.active_flows += samples.iter().map(|s| s.active_flows).sum::<f64>();
            summary.carried_bps += samples.iter().map(|s| s.rate_bps).sum::<f64>();
            if t == self.diffserv.tin_of(dscp::CS0) as usize {
                summary.level_bps = plan.level_bps as u64;
                summary.new_host_bps = plan.new_host_bps as u64;
            }
        }
        let left_out = dp.set_host_rates(&rates)?;
        if left_out > 0 {
            trace!(left_out, "host rates full");
        }
        dp.set_levels(&levels)?;
        self.seen.compact();
        self.tick_ns = monotonic_now_ns().saturating_sub(now);
        self.max_tick_ns = self.max_tick_ns.max(self.tick_ns);
        self.tick_cpu_ns = thread_cpu_ns().saturating_sub(cpu_start);
        self.max_tick_cpu_ns = self.max_tick_cpu_ns.max(self.tick_cpu_ns);
        Ok(summary)
    }

    /// A plan's levels for its hosts (followed in `slots`), with each host's boost, added to
    /// `rates`; `ahead`: hosts not bottlenecked go ahead of the calendar's bookings
    /// (`host_flags::AHEAD`).
    fn apply(
        &mut self,
        config: &ShaperConfig,
        group: &[(FlowKey, HostSample)],
        slots: &[usize],
        plan: &Plan,
        ahead: bool,
        rates: &mut Vec<(FlowKey, HostRate)>,
    ) {
        for (((key, sample), slot), (allocation_bps, flow_bps)) in
            group.iter().zip(slots).zip(&plan.hosts)
        {
            let seen = &mut self.seen.slots[*slot];
            seen.measured = true;
            let carried = seen.window.carried_rate_bps() / allocation_bps.max(1.0);
            seen.boost = next_boost(seen.boost, carried, sample.bottlenecked());
            let boost = seen.boost;
            trace!(
                host = %crate::stats::describe_key(key),
                rate_bps = sample.rate_bps as u64,
                unbacklogged_bps = sample.unbacklogged_bps as u64,
                active_flows = format_args!("{:.2}", sample.active_flows),
                backlogged_flows = format_args!("{:.2}", sample.backlogged_flows),
                weight = format_args!("{:.3}", sample.weight),
                allocation_bps = *allocation_bps as u64,
                flow_bps = (flow_bps * boost) as u64,
                boost = format_args!("{boost:.3}"),
                "host"
            );
            // Single-level modes have one pseudo-host (per tin) whose allocation is the tin's:
            // the calendar guards the rate already, and no guard would bound it ahead of the
            // calendar.
            let guarded = self.isolation.host_fields() != fields::NONE;
            let flags = if guarded && ahead && !sample.bottlenecked() {
                host_flags::AHEAD
            } else {
                0
            };
            let allocation = guarded.then_some(*allocation_bps);
            rates.push((*key, host_rate(config, allocation, *flow_bps, boost, flags)));
        }
    }
}

/// The CPU time the calling thread has spent, in ns (user and system).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid timespec pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The rates the data path reads for a host: its flows paced at their `level_bps` times its
/// `boost`, its guard at its `allocation_bps` (`None`: no guard), and its rounds at the level
/// itself. The boost recovers wire time that flows held by the guard lose; a kept ACK charged
/// a round goes ahead of the guard and loses none, and paced at the boosted level, a thinned
/// ACK flow on a 1 Mbit/s uplink sent 15 % more ACKs than CAKE's (docs/ack-filter.md).
fn host_rate(
    config: &ShaperConfig,
    allocation_bps: Option<f64>,
    level_bps: f64,
    boost: f64,
    flags: u64,
) -> HostRate {
    HostRate::new(
        config,
        edt::ns_per_byte_fp((level_bps * boost) as u64),
        allocation_bps.map_or(0, |a| edt::ns_per_byte_fp(a as u64)),
        flags,
    )
    .with_rounds_at(config, edt::ns_per_byte_fp(level_bps as u64))
}

/// Weights each active (source, destination) pair so that sources and destinations are fair
/// (see `fairness::triple_isolate_weights`), scaled to a mean of 1.
fn apply_triple_isolate_weights(active: &mut [(FlowKey, HostSample)]) {
    let mut ids: HashMap<(([u32; 4], u8), bool), usize> = HashMap::with_capacity(2 * active.len());
    let mut id = |addr: [u32; 4], family: u8, dst: bool| {
        let next = ids.len();
        *ids.entry((side_identity(addr, family), dst))
            .or_insert(next)
    };
    let pairs: Vec<(usize, usize)> = active
        .iter()
        .map(|(k, _)| (id(k.src, k.family, false), id(k.dst, k.family, true)))
        .collect();
    let weights = triple_isolate_weights(&pairs);
    let n = active.len() as f64;
    for ((_, sample), w) in active.iter_mut().zip(weights) {
        sample.weight = w * n;
    }
}

#[cfg(test)]
mod tests {
    use shaper_common::{abi::HostState, isolation::SELF_HOST};

    use super::*;

    fn bulk(flows: f64) -> HostSample {
        HostSample {
            rate_bps: 50e6,
            unbacklogged_bps: 0.0,
            active_flows: flows,
            backlogged_flows: flows,
            weight: 1.0,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-6 * b.abs().max(1.0)
    }

    #[test]
    fn hosts_left_after_a_flood_are_repacked_and_its_memory_given_back() {
        let key = |n: u32| FlowKey {
            src: [n, 0, 0, 0],
            family: 4,
            ..Default::default()
        };
        let mut followed = Followed::default();
        for n in 0..20_000 {
            let slot = followed.slot(key(n));
            followed.slots[slot].silent_ticks = n;
        }
        let flooded = followed.bytes();
        // The flood goes; one host in a hundred stays. Nothing moves while a tick may hold
        // slot numbers, and the repacking keeps each host's state under its key.
        followed.retain(|k, _| k.src[0] % 100 == 0);
        assert_eq!(followed.slots.len(), 20_000);
        followed.compact();
        assert_eq!(followed.index.len(), 200);
        for n in (0..20_000).step_by(100) {
            let slot = followed.index[&key(n)];
            assert_eq!(followed.slots[slot].silent_ticks, n);
        }
        assert!(
            followed.bytes() * 20 < flooded,
            "{} bytes after, {flooded} during the flood",
            followed.bytes()
        );
        // New hosts reuse the room left, and a small table is not repacked.
        let slot = followed.slot(key(1));
        assert_eq!(followed.slots[slot].silent_ticks, 0);
        followed.retain(|_, _| false);
        followed.compact();
        assert_eq!(followed.slots.len(), 201, "below COMPACT_FROM_SLOTS");
    }

    #[test]
    fn a_dual_stack_server_is_one_source_to_clients_of_either_family() {
        let pair = |src: [u32; 4], client: u32, family: u8, flows: f64| {
            let key = FlowKey {
                src,
                dst: [client, 0, 0, 0],
                family,
                ..Default::default()
            };
            (key, bulk(flows))
        };
        // The server's IPv4 and IPv6 addresses as the data path keys them: one host, and its
        // three clients (one over IPv4) equal, as under dual-dsthost.
        let mut active = [
            pair(SELF_HOST, 1, 6, 2.0),
            pair(SELF_HOST, 2, 4, 6.0),
            pair(SELF_HOST, 3, 6, 12.0),
        ];
        apply_triple_isolate_weights(&mut active);
        for (_, s) in &active {
            assert!(close(s.weight, 1.0), "{active:?}");
        }
        // A source that is not the machine is two hosts in two families (a v4 and a v6 address
        // may share their words): the v4 one keeps half, against two pairs of the v6 one.
        let other = [9, 0, 0, 0];
        let mut active = [
            pair(other, 1, 4, 1.0),
            pair(other, 2, 6, 1.0),
            pair(other, 3, 6, 1.0),
        ];
        apply_triple_isolate_weights(&mut active);
        assert!(close(active[0].1.weight, 1.5), "{active:?}");
    }

    #[test]
    fn the_seed_scenario_splits_by_host_then_flow() {
        // Client A with 1 connection, client B with 10, 100 Mbit/s: 50/50 by host, B's flows 5 each.
        let p = plan(100e6, &[bulk(1.0), bulk(10.0)]);
        assert!(
            close(p.hosts[0].0, 50e6) && close(p.hosts[1].0, 50e6),
            "{p:?}"
        );
        assert!(
            close(p.hosts[0].1, 50e6) && close(p.hosts[1].1, 5e6),
            "{p:?}"
        );
        // A third host would get a third at once.
        assert!(close(p.new_host_bps, 100e6 / 3.0), "{p:?}");
    }

    #[test]
    fn a_boost_paces_a_hosts_flows_not_its_rounds() {
        let config = ShaperConfig {
            ack_quantum_bytes: 150,
            ..ShaperConfig::default()
        };
        let r = host_rate(&config, Some(1e6), 200e3, 1.25, host_flags::AHEAD);
        assert_eq!(r.flow_ns_per_byte_fp, edt::ns_per_byte_fp(250_000));
        // 150 bytes at 200 kbit/s, not at the boosted 250.
        assert_eq!(r.ack_round_ns, 6_000_000);
        assert_eq!(r.host_ns_per_byte_fp, edt::ns_per_byte_fp(1_000_000));
        assert_eq!(r.flags, host_flags::AHEAD);
        let unguarded = host_rate(&config, None, 200e3, 1.0, 0);
        assert_eq!(unguarded.host_ns_per_byte_fp, 0);
        assert_eq!(unguarded.ack_round_ns, 6_000_000);
    }

    #[test]
    fn boost_recovers_a_shortfall_and_stays_bounded() {
        // A bottlenecked host carrying 85% of its allocation is paced faster, damped.
        let b = next_boost(1.0, 0.85, true);
        assert!(close(b, (1.0f64 / 0.85).sqrt()), "{b}");
        // Repeated shortfalls grow it to the bound, no further.
        let mut b = 1.0;
        for _ in 0..50 {
            b = next_boost(b, 0.5, true);
        }
        assert!(close(b, MAX_BOOST), "{b}");
        // Above its allocation it shrinks; never below 1; limited elsewhere it is 1.
        assert!(next_boost(1.2, 1.1, true) < 1.2);
        assert!(close(next_boost(1.0, 1.6, true), 1.0));
        assert!(close(next_boost(1.4, 0.2, false), 1.0));
        // Within 2% of the allocation it holds, unless the host carries all of it: then it
        // decays, and only towards 1.
        assert!(close(next_boost(1.2, 0.984, true), 1.2));
        let mut b = 1.5;
        for _ in 0..100 {
            b = next_boost(b, 0.998, true);
        }
        assert!(close(b, 1.0), "{b}");
    }

    #[test]
    fn a_low_rate_host_is_boosted_by_its_mean_shortfall_not_its_noisiest_tick() {
        // A host carrying 0.95 of its 1 Mbit/s allocation on average, whose ticks read a few
        // full-size frames more or less.
        let allocation = 1e6;
        let ticks = [0.45, 1.55, 1.35, 0.45].iter().cycle().take(60);
        let (mut window, mut state) = (HostWindow::default(), HostState::default());
        let (mut boost, mut per_tick) = (1.0, 1.0);
        let (mut boost_min, mut per_tick_min) = (f64::MAX, f64::MAX);
        for (i, &share) in ticks.enumerate() {
            let bytes = (share * allocation / 8.0 * 0.1) as u64;
            state.bytes += bytes;
            state.packets += bytes / 1514 + 60;
            window.record(state, 0.1);
            boost = next_boost(boost, window.carried_rate_bps() / allocation, true);
            per_tick = next_boost(per_tick, share, true);
            if i >= 20 {
                boost_min = boost_min.min(boost);
                per_tick_min = per_tick_min.min(per_tick);
            }
        }
        assert!(boost_min > 1.4, "{boost_min}");
        // Read tick by tick, each tick above the allocation undid the growth before it.
        assert!(per_tick_min < 1.1, "{per_tick_min}");
    }

    #[test]
    fn a_host_limited_elsewhere_keeps_its_rate_and_the_rest_is_shared() {
        let slow = HostSample {
            rate_bps: 10e6,
            unbacklogged_bps: 10e6,
            active_flows: 0.2,
            backlogged_flows: 0.0,
            weight: 1.0,
        };
        let p = plan(100e6, &[slow, bulk(2.0), bulk(4.0)]);
        assert!(close(p.level_bps, 45e6), "{p:?}");
        assert!(
            close(p.hosts[1].1, 22.5e6) && close(p.hosts[2].1, 11.25e6),
            "{p:?}"
        );
        // The slow host may still grow to the level at once.
        assert!(close(p.hosts[0].0, 45e6), "{p:?}");
    }
}
