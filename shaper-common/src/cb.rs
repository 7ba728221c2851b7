//! The packet's control block (`__sk_buff.cb`, five 32-bit words): how the data path's programs
//! and phases hand a packet's notes to each other. Its layout lives here, once; the data path
//! reads and writes it only through `shaper-ebpf/src/cb.rs`.
//!
//! Why words of the control block rather than values in registers or return values: a flag
//! the verifier knows on each path (mark or not, sparse or not, kept or not) makes it keep every
//! later path apart, and the scheduler would no longer verify within its limits. A word of the
//! control block, written and read back through memory (volatile accesses, which the compiler
//! cannot fold into what it knows), reads back as unknown: the paths merge again. It also
//! survives a tail call, which is how the marker learns what to rewrite.
//!
//! The words, by [`Slot`]:
//! - [`Slot::L3Offset`]: the IP header's offset, for the marker (`shaper_mark`).
//! - [`Slot::Rewrite`]: what the marker rewrites ([`rewrite`] bits). The scheduler sets
//!   [`rewrite::WASH`] from the configuration and [`rewrite::SET_CE`] on the AQM's mark.
//! - [`Slot::Ahead`]: whether the packet books ahead of the calendar's bookings ([`ahead`]
//!   bits), noted by the scheduler's phases where each is decided and read back where the
//!   booking is made. Zero on entry to the scheduler.
//! - [`Slot::Jump`]: the ACK filter ↔ scheduler contract ([`jump`]).
//!
//! The fifth word is unused. Nothing here outlives the packet's pass through the data path:
//! the stack may hand over a control block holding anything, so every word is written before
//! it is read.

/// Words in `__sk_buff.cb`.
pub const WORDS: usize = 5;

/// Which word holds what (the index of each in `__sk_buff.cb`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Slot {
    /// The IP header's offset from the start of the frame, for the marker.
    L3Offset = 0,
    /// What the marker rewrites: [`rewrite`] bits; zero: the marker is not called.
    Rewrite = 1,
    /// Whether the packet goes ahead of the calendar's bookings: [`ahead`] bits.
    Ahead = 2,
    /// The ACK filter's request and the scheduler's answer: [`jump`] values.
    Jump = 3,
}

impl Slot {
    pub const ALL: [Self; 4] = [Self::L3Offset, Self::Rewrite, Self::Ahead, Self::Jump];
}

/// Bits of [`Slot::Rewrite`]: what `shaper_mark` does to the DS field.
pub mod rewrite {
    /// Set Congestion Experienced (the AQM's mark). A mark the marker cannot make is a drop.
    pub const SET_CE: u32 = 1;
    /// Clear the DSCP, keep the ECN bits (CAKE's `wash`).
    pub const WASH: u32 = 2;
}

/// Bits of [`Slot::Ahead`]. Any bit set sends the packet ahead of the calendar's bookings;
/// [`SPARSE`] also says it skips its host's guard.
pub mod ahead {
    /// Goes ahead: its host does (`abi::host_flags::AHEAD`, written into the word as it
    /// is), or it is an ACK the filter kept, or one the scheduler sends at once.
    pub const AHEAD: u32 = 1;
    /// Its flow is sparse: it goes ahead and skips its host's guard.
    pub const SPARSE: u32 = 8;

    /// [`SPARSE`] as 0 or 1, from the word.
    #[inline(always)]
    pub const fn sparse(word: u32) -> u64 {
        ((word / SPARSE) & 1) as u64
    }
}

/// The word in which the ACK filter and the scheduler talk ([`super::Slot::Jump`]).
///
/// - `shaper_egress` writes it for every packet: [`KEPT`] on a pure ACK it hands to the
///   filter, zero on anything else (whatever the stack left there must not read as a request).
///   A candidate that reaches the scheduler was kept, since the filter returns those it drops,
///   so it is marked there and not on the filter's keep path (a store on that path multiplied
///   the filter's verifier states).
/// - `shaper_ack_filter` writes [`KEPT`] | [`WANTED`] on an ACK it wants sent ahead of its
///   flow's packets still scheduled (`ackfilter::jumps_queue`).
/// - The scheduler reads [`kept`] and [`wanted`] and answers in the same word: [`GRANTED`]
///   when the ACK leaves now, zero otherwise. From then on the word holds only that answer,
///   which it and the egress path read back with [`granted`].
///
/// A kept ACK books ahead of the calendar's bookings, as a sparse flow's packet does, at its
/// flow's clock, and behind its host's guard only when the host has nothing else booked after
/// it: the guard holds a host to its allocation when nearly all it sends are ACKs, while
/// behind the bulk flows' bookings of its host a download's ACKs would leave in clumps
/// (docs/ack-filter.md, "A kept ACK does not wait behind the bulk"). A granted one leaves now,
/// charged to its flow's clock, its host's guard and the calendar as if it had waited, and
/// the egress path gives it fq's control priority.
pub mod jump {
    /// The filter asks for the ACK to be sent ahead of its flow's packets.
    pub const WANTED: u32 = 1;
    /// The scheduler's answer: it leaves now.
    pub const GRANTED: u32 = 2;
    /// The filter kept the ACK.
    pub const KEPT: u32 = 4;

    /// What `shaper_egress` writes: [`KEPT`] for a packet it hands to the filter, else zero.
    #[inline(always)]
    pub const fn on_entry(candidate: bool) -> u32 {
        candidate as u32 * KEPT
    }

    /// What the filter writes for an ACK it wants sent first.
    pub const KEEP_FIRST: u32 = KEPT | WANTED;

    /// [`KEPT`] as 0 or 1, from the word as the egress path or the filter wrote it.
    #[inline(always)]
    pub const fn kept(word: u32) -> u32 {
        (word & KEPT) / KEPT
    }

    /// [`WANTED`] as 0 or 1, from the word as the egress path or the filter wrote it.
    #[inline(always)]
    pub const fn wanted(word: u32) -> u64 {
        word as u64 & WANTED as u64
    }

    /// The scheduler's answer for `jumps` (0 or 1).
    #[inline(always)]
    pub const fn answer(jumps: u64) -> u32 {
        (jumps * GRANTED as u64) as u32
    }

    /// [`GRANTED`] as 0 or 1, from the word once the scheduler has answered (it then holds
    /// [`answer`]'s value and nothing else).
    #[inline(always)]
    pub const fn granted(word: u32) -> u64 {
        word as u64 >> GRANTED.trailing_zeros()
    }

    // `wanted` and `kept` yield 0 or 1 only if their bit is alone in its value.
    const _: () = assert!(WANTED == 1 && KEPT.is_power_of_two() && GRANTED.is_power_of_two());
    const _: () = assert!(WANTED & GRANTED == 0 && WANTED & KEPT == 0 && GRANTED & KEPT == 0);
}

const _: () = {
    assert!((Slot::Jump as usize) < WORDS);
    assert!(rewrite::SET_CE & rewrite::WASH == 0);
    assert!(ahead::AHEAD & ahead::SPARSE == 0 && ahead::SPARSE.is_power_of_two());
    // The host's flag lands in the word as it is, and must not read as sparse.
    assert!(crate::abi::host_flags::AHEAD == ahead::AHEAD as u64);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_distinct_words_of_the_control_block() {
        for (i, a) in Slot::ALL.iter().enumerate() {
            assert!((*a as usize) < WORDS);
            for b in &Slot::ALL[i + 1..] {
                assert_ne!(*a as usize, *b as usize);
            }
        }
    }

    #[test]
    fn the_egress_path_marks_only_candidates_as_kept() {
        assert_eq!(jump::kept(jump::on_entry(true)), 1);
        assert_eq!(jump::wanted(jump::on_entry(true)), 0);
        assert_eq!(jump::kept(jump::on_entry(false)), 0);
        assert_eq!(jump::wanted(jump::on_entry(false)), 0);
        assert_eq!(jump::kept(jump::KEEP_FIRST), 1);
        assert_eq!(jump::wanted(jump::KEEP_FIRST), 1);
    }

    #[test]
    fn the_schedulers_answer_reads_back_as_granted_or_not() {
        for jumps in [0, 1] {
            let word = jump::answer(jumps);
            assert_eq!(jump::granted(word), jumps);
            assert_eq!(word == jump::GRANTED, jumps == 1);
            // The answer replaces the request: it no longer reads as kept or wanted.
            assert_eq!(jump::kept(word), 0);
            assert_eq!(jump::wanted(word), 0);
        }
    }

    #[test]
    fn sparse_reads_its_bit_alone() {
        assert_eq!(ahead::sparse(0), 0);
        assert_eq!(ahead::sparse(ahead::AHEAD), 0);
        assert_eq!(ahead::sparse(ahead::SPARSE), 1);
        assert_eq!(ahead::sparse(ahead::SPARSE | ahead::AHEAD), 1);
    }
}
