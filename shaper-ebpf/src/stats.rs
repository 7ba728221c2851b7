//! Counter updates. The stats value is per-CPU, so plain increments are exact.

use shaper_common::stats::{DatapathStats, DropReason, PassReason};

use crate::Verdict;

#[inline(always)]
pub fn pass(stats: &mut DatapathStats, reason: PassReason) -> Verdict {
    if let Some(c) = stats.passed.get_mut(reason as usize) {
        *c += 1;
    }
    Verdict::Pass
}

#[inline(always)]
pub fn drop(stats: &mut DatapathStats, reason: DropReason) -> Verdict {
    if let Some(c) = stats.dropped.get_mut(reason as usize) {
        *c += 1;
    }
    Verdict::Drop
}
