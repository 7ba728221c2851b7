//! Packets that leave later than their departure time: the trace of a stall.
//!
//! fq holds each packet until its `skb->tstamp` and releases every packet whose time has passed.
//! When the machine stops running the qdisc for a while (a guest its hypervisor does not run, a
//! CPU held by interrupts), everything scheduled for that while leaves at once on resume, into
//! the bottleneck behind, which drains it only at its margin over the rate. The egress program
//! cannot tell such a stall from an idle spell (neither stamps anything meanwhile); the dequeue
//! can: a stall's packets leave late. What leaves late beyond the calendar's own burst is
//! charged to the calendar as owed, and the bookings after it repay it, so the bottleneck gets
//! the time to drain the clump.

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
}

/// How late, in calendar bins, a packet may leave before it counts as part of a clump: the
/// calendar itself lets a bin's bookings (a little over its width) leave together, and a
/// packet of a full bin leaves up to a bin after its time behind the others.
pub const LATE_BINS: u64 = 2;

/// Lateness beyond which a departure time cannot have come from this clock (a receive
/// timestamp of another clock, a stale value): such a packet is not charged.
pub const MAX_LATENESS_NS: u64 = 60_000_000_000;

/// What a packet of wire time `tx_ns`, stamped to leave at `tstamp_ns` and dequeued at `now_ns`,
/// owes the calendar (whose bins are `bin_ns` wide): all of its wire time when it left more
/// than [`LATE_BINS`] bins late, else nothing. Unstamped packets (zero) and departures not yet
/// due (a qdisc that ignores them) owe nothing.
pub const fn late_charge(now_ns: u64, tstamp_ns: u64, tx_ns: u64, bin_ns: u64) -> u64 {
    if tstamp_ns == 0 || bin_ns == 0 || now_ns <= tstamp_ns {
        return 0;
    }
    let late = now_ns - tstamp_ns;
    if late > LATE_BINS * bin_ns && late < MAX_LATENESS_NS {
        tx_ns
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn only_a_packet_later_than_the_calendars_own_burst_is_charged() {
        let now = 10_000 * MS;
        let bin = MS;
        assert_eq!(late_charge(now, now - 5 * MS, 120_000, bin), 120_000);
        // Within two bins: the calendar's own burst.
        assert_eq!(late_charge(now, now - 2 * MS, 120_000, bin), 0);
        assert_eq!(late_charge(now, now - MS / 2, 120_000, bin), 0);
        // Wider bins (a slow link) tolerate more.
        assert_eq!(late_charge(now, now - 5 * MS, 120_000, 3 * MS), 0);
        assert_eq!(late_charge(now, now - 7 * MS, 120_000, 3 * MS), 120_000);
    }

    #[test]
    fn unstamped_early_and_foreign_timestamps_owe_nothing() {
        let now = 10_000 * MS;
        assert_eq!(late_charge(now, 0, 120_000, MS), 0);
        assert_eq!(late_charge(now, now + 5 * MS, 120_000, MS), 0);
        assert_eq!(late_charge(now, now, 120_000, MS), 0);
        assert_eq!(late_charge(100_000 * MS, 1, 120_000, MS), 0);
        // No calendar, nothing to charge.
        assert_eq!(late_charge(now, now - 5 * MS, 120_000, 0), 0);
    }
}
