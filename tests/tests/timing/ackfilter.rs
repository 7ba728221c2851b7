//! The ACK filter in the running kernel (BPF_PROG_TEST_RUN): the egress program hands pure
//! ACKs to the filter by a tail call, the filter drops those a later ACK will certainly cover
//! (data beyond them seen at ingress, enough of the flow's ACKs scheduled) and calls the egress
//! program back for the others. Every eligibility rule, IPv4 and IPv6.

use shaper::bpf::monotonic_now_ns;
use shaper_common::{
    abi::{HostRate, ShaperConfig},
    ackfilter::{AckFilter, KeepReason, tcp_flags::*},
    edt::{ns_per_byte_fp, tx_time_ns},
    isolation::Isolation,
    sizing::host_slack_ns,
};
use shaper_tests::{
    DROP, Harness, PASS, config,
    packet::{ETH_P_IP, ETH_P_IPV6, Frame, TCP, UDP, ipv4, ipv6, udp_datagram},
    skb::SkbContext,
    with_short_bins,
};

const SECOND: u64 = 1_000_000_000;
/// 100 kbit/s: a 66-byte ACK takes 5 ms, so back-to-back test runs find earlier ones still
/// scheduled even on a loaded machine (at 1 Mbit/s, 0.5 ms, a stall of the test process
/// between two runs let them leave, and an ACK meant to be dropped was kept).
const RATE: u64 = 100_000;
const HOST: [u8; 4] = [10, 0, 0, 1];
const PEER: [u8; 4] = [10, 0, 0, 2];

fn harness(mode: AckFilter) -> Harness {
    Harness::new(ShaperConfig {
        ack_filter: mode as u32,
        ..config(RATE, 10 * SECOND)
    })
}

/// Aggressive mode with a flow per connection, so that another flow's frames book the link
/// ahead of the ACK flow's.
fn aggressive_per_flow() -> ShaperConfig {
    ShaperConfig {
        ack_filter: AckFilter::Aggressive as u32,
        isolation: Isolation::Flows as u32,
        ..config(RATE, 10 * SECOND)
    }
}

/// A full-sized UDP frame of a flow other than the ACKs'.
fn full_frame_of_another_flow() -> Vec<u8> {
    Frame::ether_type(ETH_P_IP)
        .payload(ipv4(UDP, HOST, PEER, &udp_datagram(40001, 5201, 1472)))
        .build()
}

struct Seg {
    seq: u32,
    ack: u32,
    flags: u8,
    window: u16,
    options: Vec<u8>,
    payload: usize,
    v6: bool,
}

impl Seg {
    /// A pure ACK from HOST:40000 to PEER:5201 acknowledging `ack`.
    fn ack(ack: u32) -> Self {
        Self {
            seq: 1,
            ack,
            flags: ACK,
            window: 500,
            options: Vec::new(),
            payload: 0,
            v6: false,
        }
    }

    /// A data segment of the same connection, PEER -> HOST, as it arrives at ingress.
    fn data(seq: u32, len: usize) -> Self {
        Self {
            seq,
            ack: 1,
            flags: ACK | PSH,
            window: 500,
            options: Vec::new(),
            payload: len,
            v6: false,
        }
    }

    fn frame(&self, outgoing: bool) -> Vec<u8> {
        let (sport, dport) = if outgoing {
            (40000, 5201)
        } else {
            (5201, 40000)
        };
        let mut opts = self.options.clone();
        while !opts.len().is_multiple_of(4) {
            opts.push(0);
        }
        let mut t = vec![0u8; 20];
        t[0..2].copy_from_slice(&u16::to_be_bytes(sport));
        t[2..4].copy_from_slice(&u16::to_be_bytes(dport));
        t[4..8].copy_from_slice(&self.seq.to_be_bytes());
        t[8..12].copy_from_slice(&self.ack.to_be_bytes());
        t[12] = (((20 + opts.len()) / 4) as u8) << 4;
        t[13] = self.flags;
        t[14..16].copy_from_slice(&self.window.to_be_bytes());
        t.extend_from_slice(&opts);
        t.extend(std::iter::repeat_n(0x5a, self.payload));
        let (src, dst) = if outgoing { (HOST, PEER) } else { (PEER, HOST) };
        if self.v6 {
            Frame::ether_type(ETH_P_IPV6)
                .payload(ipv6(TCP, src[3], dst[3], &t))
                .build()
        } else {
            Frame::ether_type(ETH_P_IP)
                .payload(ipv4(TCP, src, dst, &t))
                .build()
        }
    }
}

fn send(h: &mut Harness, s: &Seg) -> u32 {
    h.run(&s.frame(true), &SkbContext::default()).verdict
}

fn kept(h: &Harness, r: KeepReason) -> u64 {
    h.view().stats.ack_kept[r as usize]
}

#[test]
fn acks_covered_by_a_certain_later_ack_are_dropped_once_two_are_scheduled() {
    let mut h = harness(AckFilter::Conservative);
    // 100 kB of data has arrived: the receiver will acknowledge up to 100001.
    assert_eq!(h.run_ingress(&Seg::data(1, 1000).frame(false)), PASS);
    assert_eq!(h.run_ingress(&Seg::data(99_001, 1000).frame(false)), PASS);
    // The first leaves at once (an idle flow), the next ones queue behind it at 0.5 ms each.
    assert_eq!(send(&mut h, &Seg::ack(10_001)), PASS, "the first is kept");
    assert_eq!(
        send(&mut h, &Seg::ack(20_001)),
        PASS,
        "none scheduled ahead"
    );
    assert_eq!(send(&mut h, &Seg::ack(30_001)), PASS, "only one ahead");
    assert_eq!(
        send(&mut h, &Seg::ack(40_001)),
        DROP,
        "two ahead, 100001 will come"
    );
    assert_eq!(send(&mut h, &Seg::ack(50_001)), DROP);
    let s = h.view().stats;
    assert_eq!((s.ack_seen, s.ack_dropped), (5, 2));
    assert_eq!(kept(&h, KeepReason::First), 1);
    assert_eq!(kept(&h, KeepReason::FewScheduled), 2);
    // The last ACK, covering everything seen, is never dropped.
    assert_eq!(send(&mut h, &Seg::ack(100_001)), PASS);
    assert_eq!(kept(&h, KeepReason::NoLaterData), 1);
    // Kept ACKs were scheduled like any packet.
    assert_eq!(s.shaped_packets, 3);
}

/// TC_PRIO_CONTROL: what fq sends first, without reading the time.
const SENT_FIRST: u32 = 7;

#[test]
fn a_kept_ack_leaves_ahead_of_its_flows_scheduled_acks_and_is_charged_for_it() {
    // At 10 kbit/s an ACK takes 43 ms: the queued ACKs are still ahead of now when the last
    // ones run, however slowly the runs follow one another.
    let mut h = Harness::new(ShaperConfig {
        ack_filter: AckFilter::Conservative as u32,
        ..config(RATE / 10, 10 * SECOND)
    });
    h.run_ingress(&Seg::data(1, 1000).frame(false));
    h.run_ingress(&Seg::data(99_001, 1000).frame(false));
    let out = |h: &mut Harness, s: &Seg| h.run(&s.frame(true), &SkbContext::default());
    let first = out(&mut h, &Seg::ack(10_001));
    let queued = [
        out(&mut h, &Seg::ack(20_001)),
        out(&mut h, &Seg::ack(30_001)),
    ];
    for o in [&first, &queued[0], &queued[1]] {
        assert_eq!((o.verdict, o.ctx.priority()), (PASS, 0), "{o:?}");
    }
    let tx = queued[1].ctx.tstamp() - queued[0].ctx.tstamp();
    assert!(
        tx > 40_000_000,
        "a 54-byte ACK takes 43 ms at 10 kbit/s: {tx} ns"
    );
    assert_eq!(out(&mut h, &Seg::ack(40_001)).verdict, DROP, "covered");
    // The end of what arrived: kept, and sent now, ahead of the two older ACKs it covers.
    let last = out(&mut h, &Seg::ack(100_001));
    assert_eq!((last.verdict, last.ctx.priority()), (PASS, SENT_FIRST));
    assert!(
        last.ctx.tstamp() < queued[0].ctx.tstamp(),
        "stamped before the ACKs it overtakes: {last:?} {queued:?}"
    );
    let s = h.view().stats;
    assert_eq!((s.ack_jumped, s.shaped_packets), (1, 4));
    // The overtaken ACKs still count for a covered ACK whose later one the receiver sends
    // anyway: no new ACK queues behind them.
    h.run_ingress(&Seg::data(109_001, 1000).frame(false));
    assert_eq!(out(&mut h, &Seg::ack(105_001)).verdict, DROP);
    // Its flow's clock was charged for it: the flow's next packet (data, not for the filter)
    // waits for the stale ACKs and for the wire time the jump took.
    let data = Seg {
        payload: 100,
        ..Seg::ack(105_001)
    };
    let next = out(&mut h, &data);
    assert_eq!((next.verdict, next.ctx.priority()), (PASS, 0));
    assert!(
        next.ctx.tstamp() >= queued[1].ctx.tstamp() + 2 * tx - tx / 10,
        "{next:?} after {queued:?} + 2 x {tx} ns"
    );
    assert_eq!(h.view().stats.ack_jumped, 1);
}

/// Books four full frames of another flow, then sends two ACKs of one flow (the second a
/// duplicate, which every mode keeps, finding its flow's clock ahead of now): how long after
/// the first the second leaves.
fn second_ack_behind_bulk(h: &mut Harness, mode: AckFilter) -> u64 {
    let bulk = full_frame_of_another_flow();
    for _ in 0..4 {
        assert_eq!(h.run(&bulk, &SkbContext::default()).verdict, PASS);
    }
    let start = monotonic_now_ns();
    let first = h.run(&Seg::ack(1_001).frame(true), &SkbContext::default());
    let second = h.run(&Seg::ack(1_001).frame(true), &SkbContext::default());
    assert_eq!((first.verdict, second.verdict), (PASS, PASS), "{mode:?}");
    second.ctx.tstamp().saturating_sub(start)
}

/// Without the filter the second ACK of [`second_ack_behind_bulk`] (run by `wait` in a
/// harness of the mode) waits behind `bookings`; kept, in every mode, it does not.
fn assert_kept_ack_goes_first(wait: impl Fn(AckFilter) -> u64, bookings: &str) {
    let frame_ns = tx_time_ns(1_514, ns_per_byte_fp(RATE));
    let off = wait(AckFilter::Off);
    assert!(off > frame_ns, "behind {bookings}: {off} ns");
    for mode in [AckFilter::Conservative, AckFilter::Aggressive] {
        let kept = wait(mode);
        assert!(
            kept < frame_ns / 4,
            "{mode:?}: ahead of {bookings}, {kept} ns (without the filter {off} ns)"
        );
    }
}

#[test]
fn a_kept_ack_leaves_at_its_flows_clock_not_behind_other_flows_bookings() {
    // Another flow of the same host books the link ahead (four full frames, ~121 ms each at
    // 100 kbit/s); the ACK flow's first ACK leaves at once (its flow was idle), its second (a
    // duplicate, which every mode keeps) finds its flow's clock ahead of now. Without the
    // filter it books behind the bulk frames; kept by the filter, at its flow's clock.
    assert_kept_ack_goes_first(
        |mode| {
            let mut h = Harness::new(ShaperConfig {
                ack_filter: mode as u32,
                ..with_short_bins(aggressive_per_flow())
            });
            h.run_ingress(&Seg::data(1, 1000).frame(false));
            second_ack_behind_bulk(&mut h, mode)
        },
        "the bulk bookings",
    );
}

/// Books four full frames of another flow of the same host when `beside_bulk`, then sends
/// three duplicate ACKs of one flow (which every mode keeps): the spacing of the last two, and
/// the flow-time the host was charged for the three. With `boosted`, a control tick first
/// paces the host's flows at 1.5 times its level, the level itself (its round) at the rate.
fn duplicates_spacing(mode: AckFilter, beside_bulk: bool, boosted: bool) -> (u64, u64) {
    let mut h = Harness::new(ShaperConfig {
        ack_filter: mode as u32,
        ..aggressive_per_flow()
    });
    h.run_ingress(&Seg::data(1, 1000).frame(false));
    if beside_bulk {
        let bulk = full_frame_of_another_flow();
        for _ in 0..4 {
            assert_eq!(h.run(&bulk, &SkbContext::default()).verdict, PASS);
        }
    }
    if boosted {
        let config = *h.datapath.config();
        h.rate_every_host(
            &HostRate::new(&config, config.ns_per_byte_fp * 2 / 3, 0, 0)
                .with_rounds_at(&config, config.ns_per_byte_fp),
        );
    }
    let busy = |h: &Harness| -> u64 {
        h.datapath
            .hosts()
            .unwrap()
            .iter()
            .map(|(_, s)| s.busy_ns)
            .sum()
    };
    let before = busy(&h);
    let t: Vec<u64> = (0..3)
        .map(|_| {
            let o = h.run(&Seg::ack(1_001).frame(true), &SkbContext::default());
            assert_eq!((o.verdict, o.ctx.priority()), (PASS, 0), "{mode:?}: {o:?}");
            o.ctx.tstamp()
        })
        .collect();
    (t[2] - t[1], busy(&h) - before)
}

#[test]
fn a_kept_ack_beside_other_flows_charges_its_flow_a_rounds_quantum_and_counts_its_wire_time() {
    let config = aggressive_per_flow();
    let ack_len = Seg::ack(1_001).frame(true).len() as u64;
    let ack_ns = tx_time_ns(ack_len, config.ns_per_byte_fp);
    let quantum = config.ack_quantum_bytes as u64;
    assert_eq!(quantum, 300, "CAKE's quantum at 100 kbit/s");
    let quantum_ns = tx_time_ns(quantum, config.ns_per_byte_fp);
    // The filter on, other flows of its host booked after it: an ACK per round's quantum at
    // its flow's level (here the rate), though the host's flow-time counts the ACKs' wire time.
    // A boost paces the host's flows faster, not its rounds: the ACKs keep to the level.
    for (mode, boosted) in [
        (AckFilter::Conservative, false),
        (AckFilter::Aggressive, false),
        (AckFilter::Conservative, true),
    ] {
        let (spacing, busy) = duplicates_spacing(mode, true, boosted);
        assert!(
            spacing + ack_ns / 10 >= quantum_ns && spacing <= quantum_ns + ack_ns,
            "{mode:?}, boosted {boosted}: {spacing} ns apart, a quantum is {quantum_ns} ns"
        );
        assert!(
            busy < 3 * ack_ns + quantum_ns,
            "{mode:?}, boosted {boosted}: flow-time {busy} ns for three ACKs of {ack_ns} ns"
        );
    }
    // Without the filter nothing thins the ACKs a round would queue: each is its wire time.
    // Alone in its host, an ACK flow has no round to keep to (a download over a thin uplink).
    for (mode, beside_bulk) in [(AckFilter::Off, true), (AckFilter::Conservative, false)] {
        let (spacing, _) = duplicates_spacing(mode, beside_bulk, false);
        assert!(
            spacing + ack_ns / 10 >= ack_ns && spacing < ack_ns + ack_ns / 2,
            "{mode:?}, beside bulk {beside_bulk}: {spacing} ns apart, an ACK is {ack_ns} ns"
        );
    }
}

/// Hosts and their flows apart (CAKE's default, `triple-isolate`), with bins for full frames:
/// a host's guard then leads its allocation by a few frames at most.
fn per_host(mode: AckFilter) -> Harness {
    Harness::new(ShaperConfig {
        ack_filter: mode as u32,
        isolation: Isolation::TripleIsolate as u32,
        host_mask_v4: u32::MAX,
        // Room for the guard's hold beyond the slack.
        horizon_ns: 10 * SECOND,
        ..with_short_bins(config(RATE, SECOND))
    })
}

/// Writes, for every host seen so far, the rates a control tick would give a host whose flows
/// are boosted to 1.5 times its allocation (the whole rate, its guard's pace), and starts the
/// epoch in which the data path reads them.
fn boosted_hosts(h: &mut Harness) {
    let config = *h.datapath.config();
    h.rate_every_host(&HostRate::new(
        &config,
        config.ns_per_byte_fp * 2 / 3,
        config.ns_per_byte_fp,
        0,
    ));
}

#[test]
fn a_kept_ack_goes_ahead_of_its_hosts_bookings_but_an_ack_only_host_keeps_to_its_allocation() {
    // The ACKs' host also sends bulk frames (uploads beside a download), booked behind its
    // guard for half a second. Without the filter the second ACK waits behind the host's
    // bookings; kept, it goes ahead of them, at its flow's clock.
    assert_kept_ack_goes_first(
        |mode| {
            let mut h = per_host(mode);
            h.run(&full_frame_of_another_flow(), &SkbContext::default());
            boosted_hosts(&mut h);
            second_ack_behind_bulk(&mut h, mode)
        },
        "its host's bookings",
    );
    // A host that sends nothing but ACKs (a download over a 100 kbit/s uplink) has no bookings
    // of others to go ahead of: its guard holds it to its allocation, less the slack it grants
    // its flows' queues, whatever its flow's boosted level would let through.
    const ACKS: u64 = 300;
    let ack = Seg::ack(1_001).frame(true);
    let last_of_many = |mode: AckFilter| {
        let mut h = per_host(mode);
        h.run(&ack, &SkbContext::default());
        boosted_hosts(&mut h);
        let start = monotonic_now_ns();
        let mut last = 0;
        for _ in 0..ACKS {
            let o = h.run(&ack, &SkbContext::default());
            assert_eq!(o.verdict, PASS, "{mode:?}: a duplicate is kept");
            last = o.ctx.tstamp();
        }
        (last.saturating_sub(start), *h.datapath.config())
    };
    for mode in [AckFilter::Conservative, AckFilter::Aggressive] {
        let (kept, config) = last_of_many(mode);
        let ack_ns = tx_time_ns(ack.len() as u64, config.ns_per_byte_fp);
        let slack = host_slack_ns(&config, config.ns_per_byte_fp * 2 / 3);
        let held = ACKS * ack_ns - slack;
        assert!(
            held > ACKS * ack_ns * 2 / 3 + 2 * ack_ns,
            "the test's load must outrun the slack"
        );
        assert!(
            kept + 2 * ack_ns >= held,
            "{mode:?}: the last of {ACKS} ACKs at {kept} ns, held to the allocation: {held} ns"
        );
    }
}

#[test]
fn no_ack_jumps_with_the_filter_off_or_with_an_unknown_option() {
    for (mode, options) in [
        (AckFilter::Off, Vec::new()),
        (AckFilter::Aggressive, vec![30, 4, 0, 0]),
    ] {
        let mut h = harness(mode);
        h.run_ingress(&Seg::data(99_001, 1000).frame(false));
        for n in 1..=10 {
            let s = Seg {
                options: options.clone(),
                ..Seg::ack(n * 10_000)
            };
            let o = h.run(&s.frame(true), &SkbContext::default());
            assert_eq!((o.verdict, o.ctx.priority()), (PASS, 0), "{mode:?} {n}");
        }
        assert_eq!(h.view().stats.ack_jumped, 0);
    }
}

#[test]
fn aggressive_needs_only_one_scheduled() {
    let mut h = harness(AckFilter::Aggressive);
    h.run_ingress(&Seg::data(1, 1000).frame(false));
    h.run_ingress(&Seg::data(99_001, 1000).frame(false));
    assert_eq!(send(&mut h, &Seg::ack(10_001)), PASS);
    assert_eq!(
        send(&mut h, &Seg::ack(20_001)),
        PASS,
        "the first left at once"
    );
    assert_eq!(
        send(&mut h, &Seg::ack(30_001)),
        DROP,
        "one scheduled ahead is enough"
    );
}

#[test]
fn an_ack_lent_a_departure_counts_as_ahead_while_the_link_carries_what_was_booked_before_it() {
    // A full frame of another flow (121 ms at 100 kbit/s) takes the link first. The flow's
    // first ACK, found idle, is lent its departure and leaves at once, but the link carries it
    // only after that frame: the sender has still to hear it, so in aggressive mode the next
    // ACK is covered by it and by the ACK that 100001 brings. (Counted by its departure, the
    // first ACK had left, and the second was kept: the uplink then carried an ACK per ACK the
    // receiver sent while CAKE's queue held one, replaced by each newer.)
    let mut h = Harness::new(aggressive_per_flow());
    h.run_ingress(&Seg::data(1, 1000).frame(false));
    h.run_ingress(&Seg::data(99_001, 1000).frame(false));
    let bulk = full_frame_of_another_flow();
    assert_eq!(h.run(&bulk, &SkbContext::default()).verdict, PASS);
    let before = monotonic_now_ns();
    let first = h.run(&Seg::ack(10_001).frame(true), &SkbContext::default());
    assert_eq!(first.verdict, PASS);
    assert!(
        first.ctx.tstamp() < before + SECOND / 1000,
        "the first ACK leaves at once: {} ms",
        (first.ctx.tstamp() as i64 - before as i64) / 1_000_000
    );
    assert_eq!(
        send(&mut h, &Seg::ack(20_001)),
        DROP,
        "the first is still ahead on the link"
    );
}

#[test]
fn a_lent_ack_does_not_clock_a_drop_whose_later_ack_needs_the_sender() {
    // As above, but the data seen ends in the middle of a write (no PSH): the ACK that covers
    // it comes only once the sender has heard an ACK and sent the rest. The lent ACK may
    // already have reached it (the calendar only estimates when the link carries it), so it
    // does not count, and the ACK is kept.
    let mut h = Harness::new(aggressive_per_flow());
    let mid_write = Seg {
        flags: ACK,
        ..Seg::data(1, 2_000)
    };
    h.run_ingress(&mid_write.frame(false));
    let bulk = full_frame_of_another_flow();
    assert_eq!(h.run(&bulk, &SkbContext::default()).verdict, PASS);
    assert_eq!(send(&mut h, &Seg::ack(1_001)), PASS);
    let before = kept(&h, KeepReason::FewScheduled);
    assert_eq!(
        send(&mut h, &Seg::ack(2_001)),
        PASS,
        "only a lent ACK ahead, and the later ACK needs the sender"
    );
    assert_eq!(kept(&h, KeepReason::FewScheduled), before + 1);
}

/// An aggressive filter's ACK flow with data beyond its ACKs seen, two full frames of another
/// flow booked on the link, and the flow's first ACK sent: lent a departure, its wire time
/// booked behind the frames. Returns when it was sent.
fn lent_ack_behind_two_frames(config: ShaperConfig) -> (Harness, u64) {
    let mut h = Harness::new(config);
    h.run_ingress(&Seg::data(1, 1000).frame(false));
    h.run_ingress(&Seg::data(99_001, 1000).frame(false));
    let bulk = full_frame_of_another_flow();
    for _ in 0..2 {
        assert_eq!(h.run(&bulk, &SkbContext::default()).verdict, PASS);
    }
    let start = monotonic_now_ns();
    assert_eq!(send(&mut h, &Seg::ack(10_001)), PASS);
    (h, start)
}

/// A covered ACK sent at `drop_at` is dropped (the lent one still ahead), the next, at
/// `keep_at`, kept (it no longer is).
fn dropped_then_kept(h: &mut Harness, drop_at: u64, keep_at: u64, why: [&str; 2]) {
    sleep_until(drop_at);
    assert_eq!(send(h, &Seg::ack(20_001)), DROP, "{}", why[0]);
    sleep_until(keep_at);
    let before = kept(h, KeepReason::FewScheduled);
    assert_eq!(send(h, &Seg::ack(30_001)), PASS, "{}", why[1]);
    assert_eq!(kept(h, KeepReason::FewScheduled), before + 1);
}

fn sleep_until(t: u64) {
    let now = monotonic_now_ns();
    std::thread::sleep(std::time::Duration::from_nanos(t.saturating_sub(now)));
}

#[test]
fn a_lent_ack_counts_as_ahead_until_where_the_calendar_booked_its_wire_time() {
    // Bins sized for full frames (60 ms at 100 kbit/s): two frames of another flow book the
    // link about four bins ahead, and the lent ACK's wire time is booked behind them. Past the
    // bin it was sent in it still reads as ahead (the receiver sends the later ACK whatever the
    // sender does, so a late estimate costs only time), and the next covered ACK is dropped;
    // once the link has reached its booking it reads as gone, and the next one is kept.
    let config = with_short_bins(aggressive_per_flow());
    let bin = config.calendar_bin_ns;
    let (mut h, start) = lent_ack_behind_two_frames(config);
    dropped_then_kept(
        &mut h,
        // Into the bin after the one it was sent in, the frames still on the link.
        (start / bin + 1) * bin + 1_000_000,
        // The frames (121 ms each) and the ACK have had their wire time.
        (start / bin + 6) * bin,
        [
            "the first ACK is booked behind the frames",
            "the link has reached where the first ACK was booked",
        ],
    );
}

#[test]
fn a_lent_ack_counts_as_ahead_no_longer_than_its_window_after_it_left() {
    // The same bookings (the ACK's wire time behind two frames of another flow, about 240 ms
    // ahead at 100 kbit/s), with a window of one frame's wire time (121 ms; the control plane
    // sets `LENT_WINDOW_FRAMES` of them). Within it the covered ACK is dropped; past it the
    // next one is kept, though the calendar's booking is still ahead.
    let frame_ns = tx_time_ns(1_514, ns_per_byte_fp(RATE));
    let config = ShaperConfig {
        lent_window_ns: frame_ns as u32,
        ..with_short_bins(aggressive_per_flow())
    };
    let (mut h, start) = lent_ack_behind_two_frames(config);
    dropped_then_kept(
        &mut h,
        start + frame_ns / 2,
        start + frame_ns + 20_000_000,
        [
            "within the window",
            "past the window, the booking still ahead",
        ],
    );
}

#[test]
fn an_ack_in_the_middle_of_a_write_is_dropped_the_end_of_a_write_kept() {
    let mut h = harness(AckFilter::Aggressive);
    // 2 kB arrived, its last segment without PSH: the sender's write goes on.
    let mid_write = Seg {
        flags: ACK,
        ..Seg::data(1, 2_000)
    };
    h.run_ingress(&mid_write.frame(false));
    assert_eq!(send(&mut h, &Seg::ack(501)), PASS);
    assert_eq!(
        send(&mut h, &Seg::ack(1_001)),
        PASS,
        "the first left at once"
    );
    assert_eq!(
        send(&mut h, &Seg::ack(2_001)),
        DROP,
        "acknowledges all data seen, but the write goes on"
    );
    // More of the write, and the ACK for it opens the window: the sender may need that window
    // to send the rest, so it is kept.
    let more = Seg {
        flags: ACK,
        ..Seg::data(2_001, 1_000)
    };
    h.run_ingress(&more.frame(false));
    let wider = Seg {
        window: 900,
        ..Seg::ack(3_001)
    };
    assert_eq!(send(&mut h, &wider), PASS);
    assert_eq!(kept(&h, KeepReason::Window), 1);
    // The write ends (PSH): the ACK for its end may be the last one.
    h.run_ingress(&Seg::data(3_001, 1_000).frame(false));
    let end = Seg {
        window: 900,
        ..Seg::ack(4_001)
    };
    assert_eq!(send(&mut h, &end), PASS);
    assert_eq!(kept(&h, KeepReason::NoLaterData), 1);
    // So is the ACK of a FIN-carrying segment (the end of the stream).
    let fin = Seg {
        flags: ACK | FIN,
        ..Seg::data(4_001, 1_000)
    };
    h.run_ingress(&fin.frame(false));
    let fin_ack = Seg {
        window: 900,
        ..Seg::ack(5_001)
    };
    assert_eq!(send(&mut h, &fin_ack), PASS);
    assert_eq!(kept(&h, KeepReason::NoLaterData), 2);
    assert_eq!(h.view().stats.ack_dropped, 1);
}

#[test]
fn without_data_seen_at_ingress_nothing_is_dropped() {
    let mut h = harness(AckFilter::Aggressive);
    for n in 1..6 {
        assert_eq!(send(&mut h, &Seg::ack(n * 10_000)), PASS);
    }
    assert_eq!(h.view().stats.ack_dropped, 0);
    assert_eq!(kept(&h, KeepReason::NoLaterData), 4);
}

#[test]
fn every_eligibility_rule_keeps_what_no_later_ack_repeats() {
    let mut h = harness(AckFilter::Aggressive);
    h.run_ingress(&Seg::data(1, 1000).frame(false));
    h.run_ingress(&Seg::data(999_001, 1000).frame(false));
    assert_eq!(send(&mut h, &Seg::ack(10_001)), PASS);
    assert_eq!(
        send(&mut h, &Seg::ack(15_001)),
        PASS,
        "nothing scheduled ahead yet"
    );
    assert_eq!(send(&mut h, &Seg::ack(20_001)), DROP, "baseline: droppable");
    let ts = vec![1, 1, 8, 10, 0, 0, 0, 7, 0, 0, 0, 9];
    let with = |ack: u32, f: &dyn Fn(&mut Seg)| {
        let mut s = Seg::ack(ack);
        f(&mut s);
        s
    };
    // Timestamps are understood: still droppable.
    assert_eq!(
        send(&mut h, &with(30_001, &|s| s.options = ts.clone())),
        DROP
    );
    // A duplicate ACK signals loss.
    assert_eq!(send(&mut h, &Seg::ack(30_001)), PASS);
    // SACK blocks: kept while a later ACK may not report them again.
    let sack = |blocks: &[(u32, u32)]| {
        let mut o = ts.clone();
        o.extend_from_slice(&[1, 1, 5, 2 + 8 * blocks.len() as u8]);
        for (start, end) in blocks {
            o.extend_from_slice(&start.to_be_bytes());
            o.extend_from_slice(&end.to_be_bytes());
        }
        o
    };
    // In order: a kept ACK's blocks count as told for the ones after it.
    type Case<'a> = (&'a [(u32, u32)], u32, &'a str);
    let cases: [Case; 6] = [
        (
            &[(999_001, 1_000_001)],
            PASS,
            "one block reaching the end of the data seen: nothing says another ACK comes",
        ),
        (
            &[(50_001, 60_001)],
            DROP,
            "one block with data beyond it seen: the later ACK reports it again, or more",
        ),
        (
            &[(70_001, 80_001), (50_001, 60_001)],
            DROP,
            "two blocks with data beyond both: the later ACK repeats them beside a new one",
        ),
        (
            &[(90_001, 95_001), (70_001, 80_001), (50_001, 60_001)],
            PASS,
            "three fill the options beside timestamps: a new block could push the last one out",
        ),
        (
            &[(96_001, 97_001), (90_001, 95_001), (70_001, 80_001)],
            DROP,
            "unless an ACK kept before (the one above) told the sender of it",
        ),
        (
            &[(70_001, 71_001), (70_001, 80_001)],
            PASS,
            "a D-SACK within another block reports a duplicate segment no later ACK repeats",
        ),
    ];
    for (blocks, verdict, why) in cases {
        let seg = with(40_001, &|s| s.options = sack(blocks));
        assert_eq!(send(&mut h, &seg), verdict, "{why}");
    }
    // An option the filter does not know (MPTCP, kind 30).
    assert_eq!(
        send(&mut h, &with(50_001, &|s| s.options = vec![30, 4, 0, 0])),
        PASS
    );
    // A new window, data beyond it seen: the later ACK carries the receiver's window then.
    assert_eq!(send(&mut h, &with(60_001, &|s| s.window = 900)), DROP);
    // A pure window update (no new ACK number) is never dropped.
    assert_eq!(send(&mut h, &with(60_001, &|s| s.window = 950)), PASS);
    // ECE appears.
    assert_eq!(
        send(
            &mut h,
            &with(70_001, &|s| {
                s.window = 950;
                s.flags = ACK | ECE;
            })
        ),
        PASS
    );
    // Not pure ACKs at all: data-bearing, FIN, SYN, RST, URG are never handed to the filter.
    let seen_before = h.view().stats.ack_seen;
    for s in [
        with(80_001, &|s| {
            s.payload = 100;
            s.window = 950;
        }),
        with(80_001, &|s| s.flags = ACK | FIN),
        with(80_001, &|s| s.flags = ACK | SYN),
        with(80_001, &|s| s.flags = ACK | RST),
        with(80_001, &|s| s.flags = ACK | URG),
    ] {
        assert_eq!(send(&mut h, &s), PASS);
    }
    assert_eq!(h.view().stats.ack_seen, seen_before);
    assert_eq!(kept(&h, KeepReason::Duplicate), 2);
    assert_eq!(kept(&h, KeepReason::Sack), 2);
    assert_eq!(kept(&h, KeepReason::SackFull), 1);
    assert_eq!(kept(&h, KeepReason::UnknownOption), 1);
    assert_eq!(kept(&h, KeepReason::Ecn), 1);
}

#[test]
fn ipv6_acks_are_filtered_too() {
    let mut h = harness(AckFilter::Aggressive);
    let v6 = |mut s: Seg| {
        s.v6 = true;
        s
    };
    h.run_ingress(&v6(Seg::data(1, 1000)).frame(false));
    h.run_ingress(&v6(Seg::data(99_001, 1000)).frame(false));
    assert_eq!(send(&mut h, &v6(Seg::ack(10_001))), PASS);
    assert_eq!(send(&mut h, &v6(Seg::ack(20_001))), PASS);
    assert_eq!(send(&mut h, &v6(Seg::ack(30_001))), DROP);
}

#[test]
fn off_leaves_acks_alone() {
    let mut h = harness(AckFilter::Off);
    h.run_ingress(&Seg::data(99_001, 1000).frame(false));
    for n in 1..5 {
        assert_eq!(send(&mut h, &Seg::ack(n * 10_000)), PASS);
    }
    let s = h.view().stats;
    assert_eq!((s.ack_seen, s.ack_dropped, s.shaped_packets), (0, 0, 4));
}

/// BIG TCP: a GSO packet beyond 64 KB carries an IP length of 0 (IPv4's total length, IPv6's
/// payload length). Its length is then the packet's: it is shaped in full, and a data segment
/// whose only flag is ACK is not taken for a pure ACK.
#[test]
fn a_length_of_zero_is_the_packets_own() {
    for v6 in [false, true] {
        let mut h = harness(AckFilter::Aggressive);
        let data = Seg {
            seq: 1,
            ack: 1,
            flags: ACK,
            window: 500,
            options: Vec::new(),
            payload: 1000,
            v6,
        };
        let mut frame = data.frame(true);
        let length = if v6 { 14 + 4..14 + 6 } else { 14 + 2..14 + 4 };
        frame[length].fill(0);
        let out = h.run(&frame, &SkbContext::default());
        assert_eq!(out.verdict, PASS, "v6 {v6}");
        assert_ne!(
            out.ctx.tstamp(),
            0,
            "v6 {v6}: shaped, not passed as malformed"
        );
        let s = h.view().stats;
        assert_eq!(
            s.shaped_bytes,
            frame.len() as u64,
            "v6 {v6}: its whole length"
        );
        assert_eq!(s.ack_seen, 0, "v6 {v6}: a data segment is not a pure ACK");
    }
}
