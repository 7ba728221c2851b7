//! The guards that hosts without an allocation share per destination (docs/design.md,
//! "Newcomers towards one destination share its guard"; the slot is
//! `shaper_common::schedule::destination_slot`).

use aya_ebpf::{macros::map, maps::Array};
use shaper_common::{schedule, sizing::DESTINATION_GUARDS};

use crate::clock::{self, Reserved};

/// One guard clock a slot, at the newcomer level of the hosts that book it.
#[map(name = "SHAPER_DESTINATIONS")]
static DESTINATIONS: Array<u64> = Array::with_max_entries(DESTINATION_GUARDS, 0);

/// [`book`]'s answer for a sparse packet it refuses.
pub const OVER_LIMIT: u64 = u64::MAX;

/// Charges `tx_ns` to the guard in `slot` and returns where its reservation starts (0 for no
/// slot: `schedule::NO_SLOT`). A sparse packet (`sparse` 1) towards a destination whose guard
/// already stands `limit_ns` ahead is charged nothing and answered [`OVER_LIMIT`]: it is
/// dropped (`schedule::sparse_over_limit`).
///
/// A global function, checked once by the verifier as the calendar is: its caller sees only
/// the value it returns, and keeps its own stack within what a call chain may use.
#[unsafe(export_name = "shaper_destination_book")]
#[inline(never)]
pub extern "C" fn book(slot: u64, now_ns: u64, tx_ns: u64, limit_ns: u64, sparse: u64) -> u64 {
    if slot >= DESTINATION_GUARDS as u64 {
        return 0;
    }
    let Some(clock) = DESTINATIONS.get_ptr_mut(slot as u32) else {
        return 0;
    };
    // SAFETY: a map value valid for the run; a stale read lets one packet more or less through.
    let lead = unsafe { core::ptr::read_volatile(clock) };
    if sparse != 0 && schedule::sparse_over_limit(lead, now_ns, limit_ns) {
        return OVER_LIMIT;
    }
    // SAFETY: as above.
    match unsafe { clock::reserve(clock, now_ns, 0, tx_ns, u64::MAX, 0) } {
        Reserved::At(start) | Reserved::AtContended(start) => start,
        Reserved::BeyondHorizon => 0,
    }
}
