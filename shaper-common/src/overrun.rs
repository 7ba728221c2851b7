//! Departures beyond the rate: the trace of a stall.
//!
//! fq holds each packet until its `skb->tstamp` and releases every packet whose time has passed.
//! When the machine stops running the qdisc for a while (a guest its hypervisor does not run, a
//! CPU held by interrupts), everything scheduled for that while leaves at once on resume, into
//! the bottleneck behind, which drains it only at its margin over the rate. The egress program
//! cannot tell such a stall from an idle spell (neither stamps anything meanwhile); the dequeue
//! can. It meters what the device sends against the rate, as a token bucket [`burst_ns`] deep:
//! what leaves beyond it left ahead of the rate, and that much is owed to the calendar, whose
//! bookings then leave the bottleneck the time to drain it.
//!
//! Lateness alone is not charged. On a busy CPU fq's timer fires late all the time, and every
//! packet leaves a little after its departure time, yet the device sends at the rate: charging
//! those packets took wire time from the rate that nothing had used. A stall's clump is
//! charged exactly what it put on the wire beyond the rate and the burst, so departures can
//! never run ahead of the rate by more than the burst over any span of time (whatever the
//! control loop's levels and the calendar's slack), and a departure process at or below the
//! rate is never charged.
//!
//! Where the device stands behind the bottleneck (ingress, on an IFB: its packets crossed the
//! link already, and what it sends goes to the local stack or a faster LAN), nothing queues
//! behind it for a clump to fill. There a packet that leaves late leaves no earlier than its
//! departure time, which the calendar booked at the rate: the meter may stand back to that time
//! (`credit_floor`), and a stall's clump of packets that were due is not charged, as CAKE's
//! shaper sends its backlog on after a stall. Departures still never run ahead of the
//! departure times by more than the burst, so the long-run rate stays the rate.

/// What the dequeue observer reads, and where: the shaped device, and the offsets of the kernel
/// structures' members it needs, from the running kernel's BTF (they move between kernels and
/// builds). Interface indexes are per network namespace, so the device is its index and its
/// namespace's inode number. `ifindex` zero: nothing watched.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DequeueWatch {
    pub ifindex: u32,
    pub netns_inum: u32,
    /// `struct sk_buff`: `tstamp` (u64), `len` (u32), `dev` (pointer).
    pub skb_tstamp: u32,
    pub skb_len: u32,
    pub skb_dev: u32,
    /// `struct net_device`: `ifindex` (int), `nd_net` (a pointer to its `struct net`).
    pub dev_ifindex: u32,
    pub dev_net: u32,
    /// `struct net`: its namespace's inode number (`ns.inum`).
    pub net_inum: u32,
    /// 1 when the device stands behind the bottleneck (ingress): a packet's lateness is not
    /// charged (`credit_floor`), else 0.
    pub behind_bottleneck: u32,
}

/// The meter's depth in calendar bins: what the calendar itself lets leave ahead of the rate. It lends priority packets up to its span ahead of the bookings (the bulk repays
/// it later), lets a bin's bookings (a little over its width) leave together, and a packet of
/// a full bin leaves up to a bin after its time.
pub const BURST_BINS: u64 = crate::sizing::CALENDAR_MAX_SPAN_BINS as u64 + 2;

/// The meter's depth for calendar bins `bin_ns` wide.
pub const fn burst_ns(bin_ns: u64) -> u64 {
    BURST_BINS * bin_ns
}

/// The words of `SHAPER_DEPARTURES`, which the dequeue observer keeps.
pub mod departures {
    /// The departure meter (`meter`).
    pub const METER: u32 = 0;
    /// The link at the rate (`link_idle`).
    pub const LINK: u32 = 1;
    /// The slack's credit (`earned`, `calendar::slack_spent`).
    pub const SLACK_CREDIT: u32 = 2;
    pub const WORDS: u32 = 3;
}

/// The bins' slack (`calendar::capacity`) is spent from a credit of wire time the device did
/// not carry, which the dequeue observer earns (`link_idle`, `earned`) and the bookings that
/// take a bin past its width spend (`calendar::slack_spent`). The slack exists to catch up what
/// the link did not carry: the phases of flows their levels pace leave some bins short and
/// overfill others, and a scheduling delay idles the link. Granted whenever the meter had some
/// credit left (a level, read again at each booking), it carried a stream of sparse packets
/// lent on top of guarded bulk 6 % past the rate; spent from what the link idled, it can add no
/// more than that. This is the credit a data path without the observer starts with: the slack
/// unbounded, as nothing earns it.
pub const SLACK_CREDIT_UNLIMITED: u64 = 1 << 62;

/// The most the slack's credit holds: the meter's burst. What the link idled longer ago than
/// that is not caught up: a bottleneck behind would take it as a burst.
pub const fn slack_credit_cap(bin_ns: u64) -> u64 {
    burst_ns(bin_ns)
}

/// The link at the rate as the device's departures keep it busy: a departure of `tx_ns` at
/// `now_ns` starts when the link is free (`free_ns`), or now if it has been idle. Returns the
/// link's new free time and how long it sat idle before this departure: wire time the device
/// did not carry. (The meter cannot say this: it stands up to a burst behind now on purpose, and
/// the same lag would read as idle at every departure.)
pub const fn link_idle(free_ns: u64, now_ns: u64, tx_ns: u64) -> (u64, u64) {
    let start = if free_ns > now_ns { free_ns } else { now_ns };
    (start.saturating_add(tx_ns), now_ns.saturating_sub(free_ns))
}

/// What a departure that found the link idle for `idle_ns` adds to the slack's credit
/// `credit` (a signed count: racing bookings may spend a little more than there was), which
/// never grows past `cap_ns`.
pub const fn earned(credit: u64, idle_ns: u64, cap_ns: u64) -> u64 {
    let c = credit as i64;
    let room = if c >= cap_ns as i64 {
        0
    } else if c < 0 {
        cap_ns + c.unsigned_abs()
    } else {
        cap_ns - c as u64
    };
    if idle_ns < room { idle_ns } else { room }
}

/// Whether the bins take their slack: the credit (signed) is above zero.
pub const fn slack_left(credit: u64) -> bool {
    (credit as i64) > 0
}

/// Where a departing packet was due, as the meter goes by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// In front of the bottleneck: its departure time does not matter.
    InFront,
    /// Behind the bottleneck, at its departure time (CLOCK_MONOTONIC ns; zero when it has none:
    /// the data path passed it unshaped).
    Behind(u64),
}

/// The earliest the meter may stand when a packet `due` leaves at `now_ns`: a burst behind
/// now, so that an idle device earns no more credit; behind the bottleneck, the packet's
/// departure time when that is earlier and within `horizon_ns` of now (anything older is not a
/// departure time the calendar booked). A packet with none (passed unshaped) there takes its
/// wire time from wherever the meter stands, up to the horizon back: it neither ends a stall's
/// credit for the booked packets after it nor is charged for it.
pub const fn credit_floor(now_ns: u64, burst_ns: u64, due: Due, horizon_ns: u64) -> u64 {
    let floor = now_ns.saturating_sub(burst_ns);
    let oldest = now_ns.saturating_sub(horizon_ns);
    match due {
        Due::InFront => floor,
        Due::Behind(0) => oldest,
        Due::Behind(at) if at < floor && at >= oldest => at,
        Due::Behind(_) => floor,
    }
}

/// One departure through the meter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metered {
    /// The meter's new value: the time (CLOCK_MONOTONIC ns) at which what the device sent would
    /// have finished leaving at the rate, less what was charged.
    pub meter_ns: u64,
    /// Wire time (ns) that left ahead of the rate and is owed to the calendar.
    pub charge_ns: u64,
}

/// A packet of wire time `tx_ns` leaving at `now_ns` through a meter at `meter_ns`, which
/// never stands behind `floor_ns` (`credit_floor`). The packet takes its wire time from it;
/// whatever then stands ahead of `now` (up to the packet's own wire time: the rest was charged
/// to earlier packets) left ahead of the rate and is charged, and taken off the meter, since
/// the calendar's bookings repay it.
pub const fn meter(meter_ns: u64, now_ns: u64, tx_ns: u64, floor_ns: u64) -> Metered {
    let start = if meter_ns > floor_ns {
        meter_ns
    } else {
        floor_ns
    };
    let end = start.saturating_add(tx_ns);
    let ahead = end.saturating_sub(now_ns);
    let charge_ns = if ahead < tx_ns { ahead } else { tx_ns };
    Metered {
        meter_ns: end - charge_ns,
        charge_ns,
    }
}

const _: () = assert!(core::mem::size_of::<DequeueWatch>() == 36);

// SAFETY: plain `#[repr(C)]` integers with no implicit padding (asserted above).
#[cfg(feature = "user")]
unsafe impl aya::Pod for DequeueWatch {}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const TX: u64 = 120_000;

    const HORIZON: u64 = 2_000 * MS;

    /// The floor of a device in front of the bottleneck: no departure time to go by.
    fn in_front(now: u64, burst: u64) -> u64 {
        credit_floor(now, burst, Due::InFront, HORIZON)
    }

    /// Packets due at `dues` all leaving at `at` through a fresh meter behind the bottleneck;
    /// the total charge.
    fn clump_behind(dues: impl IntoIterator<Item = u64>, at: u64, burst: u64) -> u64 {
        let (mut m, mut total) = (0, 0);
        for due in dues {
            let s = meter(
                m,
                at,
                TX,
                credit_floor(at, burst, Due::Behind(due), HORIZON),
            );
            m = s.meter_ns;
            total += s.charge_ns;
        }
        total
    }

    /// The next of a fixed xorshift sequence.
    fn next_random(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    /// Runs departures at the given times through a fresh meter; the total charge.
    fn charged(times: impl IntoIterator<Item = u64>, burst: u64) -> u64 {
        let mut m = 0;
        let mut total = 0;
        for now in times {
            let step = meter(m, now, TX, in_front(now, burst));
            m = step.meter_ns;
            total += step.charge_ns;
        }
        total
    }

    #[test]
    fn the_link_counts_each_idle_spell_once() {
        let start = 10_000 * MS;
        // Back to back at the rate: never idle.
        let mut free = 0;
        let mut idle = 0;
        for i in 0..100 {
            let (f, d) = link_idle(free, start + i * TX, TX);
            if i > 0 {
                idle += d;
            }
            free = f;
        }
        assert_eq!(idle, 0);
        // A gap of 5 ms after them: counted once, whatever follows at the rate.
        let resume = free + 5 * MS;
        let (f, d) = link_idle(free, resume, TX);
        assert_eq!(d, 5 * MS);
        let (_, d) = link_idle(f, resume + TX, TX);
        assert_eq!(d, 0);
        // A clump ahead of the rate earns nothing and leaves the link busy past now.
        let (f, d) = link_idle(start, start - MS, TX);
        assert_eq!((f, d), (start + TX, 0));
    }

    #[test]
    fn the_credit_is_earned_up_to_its_cap_and_spent_below_zero() {
        let cap = slack_credit_cap(MS);
        assert_eq!(earned(0, MS, cap), MS);
        assert_eq!(earned(cap - 10, MS, cap), 10);
        assert_eq!(earned(cap, MS, cap), 0);
        assert_eq!(earned(SLACK_CREDIT_UNLIMITED, MS, cap), 0);
        // Overspent by racing bookings: the idle time refills it from below zero.
        assert_eq!(earned((-5i64) as u64, MS, cap), MS);
        assert!(slack_left(1) && slack_left(SLACK_CREDIT_UNLIMITED));
        assert!(!slack_left(0) && !slack_left((-5i64) as u64));
    }

    #[test]
    fn departures_at_the_rate_are_never_charged_however_late_they_are() {
        let start = 10_000 * MS;
        // Every packet leaves exactly one wire time after the one before.
        assert_eq!(charged((0..10_000).map(|i| start + i * TX), 2 * MS), 0);
        // Below the rate, with gaps.
        assert_eq!(
            charged((0..10_000).map(|i| start + i * 3 * TX / 2), 2 * MS),
            0
        );
    }

    #[test]
    fn a_clump_is_charged_what_it_put_on_the_wire_beyond_the_burst() {
        let start = 10_000 * MS;
        let burst = 2 * MS;
        // 300 ms of wire time released at one instant after a stall.
        let n = 300 * MS / TX;
        let total = charged(core::iter::repeat_n(start, n as usize), burst);
        assert_eq!(total, n * TX - burst);
    }

    #[test]
    fn after_a_charged_clump_departures_at_the_rate_are_not_charged_again() {
        let start = 10_000 * MS;
        let burst = 2 * MS;
        let clump = 100;
        let mut m = 0;
        let mut charge = 0;
        for _ in 0..clump {
            let s = meter(m, start, TX, in_front(start, burst));
            m = s.meter_ns;
            charge += s.charge_ns;
        }
        assert_eq!(charge, clump * TX - burst);
        // The calendar's debt then holds the device for what was charged: the next packets
        // leave at the rate from the end of the burst on.
        let mut after = 0;
        for i in 0..1_000 {
            let now = start + burst + i * TX;
            let s = meter(m, now, TX, in_front(now, burst));
            m = s.meter_ns;
            after += s.charge_ns;
        }
        assert_eq!(after, 0);
    }

    #[test]
    fn departures_never_run_ahead_of_the_rate_by_more_than_the_burst() {
        // Over any run of departures, what left minus what was charged fits in the time
        // elapsed at the rate, plus the burst.
        let burst = 2 * MS;
        let mut m = 0;
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut now = 10_000 * MS;
        let (first, mut sent, mut charged) = (now, 0, 0);
        for _ in 0..100_000 {
            let seed = next_random(&mut seed);
            // Gaps from nothing (a clump) to three wire times.
            now += seed % (3 * TX);
            let s = meter(m, now, TX, in_front(now, burst));
            m = s.meter_ns;
            sent += TX;
            charged += s.charge_ns;
            assert!(sent - charged <= now - first + burst + TX);
        }
    }

    #[test]
    fn an_idle_device_earns_no_more_than_the_burst() {
        let burst = 2 * MS;
        // Idle for a second, then a clump of 50 wire times.
        let m = meter(0, 10_000 * MS, TX, in_front(10_000 * MS, burst)).meter_ns;
        let later = 10_001 * MS;
        let mut state = m;
        let mut charge = 0;
        for _ in 0..50 {
            let s = meter(state, later, TX, in_front(later, burst));
            state = s.meter_ns;
            charge += s.charge_ns;
        }
        assert_eq!(charge, 50 * TX - burst);
    }

    #[test]
    fn behind_the_bottleneck_a_stalls_clump_of_packets_that_were_due_is_not_charged() {
        let start = 10_000 * MS;
        let burst = 2 * MS;
        // Booked at the rate from `start`; a 300 ms stall; all of them leave at its end.
        let n = 300 * MS / TX;
        let resumed = start + n * TX;
        let behind = clump_behind((0..n).map(|i| start + i * TX), resumed, burst);
        let in_front_of_it = charged(core::iter::repeat_n(resumed, n as usize), burst);
        assert_eq!(behind, 0);
        assert_eq!(in_front_of_it, n * TX - burst);
    }

    #[test]
    fn behind_the_bottleneck_departures_never_run_ahead_of_their_departure_times() {
        // Packets booked at the rate leave late by anything from nothing to 400 ms (stalls),
        // in order; some leave early, up to a wire time (a bin's bookings together). What left
        // minus what was charged fits in the time from the first departure time at the rate,
        // plus the burst.
        let burst = 2 * MS;
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let first = 10_000 * MS;
        let (mut m, mut sent, mut charged, mut now) = (0, 0, 0, first);
        for i in 0..100_000u64 {
            let seed = next_random(&mut seed);
            let due = first + i * TX;
            let late = match seed % 100 {
                0 => seed % (400 * MS),
                _ => 0,
            };
            now = now.max((due + late).saturating_sub(seed % TX));
            let s = meter(
                m,
                now,
                TX,
                credit_floor(now, burst, Due::Behind(due), HORIZON),
            );
            m = s.meter_ns;
            sent += TX;
            charged += s.charge_ns;
            assert!(sent - charged <= now - first + burst + TX, "packet {i}");
        }
    }

    #[test]
    fn a_departure_time_beyond_the_horizon_or_ahead_gives_no_more_than_the_burst() {
        let now = 10_000 * MS;
        let burst = 2 * MS;
        let floor = |due| credit_floor(now, burst, due, HORIZON);
        assert_eq!(floor(Due::InFront), now - burst);
        assert_eq!(floor(Due::Behind(now - HORIZON - 1)), now - burst);
        assert_eq!(floor(Due::Behind(now - HORIZON)), now - HORIZON);
        assert_eq!(
            floor(Due::Behind(now - MS)),
            now - burst,
            "a burst's credit"
        );
        assert_eq!(floor(Due::Behind(now + MS)), now - burst, "early");
    }

    #[test]
    fn behind_the_bottleneck_an_unshaped_packet_in_a_stalls_clump_ends_no_credit() {
        let start = 10_000 * MS;
        let burst = 2 * MS;
        let n = 300 * MS / TX;
        let resumed = start + (n + 1) * TX;
        let dues = (0..n).map(|i| if i == n / 2 { 0 } else { start + i * TX });
        assert_eq!(clump_behind(dues, resumed, burst), 0);
    }
}
