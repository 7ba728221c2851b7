//! Fair scheduling at stamping time: a packet departs when its flow's clock (advancing at its
//! host's flow level) and the calendar (holding the aggregate to the rate) both allow it
//! (docs/design.md, "Fairness").
//!
//! The data path only applies levels: the control plane decides them (per host in
//! `SHAPER_HOST_RATES`, for newcomers in `SHAPER_LEVELS`) and reads the cumulative counters this
//! module keeps in `SHAPER_HOSTS`. Nothing here divides or loops over flows.

use core::intrinsics::{AtomicOrdering::Relaxed, atomic_xadd};

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::bpf_get_prandom_u32,
    macros::map,
    maps::{Array, HashMap, LruHashMap},
};
use shaper_common::{
    abi::{FlowKey, FlowState, HostRate, HostState, Levels, ShaperConfig, host_flags},
    ackfilter,
    aqm::{self, DataReach, Verdict},
    branchless, cb,
    diffserv::MAX_TINS,
    edt,
    isolation::{self, Isolation, SELF_HOST, fields},
    schedule::{self, Charge, Guarded},
    sizing::{FLOW_CREDIT_NS, OWN_ADDRESSES, ack_round_ns},
    stats::DropReason,
};

use crate::{
    calendar,
    cb::{Notes, Word},
    clock::{self, Reserved},
    destination, ecn, log,
    parse::{ETH_P_IPV6, IPPROTO_TCP, PacketInfo},
};

#[map(name = "SHAPER_LEVELS")]
static LEVELS: Array<Levels> = Array::with_max_entries(1, 0);

/// Sizes are defaults; the loader sets them from the configuration.
#[map(name = "SHAPER_HOSTS")]
static HOSTS: LruHashMap<FlowKey, HostState> = LruHashMap::with_max_entries(65_536, 0);

#[map(name = "SHAPER_HOST_RATES")]
static HOST_RATES: HashMap<FlowKey, HostRate> = HashMap::with_max_entries(65_536, 0);

#[map(name = "SHAPER_FLOWS")]
static FLOWS: LruHashMap<FlowKey, FlowState> = LruHashMap::with_max_entries(1_048_576, 0);

/// The machine's own addresses (`isolation::own_lookup_key`), written by the control plane as
/// they change: in a host field, each is the one host `isolation::SELF_HOST`.
#[map(name = "SHAPER_OWN_ADDRS")]
static OWN_ADDRS: HashMap<[u32; 4], u8> = HashMap::with_max_entries(OWN_ADDRESSES, 0);

pub enum Scheduled {
    /// Depart at this time; `contended` when a clock took its fallback path.
    At {
        depart_ns: u64,
        contended: bool,
        /// Its flow was idle: it leaves at once, ahead of the calendar and its host's guard.
        sparse: bool,
    },
    /// Dropped, for this reason; no clock was advanced.
    Dropped(DropReason),
    /// A map could not be read or written (full, or not loaded): the caller fails open.
    NoState,
}

/// Schedules one packet of `wire` bytes: its flow's clock at the flow level of its host, then
/// the calendar that holds the aggregate to the rate. It notes what it decides in the packet's
/// control block (`notes`; `shaper_common::cb` says why there): the AQM's mark in the rewrite
/// word, whether the packet goes ahead of the calendar's bookings (its host's, a kept ACK's, a
/// sparse one's) in the ahead word, from where that is decided to the booking and the branches
/// on it, and its answer to the ACK filter in the jump word: a pure ACK the filter kept goes
/// ahead of the bookings; one it wants sent first leaves now instead of behind its flow's
/// packets, charged to its flow's clock, its host's guard and the calendar as if it had waited;
/// it is not recorded among its flow's departures (see `recent_on_wire`).
#[inline(always)]
pub fn schedule(
    info: &PacketInfo,
    config: &ShaperConfig,
    wire: u64,
    now: u64,
    tcp_tstamp: u64,
    notes: Notes,
) -> Scheduled {
    let Notes {
        mut rewrite,
        mut ahead,
        mut jump,
    } = notes;
    let mode = Isolation::from_u32(config.isolation).unwrap_or_default();
    // Offset by one so that a fresh entry (epoch fields zero) is unmarked in epoch 0 too.
    let epoch = match LEVELS.get(0) {
        Some(l) => l.epoch + 1,
        None => 1,
    };
    let host_key = key(info, mode.host_fields(), config);
    let Some(host) = host_entry(&host_key) else {
        return Scheduled::NoState;
    };
    let paces = rates(host, &host_key, epoch, config, info.tin, &mut ahead);
    let mut flow_key = key(info, mode.flow_fields(), config);
    let (flow, created) = match FLOWS.get_ptr_mut(&flow_key) {
        Some(f) => (f, false),
        None => {
            admit(host, &mut flow_key, config, epoch);
            match entry(&FLOWS, &flow_key) {
                Some(e) => e,
                None => return Scheduled::NoState,
            }
        }
    };
    if log::on() {
        log::classified(&host_key, &flow_key, created as u64);
    }
    // SAFETY: as for the host.
    let flow = unsafe { &mut *flow };
    seen(host, flow, epoch);
    let at = At { wire, now };
    // 3. What the flow is at this packet, and what the packet is charged.
    let stood = stand(info, config, host, flow, &paces, at, tcp_tstamp, &mut ahead);
    // 4. The AQM, before anything is booked: a dropped packet costs no wire time.
    if let Err(reason) = judge(info, config, flow, &paces, &stood, now, &mut rewrite) {
        return Scheduled::Dropped(reason);
    }
    // 5. The flow's clock, the ACK filter's answer, the host's guard.
    let clocks = match clocks(
        config, &host_key, host, flow, &paces, &stood, at, tcp_tstamp, &mut ahead, &mut jump,
    ) {
        Ok(c) => c,
        Err(reason) => return Scheduled::Dropped(reason),
    };
    // 6. The calendar, and the departure.
    let stamped = stamp(info, config, flow, &clocks, at, &ahead, &jump);
    // Beyond the horizon, dropped before its flow's clock and last departure move: those
    // would carry its wait to every later packet of the flow, each dropped in turn.
    if stamped.depart - now > config.horizon_ns {
        return Scheduled::Dropped(DropReason::Horizon);
    }
    // 7. The flow's clock behind a wait, the counters, and when the link carries it.
    account(
        config, host, flow, &paces, &clocks, &stamped, &stood, at, &ahead,
    );
    Scheduled::At {
        depart_ns: stamped.depart,
        contended: clocks.contended,
        sparse: noted_sparse(&ahead),
    }
}

/// A host's paces as the data path applies them (see `rates`).
struct Paces {
    /// ns per byte (fixed point) of its flows' clocks.
    flow_fp: u64,
    /// ns per byte of its guard; 0 for none.
    host_fp: u64,
    /// How far its flows may book ahead of its allocation.
    slack_ns: u64,
    /// A round at its flows' level, for a pure ACK charged one.
    round_ns: u64,
}

/// Phase 1: the host's entry, created if missing.
#[inline(always)]
fn host_entry<'a>(host_key: &FlowKey) -> Option<&'a mut HostState> {
    let (host, _) = entry(&HOSTS, host_key)?;
    // SAFETY: map values stay valid for the program's run.
    Some(unsafe { &mut *host })
}

/// Phase 2: a new flow's key, under its host's quota of new flows an epoch: beyond it, the flow
/// shares an overflow bucket of its host's (`schedule::over_quota`).
#[inline(always)]
fn admit(host: &mut HostState, flow_key: &mut FlowKey, config: &ShaperConfig, epoch: u64) {
    if host.quota_epoch != epoch {
        host.quota_epoch = epoch;
        host.new_flows = 0;
    }
    host.new_flows += 1;
    if schedule::over_quota(host.new_flows, config.flow_quota) {
        flow_key.src_port = schedule::overflow_bucket(flow_key.src_port, flow_key.dst_port);
        flow_key.dst_port = 0;
        flow_key.overflow = 1;
    }
}

/// Counts the flow in its host's flows seen, once an epoch.
#[inline(always)]
fn seen(host: &mut HostState, flow: &mut FlowState, epoch: u64) {
    if flow.epoch != epoch {
        // A race between CPUs may count a flow twice in an epoch: the bound only gets looser.
        flow.epoch = epoch;
        unsafe { atomic_xadd::<u64, u64, { Relaxed }>(&raw mut host.flows_seen, 1) };
    }
}

/// The packet's size on the wire and the time it is scheduled at.
#[derive(Clone, Copy)]
struct At {
    wire: u64,
    now: u64,
}

/// What phase 3 decided.
struct Stood {
    charge: Charge,
    /// The flow's clock as this packet found it: its queue is how far that stands ahead of now.
    flow_clock: u64,
    credited: u64,
}

/// Phase 3: the flow's standing (`schedule::standing`), kept in its credit and noted in the
/// ahead word, and the packet's charge (`schedule::charge`).
#[inline(always)]
fn stand(
    info: &PacketInfo,
    config: &ShaperConfig,
    host: &HostState,
    flow: &mut FlowState,
    paces: &Paces,
    at: At,
    tcp_tstamp: u64,
    ahead: &mut Word,
) -> Stood {
    let pure_ack = ackfilter::is_pure_ack(info.tcp_flags, info.tcp_payload_len()) as u64;
    let others_after = schedule::others_after(at.now, flow.last_depart_ns, host.latest_depart_ns);
    let charge = schedule::charge(
        at.wire,
        paces.flow_fp,
        pure_ack,
        (config.ack_filter != 0) as u64,
        others_after,
        config.ack_quantum_bytes as u64,
        paces.round_ns,
    );
    // SAFETY: map value, valid for the run; a stale read gives one packet more or less.
    let flow_clock = unsafe { core::ptr::read_volatile(&raw const flow.clock_ns) };
    let credit = unsafe { core::ptr::read_volatile(&raw const flow.sparse_credit_bytes) };
    let standing = schedule::standing(
        at.now,
        flow_clock,
        charge.tx_flow_ns,
        tcp_tstamp,
        credit,
        at.wire,
        pure_ack,
        config.aqm.mtu_bytes as u64,
    );
    unsafe { core::ptr::write_volatile(&raw mut flow.sparse_credit_bytes, standing.credit_bytes) };
    // Noted in the ahead word and read back where it decides, as the other flags are.
    ahead.insert(standing.sparse as u32 * cb::ahead::SPARSE);
    Stood {
        charge,
        flow_clock,
        credited: standing.credited,
    }
}

/// Phase 4: the AQM's verdict on the flow's queue, a mark noted in the rewrite word.
#[inline(always)]
fn judge(
    info: &PacketInfo,
    config: &ShaperConfig,
    flow: &mut FlowState,
    paces: &Paces,
    stood: &Stood,
    now: u64,
    rewrite: &mut Word,
) -> Result<(), DropReason> {
    if !config.aqm.enabled() {
        return Ok(());
    }
    let packet = AqmPacket {
        now,
        queue_ns: stood.flow_clock.saturating_sub(now),
        floor_bytes: stood.charge.bytes,
        flow_ns_per_byte_fp: paces.flow_fp,
        bits: aqm_bits(info, &flow.data_reach),
    };
    let verdict = aqm_verdict(flow, config, &packet);
    if log::on() && verdict != Verdict::Pass {
        log::judged(info, flow, packet.queue_ns, verdict as u64);
    }
    let (data, ports, payload) = segment(info);
    flow.data_reach
        .record(data & verdict.goes_on(), ports, info.tcp_seq, payload);
    match verdict {
        Verdict::Pass => Ok(()),
        // Noted in the control block rather than carried as a flag.
        Verdict::Mark => {
            rewrite.insert(cb::rewrite::SET_CE);
            Ok(())
        }
        Verdict::DropCodel => Err(DropReason::Codel),
        Verdict::DropBlue => Err(DropReason::Blue),
        Verdict::DropOverlimit => Err(DropReason::Overlimit),
    }
}

/// What phase 5 decided.
struct Clocks {
    /// Where its flow's clock put the packet.
    want: u64,
    contended: bool,
    /// Where its host's guard holds it, and for a kept ACK sent ahead of its host's other
    /// bookings where it would have (`schedule::Guarded`).
    guarded: Guarded,
}

/// Phase 5: the flow's clock, then the ACK filter's answer, then the host's guard.
#[inline(always)]
fn clocks(
    config: &ShaperConfig,
    host_key: &FlowKey,
    host: &mut HostState,
    flow: &mut FlowState,
    paces: &Paces,
    stood: &Stood,
    at: At,
    tcp_tstamp: u64,
    ahead: &mut Word,
    jump: &mut Word,
) -> Result<Clocks, DropReason> {
    // SAFETY: the clock lives in a map value valid for the run.
    let (want, contended) = match unsafe {
        clock::reserve(
            &raw mut flow.clock_ns,
            at.now,
            tcp_tstamp,
            stood.charge.tx_flow_ns,
            config.horizon_ns,
            FLOW_CREDIT_NS,
        )
    } {
        Reserved::At(t) => (t, false),
        Reserved::AtContended(t) => (t, true),
        Reserved::BeyondHorizon => return Err(DropReason::Horizon),
    };
    // A kept ACK goes ahead of the calendar's bookings, as a host that goes ahead does
    // (`cb::jump` says why).
    let kept = cb::jump::kept(jump.read());
    ahead.insert(kept * cb::ahead::AHEAD);
    // 1 when the filter wants it first and its flow's queue would hold it: its wire time is
    // charged where it would have waited (the flow's clock above, the host's guard and the
    // calendar below), and it leaves now, not held behind other hosts' bookings either.
    let jumps = cb::jump::wanted(jump.read()) & branchless::below(at.now, want);
    jump.write(cb::jump::answer(jumps));
    ahead.insert(jumps as u32 * cb::ahead::AHEAD);
    let guarded = guard(
        config,
        host_key,
        host,
        flow,
        paces,
        at,
        want,
        kept != 0,
        ahead,
    )?;
    Ok(Clocks {
        want,
        contended,
        guarded,
    })
}

/// The host's guard (`schedule::guard`), for a host the control plane guards, and for a host
/// without an allocation its destination's guard too (`schedule::destination_slot`): the packet is held
/// by whichever stands further ahead. A sparse packet of a host that booked past a flow's hard
/// limit ahead of its allocation, or towards a destination whose newcomers did, is dropped
/// before it books anything (`schedule::sparse_over_limit`).
#[inline(always)]
fn guard(
    config: &ShaperConfig,
    host_key: &FlowKey,
    host: &mut HostState,
    flow: &FlowState,
    paces: &Paces,
    at: At,
    want: u64,
    kept: bool,
    ahead: &Word,
) -> Result<Guarded, DropReason> {
    let mut guarded = Guarded {
        at: want,
        behind_host: 0,
    };
    if paces.host_fp != 0 {
        // SAFETY: as for the flow clock; a stale read lets one packet more or less through.
        let host_clock = unsafe { core::ptr::read_volatile(&raw const host.clock_ns) };
        if noted_sparse(ahead)
            && schedule::sparse_over_limit(host_clock, at.now, config.aqm.limit_ns)
        {
            return Err(DropReason::Overlimit);
        }
        let tx_host = edt::tx_time_ns(at.wire, paces.host_fp);
        let slot = schedule::destination_slot(
            Isolation::from_u32(config.isolation)
                .unwrap_or_default()
                .host_fields(),
            host.rates.flags,
            &host_key.dst,
            host_key.tin,
        );
        let shared_start = destination::book(
            slot as u64,
            at.now,
            tx_host,
            config.aqm.limit_ns,
            noted_sparse(ahead) as u64,
        );
        if shared_start == destination::OVER_LIMIT {
            return Err(DropReason::Overlimit);
        }
        // A guard that stands beyond the horizon (and the flows' slack) would only hold the
        // packet there: dropped before the guard books it, as a flow's clock does.
        let beyond = config.horizon_ns.saturating_add(paces.slack_ns);
        // SAFETY: as for the flow clock.
        match unsafe { clock::reserve(&raw mut host.clock_ns, at.now, 0, tx_host, beyond, 0) } {
            Reserved::At(start) | Reserved::AtContended(start) => {
                guarded = schedule::guard(
                    want,
                    branchless::max(start, shared_start),
                    paces.slack_ns,
                    noted_sparse(ahead),
                    kept,
                    host.latest_depart_ns,
                    flow.last_depart_ns,
                );
            }
            Reserved::BeyondHorizon => return Err(DropReason::Horizon),
        }
    }
    Ok(guarded)
}

/// What phase 6 decided.
struct Stamped {
    depart: u64,
    /// The calendar's answer (`calendar::book`).
    booked: u64,
    /// 1 when the calendar lent to it.
    lent: u64,
    /// 1 when it is an ACK sent ahead of its flow's queue.
    jumps: u64,
}

/// Phase 6: the calendar books the packet's wire time at the rate from where it may leave
/// (`schedule::release`).
#[inline(always)]
fn stamp(
    info: &PacketInfo,
    config: &ShaperConfig,
    flow: &FlowState,
    clocks: &Clocks,
    at: At,
    ahead: &Word,
    jump: &Word,
) -> Stamped {
    let tx_rate = edt::tx_time_ns(at.wire, config.ns_per_byte_fp);
    let noted = ahead.read();
    let tin_first = priority_tin(info.tin);
    let goes_ahead = tin_first || noted != 0;
    // Read back rather than kept in a register since the guard: a value the verifier tracks
    // across the guard's branches keeps their paths apart.
    let jumps = cb::jump::granted(jump.read());
    let last_depart = flow.last_depart_ns;
    let released = schedule::release(
        at.now,
        clocks.guarded.at,
        last_depart,
        cb::ahead::sparse(noted),
        jumps,
    );
    let booked = calendar::book(
        released,
        at.now,
        tx_rate,
        config.calendar_bin_ns,
        (goes_ahead as u64 * calendar::PRIORITY) | (tin_first as u64 * calendar::TIN_FIRST),
    );
    let (depart, lent) = schedule::departure(booked, released);
    Stamped {
        depart,
        booked,
        lent,
        jumps,
    }
}

/// Phase 7, for a packet that goes on: its flow's clock carries a wait beyond it
/// (`schedule::carries_wait`); the host's and flow's counters for the control plane, and the
/// flow's departures and on-wire times for the next packets and the ACK filter.
#[inline(always)]
fn account(
    config: &ShaperConfig,
    host: &mut HostState,
    flow: &mut FlowState,
    paces: &Paces,
    clocks: &Clocks,
    stamped: &Stamped,
    stood: &Stood,
    at: At,
    ahead: &Word,
) {
    let depart = stamped.depart;
    if schedule::carries_wait(depart, clocks.want, flow.last_depart_ns, stood.credited) {
        // SAFETY: as for the flow clock.
        unsafe { clock::advance(&raw mut flow.clock_ns, depart + stood.charge.tx_flow_ns) };
    }
    let (charged, flow_time) = schedule::flow_time(depart, clocks.want, stood.charge.tx_wire_ns);
    let over_allocation = noted_sparse(ahead)
        && paces.host_fp != 0
        && schedule::over_allocation(
            true,
            true,
            // SAFETY: as for the flow clock.
            unsafe { core::ptr::read_volatile(&raw const host.clock_ns) },
            at.now,
            paces.slack_ns,
            edt::tx_time_ns(at.wire, paces.host_fp),
        );
    let waited = schedule::waited(charged, at.now, over_allocation);
    count(host, flow, at.wire, flow_time, waited);
    if depart > host.latest_depart_ns {
        host.latest_depart_ns = depart;
    }
    let jumps = stamped.jumps;
    flow.last_depart_ns = branchless::select(jumps, flow.last_depart_ns, depart);
    let estimate =
        schedule::on_wire_estimate(stamped.booked, stamped.lent, clocks.guarded.behind_host);
    let (last, prev) = schedule::recent_on_wire(
        flow.last_on_wire_ns,
        flow.prev_on_wire_ns,
        estimate,
        depart,
        at.now,
        config.lent_window_ns as u64,
        jumps,
    );
    flow.last_on_wire_ns = last;
    flow.prev_on_wire_ns = prev;
}

/// Whether `schedule` noted the packet as sparse, read back from the control block.
#[inline(always)]
fn noted_sparse(ahead: &Word) -> bool {
    (ahead.read() & cb::ahead::SPARSE) != 0
}

/// What the AQM needs to know of a packet.
struct AqmPacket {
    now: u64,
    /// How far its flow's clock stood ahead of now (0: the flow's queue had drained).
    queue_ns: u64,
    /// The size the standing floor is taken on: its size on the wire (its frames' size), or for
    /// an ACK charged a round's quantum the quantum, so that two of its flow's rounds queued
    /// are not a standing queue.
    floor_bytes: u64,
    flow_ns_per_byte_fp: u64,
    /// `aqm::packet` bits.
    bits: u32,
}

/// A packet as its connection's reach counts it: whether it is a TCP segment with data, its
/// connection's ports (`DataReach::ports`) and its payload's length.
#[inline(always)]
fn segment(info: &PacketInfo) -> (bool, u32, u32) {
    let payload = info.tcp_payload_len();
    let data = (info.ip_proto == IPPROTO_TCP) & (payload != 0);
    (
        data,
        DataReach::ports(info.src_port, info.dst_port),
        payload,
    )
}

/// What the AQM needs to know of the packet's kind: whether it can carry a mark, whether it may
/// end its sender's write (PSH or FIN; the parser leaves the flags zero for other protocols),
/// and whether it is a retransmission (what its connection sent reaches past it).
#[inline(always)]
fn aqm_bits(info: &PacketInfo, reach: &DataReach) -> u32 {
    use shaper_common::ackfilter::tcp_flags::{FIN, PSH};
    let ends_write = (info.tcp_flags & (PSH | FIN) != 0) as u32;
    let (data, ports, payload) = segment(info);
    let retransmit = reach.check(data, ports, info.tcp_seq, payload);
    let ends_stream = (info.tcp_flags & FIN != 0) as u32;
    ecn::capable(info) as u32 * aqm::packet::ECT
        + ends_write * aqm::packet::ENDS_WRITE
        + ends_stream * aqm::packet::ENDS_STREAM
        + retransmit
}

/// The AQM's verdict on a packet of `flow`.
#[inline(always)]
fn aqm_verdict(flow: &mut FlowState, config: &ShaperConfig, packet: &AqmPacket) -> Verdict {
    let floor = aqm::standing_floor_ns(
        &config.aqm,
        packet.floor_bytes,
        packet.flow_ns_per_byte_fp,
        config.ns_per_byte_fp,
    );
    // BLUE's coin is only drawn for flows it has a probability for.
    let random = if flow.aqm.p_drop != 0 {
        unsafe { bpf_get_prandom_u32() }
    } else {
        u32::MAX
    };
    let empty = packet.queue_ns == 0;
    flow.aqm.on_packet(
        &config.aqm,
        packet.now,
        packet.queue_ns,
        empty,
        floor,
        packet.bits,
        random,
    )
}

/// When the packet's flow's two most recent packets go on the link (last, previous), for the
/// ACK filter. Computes the flow's key as `schedule` does; a flow not seen yet has none (zeros).
#[inline(always)]
pub fn recent_on_wire(info: &PacketInfo, config: &ShaperConfig) -> (u64, u64) {
    let mode = Isolation::from_u32(config.isolation).unwrap_or_default();
    let key = key(info, mode.flow_fields(), config);
    match FLOWS.get_ptr_mut(&key) {
        // SAFETY: map value, valid for this run.
        Some(f) => unsafe { ((*f).last_on_wire_ns, (*f).prev_on_wire_ns) },
        None => (0, 0),
    }
}

/// The pace of a host's flows and of its guard (0: none), and the guard's slack: the control
/// plane's, or for a newcomer its tin's newcomer level for both (the newcomer is one
/// bottlenecked host more). Read once an epoch into the host's entry (`HostState::rates`): the
/// control plane writes them before it starts the epoch and not again until the next. CPUs
/// that refresh the copy at once write the same values; a packet that reads it while another
/// CPU writes it may take the last epoch's.
///
/// Also notes in the ahead word whether the host's packets go ahead of the calendar's bookings: it used
/// less than its allocation in the last interval (the control plane's `host_flags::AHEAD`), or
/// it is new, runs at the newcomer level, and its tin has bottlenecked hosts
/// (`Levels::newcomers_ahead_tins`). The hosts already there booked the bins ahead at
/// allocations that counted it at what it used then; behind those bookings its share would only
/// exist from the next tick on. Its own clocks still pace it, at its levels, and the wire time
/// it takes pushes the others' packets, which then count as waited.
#[inline(always)]
fn rates(
    host: &mut HostState,
    host_key: &FlowKey,
    epoch: u64,
    config: &ShaperConfig,
    tin: u8,
    ahead: &mut Word,
) -> Paces {
    // SAFETY: map value, valid for this run; a stale read takes the last epoch's rates once.
    if unsafe { core::ptr::read_volatile(&raw const host.rates_epoch) } != epoch {
        host.rates = read_rates(host_key, config, tin);
        unsafe { core::ptr::write_volatile(&raw mut host.rates_epoch, epoch) };
    }
    let r = &host.rates;
    // Written without a branch; the host's flag is the word's `AHEAD` bit.
    ahead.write((r.flags & host_flags::AHEAD) as u32);
    Paces {
        flow_fp: r.flow_ns_per_byte_fp,
        host_fp: r.host_ns_per_byte_fp,
        slack_ns: r.slack_ns,
        round_ns: r.ack_round_ns,
    }
}

/// The host's rates from the control plane's map, or its tin's newcomer level (see `rates`).
#[inline(always)]
fn read_rates(host_key: &FlowKey, config: &ShaperConfig, tin: u8) -> HostRate {
    // SAFETY: map value, valid for this run.
    if let Some(r) = unsafe { HOST_RATES.get(host_key) }
        && r.flow_ns_per_byte_fp != 0
    {
        return *r;
    }
    let t = tin as usize & (MAX_TINS - 1);
    let (newcomer, slack, goes_ahead) = match LEVELS.get(0) {
        Some(l) => (
            l.new_host_ns_per_byte_fp[t],
            l.new_host_slack_ns[t],
            (l.newcomers_ahead_tins >> t) & 1,
        ),
        None => (0, 0, 0),
    };
    match newcomer {
        0 => HostRate {
            flow_ns_per_byte_fp: config.ns_per_byte_fp,
            host_ns_per_byte_fp: 0,
            flags: 0,
            slack_ns: 0,
            ack_round_ns: ack_round_ns(config, config.ns_per_byte_fp),
        },
        newcomer => HostRate {
            flow_ns_per_byte_fp: newcomer,
            host_ns_per_byte_fp: newcomer,
            flags: (goes_ahead * host_flags::AHEAD) | host_flags::NEWCOMER,
            slack_ns: slack,
            ack_round_ns: ack_round_ns(config, newcomer),
        },
    }
}

/// Whether the packet's tin is within its bandwidth threshold and above best effort (the
/// control plane decides each tick): its packets then go ahead of lower tins' queues.
#[inline(always)]
fn priority_tin(tin: u8) -> bool {
    match LEVELS.get(0) {
        Some(l) => (l.priority_tins >> (tin & 7)) & 1 != 0,
        None => false,
    }
}

/// Cumulative counters for the control plane (atomic: several CPUs update a host at once).
#[inline(always)]
fn count(host: &mut HostState, flow: &mut FlowState, wire: u64, clock_ns: u64, waited: bool) {
    unsafe {
        atomic_xadd::<u64, u64, { Relaxed }>(&raw mut host.bytes, wire);
        atomic_xadd::<u64, u64, { Relaxed }>(&raw mut host.packets, 1);
        atomic_xadd::<u64, u64, { Relaxed }>(&raw mut host.busy_ns, clock_ns);
        atomic_xadd::<u64, u64, { Relaxed }>(&raw mut flow.bytes, wire);
        atomic_xadd::<u64, u64, { Relaxed }>(&raw mut flow.packets, 1);
    }
    if waited {
        unsafe {
            atomic_xadd::<u64, u64, { Relaxed }>(&raw mut host.waited_bytes, wire);
            atomic_xadd::<u64, u64, { Relaxed }>(&raw mut host.backlogged_busy_ns, clock_ns);
        }
    }
}

/// The key of `info` made of `want` fields (see `isolation::fields`); all-zero for none, so
/// single-level modes share one pseudo-host. A host field is made of the packet's host
/// addresses (`PacketInfo::host_src`: before NAT, with `--nat`). In it the machine's own addresses are
/// one host (`isolation::SELF_HOST`, with no family where it is the key's only address).
///
/// Every field is written once, by value: a key zeroed first and then filled in made LLVM call
/// a byte-wise `memset` of its 40 bytes, a tenth of the data path's time per packet.
#[inline(always)]
fn key(info: &PacketInfo, want: u32, config: &ShaperConfig) -> FlowKey {
    const NO_ADDR: [u32; 4] = [0; 4];
    let v6 = info.l3_proto == ETH_P_IPV6;
    let src_self = want & fields::SRC_HOST != 0 && own(&info.host_src, v6);
    let dst_self = want & fields::DST_HOST != 0 && own(&info.host_dst, v6);
    let src = if src_self {
        SELF_HOST
    } else if want & fields::SRC_HOST != 0 {
        host_addr(&info.host_src, v6, config)
    } else if want & fields::SRC_ADDR != 0 {
        info.src_addr
    } else {
        NO_ADDR
    };
    let dst = if dst_self {
        SELF_HOST
    } else if want & fields::DST_HOST != 0 {
        host_addr(&info.host_dst, v6, config)
    } else if want & fields::DST_ADDR != 0 {
        info.dst_addr
    } else {
        NO_ADDR
    };
    let (src_port, dst_port, proto) = if want & fields::TRANSPORT != 0 {
        (info.src_port, info.dst_port, info.ip_proto)
    } else {
        (0, 0, 0)
    };
    FlowKey {
        src,
        dst,
        src_port,
        dst_port,
        proto,
        family: isolation::key_family(want, v6, src_self, dst_self),
        overflow: 0,
        // Hosts and flows are per tin, as in CAKE (a host's voice and bulk traffic are two).
        tin: info.tin,
    }
}

/// Whether `addr` is one of the machine's own.
#[inline(always)]
fn own(addr: &[u32; 4], v6: bool) -> bool {
    // SAFETY: a read-only lookup; the value is not kept.
    unsafe { OWN_ADDRS.get(&isolation::own_lookup_key(addr, v6)) }.is_some()
}

#[inline(always)]
fn host_addr(addr: &[u32; 4], v6: bool, config: &ShaperConfig) -> [u32; 4] {
    if v6 {
        let m = &config.host_mask_v6;
        [
            addr[0] & m[0],
            addr[1] & m[1],
            addr[2] & m[2],
            addr[3] & m[3],
        ]
    } else {
        [addr[0] & config.host_mask_v4, 0, 0, 0]
    }
}

/// A fresh map value, from read-only data: building it on the stack makes LLVM call a byte-wise
/// `memset` for values over 32 bytes, a 64-step loop the verifier walks on every path.
trait Zeroed: Sized + 'static {
    const ZERO: &'static Self;
}

impl Zeroed for FlowState {
    // SAFETY: plain integers; all-zero is the documented fresh state.
    const ZERO: &'static Self = &unsafe { core::mem::zeroed() };
}

impl Zeroed for HostState {
    // SAFETY: as above.
    const ZERO: &'static Self = &unsafe { core::mem::zeroed() };
}

/// The entry for `key`, created zeroed if missing; `true` when this call created it.
#[inline(always)]
fn entry<V: Zeroed + 'static>(
    map: &LruHashMap<FlowKey, V>,
    key: &FlowKey,
) -> Option<(*mut V, bool)> {
    if let Some(p) = map.get_ptr_mut(key) {
        return Some((p, false));
    }
    let created = map.insert(key, V::ZERO, BPF_NOEXIST as u64).is_ok();
    map.get_ptr_mut(key).map(|p| (p, created))
}
