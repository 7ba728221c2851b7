//! The redundant-ACK filter in the data path (the rule is `shaper_common::ackfilter`, the
//! argument docs/ack-filter.md).
//!
//! Three pieces: the egress program hands each pure ACK to `shaper_ack_filter` by a tail call
//! (so the option walk is verified on its own, not multiplied into the scheduling paths); the
//! filter drops it or hands it to the scheduler; `shaper_ingress` records
//! how far the data direction of each flow has arrived on the same interface. How many of the
//! flow's packets are still ahead on the link comes from its flow state (when its last two go on
//! it).

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    cty::c_void,
    helpers::bpf_skb_load_bytes,
    macros::map,
    maps::{LruHashMap, PerCpuArray},
    programs::TcContext,
};
use shaper_common::{
    abi::{FlowKey, ShaperConfig},
    ackfilter::{
        AckFilter, AckSeen, AckState, AckVerdict, Ahead, ReverseState, decide, is_pure_ack,
        jumps_queue, latest_scheduled, record, scan_options,
    },
    logs,
    stats::DatapathStats,
};

use crate::{
    log,
    parse::{IPPROTO_TCP, PacketInfo},
};

#[map(name = "SHAPER_ACKS")]
static ACKS: LruHashMap<FlowKey, AckState> = LruHashMap::with_max_entries(65_536, 0);

#[map(name = "SHAPER_REVERSE")]
static REVERSE: LruHashMap<FlowKey, ReverseState> = LruHashMap::with_max_entries(65_536, 0);

/// A pure ACK's options, and what `scan` read from them.
#[repr(C)]
pub struct OptionsScratch {
    options: [u64; 8],
    seen: AckSeen,
}

#[map(name = "SHAPER_ACK_SCRATCH")]
static SCRATCH: PerCpuArray<OptionsScratch> = PerCpuArray::with_max_entries(1, 0);

/// Reads the `len` bytes of options in the scratch buffer into its `seen` (only the option
/// fields); 0 if the scratch is missing. A global function, which the verifier checks once on
/// its own: inlined, every layout the scan tells apart was a path through the whole filter, and
/// the filter took 484,000 instructions of the 6.12 verifier (the suite's budget is 500,000).
#[unsafe(export_name = "shaper_ack_scan")]
#[inline(never)]
pub extern "C" fn scan(len: u64) -> u64 {
    let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: per-CPU map value, valid for this run and not shared with other CPUs.
    let scratch = unsafe { &mut *scratch };
    // SAFETY: 64 bytes of plain integers.
    let buf = unsafe { &*(scratch.options.as_ptr() as *const [u8; 64]) };
    scratch.seen = AckSeen::default();
    scan_options(buf, (len & 63) as usize, &mut scratch.seen);
    1
}

/// Whether the egress program hands this packet to the filter.
#[inline(always)]
pub fn candidate(info: &PacketInfo, config: &ShaperConfig) -> bool {
    // No test of the protocol: the parser leaves the TCP fields zero for other protocols, and
    // a branch on the protocol (known on each parsed path) would keep TCP and UDP paths apart
    // through the whole program.
    config.ack_filter != AckFilter::Off as u32
        && is_pure_ack(info.tcp_flags, info.tcp_payload_len())
}

/// What becomes of a pure ACK.
pub enum Filtered {
    Drop,
    /// Scheduled like any packet, behind its flow's.
    Keep,
    /// Scheduled to leave at once, ahead of its flow's packets still scheduled (see
    /// `jumps_queue`), if its flow's queue would hold it.
    KeepFirst,
}

/// The filter's decision on a pure ACK (in `shaper_ack_filter`), `on_wire` being when its flow's
/// two most recent packets go on the link (`fair::recent_on_wire`). Updates the flow's ACK state either way;
/// counts in `stats`.
#[inline(always)]
pub fn filter(
    ctx: &TcContext,
    info: &PacketInfo,
    config: &ShaperConfig,
    on_wire: (u64, u64),
    now: u64,
    stats: &mut DatapathStats,
) -> Filtered {
    stats.ack_seen += 1;
    let mut seen = AckSeen {
        ack: info.tcp_ack,
        window: info.tcp_window,
        flags: info.tcp_flags,
        ..AckSeen::default()
    };
    if !read_options(ctx, info, &mut seen) {
        return Filtered::Keep;
    }
    let key = info.travel_key(false);
    if ACKS.get_ptr_mut(&key).is_none() {
        let _ = ACKS.insert(&key, &AckState::default(), BPF_NOEXIST as u64);
    }
    let Some(state) = ACKS.get_ptr_mut(&key) else {
        return Filtered::Keep;
    };
    // SAFETY: map value, valid for this run.
    let state = unsafe { &mut *state };
    // SAFETY: as above.
    let data = REVERSE.get_ptr_mut(&key).map(|r| unsafe { &*r });
    let mode = AckFilter::from_u32(config.ack_filter);
    let (last, prev) = on_wire;
    let ahead = Ahead::of(last, prev, now, state);
    let verdict = decide(mode, &seen, state, data, ahead);
    if log::on() {
        let decision = match verdict {
            AckVerdict::Drop => logs::ACK_DROP,
            AckVerdict::Keep(reason) => logs::ACK_KEEP + reason as usize,
        };
        log::filtered(info, decision as u64);
    }
    record(state, &seen, verdict != AckVerdict::Drop);
    match verdict {
        AckVerdict::Drop => {
            stats.ack_dropped += 1;
            Filtered::Drop
        }
        AckVerdict::Keep(reason) => {
            if let Some(n) = stats.ack_kept.get_mut(reason as usize) {
                *n += 1;
            }
            if jumps_queue(mode, reason, ahead.fresh) {
                state.overtaken(latest_scheduled(last, prev));
                Filtered::KeepFirst
            } else {
                Filtered::Keep
            }
        }
    }
}

/// Reads the ACK's TCP options into `seen` (its SACK blocks, timestamps, and whether it has an
/// option the scan does not understand); false when there is no scratch space to read them.
#[inline(always)]
fn read_options(ctx: &TcContext, info: &PacketInfo, seen: &mut AckSeen) -> bool {
    let options = (info.tcp_header_len as usize).saturating_sub(20);
    if options > 40 {
        seen.unknown_option = true;
    } else if options > 0 {
        let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
            return false;
        };
        // SAFETY: per-CPU map value, valid for this run and not shared with other CPUs.
        let scratch = unsafe { &mut *scratch };
        // Zeroed word by word (a byte array would become a byte-wise memset loop): bytes past
        // the options read as EOL.
        for w in scratch.options.iter_mut() {
            unsafe { core::ptr::write_volatile(w, 0) };
        }
        let at = info.l4_offset + 20;
        // The raw helper with a length the verifier can bound by itself: hidden from LLVM (a
        // volatile read), so that it cannot fold the mask into what it knows and hand the
        // verifier a register with a range it cannot follow; 1..=64 fits the buffer.
        let len = unsafe { core::ptr::read_volatile(&(options as u32)) };
        let len = (len.wrapping_sub(1) & 63) + 1;
        let buf = scratch.options.as_mut_ptr() as *mut c_void;
        let read = unsafe { bpf_skb_load_bytes(ctx.as_ptr(), at, buf, len) };
        if read != 0 || scan(options as u64) == 0 {
            seen.unknown_option = true;
        } else {
            // The scan wrote only the option fields; the header's are this packet's.
            *seen = AckSeen {
                ack: seen.ack,
                window: seen.window,
                flags: seen.flags,
                ..scratch.seen
            };
        }
    }
    true
}

/// Records how far a data packet arriving at ingress reaches, and whether it ended a write (in
/// `shaper_ingress`).
#[inline(always)]
pub fn observe(info: &PacketInfo) {
    if info.ip_proto != IPPROTO_TCP {
        return;
    }
    let payload = info.tcp_payload_len();
    if payload == 0 {
        return;
    }
    let end = info.tcp_seq.wrapping_add(payload);
    let key = info.travel_key(true);
    match REVERSE.get_ptr_mut(&key) {
        // SAFETY: map value, valid for this run.
        Some(r) => unsafe { (*r).on_data(end, info.tcp_flags) },
        None => {
            let fresh = ReverseState::first(end, info.tcp_flags);
            let _ = REVERSE.insert(&key, &fresh, BPF_NOEXIST as u64);
        }
    }
}
