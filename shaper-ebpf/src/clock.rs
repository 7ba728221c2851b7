//! Departure clocks shared by all CPUs.
//!
//! A reservation must be atomic: two CPUs stamping packets of the same aggregate at once must not
//! both take the same slot, or the aggregate leaves faster than its rate. The reservation is a
//! compare-and-swap loop over `edt::reserve` (BPF_CMPXCHG, kernel >= 5.12). After a few lost
//! races it falls back to an atomic add of the packet's time, which never loses wire time but
//! may not restart an idle clock at `now`; those fallbacks are counted (`clock_contended`) so the
//! error is measured, not silent.
//!
//! The bpfel target does not advertise compare-and-swap, so `AtomicU64` hides it; the
//! intrinsics emit BPF_CMPXCHG (kernels >= 5.12). The build targets BPF cpu v1 (aya-build owns
//! the rustflags), where an atomic add may not return the old value, so the fallback adds
//! without fetching and departs at the last value it saw.

use core::intrinsics::{AtomicOrdering::Relaxed, atomic_cxchg, atomic_xadd};

use shaper_common::{edt, overrun};

/// Lost compare-and-swap races tolerated before the atomic-add fallback.
const CAS_ATTEMPTS: usize = 4;

pub enum Reserved {
    /// Depart at this time (CLOCK_MONOTONIC ns).
    At(u64),
    /// Depart at this time; the reservation took the contended fallback path.
    AtContended(u64),
    /// Beyond the horizon: drop; the clock was not advanced.
    BeyondHorizon,
}

/// Reserves `tx_ns` of wire time on `clock` (a u64 in a map value).
///
/// # Safety
/// `clock` must point into a map value that stays valid for the program's run.
#[inline(always)]
pub unsafe fn reserve(
    clock: *mut u64,
    now_ns: u64,
    not_before_ns: u64,
    tx_ns: u64,
    horizon_ns: u64,
    credit_ns: u64,
) -> Reserved {
    // An aligned 64-bit load is single-copy atomic on every BPF JIT; LLVM's BPF backend only
    // selects explicit atomic loads for cpu v4, so a volatile read it is.
    let mut current = unsafe { core::ptr::read_volatile(clock) };
    for _ in 0..CAS_ATTEMPTS {
        let Some(r) = edt::reserve(current, now_ns, not_before_ns, tx_ns, horizon_ns, credit_ns)
        else {
            return Reserved::BeyondHorizon;
        };
        let (seen, swapped) =
            unsafe { atomic_cxchg::<u64, { Relaxed }, { Relaxed }>(clock, current, r.clock_ns) };
        if swapped {
            return Reserved::At(r.depart_ns);
        }
        current = seen;
    }
    // Contended: account the wire time unconditionally, depart where the clock last stood.
    let depart = if current > now_ns { current } else { now_ns };
    if depart - now_ns > horizon_ns {
        return Reserved::BeyondHorizon;
    }
    unsafe { atomic_xadd::<u64, u64, { Relaxed }>(clock, tx_ns) };
    Reserved::AtContended(depart)
}

/// Moves a clock forward to at least `to_ns` (never back).
///
/// # Safety
/// `clock` must point into a map value that stays valid for the program's run.
#[inline(always)]
pub unsafe fn advance(clock: *mut u64, to_ns: u64) {
    let mut current = unsafe { core::ptr::read_volatile(clock) };
    for _ in 0..CAS_ATTEMPTS {
        if current >= to_ns {
            return;
        }
        let (seen, swapped) =
            unsafe { atomic_cxchg::<u64, { Relaxed }, { Relaxed }>(clock, current, to_ns) };
        if swapped {
            return;
        }
        current = seen;
    }
}

/// Passes a departure of `tx_ns` at `now_ns` through the link at the rate at `link`
/// (`overrun::link_idle`): how long the link sat idle before it. When the races are lost the
/// departure is added without the idle time: the credit it would have earned is not earned.
///
/// # Safety
/// `link` must point into a map value that stays valid for the program's run.
#[inline(always)]
pub unsafe fn link(link: *mut u64, now_ns: u64, tx_ns: u64) -> u64 {
    let mut current = unsafe { core::ptr::read_volatile(link) };
    for _ in 0..CAS_ATTEMPTS {
        let (free, idle) = overrun::link_idle(current, now_ns, tx_ns);
        let (seen, swapped) =
            unsafe { atomic_cxchg::<u64, { Relaxed }, { Relaxed }>(link, current, free) };
        if swapped {
            return idle;
        }
        current = seen;
    }
    unsafe { atomic_xadd::<u64, u64, { Relaxed }>(link, tx_ns) };
    0
}

/// Passes a departure of `tx_ns` at `now_ns` through the meter at `meter`, which never stands
/// behind `floor_ns` (`overrun::meter`): the wire time that left ahead of the rate. When the
/// races are lost the departure is added without a charge: the meter never loses wire time, so
/// the next departures are charged.
///
/// # Safety
/// `meter` must point into a map value that stays valid for the program's run.
#[inline(always)]
pub unsafe fn meter(meter: *mut u64, now_ns: u64, tx_ns: u64, floor_ns: u64) -> u64 {
    let mut current = unsafe { core::ptr::read_volatile(meter) };
    for _ in 0..CAS_ATTEMPTS {
        let step = overrun::meter(current, now_ns, tx_ns, floor_ns);
        let (seen, swapped) =
            unsafe { atomic_cxchg::<u64, { Relaxed }, { Relaxed }>(meter, current, step.meter_ns) };
        if swapped {
            return step.charge_ns;
        }
        current = seen;
    }
    unsafe { atomic_xadd::<u64, u64, { Relaxed }>(meter, tx_ns) };
    0
}
