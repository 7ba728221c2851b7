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
    abi::{FlowKey, FlowState, HostRate, HostState, LENT, Levels, ShaperConfig, host_flags},
    ackfilter,
    aqm::{self, DataReach, Verdict},
    branchless, cb,
    diffserv::MAX_TINS,
    edt,
    isolation::{Isolation, fields},
    sizing::{FLOW_CREDIT_NS, ack_round_ns},
    stats::DropReason,
};

use crate::{
    calendar,
    cb::{Notes, Word},
    clock::{self, Reserved},
    ecn,
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

/// Buckets that absorb a host's new flows beyond its per-epoch quota.
const OVERFLOW_BUCKETS: u16 = 16;

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
    let Some((host, _)) = entry(&HOSTS, &host_key) else {
        return Scheduled::NoState;
    };
    // SAFETY: map values stay valid for the program's run.
    let host = unsafe { &mut *host };
    let (flow_fp, host_fp, slack_ns, round_ns) =
        rates(host, &host_key, epoch, config, info.tin, &mut ahead);

    let mut flow_key = key(info, mode.flow_fields(), config);
    let flow = match FLOWS.get_ptr_mut(&flow_key) {
        Some(f) => f,
        None => {
            if host.quota_epoch != epoch {
                host.quota_epoch = epoch;
                host.new_flows = 0;
            }
            host.new_flows += 1;
            if config.flow_quota != 0 && host.new_flows > config.flow_quota as u64 {
                // A flood of new flows from one host shares a few entries of its own instead
                // of evicting other hosts' state.
                flow_key.src_port = (flow_key.src_port ^ flow_key.dst_port) % OVERFLOW_BUCKETS;
                flow_key.dst_port = 0;
                flow_key.overflow = 1;
            }
            match entry(&FLOWS, &flow_key) {
                Some((f, _)) => f,
                None => return Scheduled::NoState,
            }
        }
    };
    // SAFETY: as above.
    let flow = unsafe { &mut *flow };
    if flow.epoch != epoch {
        // A race between CPUs may count a flow twice in an epoch: the bound only gets looser.
        flow.epoch = epoch;
        unsafe { atomic_xadd::<u64, u64, { Relaxed }>(&raw mut host.flows_seen, 1) };
    }

    // A pure ACK while the filter is on, of a flow whose host has other flows' packets booked
    // after its own: charged at least a round's quantum on its flow's clock, so that its flow
    // sends an ACK per round of the bulk flows beside it, as under CAKE's DRR, and the filter
    // thins the ACKs between (`ackfilter::round_quantum_bytes`). Alone, it has no round to
    // keep to and is charged its wire time (a download over a 100 kbit/s uplink). Its flow-time
    // (below) is its wire time either way: the level it leaves unused goes to the others.
    let pure_ack = ackfilter::is_pure_ack(info.tcp_flags, info.tcp_payload_len()) as u64;
    let others_after = branchless::below(
        branchless::max(now, flow.last_depart_ns),
        host.latest_depart_ns,
    );
    let rounds = pure_ack & (config.ack_filter != 0) as u64 & others_after;
    let charged_bytes = branchless::select(
        rounds,
        branchless::max(wire, config.ack_quantum_bytes as u64),
        wire,
    );
    let tx_wire = edt::tx_time_ns(wire, flow_fp);
    // Its round at the host's level before the boost (`HostRate::ack_round_ns`).
    let tx_flow = branchless::select(rounds, branchless::max(tx_wire, round_ns), tx_wire);
    // The flow's queue is how far its clock runs ahead of now: what this packet waits behind
    // its flow's earlier packets. The AQM decides on it before anything is booked, so a dropped
    // packet costs no wire time.
    let flow_clock = unsafe { core::ptr::read_volatile(&raw const flow.clock_ns) };
    // Idle for at least this packet's own time at its level: a sparse flow (a DNS query, a
    // keystroke, a ping) that stays within its share and so waits for nobody.
    let idle = branchless::below(now, flow_clock + tx_flow) ^ 1;
    let unpaced = branchless::below(now, tcp_tstamp) ^ 1;
    // SAFETY: as for the clock; a stale read gives one packet more or less.
    let credit = unsafe { core::ptr::read_volatile(&raw const flow.sparse_credit_bytes) };
    let has_credit = branchless::below(credit, wire) ^ 1;
    // Once found idle, a flow stays sparse while its queue is empty at each packet, within the
    // frame's bytes of credit below: idle for a packet's time is the test to become sparse, not
    // to stay so. A flow at about half its level (echo replies every 10 ms, 5 ms each at one
    // flow's share of 10 Mbit/s among 33) otherwise fell out of it whenever a packet came a
    // little early, its host's guard held that packet behind the bulk flows' 70 ms of
    // bookings, and the pings after it waited behind it: 3-6 pings 50-80 ms late, 4-10 times
    // a run on Linux 6.1. Packets that find their flow's queue not empty (a burst) are not
    // sparse, and pure ACKs take the strict test only: an ACK flow's pace is its download's,
    // and staying sparse at the 30/1 uplink's ACK rates cost the uploads 40 kbit/s in each
    // filter mode (fewer ACKs counted as scheduled, fewer filtered).
    let drained = branchless::below(now, flow_clock) ^ 1;
    let sparse_bit = (idle | (drained & has_credit & (pure_ack ^ 1))) & unpaced;
    // A flow found idle may send a frame's bytes more (CAKE's quantum for a new flow) whose
    // waits behind the bulk bookings are not carried to its clock. Two echo replies 1 ms apart
    // (2 ms each at 0.4 Mbit/s, one flow of 33): the second queues behind the bulk bookings;
    // carried to its flow's clock, that wait made every later ping find its flow busy and queue
    // behind them again, for a second at a time. Its credit spent, a flow that still queues
    // carries its waits again, so a bulk flow's clock stays where its packets leave.
    let credited = has_credit & (sparse_bit ^ 1) & unpaced;
    let quantum = config.aqm.mtu_bytes as u64;
    let left = branchless::select(
        idle,
        quantum - branchless::min(quantum, wire),
        credit - branchless::min(credit, wire),
    );
    unsafe {
        core::ptr::write_volatile(
            &raw mut flow.sparse_credit_bytes,
            branchless::select(sparse_bit | credited, left, 0),
        )
    };
    // Noted in the ahead word and read back where it decides, as the other flags are.
    ahead.insert(sparse_bit as u32 * cb::ahead::SPARSE);
    if config.aqm.enabled() {
        let packet = AqmPacket {
            now,
            queue_ns: flow_clock.saturating_sub(now),
            floor_bytes: charged_bytes,
            flow_ns_per_byte_fp: flow_fp,
            bits: aqm_bits(info, flow),
        };
        match aqm_verdict(flow, config, &packet) {
            Verdict::Pass => {}
            // Noted in the control block rather than carried as a flag.
            Verdict::Mark => rewrite.insert(cb::rewrite::SET_CE),
            Verdict::DropCodel => return Scheduled::Dropped(DropReason::Codel),
            Verdict::DropBlue => return Scheduled::Dropped(DropReason::Blue),
            Verdict::DropOverlimit => return Scheduled::Dropped(DropReason::Overlimit),
        }
    }

    // SAFETY: the clock lives in a map value valid for the run.
    let (want, contended) = match unsafe {
        clock::reserve(
            &raw mut flow.clock_ns,
            now,
            tcp_tstamp,
            tx_flow,
            config.horizon_ns,
            FLOW_CREDIT_NS,
        )
    } {
        Reserved::At(t) => (t, false),
        Reserved::AtContended(t) => (t, true),
        Reserved::BeyondHorizon => return Scheduled::Dropped(DropReason::Horizon),
    };
    // A kept ACK goes ahead of the calendar's bookings, as a host that goes ahead does
    // (`cb::jump` says why).
    let kept = cb::jump::kept(jump.read());
    ahead.insert(kept * cb::ahead::AHEAD);
    // Arithmetic, not compares (see `branchless`): 1 when the filter wants it first and its
    // flow's queue would hold it. Its wire time is charged where it would have waited (the
    // flow's clock above, the host's guard and the calendar below), and it leaves now: the
    // calendar's bins carry the same time, one ACK earlier. As a host that goes ahead, it is
    // not held behind other hosts' bookings.
    let jumps = cb::jump::wanted(jump.read()) & branchless::below(now, want);
    jump.write(cb::jump::answer(jumps));
    ahead.insert(jumps as u32 * cb::ahead::AHEAD);
    // The host's guard: its flows may book ahead of its allocation by the slack (their own
    // queues), no further. It bites only when the flow levels overbook the host. A sparse
    // packet is charged to the guard but not held by it, so it skips its host's queue; it does
    // not skip its host's rate: once the host has booked more than a flow's hard limit ahead
    // (its flows' queues cannot explain that; its traffic is many sparse flows, a flood of new
    // ones, and no flow clock holds it), its sparse packets are dropped before they book
    // anything, and what it sends is held to its allocation.
    //
    // A kept ACK goes ahead of its host's bookings as it goes ahead of the calendar's, when the
    // host has packets of other flows booked to leave after it (uploads beside a download): its
    // wire time, charged to the guard, pushes those. Held behind them, on a 1 Mbit/s uplink
    // with four uploads, a download's ACKs waited 30-60 ms and left in pairs, and its sender
    // answered with bursts that overflowed the modem ahead of the router. A host with nothing
    // booked beyond its ACK flow's own packets (a download over a 100 kbit/s uplink) has nobody
    // to push: the guard holds it to its allocation. Where the guard would have held it is
    // kept for the filter, which counts the ACK until then as it counts a lent one
    // (`behind_host`, below).
    let mut guarded = want;
    let mut behind_host = 0;
    if host_fp != 0 {
        // SAFETY: as for the flow clock; a stale read lets one packet more or less through.
        if noted_sparse(&ahead)
            && unsafe { core::ptr::read_volatile(&raw const host.clock_ns) }
                > now + config.aqm.limit_ns
        {
            return Scheduled::Dropped(DropReason::Overlimit);
        }
        let tx_host = edt::tx_time_ns(wire, host_fp);
        // SAFETY: as for the flow clock.
        match unsafe { clock::reserve(&raw mut host.clock_ns, now, 0, tx_host, u64::MAX, 0) } {
            Reserved::At(start) | Reserved::AtContended(start) => {
                let floor = start.saturating_sub(slack_ns);
                if floor > guarded && !noted_sparse(&ahead) {
                    if kept != 0
                        && host.latest_depart_ns > branchless::max(guarded, flow.last_depart_ns)
                    {
                        behind_host = floor;
                    } else {
                        guarded = floor;
                    }
                }
            }
            Reserved::BeyondHorizon => {}
        }
    }
    let tx_rate = edt::tx_time_ns(wire, config.ns_per_byte_fp);
    let noted = ahead.read();
    let sparse_bit = cb::ahead::sparse(noted);
    let tin_first = priority_tin(info.tin);
    let goes_ahead = tin_first || noted != 0;
    // Read back rather than kept in a register since the guard: a value the verifier tracks
    // across the guard's branches keeps their paths apart.
    let jumps = cb::jump::granted(jump.read());
    // No packet leaves before its flow's last one (a TCP flow's segments stay in order): its
    // clock does not carry the waits of the frame's bytes after an idle spell, so it may stand
    // before packets still booked. A sparse packet leaves now or right behind them.
    let last_depart = flow.last_depart_ns;
    let guarded = branchless::max(branchless::select(sparse_bit, now, guarded), last_depart);
    let guarded = branchless::select(jumps, now, guarded);
    let booked = calendar::book(
        guarded,
        now,
        tx_rate,
        config.calendar_bin_ns,
        (goes_ahead as u64 * calendar::PRIORITY) | (tin_first as u64 * calendar::TIN_FIRST),
    );
    let lent = booked >> LENT.trailing_zeros();
    let depart = branchless::select(lent, guarded, booked & !LENT);
    if depart > branchless::max(want, last_depart) && credited == 0 {
        // Held back by its host or the calendar: the flow's next packet queues behind this one.
        // Not for leaving behind its own flow's packets: a ping that followed the one queued
        // behind the bulk would take its flow's clock there after all.
        unsafe { clock::advance(&raw mut flow.clock_ns, depart + tx_flow) };
    }

    // Flow-time is how far this packet moved its flow's clock: its transmission time at the
    // level plus any push by the calendar. A flow kept busy here accounts for the whole interval
    // whether its level or the overbooked aggregate held it back, so the count of busy flows is
    // the number of flows, not the rate divided by a level that may be wrong. An ACK charged a
    // round's quantum counts its wire time only: an ACK flow at one ACK a round is a fraction
    // of a flow, and the level is set for the flows that use it.
    // Where its flow's clock put it: for a packet sent first, behind its flow's queue.
    let charged = branchless::max(depart, want);
    let clock_ns = charged + tx_wire - want;
    // Held back by its own clock or by the calendar, the flow is bottlenecked here: a flow the
    // calendar delays (others overbooked it) must not read as limited elsewhere, or its share
    // would go to the very flows that overbooked. A sparse packet is held by neither, but one
    // booked while its host's guard already stood more than the slack ahead was sent over the
    // host's allocation: it counts as waited too, or a host of many sparse flows would read as
    // limited elsewhere, its demand measured as what its guard let through.
    let over_allocation = noted_sparse(&ahead)
        && host_fp != 0
        && unsafe { core::ptr::read_volatile(&raw const host.clock_ns) }
            > now + slack_ns + edt::tx_time_ns(wire, host_fp);
    count(host, flow, wire, clock_ns, charged > now || over_allocation);
    if depart > host.latest_depart_ns {
        host.latest_depart_ns = depart;
    }
    // A packet sent ahead of its flow's queue is not scheduled ahead of anything: the flow's
    // departures stay those of its queue, which the filter now reads as stale.
    flow.last_depart_ns = branchless::select(jumps, flow.last_depart_ns, depart);
    let (last, prev) = (flow.last_on_wire_ns, flow.prev_on_wire_ns);
    flow.prev_on_wire_ns = branchless::select(jumps, prev, last);
    // A kept ACK sent ahead of its host's bookings is on its way to the link no earlier than
    // where its host's guard would have held it, for the filter (within the lent window).
    let estimate = branchless::select(
        lent,
        LENT | branchless::max(booked & !LENT, behind_host),
        booked,
    );
    let on_wire = ackfilter::on_wire(estimate, depart, now, config.lent_window_ns as u64);
    flow.last_on_wire_ns = branchless::select(jumps, last, on_wire);
    if depart - now > config.horizon_ns {
        return Scheduled::Dropped(DropReason::Horizon);
    }
    Scheduled::At {
        depart_ns: depart,
        contended,
        sparse: noted_sparse(&ahead),
    }
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

/// What the AQM needs to know of the packet's kind: whether it can carry a mark, whether it may
/// end its sender's write (PSH or FIN; the parser leaves the flags zero for other protocols),
/// and whether it is a retransmission (recording how far its connection's data reaches).
#[inline(always)]
fn aqm_bits(info: &PacketInfo, flow: &mut FlowState) -> u32 {
    use shaper_common::ackfilter::tcp_flags::{FIN, PSH};
    let ends_write = (info.tcp_flags & (PSH | FIN) != 0) as u32;
    let payload = info.tcp_payload_len();
    let data = (info.ip_proto == IPPROTO_TCP) & (payload != 0);
    let ports = DataReach::ports(info.src_port, info.dst_port);
    let retransmit = flow
        .data_reach
        .on_segment(data, ports, info.tcp_seq, payload);
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
) -> (u64, u64, u64, u64) {
    // SAFETY: map value, valid for this run; a stale read takes the last epoch's rates once.
    if unsafe { core::ptr::read_volatile(&raw const host.rates_epoch) } != epoch {
        host.rates = read_rates(host_key, config, tin);
        unsafe { core::ptr::write_volatile(&raw mut host.rates_epoch, epoch) };
    }
    let r = &host.rates;
    // Written without a branch; the host's flag is the word's `AHEAD` bit.
    ahead.write((r.flags & host_flags::AHEAD) as u32);
    (
        r.flow_ns_per_byte_fp,
        r.host_ns_per_byte_fp,
        r.slack_ns,
        r.ack_round_ns,
    )
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
            flags: goes_ahead * host_flags::AHEAD,
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
/// single-level modes share one pseudo-host.
///
/// Every field is written once, by value: a key zeroed first and then filled in made LLVM call
/// a byte-wise `memset` of its 40 bytes, a tenth of the data path's time per packet.
#[inline(always)]
fn key(info: &PacketInfo, want: u32, config: &ShaperConfig) -> FlowKey {
    const NO_ADDR: [u32; 4] = [0; 4];
    let v6 = info.l3_proto == ETH_P_IPV6;
    let src = if want & fields::SRC_HOST != 0 {
        host_addr(&info.src_addr, v6, config)
    } else if want & fields::SRC_ADDR != 0 {
        info.src_addr
    } else {
        NO_ADDR
    };
    let dst = if want & fields::DST_HOST != 0 {
        host_addr(&info.dst_addr, v6, config)
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
        family: match (want == fields::NONE, v6) {
            (true, _) => 0,
            (false, true) => 6,
            (false, false) => 4,
        },
        overflow: 0,
        // Hosts and flows are per tin, as in CAKE (a host's voice and bulk traffic are two).
        tin: info.tin,
    }
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
