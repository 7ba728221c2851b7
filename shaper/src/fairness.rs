//! Max-min fair levels: the arithmetic of the control loop (pure functions).
//!
//! The data path advances every clock of a group at one *level* (see docs/design.md): members
//! limited elsewhere use less than the level, bottlenecked members get exactly it. The control
//! loop measures demands and computes the levels here.

/// One member of a group (a host among hosts).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Member {
    /// Relative weight (1.0 for plain fairness; the triple-isolate pair weights otherwise).
    pub weight: f64,
    /// What it used when it was not held back by its clock: `None` when it was bottlenecked
    /// here (it would use more), `Some(bps)` when it was limited elsewhere.
    pub demand_bps: Option<f64>,
}

/// The max-min fair level of `members` sharing `capacity_bps`: the largest `level` with
/// `Σ min(demand, level·weight) ≤ capacity`. When every member is limited elsewhere there is
/// capacity to spare and the level is the whole capacity: any member may grow into it (the
/// guard clock absorbs a simultaneous surge until the next interval).
pub fn water_level(capacity_bps: f64, members: &[Member]) -> f64 {
    let capacity = capacity_bps.max(0.0);
    let mut limited: Vec<(f64, f64)> = members
        .iter()
        .filter(|m| m.weight > 0.0)
        .filter_map(|m| m.demand_bps.map(|d| (d.max(0.0), m.weight)))
        .collect();
    limited.sort_by(|a, b| (a.0 / a.1).total_cmp(&(b.0 / b.1)));
    let mut remaining = capacity;
    let mut weight: f64 = members.iter().map(|m| m.weight.max(0.0)).sum();
    for (demand, w) in limited {
        if weight <= 0.0 || demand / w >= remaining / weight {
            break;
        }
        remaining -= demand;
        weight -= w;
    }
    if weight <= f64::EPSILON {
        capacity
    } else {
        (remaining / weight).max(0.0)
    }
}

/// The level of the flows of one host: its allocation minus what its unbacklogged (limited)
/// flows used, split between the backlogged ones (counts are flow-time averages, so
/// fractional). Never below an equal split of the allocation between all its active flows
/// (measurement noise must not starve anyone), never above the allocation.
pub fn flow_level(allocation_bps: f64, unbacklogged_bps: f64, backlogged: f64, active: f64) -> f64 {
    let allocation = allocation_bps.max(0.0);
    if backlogged < 1.0 {
        // Less than one flow kept busy: any single flow may use the whole allocation.
        return allocation;
    }
    // Flow-time counts run a little above the truth while a backlog builds (packets are
    // counted when stamped, ahead of their departure): round before dividing, so that one flow
    // measured as 1.02 still gets the whole allocation. Overestimating a level by a fraction of
    // a flow is safe, the calendar holds the aggregate to the rate.
    let floor = allocation / active.max(backlogged).round().max(1.0);
    ((allocation - unbacklogged_bps.max(0.0)) / backlogged).clamp(floor, allocation)
}

/// Weights for `triple-isolate`: one per active (source, destination) pair such that every
/// source host gets an equal share and every destination host gets an equal share, as far as
/// the pairs that exist allow. Found by alternately scaling rows and columns (Sinkhorn); with
/// one source this is `dual-dsthost`, with one destination `dual-srchost`. Where both cannot
/// hold (two sources, one of them talking to three destinations and the other to a fourth),
/// the side with fewer active hosts is scaled last and so is exactly fair (sources on a tie):
/// on a router's uplink that is its LAN hosts, on a server its clients, the hosts a user
/// counts, and a host cannot gain by talking to more peers. Weights sum to 1.
pub fn triple_isolate_weights(pairs: &[(usize, usize)]) -> Vec<f64> {
    if pairs.is_empty() {
        return Vec::new();
    }
    let sources = pairs.iter().map(|p| p.0).max().unwrap_or(0) + 1;
    let dests = pairs.iter().map(|p| p.1).max().unwrap_or(0) + 1;
    let n_src = count_distinct(pairs.iter().map(|p| p.0), sources);
    let n_dst = count_distinct(pairs.iter().map(|p| p.1), dests);
    let by_source = |w: &mut [f64], sums: &mut Vec<f64>| {
        scale(w, sums, pairs, sources, |p| p.0, 1.0 / n_src as f64)
    };
    let by_dest = |w: &mut [f64], sums: &mut Vec<f64>| {
        scale(w, sums, pairs, dests, |p| p.1, 1.0 / n_dst as f64)
    };
    let mut sums = Vec::with_capacity(sources.max(dests));
    let mut w = vec![1.0 / pairs.len() as f64; pairs.len()];
    let mut before = w.clone();
    for _ in 0..50 {
        before.copy_from_slice(&w);
        if n_src <= n_dst {
            by_dest(&mut w, &mut sums);
            by_source(&mut w, &mut sums);
        } else {
            by_source(&mut w, &mut sums);
            by_dest(&mut w, &mut sums);
        }
        // A round that changed no weight would change none again.
        if w.iter()
            .zip(&before)
            .all(|(a, b)| a.to_bits() == b.to_bits())
        {
            break;
        }
    }
    let total: f64 = w.iter().sum();
    w.iter().map(|x| x / total).collect()
}

/// What one DiffServ tin did in the last interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TinUsage {
    /// Its bandwidth threshold (bits per second).
    pub threshold_bps: f64,
    /// Higher goes first while within its threshold.
    pub priority: u8,
    /// Rate it carried.
    pub rate_bps: f64,
    /// Some host of the tin was held back here (it would use more).
    pub bottlenecked: bool,
    /// It carried anything at all.
    pub active: bool,
    /// Its priority is above best effort's: while within its threshold its packets go ahead
    /// of the calendar's bookings, which lends them their wire time.
    pub above_best_effort: bool,
}

impl TinUsage {
    /// Its packets go ahead of the bookings next interval (within its threshold, above best
    /// effort).
    pub fn goes_first(&self) -> bool {
        self.above_best_effort && self.rate_bps <= self.threshold_bps
    }

    /// It would use more than it carried. Not a tin that goes first: its own bursts make its
    /// flows wait on their clocks (an EF stream at 2 Mbit/s paced at 2.5 did in some ticks),
    /// and read as wanting all of its threshold (a quarter of the rate), each such tick left
    /// best effort only the rest, not the rate less what it carried (32 bulk flows beside it
    /// carried 7.22-7.28 Mbit/s at 10 Mbit/s against CAKE's 7.55-7.62). Allocated what it
    /// carried, its level still reaches its threshold, and what it takes beyond its allocation
    /// the calendar lends it ahead of the bookings.
    fn wants_more(&self) -> bool {
        self.bottlenecked && !self.goes_first()
    }
}

/// What each tin may use for the next interval: the capacity its hosts are levelled within.
///
/// CAKE's tin semantics with levels: in priority order each active tin first gets what it
/// wants up to its threshold (a tin within its threshold goes first); what remains is shared
/// by the tins that want more in proportion to their thresholds (a tin above its threshold
/// competes by weight, so it cannot starve the others). A tin limited elsewhere may grow at
/// once to its threshold and into capacity nobody uses (the calendar absorbs a simultaneous
/// surge until the next interval).
pub fn tin_capacities(rate_bps: f64, tins: &[TinUsage]) -> Vec<f64> {
    let mut alloc = vec![0.0; tins.len()];
    let mut order: Vec<usize> = (0..tins.len()).filter(|&i| tins[i].active).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(tins[i].priority));
    let mut remaining = rate_bps.max(0.0);
    for &i in &order {
        let t = &tins[i];
        let want = if t.wants_more() {
            f64::INFINITY
        } else {
            t.rate_bps
        };
        alloc[i] = want.min(t.threshold_bps).min(remaining);
        remaining -= alloc[i];
    }
    let members: Vec<Member> = order
        .iter()
        .map(|&i| Member {
            weight: tins[i].threshold_bps.max(1.0),
            demand_bps: (!tins[i].wants_more()).then_some((tins[i].rate_bps - alloc[i]).max(0.0)),
        })
        .collect();
    if remaining > 0.0 && !members.is_empty() {
        let level = water_level(remaining, &members);
        for (m, &i) in members.iter().zip(&order) {
            let share = level * m.weight;
            let extra = m.demand_bps.map_or(share, |d| d.min(share));
            alloc[i] += extra;
            remaining -= extra;
        }
    }
    let spare = remaining.max(0.0);
    tins.iter()
        .zip(&alloc)
        .map(|(t, &a)| {
            if t.wants_more() {
                a
            } else {
                (a.max(t.threshold_bps.min(rate_bps)) + spare).min(rate_bps)
            }
        })
        .collect()
}

fn count_distinct(ids: impl Iterator<Item = usize>, n: usize) -> usize {
    let mut seen = vec![false; n];
    ids.for_each(|i| seen[i] = true);
    seen.iter().filter(|s| **s).count()
}

/// Scales weights so that the sum over each group (`group(pair)`) is `target`; `sums` is room
/// for the groups' sums.
fn scale(
    w: &mut [f64],
    sums: &mut Vec<f64>,
    pairs: &[(usize, usize)],
    groups: usize,
    group: impl Fn(&(usize, usize)) -> usize,
    target: f64,
) {
    sums.clear();
    sums.resize(groups, 0.0);
    for (x, p) in w.iter().zip(pairs) {
        sums[group(p)] += x;
    }
    for (x, p) in w.iter_mut().zip(pairs) {
        let s = sums[group(p)];
        if s > 0.0 {
            *x *= target / s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bottlenecked(weight: f64) -> Member {
        Member {
            weight,
            demand_bps: None,
        }
    }

    fn limited(bps: f64) -> Member {
        Member {
            weight: 1.0,
            demand_bps: Some(bps),
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-6 * b.abs().max(1.0)
    }

    fn tin(threshold: f64, priority: u8, rate: f64, bottlenecked: bool) -> TinUsage {
        TinUsage {
            threshold_bps: threshold,
            priority,
            rate_bps: rate,
            bottlenecked,
            active: rate > 0.0 || bottlenecked,
            above_best_effort: priority > 1,
        }
    }

    #[test]
    fn a_voice_flow_within_its_threshold_keeps_its_rate() {
        // diffserv4 on 10 Mbit/s: EF at 2 Mbit/s (voice, threshold 2.5) among bulk best effort.
        let c = tin_capacities(
            10e6,
            &[
                tin(10e6, 1, 8e6, true),
                tin(0.625e6, 0, 0.0, false),
                tin(5e6, 2, 0.0, false),
                tin(2.5e6, 3, 2e6, false),
            ],
        );
        assert!(close(c[0], 8e6), "best effort gets the rest: {c:?}");
        assert!(close(c[3], 2.5e6), "voice may use its threshold: {c:?}");
        // Its own bursts made it wait on its clocks: still allocated what it carried.
        let c = tin_capacities(
            10e6,
            &[tin(10e6, 1, 7.8e6, true), tin(2.5e6, 3, 2.06e6, true)],
        );
        assert!(close(c[0], 10e6 - 2.06e6), "{c:?}");
        assert!(close(c[1], 2.5e6), "{c:?}");
    }

    #[test]
    fn a_flooding_tin_is_held_to_its_share_and_best_effort_is_not_starved() {
        // Voice floods (bottlenecked), best effort is bottlenecked too: voice gets its
        // threshold and the remainder is shared by threshold weight (10 : 2.5).
        let c = tin_capacities(10e6, &[tin(10e6, 1, 7e6, true), tin(2.5e6, 3, 3e6, true)]);
        assert!(close(c[1], 2.5e6 + 0.0), "{c:?}");
        assert!(close(c[0], 7.5e6), "{c:?}");
        // Alone, a tin gets the whole rate.
        let c = tin_capacities(10e6, &[tin(10e6, 1, 0.0, false), tin(2.5e6, 3, 9e6, true)]);
        assert!(close(c[1], 10e6), "{c:?}");
    }

    #[test]
    fn one_tin_behaves_as_before() {
        let c = tin_capacities(100e6, &[tin(100e6, 0, 30e6, false)]);
        assert!(
            close(c[0], 100e6),
            "limited elsewhere, it may grow to the rate: {c:?}"
        );
        let c = tin_capacities(100e6, &[tin(100e6, 0, 95e6, true)]);
        assert!(close(c[0], 100e6), "{c:?}");
    }

    #[test]
    fn equal_split_between_bottlenecked_members() {
        let level = water_level(100e6, &[bottlenecked(1.0), bottlenecked(1.0)]);
        assert!(close(level, 50e6), "{level}");
    }

    #[test]
    fn limited_members_keep_what_they_use_and_the_rest_is_shared() {
        // A slow sender at 10 Mbit/s and two bulk hosts on 100 Mbit/s: 10 / 45 / 45.
        let level = water_level(
            100e6,
            &[limited(10e6), bottlenecked(1.0), bottlenecked(1.0)],
        );
        assert!(close(level, 45e6), "{level}");
        // A "limited" member using more than the fair level is in fact bottlenecked-like: the
        // level is what a fair split gives (it is capped at it by its clock).
        let level = water_level(90e6, &[limited(80e6), bottlenecked(1.0), bottlenecked(1.0)]);
        assert!(close(level, 30e6), "{level}");
    }

    #[test]
    fn all_limited_leaves_the_whole_capacity_as_level() {
        assert!(close(
            water_level(100e6, &[limited(1e6), limited(2e6)]),
            100e6
        ));
        assert!(close(water_level(100e6, &[]), 100e6));
    }

    #[test]
    fn weights_scale_the_level() {
        let level = water_level(90e6, &[bottlenecked(2.0), bottlenecked(1.0)]);
        assert!(close(level, 30e6), "{level}");
    }

    #[test]
    fn flow_level_splits_what_the_limited_flows_leave() {
        // 50 Mbit/s host, one DNS-like flow at 1 Mbit/s, 7 bulk flows: 7 Mbit/s each.
        // (The limited flow is busy a seventh of the time at the 7 Mbit/s level: the rounded
        // floor gives the bulk flows 50/7, a fraction of a flow more than exact.)
        let level = flow_level(50e6, 1e6, 7.0, 7.0 + 1.0 / 7.0);
        assert!((7e6..=50e6 / 7.0).contains(&level), "{level}");
        // 9 Mbit/s of limited flows (busy 9/10.25 of the time) and 4 bulk flows.
        assert!(close(
            flow_level(50e6, 9e6, 4.0, 4.0 + 9.0 / 10.25),
            10.25e6
        ));
        // No backlogged flow: any flow may use the whole allocation.
        assert!(close(flow_level(50e6, 3e6, 0.0, 0.4), 50e6));
        // Noise (limited flows measured above the allocation) never starves the bulk flows.
        assert!(close(flow_level(50e6, 80e6, 2.0, 4.0), 12.5e6));
        // One flow measured slightly above one still gets the whole allocation.
        assert!(close(flow_level(50e6, 0.5e6, 1.02, 1.03), 50e6));
    }

    #[test]
    fn triple_isolate_with_one_source_is_dual_dsthost() {
        let w = triple_isolate_weights(&[(0, 0), (0, 1)]);
        assert!(close(w[0], 0.5) && close(w[1], 0.5), "{w:?}");
    }

    #[test]
    fn triple_isolate_with_one_destination_is_dual_srchost() {
        let w = triple_isolate_weights(&[(0, 0), (1, 0), (2, 0)]);
        assert!(w.iter().all(|x| close(*x, 1.0 / 3.0)), "{w:?}");
    }

    #[test]
    fn triple_isolate_balances_sources_and_destinations() {
        // Source 0 talks to destinations 0..3, source 1 to destinations 0 and 1: sources get
        // half each; destinations 2 and 3 are reached by source 0 only.
        let pairs = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)];
        let w = triple_isolate_weights(&pairs);
        let src0: f64 = w[..4].iter().sum();
        let src1: f64 = w[4..].iter().sum();
        assert!((src0 - src1).abs() < 0.02, "{w:?}");
        let dst = |d: usize| -> f64 {
            pairs
                .iter()
                .zip(&w)
                .filter(|(p, _)| p.1 == d)
                .map(|(_, x)| x)
                .sum()
        };
        assert!((dst(0) - dst(2)).abs() < 0.02, "{w:?}");
        assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn triple_isolate_keeps_the_smaller_side_fair_when_both_cannot_be() {
        // The CAKE paper's isolation test: c1 uploads to s1, c2 to s2, s3 and s4. Sources and
        // destinations cannot both be fair; the two sources (the smaller side) are, and c2's
        // half is split evenly between its destinations.
        let w = triple_isolate_weights(&[(0, 0), (1, 1), (1, 2), (1, 3)]);
        assert!(close(w[0], 0.5), "{w:?}");
        assert!(w[1..].iter().all(|x| close(*x, 1.0 / 6.0)), "{w:?}");
        // Mirrored (one source to one destination, three sources to another): the two
        // destinations are the smaller side.
        let w = triple_isolate_weights(&[(0, 0), (1, 1), (2, 1), (3, 1)]);
        assert!(close(w[0], 0.5), "{w:?}");
        assert!(w[1..].iter().all(|x| close(*x, 1.0 / 6.0)), "{w:?}");
    }
}
