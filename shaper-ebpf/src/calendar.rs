//! The global guard: a calendar of wire time that keeps the aggregate at the configured rate
//! without making anyone wait behind a flow paced into the future.
//!
//! Time is cut into bins of `calendar_bin_ns`; each bin can carry `calendar_bin_ns` of wire
//! time at the configured rate, less what has already passed. A packet that wants to leave at
//! `want` takes wire time from the bin holding `want` and, if that is full, from the following
//! ones. In its own bin it leaves at `want`; pushed into a later bin, it leaves after what that
//! bin already carries. So the aggregate never exceeds the rate by more than one bin's worth,
//! and only when the levels are overbooked. A single "next free" clock would instead make a
//! sparse flow wait behind a bulk flow's packets scheduled 5 ms ahead; a usage counter would
//! make it wait for their total.
//!
//! Each bin is one u64 updated by compare-and-swap: the high 24 bits tag the lap of the ring
//! the bin belongs to (a stale lap reads as empty), the low 40 bits the wire time taken (ns).

use core::intrinsics::{AtomicOrdering::Relaxed, atomic_cxchg};

use aya_ebpf::{macros::map, maps::Array};
use shaper_common::datapath::{CALENDAR_BINS, CALENDAR_MAX_SPAN_BINS};

#[map(name = "SHAPER_CALENDAR")]
static CALENDAR: Array<u64> = Array::with_max_entries(CALENDAR_BINS, 0);

const USED_BITS: u32 = 40;
const USED_MASK: u64 = (1 << USED_BITS) - 1;
const LAP_MASK: u64 = (1 << 24) - 1;
const CAS_ATTEMPTS: usize = 2;

pub struct Booked {
    /// Earliest departure the calendar allows.
    pub depart_ns: u64,
    /// Whether the packet had to move past its wanted time (the aggregate was overbooked).
    pub delayed: bool,
    /// Wire time that found no room within the bins a packet may span (counted, not lost: the
    /// packet still leaves; the flow clocks keep pacing it).
    pub unplaced_ns: u64,
    pub contended: bool,
}

/// Books `tx_ns` of wire time at or after `want_ns` (≥ `now_ns`). Packets wanted beyond the
/// ring's span are not booked: the flow clocks that put them there already pace them.
#[inline(always)]
pub fn book(want_ns: u64, now_ns: u64, tx_ns: u64, bin_ns: u64) -> Booked {
    let mut out = Booked {
        depart_ns: want_ns,
        delayed: false,
        unplaced_ns: 0,
        contended: false,
    };
    if bin_ns == 0 || want_ns - now_ns >= bin_ns * (CALENDAR_BINS as u64 - 1) {
        return out;
    }
    let mut index = want_ns / bin_ns;
    let mut remaining = tx_ns;
    let mut placed = false;
    for _ in 0..CALENDAR_MAX_SPAN_BINS {
        if remaining == 0 {
            break;
        }
        let Some(bin) = CALENDAR.get_ptr_mut((index % CALENDAR_BINS as u64) as u32) else {
            break;
        };
        let lap = (index / CALENDAR_BINS as u64) & LAP_MASK;
        let mut current = unsafe { core::ptr::read_volatile(bin) };
        for _ in 0..CAS_ATTEMPTS {
            let booked = if current >> USED_BITS == lap {
                current & USED_MASK
            } else {
                0
            };
            // Wire time that has already passed cannot be used: no burst credit from an idle
            // start of the current bin.
            let bin_start = index * bin_ns;
            let elapsed = if now_ns > bin_start { now_ns - bin_start } else { 0 };
            let used = if elapsed > booked { elapsed } else { booked };
            if used >= bin_ns {
                break;
            }
            let take = if bin_ns - used < remaining {
                bin_ns - used
            } else {
                remaining
            };
            let next = (lap << USED_BITS) | (used + take);
            let (seen, swapped) =
                unsafe { atomic_cxchg::<u64, { Relaxed }, { Relaxed }>(bin, current, next) };
            if swapped {
                if !placed {
                    placed = true;
                    // In the bin it wanted, a packet leaves when its flow said: the bin's
                    // capacity bounds the aggregate without ordering flows inside it. A packet
                    // pushed into a later bin queues behind what that bin already carries.
                    if bin_start > want_ns {
                        out.depart_ns = bin_start + used;
                        out.delayed = true;
                    }
                }
                remaining -= take;
                break;
            }
            out.contended = true;
            current = seen;
        }
        index += 1;
    }
    if !placed {
        // Every bin the packet may span is full: leave after them.
        out.depart_ns = index * bin_ns;
        out.delayed = true;
    }
    out.unplaced_ns = remaining;
    out
}
