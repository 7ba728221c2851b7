//! The redundant-ACK filter: which pure ACKs may be dropped on a congested uplink, decided with
//! only the packet in hand and the state in maps (docs/ack-filter.md has the argument).
//!
//! CAKE drops an *older* ACK still in its queue when a newer one covers it. From clsact on top
//! of fq a queued packet cannot be removed, so shaper drops the *newer* one, and only when a
//! later ACK that covers it is certain to come: data beyond what it acknowledges has already
//! been seen arriving on the same interface (the receiver must acknowledge it), or the data it
//! acknowledges ended in the middle of one of the sender's writes (no PSH: the rest of the
//! write is still to come), and the flow still has ACKs scheduled ahead (the sender is not
//! left without an ACK clock meanwhile).

use crate::{abi::LENT, branchless};

/// `--ack-filter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u32)]
pub enum AckFilter {
    #[default]
    Off = 0,
    /// Keeps at least two of the flow's ACKs scheduled ahead.
    Conservative = 1,
    /// Keeps at least one.
    Aggressive = 2,
}

impl AckFilter {
    pub const ALL: [Self; 3] = [Self::Off, Self::Conservative, Self::Aggressive];

    pub const fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Conservative => "conservative",
            Self::Aggressive => "aggressive",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// How many of a flow's packets must be scheduled ahead before the mode drops a covered
    /// ACK (rule 7 of docs/ack-filter.md); `None` when it drops nothing.
    pub const fn scheduled_needed(self) -> Option<u32> {
        match self {
            Self::Off => None,
            Self::Conservative => Some(2),
            Self::Aggressive => Some(1),
        }
    }

    pub const fn from_u32(v: u32) -> Self {
        match v {
            1 => Self::Conservative,
            2 => Self::Aggressive,
            _ => Self::Off,
        }
    }
}

/// The least a kept ACK charges its flow's clock while the filter is on and other flows of its
/// host have packets booked after it (bytes): a round's quantum, CAKE's for the rate (its bytes
/// per second / 4096, within 300 bytes and a full frame). CAKE's DRR serves a flow no more than
/// its queue holds in a round, so a flow its filter keeps at an ACK or two sends one or two per
/// round of the bulk flows' quanta. A flow paced at its level like a bulk flow instead takes the
/// level in 66-byte ACKs: conservative mode, which keeps two of them scheduled, left each of
/// four downloads' ACK flows nearly a whole flow's share of a 1 Mbit/s uplink, and four uploads
/// beside them got less than with the filter off (docs/ack-filter.md). Charged a quantum, an ACK
/// flow sends one ACK per quantum at its level, the ACKs between are the filter's to thin, and
/// its flow-time counts only its real wire time, so the level it leaves unused goes to the bulk
/// flows.
pub fn round_quantum_bytes(rate_bps: u64, frame_bytes: u32) -> u32 {
    const LEAST: u64 = 300;
    let per_round = (rate_bps / 8) >> 12;
    per_round.clamp(LEAST, (frame_bytes as u64).max(LEAST)) as u32
}

/// TCP flags.
pub mod tcp_flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
    pub const URG: u8 = 0x20;
    pub const ECE: u8 = 0x40;
    pub const CWR: u8 = 0x80;
}

/// Whether a TCP segment is a pure ACK the filter looks at: ACK set, no payload, none of SYN,
/// FIN, RST, URG (they carry information no later ACK repeats).
pub const fn is_pure_ack(flags: u8, payload_bytes: u32) -> bool {
    use tcp_flags::*;
    payload_bytes == 0 && flags & ACK != 0 && flags & (SYN | FIN | RST | URG) == 0
}

/// `a` is after `b` in sequence space (RFC 1982 arithmetic on 32 bits).
pub const fn after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// What the filter read from a pure ACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AckSeen {
    pub ack: u32,
    /// The raw window field (the scale is the connection's, the same for all its ACKs).
    pub window: u16,
    pub flags: u8,
    /// Its SACK blocks, in the order sent: the first holds the segment the receiver got last
    /// (RFC 2018), or is a D-SACK (RFC 2883); the others repeat the most recently reported.
    pub sack: [SackBlock; MAX_SACK_BLOCKS],
    /// How many of `sack` it carries.
    pub sack_count: u8,
    /// The furthest any of its SACK blocks reaches.
    pub sack_reach: u32,
    /// The first block lies within another one: a D-SACK above the cumulative ACK.
    pub sack_duplicate: bool,
    /// No further block fits in its options: the receiver's next ACK may have to leave one of
    /// these out to report a new one.
    pub sack_full: bool,
    /// It carries an option other than NOP, EOL, timestamps and SACK, or options that do not
    /// parse.
    pub unknown_option: bool,
}

impl AckSeen {
    pub const fn has_sack(&self) -> bool {
        self.sack_count > 0
    }

    /// Its last SACK block: the one the receiver's next ACK leaves out to report a new block
    /// when the option is full.
    pub const fn last_sack(&self) -> SackBlock {
        self.sack[(self.sack_count as usize).wrapping_sub(1) & (MAX_SACK_BLOCKS - 1)]
    }
}

/// The most SACK blocks an option holds (40 bytes of options, 8 per block).
pub const MAX_SACK_BLOCKS: usize = 4;

/// A SACK block: the receiver holds `[start, end)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SackBlock {
    pub start: u32,
    pub end: u32,
}

impl SackBlock {
    /// Whether it lies within `other`.
    pub const fn within(self, other: SackBlock) -> bool {
        !after(other.start, self.start) && !after(self.end, other.end)
    }
}

/// Per ACK flow (the direction the ACKs travel), written by the filter.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AckState {
    /// The highest ACK number seen (kept or dropped).
    pub last_ack: u32,
    pub window: u16,
    pub flags: u8,
    /// Non-zero once an ACK was seen.
    pub seen: u8,
    /// The flow's packets scheduled to leave until then were overtaken by an ACK sent first
    /// ([`jumps_queue`]): the ACKs among them tell the sender nothing it does not know.
    pub stale_until_ns: u64,
    /// What the flow's kept ACKs have told the sender (see [`AckState::told`]): the highest ACK
    /// number, and the SACK blocks of the last one.
    pub told_ack: u32,
    pub told_count: u32,
    pub told_sack: [SackBlock; MAX_SACK_BLOCKS],
}

/// How many of a flow's packets are still ahead of `now` on the link, from when its two most
/// recent packets go on it (the flow's state keeps them: their departures, or for a packet the
/// calendar lent a departure, where it booked its wire time, marked [`LENT`]): 0, 1 or 2 (two
/// or more). With `lent` false, a lent one does not count: it has left.
pub const fn scheduled_ahead(
    last_on_wire_ns: u64,
    prev_on_wire_ns: u64,
    now_ns: u64,
    lent: bool,
) -> u32 {
    is_ahead(last_on_wire_ns, now_ns, lent) as u32 + is_ahead(prev_on_wire_ns, now_ns, lent) as u32
}

const fn is_ahead(on_wire_ns: u64, now_ns: u64, lent: bool) -> bool {
    (on_wire_ns & !LENT) > now_ns && (lent || on_wire_ns & LENT == 0)
}

/// What a flow's state records as when a packet goes on the link, from what the calendar
/// returned for it (`booked`, at `now_ns`) and when it departs (`depart_ns`): its departure,
/// or for a packet the calendar lent to that leaves now, where it booked its wire time marked
/// [`LENT`], but no more than `window_ns` ahead (`sizing::LENT_WINDOW_FRAMES`; zero:
/// unbounded). A lent packet its flow's clock holds until later (a kept ACK, a packet of a host
/// that goes ahead) has not left: it is scheduled until its departure, like any other.
#[inline(always)]
pub fn on_wire(booked: u64, depart_ns: u64, now_ns: u64, window_ns: u64) -> u64 {
    let lent = booked >> LENT.trailing_zeros();
    let left = lent & (branchless::below(now_ns, depart_ns) ^ 1);
    let bounded = LENT | branchless::min(booked & !LENT, now_ns + window_ns);
    let estimate = branchless::select((window_ns != 0) as u64, bounded, booked);
    // Not lent: the calendar's answer is the departure.
    branchless::select(left, estimate, depart_ns)
}

/// The later departure of a flow's two most recent packets, not counting lent ones (they have
/// left): how far an ACK sent ahead of them overtakes (see [`AckState::overtaken`]).
pub const fn latest_scheduled(last_on_wire_ns: u64, prev_on_wire_ns: u64) -> u64 {
    let (last, prev) = (scheduled(last_on_wire_ns), scheduled(prev_on_wire_ns));
    if last > prev { last } else { prev }
}

const fn scheduled(on_wire_ns: u64) -> u64 {
    if on_wire_ns & LENT != 0 {
        0
    } else {
        on_wire_ns
    }
}

/// A flow's packets ahead on the link, for the filter: all of them, and those that are fresh:
/// scheduled after the flow's last ACK sent first (so still news to the sender), and not lent a
/// departure now by the calendar.
///
/// A lent packet left at once, and only the calendar's estimate says when the link carries it.
/// It keeps the sender's clock for an ACK the receiver sends whatever the sender does: if the
/// estimate is late, the sender only hears the news later, from that ACK. For an ACK whose
/// successor needs the sender to send more first it does not: had the sender already heard it
/// and sent all it could, nothing more would come and the sender would wait for a timeout. Nor
/// is there anything to jump ahead of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ahead {
    pub all: u32,
    pub fresh: u32,
}

impl Ahead {
    /// From when the flow's two most recent packets go on the link (see [`scheduled_ahead`]).
    pub const fn of(
        last_on_wire_ns: u64,
        prev_on_wire_ns: u64,
        now_ns: u64,
        state: &AckState,
    ) -> Self {
        let fresh_after = if state.stale_until_ns > now_ns {
            state.stale_until_ns
        } else {
            now_ns
        };
        Self {
            all: scheduled_ahead(last_on_wire_ns, prev_on_wire_ns, now_ns, true),
            fresh: scheduled_ahead(last_on_wire_ns, prev_on_wire_ns, fresh_after, false),
        }
    }
}

/// Nothing stale: `n` scheduled ahead, all fresh.
impl From<u32> for Ahead {
    fn from(n: u32) -> Self {
        Self { all: n, fresh: n }
    }
}

/// The data direction of the flow as seen arriving on the same interface (ingress), written
/// by the ingress program.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReverseState {
    /// One past the highest data byte seen.
    pub data_end: u32,
    /// Non-zero when the segment that ended at `data_end` carried PSH or FIN: the sender's
    /// write (or the stream) may end there. Without it, the sender had more of the same write
    /// queued when it sent that segment.
    pub pushed: u32,
}

impl ReverseState {
    /// The state after a data segment `[seq, end)` with TCP `flags` arrived.
    pub fn on_data(&mut self, end: u32, flags: u8) {
        use tcp_flags::{FIN, PSH};
        let pushed = (flags & (PSH | FIN) != 0) as u32;
        if after(end, self.data_end) {
            self.data_end = end;
            self.pushed = pushed;
        } else if end == self.data_end {
            // The last segment again (a tail loss probe, a retransmission): a push on either
            // copy counts.
            self.pushed |= pushed;
        }
    }

    /// A fresh state for a flow whose first data segment seen ends at `end`.
    pub fn first(end: u32, flags: u8) -> Self {
        let mut r = Self {
            data_end: end,
            pushed: 0,
        };
        r.on_data(end, flags);
        r
    }

    /// Whether an ACK for `ack` will certainly be followed by one that covers it: data beyond
    /// it has arrived (the receiver must acknowledge that), or it acknowledges exactly the data
    /// seen and the segment that ended there was not pushed (the sender had the rest of that
    /// write queued; it sends it as the ACKs still scheduled open its window, and the receiver
    /// acknowledges that in turn).
    pub fn later_ack_certain(&self, ack: u32) -> bool {
        self.data_beyond(ack) || (self.data_end == ack && self.pushed == 0)
    }

    /// Whether data beyond `ack` has arrived.
    pub fn data_beyond(&self, ack: u32) -> bool {
        after(self.data_end, ack)
    }
}

/// Why an ACK was kept (a counter each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum KeepReason {
    /// An option the filter does not know, or options that do not parse.
    UnknownOption = 0,
    /// SACK blocks a later ACK may not repeat: a D-SACK, or no data seen beyond them.
    Sack = 1,
    /// The flow's first ACK.
    First = 2,
    /// Not newer than the last ACK: a duplicate signals loss.
    Duplicate = 3,
    /// A new window, and the later ACK depends on the sender sending more.
    Window = 4,
    /// ECE or CWR changed.
    Ecn = 5,
    /// No data beyond it was seen arriving, and the data it acknowledges ended a write (PSH or
    /// FIN): it may be the last ACK.
    NoLaterData = 6,
    /// Too few of the flow's ACKs are scheduled ahead for the mode.
    FewScheduled = 7,
    /// SACK blocks filling the options: the receiver's next ACK may leave one out.
    SackFull = 8,
}

impl KeepReason {
    pub const COUNT: usize = 9;
    pub const ALL: [Self; Self::COUNT] = [
        Self::UnknownOption,
        Self::Sack,
        Self::SackFull,
        Self::First,
        Self::Duplicate,
        Self::Window,
        Self::Ecn,
        Self::NoLaterData,
        Self::FewScheduled,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Self::UnknownOption => "unknown_option",
            Self::Sack => "sack",
            Self::SackFull => "sack_full",
            Self::First => "first",
            Self::Duplicate => "duplicate",
            Self::Window => "window",
            Self::Ecn => "ecn",
            Self::NoLaterData => "no_later_data",
            Self::FewScheduled => "few_scheduled",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckVerdict {
    Drop,
    Keep(KeepReason),
}

/// Decides for a pure ACK of a flow in `state`, `data` being what the data direction has
/// shown arriving (if anything) and `ahead` how many of the flow's packets are still scheduled
/// ([`Ahead`]). Does not update the state (see [`record`]).
pub fn decide(
    mode: AckFilter,
    seen: &AckSeen,
    state: &AckState,
    data: Option<&ReverseState>,
    ahead: impl Into<Ahead>,
) -> AckVerdict {
    let ahead = ahead.into();
    use tcp_flags::{CWR, ECE};
    let keep = AckVerdict::Keep;
    if seen.unknown_option {
        return keep(KeepReason::UnknownOption);
    }
    // CAKE drops an older ACK when a newer one acknowledges more, SACK blocks included, so a
    // duplicate ACK whose blocks grew makes the older one redundant. With the newer one still
    // to come: data beyond all of this ACK's blocks has arrived (not yet at the receiver, or
    // its blocks would hold it), so the receiver will acknowledge more, and its next ACK
    // reports the blocks it reported most recently again, as many as fit beside the newest
    // (RFC 2018): each of these comes again, grown, merged or cumulatively acknowledged,
    // unless the option is full and a new block pushes the oldest out. A D-SACK (at or below
    // the cumulative ACK, or within another block, RFC 2883) reports a duplicate no later ACK
    // repeats.
    let sack_covered = seen.has_sack()
        && !seen.sack_duplicate
        && after(seen.sack[0].start, seen.ack)
        && data.is_some_and(|d| d.data_beyond(seen.sack_reach));
    if seen.has_sack() && !sack_covered {
        return keep(KeepReason::Sack);
    }
    // The block the next ACK would push out of a full option must have reached the sender
    // already, in an ACK kept before.
    if seen.sack_full && !state.told(seen.last_sack()) {
        return keep(KeepReason::SackFull);
    }
    if state.seen == 0 {
        return keep(KeepReason::First);
    }
    // A duplicate ACK signals loss and is kept, unless its blocks will be covered: the ACK
    // that covers them is a duplicate too, with more, so the sender misses nothing a SACK
    // scoreboard counts.
    let covered_duplicate = sack_covered && seen.ack == state.last_ack;
    if !(after(seen.ack, state.last_ack) || covered_duplicate) {
        return keep(KeepReason::Duplicate);
    }
    if (seen.flags ^ state.flags) & (ECE | CWR) != 0 {
        return keep(KeepReason::Ecn);
    }
    let Some(data) = data.filter(|d| d.later_ack_certain(seen.ack)) else {
        return keep(KeepReason::NoLaterData);
    };
    // A new window is carried by the later ACK too (a window is the receiver's current state,
    // the newer value supersedes), but only if that ACK comes whatever the sender may send:
    // when it depends on the rest of a write, the sender may need this window to send it.
    if seen.window != state.window && !data.data_beyond(seen.ack) {
        return keep(KeepReason::Window);
    }
    let Some(needed) = mode.scheduled_needed() else {
        return keep(KeepReason::FewScheduled);
    };
    // The ACKs that keep the sender's clock until the later one comes. When the receiver
    // acknowledges data already on its way whatever the sender does, any scheduled packet
    // serves; when the later ACK depends on the sender sending more, only ACKs it has not
    // already been told the news of by one sent first: the stale ones open no window.
    let scheduled = if data.data_beyond(seen.ack) {
        ahead.all
    } else {
        ahead.fresh
    };
    if scheduled < needed {
        return keep(KeepReason::FewScheduled);
    }
    AckVerdict::Drop
}

/// Whether a kept ACK leaves at once, ahead of the `fresh` packets its flow still has
/// scheduled (not overtaken before, see [`Ahead`]), instead of behind them.
///
/// A cumulative ACK says all that the flow's older ACKs say and more: sent behind them, it
/// reaches the sender as late as they are long. CAKE removes the older ones from its queue; fq
/// cannot give a queued packet back, so shaper sends the newest first and lets the older ones
/// follow, stale (TCP discards an ACK below what it has already been acknowledged). The flow's
/// clock is charged for it as for any packet, so the flow keeps to its share; the stale ones
/// cost uplink time that CAKE saves, so only the ACKs the sender waits for jump: those kept
/// as the end of a write or for a window the rest of one depends on (not SACK or duplicate
/// ACKs, nor ones with options the filter does not understand).
///
/// Only when the mode would drop a covered ACK here (as many fresh ones scheduled as it
/// keeps). The flow's packets it overtakes are stale from then on ([`AckState::overtaken`]):
/// they still count for dropping an ACK whose later one the receiver sends whatever the sender
/// does, so no new ACK queues behind them meanwhile, and not for one whose later one needs the
/// sender to hear, nor for another jump.
pub const fn jumps_queue(mode: AckFilter, reason: KeepReason, fresh: u32) -> bool {
    match mode.scheduled_needed() {
        Some(needed) => {
            fresh >= needed && matches!(reason, KeepReason::NoLaterData | KeepReason::Window)
        }
        None => false,
    }
}

impl AckState {
    /// Whether the flow's kept ACKs have told the sender that the receiver holds `block`: it
    /// is at or below the highest ACK number they carried, or within a SACK block of the last
    /// one. The last kept ACK's blocks are the receiver's most recent; an older block it left
    /// out counts as not told, which only keeps an ACK. An ACK kept here and dropped later on
    /// its way (by the AQM, or downstream) is counted as told all the same: the sender then
    /// misses that block as after any lost ACK whose blocks no later one repeats, and at worst
    /// sends its data again.
    pub fn told(&self, block: SackBlock) -> bool {
        if !after(block.end, self.told_ack) {
            return true;
        }
        let mut told = false;
        for (i, t) in self.told_sack.iter().enumerate() {
            told |= (i as u32) < self.told_count && block.within(*t);
        }
        told
    }

    /// An ACK was sent first, ahead of the flow's packets scheduled to leave until
    /// `latest_depart_ns`.
    pub fn overtaken(&mut self, latest_depart_ns: u64) {
        if latest_depart_ns > self.stale_until_ns {
            self.stale_until_ns = latest_depart_ns;
        }
    }
}

/// Updates the flow's state with an ACK seen, `kept` or dropped.
pub fn record(state: &mut AckState, seen: &AckSeen, kept: bool) {
    if state.seen == 0 || after(seen.ack, state.last_ack) {
        state.last_ack = seen.ack;
    }
    state.window = seen.window;
    state.flags = seen.flags;
    if kept {
        if state.seen == 0 || after(seen.ack, state.told_ack) {
            state.told_ack = seen.ack;
        }
        state.told_count = seen.sack_count as u32;
        state.told_sack = seen.sack;
    }
    state.seen = 1;
}

/// TCP option kinds the filter knows.
pub mod options {
    pub const EOL: u8 = 0;
    pub const NOP: u8 = 1;
    pub const SACK: u8 = 5;
    pub const TIMESTAMP: u8 = 8;
}

/// Reads the options of a pure ACK: `opts` holds the `len` bytes after the 20-byte header,
/// zero-padded beyond them. Understood are the layouts TCP stacks send on ACKs: timestamps
/// (padded by two NOPs, before or after), then SACK (two NOPs, 1-4 blocks), then only NOP/EOL
/// padding. Anything else (another option, another layout, an option past `len`) is unknown,
/// and the ACK is kept. Fixed positions, not a walk: a walk's every step is a branch point for
/// the BPF verifier, and it gives up on the sequence.
///
/// An ACK whose options are unknown reports no SACK blocks: the filter records a kept ACK's
/// blocks as told to the sender, and the sender's own walk of options the scan does not
/// understand may not read them (a SACK option running past `len` is dropped whole, of two
/// SACK options the last counts).
pub fn scan_options(opts: &[u8], len: usize, seen: &mut AckSeen) {
    if !scan_layout(opts, len, seen) {
        *seen = AckSeen {
            ack: seen.ack,
            window: seen.window,
            flags: seen.flags,
            unknown_option: true,
            ..AckSeen::default()
        };
    }
}

/// [`scan_options`]'s reading: whether the options have a layout it understands (what it
/// wrote into `seen` counts only then).
fn scan_layout(opts: &[u8], len: usize, seen: &mut AckSeen) -> bool {
    let byte = |i: usize| opts.get(i).copied().unwrap_or(0xff);
    let padded_before = byte(0) == options::NOP
        && byte(1) == options::NOP
        && byte(2) == options::TIMESTAMP
        && byte(3) == 10;
    let padded_after = byte(0) == options::TIMESTAMP
        && byte(1) == 10
        && byte(10) == options::NOP
        && byte(11) == options::NOP;
    let mut at = if padded_before || padded_after { 12 } else { 0 };
    if byte(at) == options::NOP && byte(at + 1) == options::NOP && byte(at + 2) == options::SACK {
        let olen = byte(at + 3) as usize;
        if !matches!(olen, 10 | 18 | 26 | 34) {
            return false;
        }
        let word = |i: usize| u32::from_be_bytes([byte(i), byte(i + 1), byte(i + 2), byte(i + 3)]);
        let blocks = (olen - 2) / 8;
        seen.sack_count = blocks as u8;
        for (b, block) in seen.sack.iter_mut().enumerate() {
            if b < blocks {
                *block = SackBlock {
                    start: word(at + 4 + 8 * b),
                    end: word(at + 8 + 8 * b),
                };
            }
        }
        let first = seen.sack[0];
        seen.sack_reach = first.end;
        for b in 1..MAX_SACK_BLOCKS {
            if b < blocks {
                let block = seen.sack[b];
                if after(block.end, seen.sack_reach) {
                    seen.sack_reach = block.end;
                }
                seen.sack_duplicate |= first.within(block);
            }
        }
        at += 2 + olen;
        seen.sack_full = at + 8 > 40;
    }
    if at > len {
        return false;
    }
    // The rest is padding: NOP or EOL (and the zeros past `len`).
    let mut rest = 0u8;
    for i in 0..40 {
        if i >= at {
            rest |= byte(i) & !options::NOP;
        }
    }
    rest == 0
}

const _: () = {
    assert!(core::mem::size_of::<AckState>() == 56);
    assert!(core::mem::size_of::<ReverseState>() == 8);
};

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: plain `#[repr(C)]` integers with no implicit padding (asserted above).
    unsafe impl aya::Pod for AckState {}
    unsafe impl aya::Pod for ReverseState {}
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::{tcp_flags::*, *};
    use std::{vec, vec::Vec};

    const MS: u64 = 1_000_000;

    #[test]
    fn the_round_quantum_is_cakes_for_the_rate() {
        // 1 Mbit/s: 30 bytes a 4096th of a second, raised to 300; 10 Mbit/s: 305; 100 Mbit/s:
        // 3,051, held to the frame.
        assert_eq!(round_quantum_bytes(1_000_000, 1514), 300);
        assert_eq!(round_quantum_bytes(100_000, 1514), 300);
        assert_eq!(round_quantum_bytes(10_000_000, 1514), 305);
        assert_eq!(round_quantum_bytes(30_000_000, 1514), 915);
        assert_eq!(round_quantum_bytes(100_000_000, 1514), 1514);
        assert_eq!(round_quantum_bytes(100_000_000, 9014), 3051);
        // A tiny frame never lowers it below the floor.
        assert_eq!(round_quantum_bytes(100_000_000, 100), 300);
    }

    fn state(last_ack: u32) -> AckState {
        AckState {
            last_ack,
            window: 500,
            flags: ACK,
            seen: 1,
            ..Default::default()
        }
    }

    /// Data seen up to `end`, its last segment pushed (the end of a write).
    fn pushed(end: u32) -> ReverseState {
        ReverseState::first(end, ACK | PSH)
    }

    fn ack(n: u32) -> AckSeen {
        AckSeen {
            ack: n,
            window: 500,
            flags: ACK,
            ..Default::default()
        }
    }

    #[test]
    fn drops_only_when_a_later_ack_is_certain_and_enough_are_scheduled() {
        let now = 100 * MS;
        let st = state(1000);
        let two = scheduled_ahead(now + 2 * MS, now + MS, now, true);
        assert_eq!(two, 2);
        let c = AckFilter::Conservative;
        assert_eq!(
            decide(c, &ack(2000), &st, Some(&pushed(5000)), two),
            AckVerdict::Drop
        );
        // No data seen beyond it: it may be the last one.
        assert_eq!(
            decide(c, &ack(2000), &st, Some(&pushed(2000)), two),
            AckVerdict::Keep(KeepReason::NoLaterData)
        );
        assert_eq!(
            decide(c, &ack(2000), &st, None, two),
            AckVerdict::Keep(KeepReason::NoLaterData)
        );
        // One scheduled ahead: enough for aggressive, not for conservative.
        let one = scheduled_ahead(now + MS, now - MS, now, true);
        assert_eq!(one, 1);
        assert_eq!(
            decide(c, &ack(2000), &st, Some(&pushed(5000)), one),
            AckVerdict::Keep(KeepReason::FewScheduled)
        );
        assert_eq!(
            decide(
                AckFilter::Aggressive,
                &ack(2000),
                &st,
                Some(&pushed(5000)),
                one
            ),
            AckVerdict::Drop
        );
        let none = scheduled_ahead(now - MS, now - 2 * MS, now, true);
        assert_eq!(
            decide(
                AckFilter::Aggressive,
                &ack(2000),
                &st,
                Some(&pushed(5000)),
                none
            ),
            AckVerdict::Keep(KeepReason::FewScheduled)
        );
        assert_eq!(
            decide(AckFilter::Off, &ack(2000), &st, Some(&pushed(5000)), two),
            AckVerdict::Keep(KeepReason::FewScheduled)
        );
    }

    #[test]
    fn information_no_later_ack_repeats_is_never_dropped() {
        let st = state(1000);
        let c = AckFilter::Aggressive;
        let keep = |a: AckSeen| decide(c, &a, &st, Some(&pushed(9000)), 2);
        assert_eq!(keep(ack(1000)), AckVerdict::Keep(KeepReason::Duplicate));
        assert_eq!(keep(ack(900)), AckVerdict::Keep(KeepReason::Duplicate));
        // A new window with data beyond it seen: the later ACK carries the receiver's window
        // then, whatever the sender does.
        assert_eq!(
            keep(AckSeen {
                window: 501,
                ..ack(2000)
            }),
            AckVerdict::Drop
        );
        // Only the rest of a write to come: the sender may need this window to send it.
        let mid = ReverseState::first(2000, ACK);
        assert_eq!(
            decide(
                c,
                &AckSeen {
                    window: 501,
                    ..ack(2000)
                },
                &st,
                Some(&mid),
                2
            ),
            AckVerdict::Keep(KeepReason::Window)
        );
        // A pure window update (the same ACK number) is a duplicate: never dropped.
        assert_eq!(
            keep(AckSeen {
                window: 501,
                ..ack(1000)
            }),
            AckVerdict::Keep(KeepReason::Duplicate)
        );
        assert_eq!(
            keep(AckSeen {
                flags: ACK | ECE,
                ..ack(2000)
            }),
            AckVerdict::Keep(KeepReason::Ecn)
        );
        assert_eq!(
            keep(AckSeen {
                sack_count: 1,
                ..ack(2000)
            }),
            AckVerdict::Keep(KeepReason::Sack)
        );
        assert_eq!(
            keep(AckSeen {
                unknown_option: true,
                ..ack(2000)
            }),
            AckVerdict::Keep(KeepReason::UnknownOption)
        );
        let fresh = AckState::default();
        assert_eq!(
            decide(c, &ack(2000), &fresh, Some(&pushed(9000)), 2),
            AckVerdict::Keep(KeepReason::First)
        );
    }

    #[test]
    fn an_ack_in_the_middle_of_a_write_is_followed_by_another() {
        let st = state(1000);
        let c = AckFilter::Conservative;
        // The data it acknowledges ended without PSH: the rest of the write is coming.
        let mid = ReverseState::first(2000, ACK);
        assert_eq!(decide(c, &ack(2000), &st, Some(&mid), 2), AckVerdict::Drop);
        // Pushed, or the stream's FIN: the write (or the transfer) may end there.
        for flags in [ACK | PSH, ACK | FIN] {
            let end = ReverseState::first(2000, flags);
            assert_eq!(
                decide(c, &ack(2000), &st, Some(&end), 2),
                AckVerdict::Keep(KeepReason::NoLaterData)
            );
        }
        // An ACK beyond the data seen (a FIN's, or data that came another way): kept.
        assert_eq!(
            decide(c, &ack(2001), &st, Some(&mid), 2),
            AckVerdict::Keep(KeepReason::NoLaterData)
        );
        // Still needs the ACKs scheduled ahead.
        assert_eq!(
            decide(c, &ack(2000), &st, Some(&mid), 1),
            AckVerdict::Keep(KeepReason::FewScheduled)
        );
    }

    #[test]
    fn the_push_follows_the_highest_data() {
        let mut r = ReverseState::first(1000, ACK);
        assert_eq!((r.data_end, r.pushed), (1000, 0));
        r.on_data(2000, ACK | PSH);
        assert_eq!((r.data_end, r.pushed), (2000, 1));
        // Later data without a push: the write goes on.
        r.on_data(3000, ACK);
        assert_eq!((r.data_end, r.pushed), (3000, 0));
        // A retransmission below the end changes nothing; the end again with PSH (a tail loss
        // probe) marks it pushed.
        r.on_data(2000, ACK | PSH);
        assert_eq!((r.data_end, r.pushed), (3000, 0));
        r.on_data(3000, ACK | PSH);
        assert_eq!((r.data_end, r.pushed), (3000, 1));
        // Sequence space wraps.
        let mut w = ReverseState::first(u32::MAX - 10, ACK | PSH);
        w.on_data(100, ACK);
        assert_eq!((w.data_end, w.pushed), (100, 0));
    }

    #[test]
    fn sequence_space_wraps() {
        assert!(after(5, u32::MAX - 5));
        assert!(!after(u32::MAX - 5, 5));
        let st = state(u32::MAX - 100);
        assert_eq!(
            decide(
                AckFilter::Conservative,
                &ack(200),
                &st,
                Some(&pushed(5000)),
                2
            ),
            AckVerdict::Drop
        );
    }

    #[test]
    fn pure_acks_and_options() {
        assert!(is_pure_ack(ACK, 0));
        assert!(is_pure_ack(ACK | PSH | ECE, 0));
        assert!(!is_pure_ack(ACK, 1), "data-bearing");
        assert!(!is_pure_ack(ACK | FIN, 0));
        assert!(!is_pure_ack(ACK | SYN, 0));
        assert!(!is_pure_ack(ACK | RST, 0));
        assert!(!is_pure_ack(ACK | URG, 0));
        assert!(!is_pure_ack(0, 0));
        let scan = |bytes: &[u8]| {
            let mut o = [0u8; 64];
            o[..bytes.len()].copy_from_slice(bytes);
            let mut s = AckSeen::default();
            scan_options(&o, bytes.len(), &mut s);
            (s.has_sack(), s.unknown_option)
        };
        let ts = [1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2];
        assert_eq!(scan(&ts), (false, false));
        let mut ts_sack = ts.to_vec();
        ts_sack.extend_from_slice(&[1, 1, 5, 10, 0, 0, 0, 1, 0, 0, 0, 2]);
        assert_eq!(scan(&ts_sack), (true, false));
        assert_eq!(scan(&[2, 4, 5, 180]), (false, true), "MSS is not for ACKs");
        assert_eq!(scan(&[1, 1, 8, 10, 0, 0]), (false, true), "truncated");
        assert_eq!(
            scan(&[5, 7, 0, 0, 0, 0, 0]),
            (false, true),
            "bad SACK length"
        );
        assert_eq!(scan(&[0, 0, 0, 0]), (false, false), "EOL padding");
        assert_eq!(scan(&[1, 1, 1, 0]), (false, false), "NOP padding");
        assert_eq!(
            scan(&[0, 2, 4]),
            (false, true),
            "bytes after EOL must be padding"
        );
        let sack_only = [1, 1, 5, 10, 0, 0, 0, 1, 0, 0, 0, 2];
        assert_eq!(scan(&sack_only), (true, false));
        let ts_after = [8, 10, 0, 0, 0, 1, 0, 0, 0, 2, 1, 1];
        assert_eq!(scan(&ts_after), (false, false), "timestamps padded after");
        let mut cut = [0u8; 16];
        cut[..12].copy_from_slice(&ts_after);
        cut[12..].copy_from_slice(&[1, 1, 5, 18]);
        assert_eq!(scan(&cut), (false, true), "a SACK block past the options");
        assert_eq!(scan(&[]), (false, false));
    }

    #[test]
    fn a_kept_ack_whose_options_are_not_understood_tells_no_blocks() {
        // Block [11000, 12000) in a SACK option the header's length (4 bytes of options) cuts:
        // the sender's TCP drops the option whole, so keeping the ACK told it nothing.
        let block = [0, 0, 0x2a, 0xf8, 0, 0, 0x2e, 0xe0];
        let mut cut = [0u8; 64];
        cut[..4].copy_from_slice(&[1, 1, 5, 10]);
        cut[4..12].copy_from_slice(&block);
        // Two SACK options: the sender reads the last one.
        let mut two = [0u8; 64];
        two[..12].copy_from_slice(&cut[..12]);
        two[12..16].copy_from_slice(&[1, 1, 5, 10]);
        for (opts, len) in [(cut, 4), (two, 24)] {
            let mut seen = ack(2000);
            scan_options(&opts, len, &mut seen);
            assert_eq!(
                seen,
                AckSeen {
                    unknown_option: true,
                    ..ack(2000)
                },
                "nothing read from the options"
            );
            let mut st = state(1000);
            record(&mut st, &seen, true);
            assert!(!st.told(SackBlock {
                start: 11_000,
                end: 12_000
            }));
        }
    }

    #[test]
    fn record_keeps_the_highest_ack() {
        let mut st = AckState::default();
        record(&mut st, &ack(2000), false);
        record(&mut st, &ack(1500), false);
        assert_eq!((st.last_ack, st.seen), (2000, 1));
    }

    #[test]
    fn only_acks_the_mode_could_not_drop_jump_their_flows_queue() {
        use AckFilter::*;
        for reason in KeepReason::ALL {
            let jumps = matches!(reason, KeepReason::NoLaterData | KeepReason::Window);
            assert_eq!(jumps_queue(Conservative, reason, 2), jumps, "{reason:?}");
            assert!(!jumps_queue(Conservative, reason, 1), "{reason:?}");
            assert_eq!(jumps_queue(Aggressive, reason, 1), jumps, "{reason:?}");
            assert!(!jumps_queue(Aggressive, reason, 0), "{reason:?}");
            assert!(!jumps_queue(Off, reason, 2), "{reason:?}");
        }
    }

    /// In conservative mode with `ahead`, an ACK at 2000 is dropped when data beyond it is on
    /// its way (the receiver acknowledges it whatever the sender does), and kept when the later
    /// ACK needs the sender to send the rest of a write.
    fn assert_clocks_only_what_the_receiver_sends_anyway(st: &AckState, ahead: Ahead) {
        let c = AckFilter::Conservative;
        assert_eq!(
            decide(c, &ack(2000), st, Some(&pushed(5000)), ahead),
            AckVerdict::Drop
        );
        let mid = ReverseState::first(2000, ACK);
        assert_eq!(
            decide(c, &ack(2000), st, Some(&mid), ahead),
            AckVerdict::Keep(KeepReason::FewScheduled)
        );
    }

    #[test]
    fn a_lent_packet_is_recorded_no_further_ahead_than_its_window() {
        let now = 1_000 * MS;
        // A departure is recorded as it is, however far ahead.
        assert_eq!(
            on_wire(now + 50 * MS, now + 50 * MS, now, 2 * MS),
            now + 50 * MS
        );
        // A lent packet that leaves now: where the calendar booked it, within the window or
        // capped to it.
        assert_eq!(
            on_wire(LENT | (now + MS), now, now, 2 * MS),
            LENT | (now + MS)
        );
        assert_eq!(
            on_wire(LENT | (now + 50 * MS), now, now, 2 * MS),
            LENT | (now + 2 * MS)
        );
        // No window: the booking.
        assert_eq!(
            on_wire(LENT | (now + 50 * MS), now, now, 0),
            LENT | (now + 50 * MS)
        );
        // Lent to, but held by its flow's clock: scheduled until it departs.
        assert_eq!(
            on_wire(LENT | (now + 50 * MS), now + 3 * MS, now, 2 * MS),
            now + 3 * MS
        );
    }

    #[test]
    fn a_lent_packet_clocks_only_what_the_receiver_sends_anyway() {
        let now = 100 * MS;
        let st = state(1000);
        // The flow's last ACK was lent a departure now; the calendar expects the link to carry
        // it 2 ms from now. Its previous one is scheduled 1 ms ahead.
        let ahead = Ahead::of(LENT | (now + 2 * MS), now + MS, now, &st);
        assert_eq!(ahead, Ahead { all: 2, fresh: 1 });
        assert_eq!(scheduled_ahead(LENT | (now - MS), 0, now, true), 0);
        // For the rest of a write, the sender may already have heard the lent one.
        assert_clocks_only_what_the_receiver_sends_anyway(&st, ahead);
        // Alone ahead in aggressive mode: it clocks a drop, but a kept ACK has nothing to jump
        // ahead of (it has left).
        let a = AckFilter::Aggressive;
        let lent_only = Ahead::of(LENT | (now + 2 * MS), 0, now, &st);
        assert_eq!(lent_only, Ahead { all: 1, fresh: 0 });
        assert_eq!(
            decide(a, &ack(2000), &st, Some(&pushed(5000)), lent_only),
            AckVerdict::Drop
        );
        assert!(!jumps_queue(a, KeepReason::NoLaterData, lent_only.fresh));
    }

    #[test]
    fn acks_a_jump_overtook_clock_only_what_the_receiver_sends_anyway() {
        let now = 100 * MS;
        let mut st = state(1000);
        st.overtaken(now + 2 * MS);
        let ahead = Ahead::of(now + 2 * MS, now + MS, now, &st);
        assert_eq!(ahead, Ahead { all: 2, fresh: 0 });
        // For the rest of a write, only ACKs with news for the sender would bring it.
        assert_clocks_only_what_the_receiver_sends_anyway(&st, ahead);
        // Packets scheduled after the jump are fresh again; the horizon never moves back.
        st.overtaken(now);
        assert_eq!(
            Ahead::of(now + 4 * MS, now + 3 * MS, now, &st),
            Ahead { all: 2, fresh: 2 }
        );
        assert_eq!(
            Ahead::of(now + 4 * MS, now + MS, now, &st),
            Ahead { all: 2, fresh: 1 }
        );
        let mid = ReverseState::first(2000, ACK);
        assert_eq!(
            decide(
                AckFilter::Conservative,
                &ack(2000),
                &st,
                Some(&mid),
                Ahead { all: 2, fresh: 2 }
            ),
            AckVerdict::Drop
        );
    }

    /// The options of an ACK with timestamps and SACK `blocks`.
    fn sack_options(blocks: &[(u32, u32)]) -> Vec<u8> {
        let mut o = vec![1, 1, 8, 10, 0, 0, 0, 7, 0, 0, 0, 9, 1, 1, 5];
        o.push(2 + 8 * blocks.len() as u8);
        for (start, end) in blocks {
            o.extend_from_slice(&start.to_be_bytes());
            o.extend_from_slice(&end.to_be_bytes());
        }
        o
    }

    /// An ACK for `ack` with `options`, as the scan reads them.
    fn scanned(ack: u32, options: &[u8]) -> AckSeen {
        let mut seen = super::tests::ack(ack);
        let mut buf = [0u8; 64];
        buf[..options.len()].copy_from_slice(options);
        scan_options(&buf, options.len(), &mut seen);
        seen
    }

    /// An ACK for `ack` with timestamps and SACK `blocks`, as the scan reads it.
    fn sacked(ack: u32, blocks: &[(u32, u32)]) -> AckSeen {
        let seen = scanned(ack, &sack_options(blocks));
        assert!(!seen.unknown_option);
        assert_eq!(seen.sack_count as usize, blocks.len());
        for (b, (start, end)) in seen.sack.iter().zip(blocks) {
            assert_eq!((b.start, b.end), (*start, *end));
        }
        seen
    }

    #[test]
    fn sack_blocks_are_dropped_once_data_beyond_them_has_arrived() {
        let st = state(2000);
        let c = AckFilter::Conservative;
        // The hole at 2000 stays; 5000-6000 arrived; data up to 7000 has arrived since.
        let dup = sacked(2000, &[(5000, 6000)]);
        assert_eq!(
            decide(c, &dup, &st, Some(&pushed(7000)), 2),
            AckVerdict::Drop
        );
        // Nothing beyond the block yet: the next ACK may not come.
        assert_eq!(
            decide(c, &dup, &st, Some(&pushed(6000)), 2),
            AckVerdict::Keep(KeepReason::Sack)
        );
        assert_eq!(
            decide(c, &dup, &st, None, 2),
            AckVerdict::Keep(KeepReason::Sack)
        );
        // Two holes: the newest block first, the older one repeated. Data must have arrived
        // beyond the furthest block, not only the first: data up to 9000 is already at the
        // receiver (its second block), so nothing else says another ACK comes.
        let two = sacked(2000, &[(5000, 6000), (8000, 9000)]);
        assert_eq!((two.sack_reach, two.sack_full), (9000, false));
        assert_eq!(
            decide(c, &two, &st, Some(&pushed(9000)), 2),
            AckVerdict::Keep(KeepReason::Sack)
        );
        assert_eq!(
            decide(c, &two, &st, Some(&pushed(10_000)), 2),
            AckVerdict::Drop
        );
        // Three blocks beside timestamps fill the option: the next ACK may push the oldest out
        // to report a new one, unless an ACK kept before told the sender of it.
        let three = sacked(2000, &[(11_000, 12_000), (5000, 6000), (8000, 9000)]);
        assert!(three.sack_full);
        assert_eq!(
            decide(c, &three, &st, Some(&pushed(20_000)), 2),
            AckVerdict::Keep(KeepReason::SackFull)
        );
        // `three` after an earlier ACK carrying `block`, kept or not.
        let after_one = |block: (u32, u32), kept: bool| {
            let mut earlier = st;
            record(&mut earlier, &sacked(2000, &[block]), kept);
            (
                decide(c, &three, &earlier, Some(&pushed(20_000)), 2),
                earlier,
            )
        };
        let (verdict, mut told) = after_one((8000, 9000), true);
        assert_eq!(verdict, AckVerdict::Drop);
        // A dropped ACK tells the sender nothing.
        assert_eq!(
            after_one((8000, 9000), false).0,
            AckVerdict::Keep(KeepReason::SackFull)
        );
        // The block has grown since the sender was told of it: the growth is news.
        assert_eq!(
            after_one((8000, 8500), true).0,
            AckVerdict::Keep(KeepReason::SackFull)
        );
        // The last kept ACK replaces what the sender was told of blocks; a cumulative ACK
        // tells it of all below.
        record(&mut told, &sacked(2000, &[(11_000, 12_000)]), true);
        assert_eq!(
            decide(c, &three, &told, Some(&pushed(20_000)), 2),
            AckVerdict::Keep(KeepReason::SackFull)
        );
        let mut acked = st;
        record(&mut acked, &ack(9000), true);
        assert!(acked.told(SackBlock {
            start: 8000,
            end: 9000
        }));
        assert!(!acked.told(SackBlock {
            start: 8000,
            end: 9001
        }));
        // Without timestamps four blocks fit: three leave room for the next.
        let seen = scanned(
            2000,
            &sack_options(&[(11_000, 12_000), (5000, 6000), (8000, 9000)])[12..],
        );
        assert_eq!(
            (seen.sack_count, seen.sack_full, seen.sack_reach),
            (3, false, 12_000)
        );
        assert_eq!(
            decide(c, &seen, &st, Some(&pushed(20_000)), 2),
            AckVerdict::Drop
        );
        // A D-SACK (at or below the cumulative ACK, or within another block) is never
        // repeated.
        let below = sacked(2000, &[(1000, 1500)]);
        assert_eq!(
            decide(c, &below, &st, Some(&pushed(7000)), 2),
            AckVerdict::Keep(KeepReason::Sack)
        );
        let within = sacked(2000, &[(5000, 5500), (5000, 6000)]);
        assert!(within.sack_duplicate);
        assert_eq!(
            decide(c, &within, &st, Some(&pushed(7000)), 2),
            AckVerdict::Keep(KeepReason::Sack)
        );
        // An ACK below the last one is reordered, not redundant; the ACK clock still counts.
        assert_eq!(
            decide(
                c,
                &sacked(1000, &[(5000, 6000)]),
                &st,
                Some(&pushed(7000)),
                2
            ),
            AckVerdict::Keep(KeepReason::Duplicate)
        );
        assert_eq!(
            decide(c, &dup, &st, Some(&pushed(7000)), 1),
            AckVerdict::Keep(KeepReason::FewScheduled)
        );
        // Sequence space wraps inside the blocks too.
        let wrapped = sacked(
            u32::MAX - 5000,
            &[(u32::MAX - 2000, u32::MAX - 1000), (500, 1500)],
        );
        assert_eq!(wrapped.sack_reach, 1500);
        assert_eq!(
            decide(c, &wrapped, &state(u32::MAX - 5000), Some(&pushed(1500)), 2),
            AckVerdict::Keep(KeepReason::Sack)
        );
    }
}
