//! shaper's data path: classify each packet, stamp its Earliest Departure Time, and let `fq`
//! release it on time.
//!
//! Principles:
//! - The fast path parses, looks up, computes and stamps; policy (rates, shares, modes) is the
//!   control plane's, written into maps.
//! - Fail open: a packet this program cannot understand leaves unshaped, and a counter says why.
//!   Only one thing drops: a departure beyond the horizon (the queue's last-resort bound).
//! - The program returns TC_ACT_UNSPEC (TCX_NEXT) for every packet it lets through, so programs
//!   attached after it (another datapath, a firewall) still run.
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![expect(internal_features, reason = "atomic intrinsics: see clock.rs")]

mod ackfilter;
mod calendar;
mod cb;
mod clock;
mod conntrack;
mod dequeue;
mod destination;
mod ecn;
mod fair;
mod kmem;
mod log;
mod parse;
mod segment;
mod stats;

use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC},
    helpers::{bpf_ktime_get_ns, bpf_skb_set_tstamp},
    macros::{classifier, map},
    maps::{Array, PerCpuArray, ProgramArray},
    programs::TcContext,
};
use shaper_common::{
    abi::ShaperConfig,
    autorate, branchless,
    cb::{Slot, jump, rewrite},
    diffserv::MAX_TINS,
    framing::Packet,
    names::program_slots,
    stats::{DatapathStats, DropReason, PassReason, delay_bucket},
};

use crate::{
    cb::ControlBlock,
    fair::Scheduled,
    parse::{MAX_HEADER_BYTES, PacketInfo, ParseError},
};

/// `bpf_skb_set_tstamp`'s CLOCK_MONOTONIC delivery time (5.18+; `BPF_SKB_CLOCK_MONOTONIC` since
/// 6.11, the same value).
const BPF_SKB_TSTAMP_DELIVERY_MONO: u32 = 1;

/// `skb->priority` of control traffic (`TC_PRIO_CONTROL`, include/uapi/linux/pkt_sched.h).
const TC_PRIO_CONTROL: u32 = 7;

#[map(name = "SHAPER_CONFIG")]
static CONFIG: Array<ShaperConfig> = Array::with_max_entries(1, 0);

#[map(name = "SHAPER_STATS")]
static STATS: PerCpuArray<DatapathStats> = PerCpuArray::with_max_entries(1, 0);

/// Programs reached by tail calls (`program_slots`), set by the loader.
#[map(name = "SHAPER_PROGRAMS")]
static PROGRAMS: ProgramArray = ProgramArray::with_max_entries(3, 0);

/// The parsed packet, handed by `shaper_egress` to the programs it tail-calls. A tail call
/// stays on its CPU and nothing else runs there in between (TC programs run with bottom halves
/// off), so one slot per CPU is the packet's own. Read back from a map, every field is unknown
/// to the verifier: the parser's paths (VLAN tags, IPv4 or IPv6, extension headers, TCP or UDP)
/// end here instead of each being walked again through the scheduler.
#[map(name = "SHAPER_PACKET")]
static PACKET: PerCpuArray<PacketInfo> = PerCpuArray::with_max_entries(1, 0);

/// Classifies the packet and hands it on: a pure ACK to the ACK filter, anything else to the
/// scheduler. What it cannot parse leaves unshaped.
#[classifier]
pub fn shaper_egress(ctx: TcContext) -> i32 {
    match try_egress(&ctx) {
        Verdict::Pass => TC_ACT_UNSPEC,
        Verdict::Drop => TC_ACT_SHOT as i32,
    }
}

enum Verdict {
    Pass,
    Drop,
}

#[inline(always)]
fn try_egress(ctx: &TcContext) -> Verdict {
    // The segmenter's filter reads this for the packet at hand: no follower unless
    // `segment::route` makes it one.
    segment::note_follower(false);
    let Some(stats) = STATS.get_ptr_mut(0) else {
        return Verdict::Pass;
    };
    // SAFETY: per-CPU map value, valid for this run and not shared with other CPUs.
    let stats = unsafe { &mut *stats };

    let Some(config) = CONFIG.get(0) else {
        return stats::pass(stats, PassReason::Unconfigured);
    };
    if config.rate_bps == 0 {
        return stats::pass(stats, PassReason::Unconfigured);
    }
    // SAFETY: the context is a valid __sk_buff for the whole run.
    let skb = unsafe { &*ctx.skb.skb };
    if skb.priority == autorate::PROBE_PRIORITY {
        return stats::pass(stats, PassReason::Probe);
    }
    let mut info = match classify(ctx, config) {
        Ok(info) => info,
        Err(_) if segment::wanted(skb, config) => {
            // Its frames come back from the segmenter and are stamped then.
            stats.segmented += 1;
            return Verdict::Pass;
        }
        Err(err) => {
            return stats::pass(
                stats,
                match err {
                    ParseError::NonIp => PassReason::NonIp,
                    ParseError::Malformed | ParseError::NotLinear => PassReason::Malformed,
                },
            );
        }
    };
    // SAFETY: the context is a valid __sk_buff for the whole run.
    let skb = unsafe { &*ctx.skb.skb };
    if config.segmenter_ifindex != 0 {
        let now = unsafe { bpf_ktime_get_ns() };
        if let segment::Route::Segmenter { follower } = segment::route(skb, config, &info, now) {
            // Stamped when it comes back, in its flow's order.
            stats.segmented += !follower as u64;
            stats.segment_followers += follower as u64;
            segment::note_follower(follower);
            return Verdict::Pass;
        }
    }
    info.tin = tin(&info, skb.mark, config);
    // Here rather than in the scheduler, whose stack has no room to spare on 6.1.
    info.wire = config.framing.packet_bytes(Packet {
        qdisc_len: skb.wire_len,
        len: skb.len,
        segs: skb.gso_segs,
        seg_size: skb.gso_size,
        network_offset: info.l3_offset,
    }) as u32;
    let Some(slot) = PACKET.get_ptr_mut(0) else {
        return stats::pass(stats, PassReason::NoState);
    };
    // SAFETY: per-CPU map value, this packet's until the run ends (see `PACKET`).
    unsafe { *slot = info };
    // The jump word, for every packet (`shaper_common::cb::jump`): a candidate that reaches
    // the scheduler was kept.
    let candidate = ackfilter::candidate(&info, config);
    ControlBlock::of(ctx)
        .word(Slot::Jump)
        .write(jump::on_entry(candidate));
    if candidate {
        unsafe { PROGRAMS.tail_call(ctx, program_slots::ACK_FILTER) };
        // The filter could not be called: the ACK is simply kept.
    }
    unsafe { PROGRAMS.tail_call(ctx, program_slots::SCHEDULE) };
    stats::pass(stats, PassReason::NoState)
}

/// Schedules the packet `shaper_egress` parsed: its departure time, its AQM verdict, its
/// counters; then hands it to the marker if its header is to be rewritten.
#[classifier]
pub fn shaper_schedule(ctx: TcContext) -> i32 {
    match try_schedule(&ctx) {
        Verdict::Pass => TC_ACT_UNSPEC,
        Verdict::Drop => TC_ACT_SHOT as i32,
    }
}

#[inline(always)]
fn try_schedule(ctx: &TcContext) -> Verdict {
    let Some(stats) = STATS.get_ptr_mut(0) else {
        return Verdict::Pass;
    };
    // SAFETY: per-CPU map value, valid for this run and not shared with other CPUs.
    let stats = unsafe { &mut *stats };
    let (Some(config), Some(info)) = (CONFIG.get(0), PACKET.get(0)) else {
        return stats::pass(stats, PassReason::NoState);
    };

    // SAFETY: the context is a valid __sk_buff for the whole run.
    let skb = unsafe { &mut *ctx.skb.skb };
    let wire = info.wire as u64;
    let now = unsafe { bpf_ktime_get_ns() };
    // The marker's instructions (see `ecn`): where the IP header is, and what to rewrite.
    let mut cb = ControlBlock::new(&mut skb.cb);
    cb.word(Slot::L3Offset).write(info.l3_offset);
    // Without a branch: one on it let LLVM compute the word's address on each side and store
    // through the result, a moved context pointer the verifier refuses.
    let wash = (config.wash != 0) & (info.tos >> 2 != 0);
    cb.word(Slot::Rewrite).write(wash as u32 * rewrite::WASH);
    cb.word(Slot::Ahead).write(0);
    let depart = match fair::schedule(info, config, wire, now, skb.tstamp, cb.notes()) {
        Scheduled::At {
            depart_ns,
            contended,
            sparse,
        } => {
            // Flags become counts without branches: a branch on a flag the verifier knows
            // keeps the paths that set it apart from those that did not.
            stats.clock_contended += contended as u64;
            stats.sparse += sparse as u64;
            depart_ns
        }
        Scheduled::Dropped(reason) => {
            stats.ecn_capable_dropped += ecn::capable(info) as u64;
            return stats::drop(stats, reason);
        }
        Scheduled::NoState => return stats::pass(stats, PassReason::NoState),
    };
    stamp(ctx, stats, info, config, depart, now, wire);
    // SAFETY: as above; a helper write invalidates packet pointers, not the context.
    let skb = unsafe { &mut *ctx.skb.skb };
    if ControlBlock::new(&mut skb.cb).word(Slot::Rewrite).read() != 0 {
        // A mark or a wash. The marker rewrites the header and returns the verdict; it only
        // comes back here if it could not be called: a wanted mark becomes a drop, a wash is
        // skipped.
        unsafe { PROGRAMS.tail_call(ctx, program_slots::MARK) };
        if ControlBlock::new(&mut skb.cb).word(Slot::Rewrite).read() & rewrite::SET_CE != 0 {
            return stats::drop(stats, DropReason::Codel);
        }
    }
    Verdict::Pass
}

/// Stamps the packet's departure and counts it: its scheduled delay, its tin, and an ACK the
/// scheduler sent ahead of its flow's queue.
#[inline(always)]
fn stamp(
    ctx: &TcContext,
    stats: &mut DatapathStats,
    info: &PacketInfo,
    config: &ShaperConfig,
    depart: u64,
    now: u64,
    wire: u64,
) {
    // SAFETY: the context is a valid __sk_buff for the whole run.
    let skb = unsafe { &mut *ctx.skb.skb };
    let segs = if skb.gso_segs == 0 {
        1
    } else {
        skb.gso_segs as u64
    };
    let bucket = delay_bucket(depart - now);
    if let Some(slot) = stats.delay_hist.get_mut(bucket) {
        *slot += segs;
    }
    stats.over_target += segs * branchless::below(config.aqm.target_ns, depart - now);
    // Marked as a CLOCK_MONOTONIC delivery time, as TCP marks its own: a packet delivered
    // locally after it leaves (ingress shaping, through the IFB) then gets the real time as its
    // receive timestamp, not its departure time read as wall-clock time. The helper takes IP
    // packets only; anything else gets the plain store fq reads just the same.
    // SAFETY: the helper only writes the context's timestamp fields.
    if unsafe { bpf_skb_set_tstamp(ctx.skb.skb, depart, BPF_SKB_TSTAMP_DELIVERY_MONO) } != 0 {
        skb.tstamp = depart;
    }
    if depart > stats.latest_depart_ns {
        stats.latest_depart_ns = depart;
    }
    // The scheduler's answer to the ACK filter (`shaper_common::cb::jump`).
    if ControlBlock::new(&mut skb.cb).word(Slot::Jump).read() == jump::GRANTED {
        // fq sends control-priority packets from its internal queue before any flow's, without
        // reading their time: the one way past the flow's own packets, which fq keeps in time
        // order but only looks at again when the earliest of them is due. Forwarding resets
        // the priority at the next hop; nothing else here reads it.
        skb.priority = TC_PRIO_CONTROL;
        stats.ack_jumped += 1;
    }
    stats.shaped_packets += 1;
    stats.shaped_bytes += wire;
    let t = info.tin as usize & (MAX_TINS - 1);
    stats.tin_packets[t] += 1;
    stats.tin_bytes[t] += wire;
    // The histogram's sum last: beside its buckets it changed the stack slots LLVM spills to,
    // and the verifier pruned fewer states (notebook/verifier.md).
    stats.delay_sum_ns += segs * (depart - now);
}

/// The ACK filter's decision on a pure ACK handed over by `shaper_egress`: drop it, or hand it
/// to the scheduler.
#[classifier]
pub fn shaper_ack_filter(ctx: TcContext) -> i32 {
    let Some(stats) = STATS.get_ptr_mut(0) else {
        return TC_ACT_UNSPEC;
    };
    // SAFETY: per-CPU map value, valid for this run.
    let stats = unsafe { &mut *stats };
    let (Some(config), Some(info)) = (CONFIG.get(0), PACKET.get(0)) else {
        return TC_ACT_UNSPEC;
    };
    let now = unsafe { bpf_ktime_get_ns() };
    let on_wire = fair::recent_on_wire(info, config);
    match ackfilter::filter(&ctx, info, config, on_wire, now, stats) {
        ackfilter::Filtered::Drop => return TC_ACT_SHOT as i32,
        ackfilter::Filtered::Keep => {}
        ackfilter::Filtered::KeepFirst => ControlBlock::of(&ctx)
            .word(Slot::Jump)
            .write(jump::KEEP_FIRST),
    }
    unsafe { PROGRAMS.tail_call(&ctx, program_slots::SCHEDULE) };
    // Not callable: the ACK leaves unshaped, counted.
    match stats::pass(stats, PassReason::NoState) {
        Verdict::Pass | Verdict::Drop => TC_ACT_UNSPEC,
    }
}

/// At ingress: records how far each flow's data has arrived, for the ACK filter. Never delays
/// or drops anything.
#[classifier]
pub fn shaper_ingress(ctx: TcContext) -> i32 {
    let Some(config) = CONFIG.get(0) else {
        return TC_ACT_UNSPEC;
    };
    if config.ack_filter == 0 {
        return TC_ACT_UNSPEC;
    }
    // GRO packets may hold their headers in pages: pull them as the egress path does.
    if let Ok(info) = classify(&ctx, config) {
        ackfilter::observe(&info);
    }
    TC_ACT_UNSPEC
}

/// The segmenter's filter (not direct-action: its verdict is "match" or "no match", and the
/// filter's `mirred` action does the redirect). It matches the packets `shaper_egress` left to
/// the segmenter, and the frames coming back from it: for those the action is skipped (the IFB
/// marked them to skip tc actions once) and matching clears that mark, so it does not follow
/// the frame to the next hop's receive path.
#[classifier]
pub fn shaper_segment(ctx: TcContext) -> i32 {
    let Some(config) = CONFIG.get(0) else {
        return segment::NO_MATCH;
    };
    // SAFETY: the context is a valid __sk_buff for the whole run.
    let skb = unsafe { &*ctx.skb.skb };
    if segment::take_follower() || segment::wanted(skb, config) || segment::returning(skb, config) {
        segment::MATCH
    } else {
        segment::NO_MATCH
    }
}

/// The packet's DiffServ tin: from its fwmark when one is configured and set, else from its
/// DSCP through the mode's table.
#[inline(always)]
fn tin(info: &PacketInfo, mark: u32, config: &ShaperConfig) -> u8 {
    if config.fwmark_mask != 0 {
        let by_mark = (mark & config.fwmark_mask) >> (config.fwmark_shift & 31);
        if by_mark != 0 && by_mark <= config.tins {
            return (by_mark - 1) as u8;
        }
    }
    config.tin_of_dscp[(info.tos >> 2) as usize & 63]
}

/// Sets CE on a packet the AQM picked and washes DSCPs (see `ecn`), after `shaper_egress`
/// stamped it.
#[classifier]
pub fn shaper_mark(ctx: TcContext) -> i32 {
    let Some(stats) = STATS.get_ptr_mut(0) else {
        return TC_ACT_UNSPEC;
    };
    // SAFETY: per-CPU map value, valid for this run.
    let stats = unsafe { &mut *stats };
    let mut cb = ControlBlock::of(&ctx);
    let (l3, what) = (
        cb.word(Slot::L3Offset).read() as usize,
        cb.word(Slot::Rewrite).read(),
    );
    match ecn::rewrite(&ctx, l3, what) {
        Ok(()) => {
            if what & rewrite::SET_CE != 0 {
                stats.ecn_marked += 1;
            }
            TC_ACT_UNSPEC
        }
        // An unwritable header: a wanted mark becomes a drop; a wash is skipped.
        Err(()) if what & rewrite::SET_CE != 0 => match stats::drop(stats, DropReason::Codel) {
            Verdict::Pass => TC_ACT_UNSPEC,
            Verdict::Drop => TC_ACT_SHOT as i32,
        },
        Err(()) => TC_ACT_UNSPEC,
    }
}

/// Parses the headers, pulling them into the linear area once if they are paged.
#[inline(always)]
fn classify(ctx: &TcContext, config: &ShaperConfig) -> Result<parse::PacketInfo, ParseError> {
    let mut info = match parse::parse(ctx, config.link_header_bytes) {
        Err(ParseError::NotLinear) => {
            let want = if ctx.len() < MAX_HEADER_BYTES {
                ctx.len()
            } else {
                MAX_HEADER_BYTES
            };
            ctx.pull_data(want).map_err(|_| ParseError::Malformed)?;
            parse::parse(ctx, config.link_header_bytes)
        }
        other => other,
    }?;
    info.host_src = info.src_addr;
    info.host_dst = info.dst_addr;
    conntrack::before_nat(ctx, &mut info);
    Ok(info)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
