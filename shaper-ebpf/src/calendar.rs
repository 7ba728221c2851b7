//! The global guard: a calendar of wire time that keeps the aggregate at the configured rate
//! without making anyone wait behind a flow paced into the future.
//!
//! Time is cut into bins of `calendar_bin_ns`; each bin can carry `calendar_bin_ns` of wire
//! time at the configured rate, less what has already passed. A packet that wants to leave at
//! `want` takes wire time from the bin holding `want` and, if that is full, from the following
//! ones, up to a few bins (the span); past them, the next bin takes it whatever it holds. In its
//! own bin it leaves at `want`; pushed into a later bin, it leaves after what that bin already
//! carries. So the aggregate never exceeds the rate by more than one bin's worth, and only when
//! the levels are overbooked. A single "next free" clock would instead make a
//! sparse flow wait behind a bulk flow's packets scheduled 5 ms ahead; a usage counter would
//! make it wait for their total.
//!
//! Each bin is one u64 updated by compare-and-swap: the high 24 bits tag the lap of the ring
//! the bin belongs to (a stale lap reads as empty), the low 40 bits the wire time taken (ns).
//!
//! Priority packets leave at once and borrow their wire time from bins ahead; what finds no room
//! within the bins a packet may span is the calendar's *debt*, a word after the ring (one for
//! sparse packets, one for prioritised tins); what other packets put past what the bin after
//! their span can hold is owed in another.
//! Packets that book behind others repay it: each books, besides its own wire time, up to as
//! much again of the debt, wherever its flow books, so the debt is repaid however far ahead
//! the bulk flows book. docs/design.md (Fairness: "The calendar, not a guard clock" and the
//! bullets after it) has the measurements behind each of these choices.

use core::intrinsics::{AtomicOrdering::Relaxed, atomic_cxchg, atomic_xadd};

use aya_ebpf::{macros::map, maps::Array};
use shaper_common::{
    abi::LENT,
    branchless, calendar as bins,
    overrun::{self, departures},
    sizing::{CALENDAR_BINS, CALENDAR_MAX_SPAN_BINS},
};

/// The ring's bins, then the debts (wire time, ns, as signed counts: racing repayments may
/// take a little more than there was, which reads as none) and the frontier.
#[map(name = "SHAPER_CALENDAR")]
static CALENDAR: Array<u64> = Array::with_max_entries(CALENDAR_BINS + 4, 0);

/// What the calendar lent sparse packets beyond their span: its size decides whether they are
/// lent to.
const DEBT_SLOT: u32 = CALENDAR_BINS;
/// What packets queued behind the bin after their span put over its capacity. Kept apart from
/// the sparse packets' debt, whose size decides whether they are lent to: it is bulk traffic's
/// own, which bulk traffic repays, and bulk bursts must not stop the lending.
const OVERFLOW_SLOT: u32 = CALENDAR_BINS + 1;
/// The frontier: the first bin the packets that book behind others have not filled (the
/// time it starts, in ns: bins of another width, at a new rate, read it where it was; one in
/// the past reads as the current bin). Such a packet wanting an
/// earlier bin starts its scan there: the bins before it are full. The bin after a packet's
/// span is relative to the packet; without the frontier, under a load the span cannot hold,
/// each bin's width would bring a new, empty bin after the span, and the aggregate would run
/// at all it is offered.
const FRONTIER_SLOT: u32 = CALENDAR_BINS + 2;
/// What the calendar lent a prioritised tin's packets (`TIN_FIRST`) beyond their span. Kept
/// apart from the sparse packets' debt, as that one is kept apart from the bulk's overflow: a
/// burst of a prioritised tin must not stop the lending to sparse flows. The tin's bandwidth
/// threshold bounds this debt; nothing needs its size.
const TIN_DEBT_SLOT: u32 = CALENDAR_BINS + 3;

/// What the dequeue observer keeps of the device's departures, shared by every CPU that
/// dequeues it: the departure meter (`overrun::meter`), the link at the rate
/// (`overrun::link_idle`) and the slack's credit (`overrun::earned`), which the bookings that
/// take a bin past its width spend (`bins::slack_spent`).
#[map(name = "SHAPER_DEPARTURES")]
pub static DEPARTURES: Array<u64> = Array::with_max_entries(departures::WORDS, 0);

/// `book`'s flags.
pub const PRIORITY: u64 = 1;
pub const TIN_FIRST: u64 = 2;

/// Books `tx_ns` of wire time at or after `want_ns` (≥ `now_ns`). Packets wanted beyond the
/// ring's span are not booked: the flow clocks that put them there already pace them.
///
/// A `PRIORITY` packet (a sparse flow's, a prioritised tin's) leaves at `want` whatever the
/// bins hold, but its wire time is taken like any other: from the first bin with room. Bulk
/// flows book bins ahead of now; charging a sparse packet only to the current, already booked
/// bin would let the aggregate run over the rate by all the sparse traffic. Borrowed
/// from the future, the time pushes the next bulk packets instead; what the bins it may span
/// cannot hold becomes the calendar's debt, which the next packets that book behind others
/// repay.
///
/// The calendar lends no more than those bins hold: while the debt stands at that, a priority
/// packet books like any other: traffic that is nearly all priority has nobody to repay it. A
/// prioritised tin's packet (`TIN_FIRST`) is always lent to: its tin's bandwidth threshold
/// bounds it, and an EF flow must not wait behind bulk bookings because sparse packets ran
/// the debt up.
///
/// Returns the departure, or for a packet it lent to [`LENT`] and when the link carries it;
/// its counters go to the stats directly. It is a global function,
/// which the verifier checks once on its own: its callers see only the value it returns, so
/// the outcomes of the bins' scan are not each a path through the rest of the scheduler
/// (docs/design.md, "The calendar is a function of its own").
#[unsafe(export_name = "shaper_calendar_book")]
#[inline(never)]
pub extern "C" fn book(want_ns: u64, now_ns: u64, tx_ns: u64, bin_ns: u64, flags: u64) -> u64 {
    let booked = scan(
        want_ns,
        now_ns,
        tx_ns,
        bin_ns,
        flags & PRIORITY != 0,
        flags & TIN_FIRST != 0,
    );
    if let Some(stats) = crate::STATS.get_ptr_mut(0) {
        // SAFETY: per-CPU map value, valid for this run and not shared with other CPUs.
        let stats = unsafe { &mut *stats };
        stats.clock_contended += booked.contended as u64;
        stats.calendar_delayed += booked.delayed as u64;
        stats.calendar_unplaced_ns += booked.unplaced_ns;
        stats.calendar_refused += booked.refused as u64;
    }
    branchless::select(
        booked.lent as u64,
        LENT | booked.on_wire_ns,
        booked.depart_ns,
    )
}

struct Booked {
    /// Earliest departure the calendar allows.
    depart_ns: u64,
    /// Whether the packet had to move past its wanted time (the aggregate was overbooked).
    delayed: bool,
    /// Wire time that found no room (a priority packet's beyond what the calendar lends, or
    /// a packet's when the bins changed under it); counted.
    unplaced_ns: u64,
    contended: bool,
    /// A priority packet the calendar did not lend to.
    refused: bool,
    /// A priority packet it lent to, and where its wire time was booked: the link carries what
    /// was booked before it first.
    lent: bool,
    on_wire_ns: u64,
}

#[inline(always)]
fn scan(
    want_ns: u64,
    now_ns: u64,
    tx_ns: u64,
    bin_ns: u64,
    priority: bool,
    tin_first: bool,
) -> Booked {
    let mut out = Booked {
        depart_ns: want_ns,
        delayed: false,
        unplaced_ns: 0,
        contended: false,
        refused: false,
        lent: false,
        on_wire_ns: want_ns,
    };
    if bin_ns == 0 || want_ns - now_ns >= bin_ns * (CALENDAR_BINS as u64 - 1) {
        return out;
    }
    let terms = terms(tx_ns, bin_ns, priority, tin_first);
    out.refused = priority && terms.lent_to == 0;
    let priority = terms.lent_to != 0;
    let frontier = CALENDAR.get_ptr_mut(FRONTIER_SLOT);
    let now_bin = now_ns / bin_ns;
    // SAFETY: map value, valid for the run; a stale read starts a scan a bin early or late.
    let front = match frontier {
        Some(f) => branchless::max(unsafe { core::ptr::read_volatile(f) } / bin_ns, now_bin),
        None => now_bin,
    };
    let mut walk = Walk {
        index: want_ns / bin_ns,
        remaining: terms.books_ns,
        placed: false,
        placed_at: 0,
        last_bin: core::ptr::null_mut(),
    };
    // Only a packet that scans from the frontier learns where it now is.
    let from_front = !priority && walk.index <= front;
    if from_front {
        walk.index = front;
        if (front * bin_ns).saturating_sub(now_ns) >= bin_ns * (CALENDAR_BINS as u64 - 1) {
            // A ring ahead: it leaves there unbooked (beyond the horizon, which drops it).
            out.depart_ns = front * bin_ns;
            out.delayed = true;
            return out;
        }
    }
    for i in 0..=CALENDAR_MAX_SPAN_BINS {
        // The bin after the span takes whatever a packet that may not borrow still carries
        // (see `step`).
        let beyond = i == CALENDAR_MAX_SPAN_BINS;
        if walk.remaining == 0 || (beyond && priority) {
            break;
        }
        if !step(
            &mut walk,
            &mut out,
            want_ns,
            now_ns,
            bin_ns,
            terms.capacity,
            priority,
            beyond,
        ) {
            break;
        }
    }
    if from_front
        && walk.placed_at > front
        && let Some(f) = frontier
    {
        // Racing CPUs may move it back a bin, which the next packet that scans it fills.
        unsafe { core::ptr::write_volatile(f, walk.placed_at * bin_ns) };
    }
    settle(&walk, &mut out, bin_ns, priority, tin_first);
    out
}

/// The terms a packet books on: the bins' capacity for it, whether the calendar lends to it,
/// and the wire time it books: its own and what it repays of the debts.
struct Terms {
    capacity: u64,
    lent_to: u64,
    books_ns: u64,
}

/// A packet's terms (see `Terms`). A packet that books behind others repays up to its own wire
/// time of each debt, booked with it where it books, which pushes the packets after it. A
/// priority packet repays nothing (it would only push itself), nor does one the calendar would
/// not lend to (it would push nobody when it cannot be placed either, and the debt would only
/// move over the last bin's capacity).
#[inline(always)]
fn terms(tx_ns: u64, bin_ns: u64, priority: bool, tin_first: bool) -> Terms {
    let lend_limit = CALENDAR_MAX_SPAN_BINS as u64 * bin_ns;
    // The two lent debts share one packet's worth of repayment, the sparse packets' first (it
    // decides the lending).
    let (lent, repay_lent) = repay(DEBT_SLOT, tx_ns, !priority);
    let (_, repay_tin) = repay(TIN_DEBT_SLOT, tx_ns - repay_lent, !priority);
    let (_, repay_overflow) = repay(OVERFLOW_SLOT, tx_ns, !priority);
    let lent_to = bins::lends(priority, tin_first, lent, lend_limit);
    // SAFETY: map value, valid for the run; a stale read moves the slack by one packet.
    let credit = DEPARTURES
        .get_ptr(departures::SLACK_CREDIT)
        .map_or(0, |c| unsafe { core::ptr::read_volatile(c) });
    let room = overrun::slack_left(credit) as u64;
    Terms {
        capacity: bins::capacity(bin_ns, (priority as u64 & (lent_to ^ 1)) | (room ^ 1)),
        lent_to,
        books_ns: tx_ns + repay_lent + repay_tin + repay_overflow,
    }
}

/// Where a packet's scan of the bins stands.
struct Walk {
    /// The absolute index of the next bin.
    index: u64,
    /// Wire time still to book.
    remaining: u64,
    /// Whether its first share is booked, and the bin it then takes as the frontier.
    placed: bool,
    placed_at: u64,
    /// The last bin it scanned.
    last_bin: *mut u64,
}

/// Takes what the packet can from the walk's next bin; false when there is no bin to read.
///
/// In the bin it wanted, a packet leaves when its flow said: the bin's capacity bounds the
/// aggregate without ordering flows inside it. A packet pushed into a later bin queues behind
/// what that bin already carries. The bin after the span (`beyond`) takes whatever a packet
/// that may not borrow still carries, behind what it holds; what goes over its capacity leaves
/// in the following bins' time and is owed (`OVERFLOW_SLOT`).
#[inline(always)]
fn step(
    walk: &mut Walk,
    out: &mut Booked,
    want_ns: u64,
    now_ns: u64,
    bin_ns: u64,
    capacity: u64,
    priority: bool,
    beyond: bool,
) -> bool {
    let index = walk.index;
    let Some(bin) = CALENDAR.get_ptr_mut((index % CALENDAR_BINS as u64) as u32) else {
        return false;
    };
    walk.last_bin = bin;
    walk.index += 1;
    let lap = bins::lap(index, CALENDAR_BINS as u64);
    let current = unsafe { core::ptr::read_volatile(bin) };
    let bin_start = index * bin_ns;
    let used = bins::used(current, lap, bin_start, now_ns);
    let room = if beyond { bins::USED_MASK } else { capacity };
    let Some(take) = bins::take(used, room, walk.remaining) else {
        return true;
    };
    // One attempt per bin: a lost race moves on to the next bin (counted) rather than
    // looping, which keeps the program within what the verifier explores.
    let (_, swapped) = unsafe {
        atomic_cxchg::<u64, { Relaxed }, { Relaxed }>(bin, current, bins::word(lap, used + take))
    };
    if !swapped {
        out.contended = true;
        return true;
    }
    if !walk.placed {
        walk.placed = true;
        walk.placed_at = index + (used + take >= capacity) as u64;
        // Behind what the bins up to its own already carry: where a FIFO at the rate would
        // send it. It overtakes them on the wire, so this is no promise that its recipient
        // has not had it already: the ACK filter counts it only where a late estimate costs
        // the sender nothing but time (see `ackfilter::Ahead`).
        out.on_wire_ns = branchless::max(want_ns, bin_start + used);
        if bin_start > want_ns && !priority {
            out.depart_ns = bin_start + used;
            out.delayed = true;
        }
    }
    if beyond && used + take > capacity {
        owe(OVERFLOW_SLOT, bins::beyond_capacity(used, take, capacity));
    } else {
        spend_slack(bins::slack_spent(used, take, bin_ns));
    }
    walk.remaining -= take;
    true
}

/// The end of a packet's scan: where one never placed leaves, and where the wire time that
/// found no room goes. A priority packet's becomes debt; any other packet's (a race lost on the
/// bin after the span) is charged to the last bin scanned, over its capacity, so that the
/// packets after it see that bin full instead of the aggregate silently running over the rate.
#[inline(always)]
fn settle(walk: &Walk, out: &mut Booked, bin_ns: u64, priority: bool, tin_first: bool) {
    out.lent = priority;
    if !walk.placed && priority {
        // All of it owed: behind every bin it scanned.
        out.on_wire_ns = walk.index * bin_ns;
    }
    if !walk.placed && !priority {
        // Even the bin after the span changed under us (a lost race): leave after it.
        out.depart_ns = walk.index * bin_ns;
        out.delayed = true;
    }
    let remaining = walk.remaining;
    if remaining > 0 {
        if priority {
            // `tin_first` packets are always lent to; a sparse one only while it may be.
            let slot = branchless::select(tin_first as u64, TIN_DEBT_SLOT as u64, DEBT_SLOT as u64);
            owe(slot as u32, remaining);
        } else if !walk.last_bin.is_null() {
            unsafe { atomic_xadd::<u64, u64, { Relaxed }>(walk.last_bin, remaining) };
        }
    }
    out.unplaced_ns = remaining;
}

/// What the device sent ahead of the rate (`shaper_common::overrun`): owed like what packets
/// put past the bin after their span, and repaid the same way, by the bookings of bulk
/// traffic, whose schedule it was.
#[inline(always)]
pub fn owe_overrun(ns: u64) {
    owe(OVERFLOW_SLOT, ns);
}

/// Takes `ns` of wire time a booking put past its bin's width off the slack's credit.
#[inline(always)]
fn spend_slack(ns: u64) {
    if ns == 0 {
        return;
    }
    if let Some(credit) = DEPARTURES.get_ptr_mut(departures::SLACK_CREDIT) {
        unsafe { atomic_xadd::<u64, u64, { Relaxed }>(credit, ns.wrapping_neg()) };
    }
}

/// Adds `ns` to the debt in `slot`.
#[inline(always)]
fn owe(slot: u32, ns: u64) {
    if let Some(debt) = CALENDAR.get_ptr_mut(slot) {
        unsafe { atomic_xadd::<u64, u64, { Relaxed }>(debt, ns) };
    }
}

/// Reads the debt in `slot` and, if `repays`, takes up to `tx_ns` of it for this packet to book
/// with its own wire time: (what was owed, what this packet repays). The pointer is only used
/// where it was checked: a verifier that loses the link between a null pointer and a zero
/// repayment (Linux 6.12's) rejects the program otherwise.
#[inline(always)]
fn repay(slot: u32, tx_ns: u64, repays: bool) -> (u64, u64) {
    let Some(debt) = CALENDAR.get_ptr_mut(slot) else {
        return (0, 0);
    };
    let owed = bins::owed(unsafe { core::ptr::read_volatile(debt) });
    let repaid = bins::repayment(owed, tx_ns, repays);
    if repaid != 0 {
        unsafe { atomic_xadd::<u64, u64, { Relaxed }>(debt, repaid.wrapping_neg()) };
    }
    (owed, repaid)
}
