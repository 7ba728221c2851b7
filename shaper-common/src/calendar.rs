//! The calendar's arithmetic: its bins' words, their capacity and what a packet takes from one
//! (the ring itself, its compare-and-swap and its debts are the data path's `calendar`;
//! docs/design.md, Fairness, "The calendar, not a guard clock").
//!
//! A bin is one u64: the high 24 bits tag the lap of the ring it belongs to (a stale lap reads
//! as empty), the low 40 bits the wire time taken (ns).

use crate::branchless;

pub const USED_BITS: u32 = 40;
pub const USED_MASK: u64 = (1 << USED_BITS) - 1;
pub const LAP_MASK: u64 = (1 << 24) - 1;
/// Slack of a bin over its width, as a shift: 1/16 (6.25 %).
pub const SLACK_SHIFT: u32 = 4;

/// The lap of the bin at absolute index `index` in a ring of `bins`.
#[inline(always)]
pub const fn lap(index: u64, bins: u64) -> u64 {
    (index / bins) & LAP_MASK
}

/// A bin's word for `used` ns of wire time in lap `lap`.
#[inline(always)]
pub const fn word(lap: u64, used: u64) -> u64 {
    (lap << USED_BITS) | used
}

/// How much of the bin starting at `bin_start` is used at `now`: what its word `current` holds
/// in lap `lap`, and at least the time already passed (no burst credit from an idle start of
/// the current bin).
#[inline(always)]
pub const fn used(current: u64, lap: u64, bin_start: u64, now: u64) -> u64 {
    let booked = if current >> USED_BITS == lap {
        current & USED_MASK
    } else {
        0
    };
    let elapsed = now.saturating_sub(bin_start);
    if elapsed > booked { elapsed } else { booked }
}

/// What a packet with `remaining` ns to book takes from a bin holding `used` of `room`: none
/// when it is full.
#[inline(always)]
pub const fn take(used: u64, room: u64, remaining: u64) -> Option<u64> {
    if used >= room {
        return None;
    }
    Some(if room - used >= remaining {
        remaining
    } else {
        room - used
    })
}

/// A bin's capacity: a little more than its width, for the phases of flows their levels pace
/// (levels that add up to the rate fill the bins only on average; without slack every bin a
/// flow's phase overfills pushes packets while those it underfills go to waste). None
/// (`no_slack` 1) for a sparse packet the calendar no longer lends to (nothing paces those, and
/// a load of nothing else would fill every bin to the slack, over the rate), and while the
/// slack's credit is spent (`overrun::slack_left`): the slack catches up only what the link did
/// not carry.
#[inline(always)]
pub fn capacity(bin_ns: u64, no_slack: u64) -> u64 {
    bin_ns + (bin_ns >> SLACK_SHIFT) - (bin_ns >> SLACK_SHIFT) * no_slack
}

/// 1 when the calendar lends to a priority packet: always to a prioritised tin's (its tin's
/// bandwidth threshold bounds what it borrows), to a sparse one while what it already lent
/// (`lent`) is below `lend_limit`.
#[inline(always)]
pub fn lends(priority: bool, tin_first: bool, lent: u64, lend_limit: u64) -> u64 {
    priority as u64 & (tin_first as u64 | branchless::below(lent, lend_limit))
}

/// What a debt word holds: a signed count, since racing repayments may take a little more than
/// there was, which reads as none.
#[inline(always)]
pub const fn owed(word: u64) -> u64 {
    let d = word as i64;
    (d & !(d >> 63)) as u64
}

/// What a packet repays of `owed`: up to its own wire time `tx_ns`, and only if it `repays`.
#[inline(always)]
pub fn repayment(owed: u64, tx_ns: u64, repays: bool) -> u64 {
    branchless::min(owed, tx_ns) * repays as u64
}

/// What a booking of `take` in a bin holding `used` takes past the bin's width `bin_ns`: the
/// slack it spends (`overrun::SLACK_CREDIT_UNLIMITED` says from what).
#[inline(always)]
pub fn slack_spent(used: u64, take: u64, bin_ns: u64) -> u64 {
    (used + take).saturating_sub(branchless::max(used, bin_ns))
}

/// What a packet taking `take` from the bin after its span, which held `used`, puts past that
/// bin's `capacity`: owed, for the bins after it.
#[inline(always)]
pub fn beyond_capacity(used: u64, take: u64, capacity: u64) -> u64 {
    (used + take).saturating_sub(branchless::max(used, capacity))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BIN: u64 = 1_000_000;

    #[test]
    fn a_bin_of_another_lap_reads_empty_and_time_passed_is_used() {
        let w = word(3, 400_000);
        assert_eq!(used(w, 3, 10 * BIN, 10 * BIN), 400_000);
        assert_eq!(used(w, 4, 10 * BIN, 10 * BIN), 0);
        // Half the bin passed: half is used, whatever was booked below that.
        assert_eq!(used(w, 3, 10 * BIN, 10 * BIN + BIN / 2), BIN / 2);
        assert_eq!(used(w, 4, 10 * BIN, 10 * BIN + BIN / 2), BIN / 2);
        // A bin ahead has nothing passed.
        assert_eq!(used(0, 0, 11 * BIN, 10 * BIN), 0);
    }

    #[test]
    fn laps_wrap_in_their_24_bits() {
        assert_eq!(lap(5, 64), 0);
        assert_eq!(lap(64, 64), 1);
        assert_eq!(lap((LAP_MASK + 1) * 64, 64), 0);
        assert_eq!(word(LAP_MASK, USED_MASK) >> USED_BITS, LAP_MASK);
    }

    #[test]
    fn a_packet_takes_what_is_left_up_to_what_it_needs() {
        assert_eq!(take(BIN, BIN, 10), None);
        assert_eq!(take(BIN + 1, BIN, 10), None);
        assert_eq!(take(BIN - 4, BIN, 10), Some(4));
        assert_eq!(take(0, BIN, 10), Some(10));
    }

    #[test]
    fn the_slack_is_for_paced_traffic_only() {
        assert_eq!(capacity(BIN, 0), BIN + BIN / 16);
        assert_eq!(capacity(BIN, 1), BIN);
    }

    #[test]
    fn the_calendar_lends_to_sparse_packets_up_to_its_limit_and_always_to_a_tin() {
        assert_eq!(lends(false, true, 0, 10), 0);
        assert_eq!(lends(true, false, 9, 10), 1);
        assert_eq!(lends(true, false, 10, 10), 0);
        assert_eq!(lends(true, true, 100, 10), 1);
    }

    #[test]
    fn a_debt_overdrawn_by_racing_repayments_reads_as_none() {
        assert_eq!(owed(5), 5);
        assert_eq!(owed((-3i64) as u64), 0);
        assert_eq!(repayment(5, 3, true), 3);
        assert_eq!(repayment(5, 30, true), 5);
        assert_eq!(repayment(5, 30, false), 0);
    }

    #[test]
    fn a_booking_spends_what_it_takes_past_the_width() {
        assert_eq!(slack_spent(0, BIN / 2, BIN), 0);
        assert_eq!(slack_spent(BIN - 10, 30, BIN), 20);
        assert_eq!(slack_spent(BIN + 5, 30, BIN), 30);
    }

    #[test]
    fn only_what_goes_past_the_capacity_is_owed() {
        assert_eq!(beyond_capacity(100, 50, 200), 0);
        assert_eq!(beyond_capacity(180, 50, 200), 30);
        // Already over: all it takes is owed.
        assert_eq!(beyond_capacity(250, 50, 200), 50);
    }
}
