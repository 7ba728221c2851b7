//! Debug events of the data path (`shaper run --log-datapath`): a packet's classification, the
//! AQM's marks and drops, the ACK filter's decisions; at most `logs::EVENTS_PER_SECOND` of each
//! kind per CPU (`shaper_common::logs`), through aya-log's ring buffer.
//!
//! Two invariants:
//! - Off costs nothing. Every event is sent from behind [`on`], a read-only global the loader
//!   sets before the verifier runs: off, the verifier knows the branch is never taken, does not
//!   walk it and removes it from the program.
//! - On, the programs' frames stay as they were. Each event is sent from a global function of
//!   its own: a frame of its own on top of the caller's (the record is built there, and the
//!   two must stay within the kernel's 512 bytes), called with pointers to what the caller
//!   already has (its keys, a map value) rather than with copies; and verified once, on its
//!   own, rather than again for every state the caller reaches it in (the ACK filter reaches
//!   it with each of its decisions).

use aya_ebpf::{Global, helpers::bpf_ktime_get_ns, macros::map, maps::PerCpuArray};
use aya_log_ebpf::debug;
use shaper_common::{
    abi::{FlowKey, FlowState},
    isolation::SELF_HOST,
    logs::{ACK_DECISIONS, AQM_VERDICTS, Buckets, Kind, NAME_BYTES},
};

use crate::parse::{ETH_P_IPV6, PacketInfo};

/// Non-zero when events are sent; set by the loader (`logs::SWITCH`).
#[unsafe(no_mangle)]
static SHAPER_LOG_DATAPATH: Global<u32> = Global::new(0);

#[map(name = "SHAPER_LOG_BUCKETS")]
static BUCKETS: PerCpuArray<Buckets> = PerCpuArray::with_max_entries(1, 0);

/// Whether events are sent: a constant to the verifier (see the module's invariants).
#[inline(always)]
pub fn on() -> bool {
    SHAPER_LOG_DATAPATH.load() != 0
}

/// The packet's tin, host and flow as the scheduler keyed them (`created`: its flow's entry is
/// new).
#[unsafe(export_name = "shaper_log_classified")]
#[inline(never)]
pub extern "C" fn classified(host: *const FlowKey, flow: *const FlowKey, created: u64) -> u64 {
    // SAFETY: null or valid for the call (the verifier checks the caller's pointers).
    let (Some(host), Some(flow)) = (unsafe { host.as_ref() }, unsafe { flow.as_ref() }) else {
        return 0;
    };
    let Some(refused) = admit(Kind::Classify) else {
        return 0;
    };
    debug!(
        &(),
        "classify: host {:i} > {:i}, flow {} > {} proto {} tin {} new {} ({} not logged)",
        key_addr(&host.src, host.family),
        key_addr(&host.dst, host.family),
        flow.src_port,
        flow.dst_port,
        flow.proto,
        flow.tin,
        created,
        refused
    );
    1
}

/// The AQM's mark or drop (`verdict`, an `aqm::Verdict`) of `info`, its flow's queue standing
/// `queue_ns` ahead.
#[unsafe(export_name = "shaper_log_judged")]
#[inline(never)]
pub extern "C" fn judged(
    info: *const PacketInfo,
    flow: *const FlowState,
    queue_ns: u64,
    verdict: u64,
) -> u64 {
    // SAFETY: as in `classified`.
    let (Some(info), Some(flow)) = (unsafe { info.as_ref() }, unsafe { flow.as_ref() }) else {
        return 0;
    };
    let Some(refused) = admit(Kind::Aqm) else {
        return 0;
    };
    debug!(
        &(),
        "aqm: {:i} {} > {:i} {} proto {} queue {} us, count {}, blue {}/65536 ({} not logged): {}",
        packet_addr(&info.src_addr, info.l3_proto),
        info.src_port,
        packet_addr(&info.dst_addr, info.l3_proto),
        info.dst_port,
        info.ip_proto,
        queue_ns / 1_000,
        flow.aqm.count,
        flow.aqm.p_drop >> 16,
        refused,
        name(&AQM_VERDICTS, verdict as usize)
    );
    1
}

/// The ACK filter's decision on `info` (`logs::ACK_DROP`, or `logs::ACK_KEEP` + its reason).
#[unsafe(export_name = "shaper_log_filtered")]
#[inline(never)]
pub extern "C" fn filtered(info: *const PacketInfo, decision: u64) -> u64 {
    // SAFETY: as in `classified`.
    let Some(info) = (unsafe { info.as_ref() }) else {
        return 0;
    };
    let Some(refused) = admit(Kind::AckFilter) else {
        return 0;
    };
    debug!(
        &(),
        "ack filter: {:i} {} > {:i} {} ack {} window {} ({} not logged): {}",
        packet_addr(&info.src_addr, info.l3_proto),
        info.src_port,
        packet_addr(&info.dst_addr, info.l3_proto),
        info.dst_port,
        info.tcp_ack,
        info.tcp_window,
        refused,
        name(&ACK_DECISIONS, decision as usize)
    );
    1
}

/// This CPU's budget for one more event of `kind`: how many it refused before, or `None`.
#[inline(always)]
fn admit(kind: Kind) -> Option<u64> {
    let buckets = BUCKETS.get_ptr_mut(0)?;
    // SAFETY: per-CPU map value, valid for this run and not shared with other CPUs.
    let bucket = unsafe { (*buckets).by_kind.get_mut(kind as usize)? };
    bucket.admit(unsafe { bpf_ktime_get_ns() })
}

/// A decision's name from its table, as text (the names are ASCII); empty past the table.
#[inline(always)]
fn name<const N: usize>(table: &'static [[u8; NAME_BYTES]; N], at: usize) -> &'static str {
    match table.get(at) {
        // SAFETY: `logs::name` writes ASCII only.
        Some(bytes) => unsafe { core::str::from_utf8_unchecked(bytes) },
        None => "",
    }
}

/// A key's address as IPv6 (IPv4 mapped, `::ffff:a.b.c.d`; `::` for a key without one). Built
/// word by word: bytes set one by one each take a stack slot of their own.
#[inline(always)]
fn key_addr(words: &[u32; 4], family: u8) -> [u8; 16] {
    let v4_mapped = u32::from_ne_bytes([0, 0, 0xff, 0xff]);
    let words = match family {
        // The machine itself reads as ffff:...:ffff in either family.
        _ if *words == SELF_HOST => SELF_HOST,
        4 => [0, 0, v4_mapped, words[0]],
        6 => *words,
        _ => [0; 4],
    };
    // SAFETY: four words are sixteen bytes, in the order they came off the wire.
    unsafe { core::mem::transmute::<[u32; 4], [u8; 16]>(words) }
}

/// A packet's address as IPv6 (IPv4 mapped).
#[inline(always)]
fn packet_addr(words: &[u32; 4], l3_proto: u16) -> [u8; 16] {
    key_addr(words, if l3_proto == ETH_P_IPV6 { 6 } else { 4 })
}
