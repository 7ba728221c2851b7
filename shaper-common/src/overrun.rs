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

/// Whether the device's departures have room left in the meter's burst (`burst_ns`, for bins
/// `bin_ns` wide): the meter at `meter_ns` stands less than the burst less a bin ahead of `now`.
/// The calendar's bins take their slack only then. The slack catches up wire time the link did
/// not carry, and lets departures run ahead of the rate within the burst; once they are within
/// a bin of its end, what the slack would carry more is what is lent on top of full bins (a
/// flood of sparse packets), and the repayments of what the meter charged would only refill
/// the slack instead of pushing the bookings after them. A meter that never moved (no observer
/// attached) reads as room.
pub const fn within_burst(meter_ns: u64, now_ns: u64, bin_ns: u64, burst_ns: u64) -> bool {
    meter_ns.saturating_add(bin_ns) < now_ns.saturating_add(burst_ns)
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
    fn the_slack_stops_a_bin_before_the_meter_would_charge() {
        let bin = MS;
        let burst = burst_ns(bin);
        let now = 10_000 * MS;
        assert!(within_burst(0, now, bin, burst), "a meter that never moved");
        assert!(
            within_burst(now - burst, now, bin, burst),
            "the whole burst of credit"
        );
        assert!(
            within_burst(now + bin, now, bin, burst),
            "a bin's swing about now"
        );
        assert!(within_burst(now + burst - bin - 1, now, bin, burst));
        assert!(!within_burst(now + burst - bin, now, bin, burst));
        assert!(!within_burst(u64::MAX, now, bin, burst));
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
