//! Fair scheduling in the running kernel (BPF_PROG_TEST_RUN): flow clocks at their host's flow
//! level, host and global guards, newcomer levels, activity counters, the new-flow quota.
//! The control plane is played by the test, which writes the levels by hand.

use aya::maps::{Array, Map, MapData};
use shaper::{bpf::monotonic_now_ns, control::Controller};
use shaper_common::{
    abi::{FlowKey, HostRate, Levels, ShaperConfig, host_flags},
    diffserv::{Diffserv, MAX_TINS},
    edt::{ns_per_byte_fp, tx_time_ns},
    isolation::Isolation,
    overrun,
    sizing::CALENDAR_MAX_SPAN_BINS,
    stats::DropReason,
};
use shaper_tests::{DROP, Harness, PASS, config, packet, skb::SkbContext, with_short_bins};

const SECOND: u64 = 1_000_000_000;
const RATE: u64 = 10_000_000;
const FRAME: usize = 1514;

const SERVER: [u8; 4] = [10, 0, 0, 1];
const CLIENT_A: [u8; 4] = [10, 0, 1, 1];
const CLIENT_B: [u8; 4] = [10, 0, 2, 1];
const CLIENT_C: [u8; 4] = [10, 0, 3, 1];

fn harness(mode: Isolation) -> Harness {
    Harness::new(harness_config(mode))
}

fn harness_config(mode: Isolation) -> ShaperConfig {
    ShaperConfig {
        isolation: mode as u32,
        host_mask_v4: u32::MAX,
        host_mask_v6: [u32::MAX, u32::MAX, 0, 0],
        ..config(RATE, 10 * SECOND)
    }
}

fn send(h: &mut Harness, dst: [u8; 4], port: u16) -> u64 {
    let out = h.run(
        &packet::tcp4_flow(SERVER, dst, port, 5201, FRAME),
        &SkbContext::default(),
    );
    assert_eq!(out.verdict, PASS);
    assert_ne!(out.ctx.tstamp(), 0);
    out.ctx.tstamp()
}

fn host_key(dst: [u8; 4]) -> FlowKey {
    FlowKey {
        dst: [u32::from_ne_bytes(dst), 0, 0, 0],
        family: 4,
        ..Default::default()
    }
}

/// The control plane's levels for the host `dst`, written by hand.
fn set_rate(h: &mut Harness, dst: [u8; 4], flow_fp: u64, host_fp: u64, flags: u64) {
    set_key_rate(h, &host_key(dst), flow_fp, host_fp, flags);
}

/// The control plane's levels for the host (or, in single-level modes, pseudo-host) `key`,
/// and a new epoch, in which the data path reads them (as a tick does).
fn set_key_rate(h: &mut Harness, key: &FlowKey, flow_fp: u64, host_fp: u64, flags: u64) {
    let rate = HostRate::new(h.datapath.config(), flow_fp, host_fp, flags);
    h.datapath.set_host_rate(key, &rate).unwrap();
    h.start_epoch();
}

/// The control plane's newcomer level (every tin), written by hand; `ahead`: the tins have
/// bottlenecked hosts, whose bookings a newcomer goes ahead of.
fn set_newcomer_level(h: &mut Harness, epoch: u64, fp: u64, ahead: bool) {
    let mut levels = Levels {
        epoch,
        newcomers_ahead_tins: if ahead { u64::MAX } else { 0 },
        ..Default::default()
    };
    for tin in 0..MAX_TINS {
        levels.set_newcomer(h.datapath.config(), tin, fp);
    }
    h.datapath.set_levels(&levels).unwrap();
}

/// How long `frames` frames of `full` ns each take at the rate, plus the calendar's slack (a
/// bin holds 1/16 more than its width); the last of them may leave earlier by one span of
/// borrowing and one bin.
fn at_the_rate(frames: u64, full: u64) -> u64 {
    frames * full * 16 / 17
}

/// Hosts by destination, bins for full-sized frames and a 1 s horizon (1 ms bins): the bins a
/// packet may span are short of a test's bookings.
fn short_bins_config() -> ShaperConfig {
    with_short_bins(harness_config(Isolation::DualDstHost))
}

/// Hosts by destination, each new 5-tuple a flow of its own (no quota bucket), 1 s horizon.
fn sparse_harness() -> Harness {
    Harness::new(ShaperConfig {
        isolation: Isolation::DualDstHost as u32,
        host_mask_v4: u32::MAX,
        flow_quota: 100_000,
        ..config(RATE, SECOND)
    })
}

#[test]
fn flows_mode_interleaves_flows_at_the_flow_level() {
    let mut h = harness(Isolation::Flows);
    // The control plane's verdict: two bottlenecked flows, 5 Mbit/s each.
    set_key_rate(&mut h, &FlowKey::default(), ns_per_byte_fp(RATE / 2), 0, 0);
    let half = tx_time_ns(FRAME as u64, ns_per_byte_fp(RATE / 2));
    // Flow 1 sends a burst of 4 first; flow 2's packets still interleave with it.
    let a: Vec<u64> = (0..4).map(|_| send(&mut h, CLIENT_A, 1)).collect();
    let b: Vec<u64> = (0..4).map(|_| send(&mut h, CLIENT_A, 2)).collect();
    // Each flow is paced at its level: never faster; slower only when the calendar (whose
    // bins are the unit of its accounting) had to push a packet into the next bin.
    let bin = config(RATE, SECOND).calendar_bin_ns;
    for w in a.windows(2).chain(b.windows(2)) {
        assert!(
            w[1] - w[0] >= half && w[1] - w[0] <= half + bin,
            "flow spacing {} ns, level spacing {half} ns",
            w[1] - w[0]
        );
    }
    assert!(
        b[0] < a[1],
        "flow 2's first packet does not wait behind flow 1's burst: a={a:?} b={b:?}"
    );
}

#[test]
fn flowblind_is_one_fifo_at_the_rate() {
    let mut h = harness(Isolation::FlowBlind);
    let full = tx_time_ns(FRAME as u64, ns_per_byte_fp(RATE));
    let t: Vec<u64> = (0..3)
        .map(|i| send(&mut h, if i % 2 == 0 { CLIENT_A } else { CLIENT_B }, i))
        .collect();
    assert_eq!(t[1] - t[0], full);
    assert_eq!(t[2] - t[1], full);
}

#[test]
fn dual_dsthost_paces_hosts_and_their_flows() {
    let mut h = harness(Isolation::DualDstHost);
    let half = ns_per_byte_fp(RATE / 2);
    // A has one flow, B ten: B's flows get a tenth of its half.
    set_rate(&mut h, CLIENT_A, half, half, 0);
    set_rate(&mut h, CLIENT_B, ns_per_byte_fp(RATE / 20), half, 0);
    let a: Vec<u64> = (0..3).map(|_| send(&mut h, CLIENT_A, 1)).collect();
    let b: Vec<u64> = (0..3).map(|_| send(&mut h, CLIENT_B, 7)).collect();
    let bin = config(RATE, SECOND).calendar_bin_ns;
    let spacing_a = tx_time_ns(FRAME as u64, half);
    let spacing_b = tx_time_ns(FRAME as u64, ns_per_byte_fp(RATE / 20));
    assert!(a[1] - a[0] >= spacing_a && a[1] - a[0] <= spacing_a + bin);
    assert!(b[1] - b[0] >= spacing_b && b[1] - b[0] <= spacing_b + bin);
    assert!(b[0] < a[1], "host B does not wait behind host A");
    let hosts = h.datapath.hosts().unwrap();
    assert_eq!(hosts.len(), 2, "one entry per destination host");
    let b_state = hosts
        .iter()
        .find(|(k, _)| *k == host_key(CLIENT_B))
        .unwrap()
        .1;
    assert_eq!(b_state.packets, 3);
    assert_eq!(b_state.bytes, 3 * FRAME as u64);
    // Flow-time: three frames at B's flow level, two of them after waiting on the clock.
    assert_eq!(b_state.busy_ns, 3 * spacing_b);
    assert_eq!(b_state.backlogged_busy_ns, 2 * spacing_b);
    assert_eq!(b_state.waited_bytes, 2 * FRAME as u64);
}

#[test]
fn a_new_host_starts_at_the_newcomer_level() {
    let mut h = harness(Isolation::DualDstHost);
    let third = ns_per_byte_fp(RATE / 3);
    set_newcomer_level(&mut h, 7, third, true);
    let t: Vec<u64> = (0..2).map(|_| send(&mut h, CLIENT_A, 1)).collect();
    let bin = config(RATE, SECOND).calendar_bin_ns;
    let spacing = tx_time_ns(FRAME as u64, third);
    assert!(t[1] - t[0] >= spacing && t[1] - t[0] <= spacing + bin);
    // Once the control plane has written the host's level, that one applies.
    set_rate(&mut h, CLIENT_A, ns_per_byte_fp(RATE / 10), 0, 0);
    let t2 = send(&mut h, CLIENT_A, 1);
    let t3 = send(&mut h, CLIENT_A, 1);
    let spacing = tx_time_ns(FRAME as u64, ns_per_byte_fp(RATE / 10));
    assert!(t3 - t2 >= spacing && t3 - t2 <= spacing + bin);
}

#[test]
fn removing_the_rate_of_a_host_that_has_none_succeeds() {
    // The control loop removes the rate of every host the data path evicted, including hosts
    // it never gave one (a spoofed host that sent one packet): a failure there fails its tick.
    let mut h = harness(Isolation::DualDstHost);
    h.datapath.remove_host_rate(&host_key(CLIENT_A)).unwrap();
    set_rate(&mut h, CLIENT_A, ns_per_byte_fp(RATE / 10), 0, 0);
    h.datapath.remove_host_rate(&host_key(CLIENT_A)).unwrap();
    h.datapath.remove_host_rate(&host_key(CLIENT_A)).unwrap();
}

#[test]
fn the_calendar_holds_overbooked_levels_to_the_rate() {
    let mut h = harness(Isolation::Flows);
    // Provisional levels overbook the link fourfold: four flows at the full rate each.
    set_key_rate(&mut h, &FlowKey::default(), ns_per_byte_fp(RATE), 0, 0);
    let full = tx_time_ns(FRAME as u64, ns_per_byte_fp(RATE));
    let bin = config(RATE, SECOND).calendar_bin_ns;
    let start = monotonic_now_ns();
    let departures: Vec<u64> = (0..40).map(|i| send(&mut h, CLIENT_A, i % 4)).collect();
    let last = *departures.iter().max().unwrap();
    // 40 frames at the rate take 39 frame times after the first; the flows alone would
    // release them in 10. The calendar's accounting is exact to one bin.
    assert!(
        last - start + bin >= 39 * full,
        "the aggregate left faster than the rate: last departure {} ns after start, {} per frame",
        last - start,
        full
    );
    assert!(h.view().stats.calendar_delayed > 0);
}

#[test]
fn a_lower_rate_reads_the_calendars_frontier_where_it_was() {
    // Overbooked levels fill the bins ahead, and packets book from the frontier. A rate five
    // times lower has bins five times wider: the frontier must still stand where the bookings
    // end, not at its old bin index read in the new bins' width (far in the future, beyond
    // the horizon, with nothing queued).
    let mut h = harness(Isolation::Flows);
    let fast = *h.datapath.config();
    set_key_rate(&mut h, &FlowKey::default(), ns_per_byte_fp(RATE), 0, 0);
    for i in 0..40 {
        send(&mut h, CLIENT_A, i % 4);
    }
    let slow = ShaperConfig {
        rate_bps: RATE / 5,
        ns_per_byte_fp: ns_per_byte_fp(RATE / 5),
        calendar_bin_ns: config(RATE / 5, 10 * SECOND).calendar_bin_ns,
        ..fast
    };
    assert!(slow.calendar_bin_ns >= 4 * fast.calendar_bin_ns);
    h.datapath.configure(&slow).unwrap();
    set_key_rate(&mut h, &FlowKey::default(), ns_per_byte_fp(RATE / 5), 0, 0);
    let now = monotonic_now_ns();
    // 40 frames (48 ms at the old rate) were booked; the next ones follow within a few of the
    // new bins and their own wire time at the new rate.
    for i in 0..4 {
        let depart = send(&mut h, CLIENT_A, i);
        assert!(
            depart < now + SECOND / 2,
            "departs {} ms ahead",
            (depart - now) / 1_000_000
        );
    }
    assert_eq!(h.view().stats.dropped[DropReason::Horizon as usize], 0);
}

#[test]
fn newcomers_that_overbook_the_link_together_are_held_to_the_rate() {
    // Three hosts appear within one control interval and no host was bottlenecked before
    // them: each gets the newcomer level, the full rate. Going ahead of the calendar's
    // bookings, they would only go ahead of each other, with nobody's later packets to push
    // (they left at three times the rate): they book like everyone else, and the calendar
    // holds the aggregate.
    let mut h = Harness::new(short_bins_config());
    let bin = h.datapath.config().calendar_bin_ns;
    set_newcomer_level(&mut h, 3, ns_per_byte_fp(RATE), false);
    let full = tx_time_ns(FRAME as u64, ns_per_byte_fp(RATE));
    let start = monotonic_now_ns();
    let hosts = [CLIENT_A, CLIENT_B, CLIENT_C];
    let departures: Vec<u64> = (0..60).map(|i| send(&mut h, hosts[i % 3], 1)).collect();
    assert_held_to_the_rate("three newcomers", &departures, start, full, bin);
    assert!(h.view().stats.calendar_delayed > 0);
}

/// Asserts that frames of `full` ns each, sent from `start`, left no faster than the rate: the
/// last of them no earlier than the rate allows, less one span of borrowing and one bin.
fn assert_held_to_the_rate(who: &str, departures: &[u64], start: u64, full: u64, bin: u64) {
    let last = *departures.iter().max().unwrap();
    let wire = at_the_rate(departures.len() as u64, full);
    let span = CALENDAR_MAX_SPAN_BINS as u64 * bin;
    assert!(
        last + span + bin >= start + wire,
        "{who} left faster than the rate: last departure {} ms after start, the rate allows {} ms",
        (last - start) / 1_000_000,
        wire / 1_000_000
    );
}

/// The most frames that leave within any `window` ns of `departures`.
fn densest(departures: &[u64], window: u64) -> usize {
    let mut sorted = departures.to_vec();
    sorted.sort_unstable();
    (0..sorted.len())
        .map(|i| {
            sorted[i..]
                .iter()
                .take_while(|&&d| d < sorted[i] + window)
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn packets_that_find_their_span_full_queue_behind_what_follows_it() {
    // Two hosts at the whole rate each overbook the link twofold (levels of one control tick
    // ago): most packets find every bin they may span full. They queue behind what the next
    // bin holds, one after the other, instead of leaving together at its start while the bins
    // after it fill up again; so no stretch of the schedule carries more than the rate and a
    // bin's slack.
    let mut h = Harness::new(short_bins_config());
    let bin = h.datapath.config().calendar_bin_ns;
    let full_rate = ns_per_byte_fp(RATE);
    set_rate(&mut h, CLIENT_A, full_rate, full_rate, 0);
    set_rate(&mut h, CLIENT_B, full_rate, full_rate, 0);
    let full = tx_time_ns(FRAME as u64, full_rate);
    let start = monotonic_now_ns();
    let departures: Vec<u64> = (0..100)
        .map(|i| {
            send(
                &mut h,
                if i % 2 == 0 { CLIENT_A } else { CLIENT_B },
                1 + (i % 4) as u16,
            )
        })
        .collect();
    assert_held_to_the_rate("two hosts", &departures, start, full, bin);
    let window = 20 * bin;
    let allowed = ((window + 2 * bin) * 17 / 16).div_ceil(full) as usize;
    let densest = densest(&departures, window);
    assert!(
        densest <= allowed,
        "{densest} frames left within {} ms; the rate allows {allowed}",
        window / 1_000_000
    );
}

/// Sets the departure meter (`overrun::meter`), which the dequeue observer moves on a real
/// device: `at` is the time by which the device's departures would have left at the rate.
/// The dequeue observer's words (`overrun::departures`), read and written as it would.
fn departures(h: &Harness) -> Array<MapData, u64> {
    let id = h.datapath.map_id("SHAPER_DEPARTURES").unwrap();
    let map = Map::from_map_data(MapData::from_id(id).unwrap()).unwrap();
    Array::try_from(map).unwrap()
}

/// Host A bottlenecked at the whole rate books 200 frames while 200 new hosts each send one
/// small packet between them (a SYN flood): each is sparse and leaves at once, borrowing its
/// wire time from the bins ahead. The time after the start at which A's last frame leaves, and
/// the wire time of the frames and the flood.
fn bulk_beside_a_flood(h: &mut Harness) -> (u64, u64) {
    let full_rate = ns_per_byte_fp(RATE);
    set_rate(h, CLIENT_A, full_rate, full_rate, 0);
    set_newcomer_level(h, 3, full_rate, false);
    const SMALL: usize = 66;
    let wire = 200 * (tx_time_ns(FRAME as u64, full_rate) + tx_time_ns(SMALL as u64, full_rate));
    let start = monotonic_now_ns();
    let mut last = 0;
    for n in 0..200u32 {
        last = send(h, CLIENT_A, 1);
        let flooder = [10, 1, (n >> 8) as u8, n as u8];
        let out = h.run(
            &packet::tcp4_flow(SERVER, flooder, 40_000, 5201, SMALL),
            &SkbContext::default(),
        );
        assert_eq!(out.verdict, PASS);
    }
    (last - start, wire)
}

#[test]
fn a_flood_lent_on_top_of_a_link_at_the_rate_pushes_the_bulk_back() {
    // The link has not idled: the slack has no credit (as under a flood lent on top of full
    // bins, for as long as it lasts). The bins hold their width and no more, so the flood's
    // borrowed wire time pushes A's frames back, and the link carries the rate. With the bins'
    // slack it would ride on top of A's schedule.
    let mut h = Harness::new(short_bins_config());
    let bin = h.datapath.config().calendar_bin_ns;
    h.datapath.set_slack_credit(0).unwrap();
    let (last, wire) = bulk_beside_a_flood(&mut h);
    let full = tx_time_ns(FRAME as u64, ns_per_byte_fp(RATE));
    let span = CALENDAR_MAX_SPAN_BINS as u64 * bin;
    assert!(
        last + full + span + bin >= wire,
        "A's last frame left {} ms after the start; with the flood's wire time the rate allows \
         it {} ms",
        last / 1_000_000,
        (wire - full) / 1_000_000
    );
}

#[test]
fn with_room_in_the_meters_burst_the_bins_slack_catches_up() {
    // The same schedule with credit for the slack (as with no observer, which leaves it
    // unbounded): the bins take their slack, and A's frames with the flood run up to 1/16
    // faster than the rate, catching up wire time the link did not carry.
    let mut h = Harness::new(short_bins_config());
    let bin = h.datapath.config().calendar_bin_ns;
    let (last, wire) = bulk_beside_a_flood(&mut h);
    let full = tx_time_ns(FRAME as u64, ns_per_byte_fp(RATE));
    let span = CALENDAR_MAX_SPAN_BINS as u64 * bin;
    assert!(
        last + full + span + bin < wire,
        "A's last frame left {} ms after the start: the slack caught up nothing of {} ms",
        last / 1_000_000,
        wire / 1_000_000
    );
}

#[test]
fn what_bulk_puts_past_its_span_does_not_stop_the_lending() {
    // Four hosts at the whole rate each overbook the link fourfold: most of their packets go
    // to the bin after their span, far over its capacity. That is theirs to repay, not what the
    // calendar lent: a sparse packet (a ping) still leaves at once.
    let mut h = Harness::new(short_bins_config());
    let bin = h.datapath.config().calendar_bin_ns;
    let full_rate = ns_per_byte_fp(RATE);
    let hosts = [CLIENT_A, CLIENT_B, CLIENT_C, [10, 0, 4, 1]];
    for host in hosts {
        set_rate(&mut h, host, full_rate, full_rate, 0);
    }
    for i in 0..200 {
        send(&mut h, hosts[i % 4], 1 + (i % 8) as u16);
    }
    let before = monotonic_now_ns();
    let ping = send(&mut h, [10, 0, 5, 1], 9);
    assert!(
        ping <= before + bin,
        "a sparse packet waited {} ms behind the overbooked bulk",
        (ping - before) / 1_000_000
    );
}

#[test]
fn a_host_going_ahead_is_repaid_by_the_bookings_it_went_ahead_of() {
    // Host A, bottlenecked at the rate, has booked 36 ms ahead: much further than the bins a
    // packet may span. Host C, below its allocation, goes ahead of those bookings at half the
    // rate. The wire time C takes is A's to give back: A's next packets leave later by as much,
    // so the link carries the rate, not the rate plus C's half.
    let mut h = Harness::new(short_bins_config());
    let bin = h.datapath.config().calendar_bin_ns;
    let full_rate = ns_per_byte_fp(RATE);
    let half = ns_per_byte_fp(RATE / 2);
    set_rate(&mut h, CLIENT_A, full_rate, full_rate, 0);
    set_rate(&mut h, CLIENT_C, half, half, host_flags::AHEAD);
    let full = tx_time_ns(FRAME as u64, full_rate);
    let span = CALENDAR_MAX_SPAN_BINS as u64 * bin;
    let start = monotonic_now_ns();
    for _ in 0..30 {
        send(&mut h, CLIENT_A, 1);
    }
    // Measured from C's own send: on a loaded machine A's 30 runs can take longer than a bin.
    let c_sent = monotonic_now_ns();
    let c: Vec<u64> = (0..10).map(|_| send(&mut h, CLIENT_C, 1)).collect();
    assert!(
        c[0] < c_sent + bin,
        "C goes ahead of A's bookings: its first packet {} ms after it was sent",
        (c[0] - c_sent) / 1_000_000
    );
    let last = (0..40).map(|_| send(&mut h, CLIENT_A, 1)).max().unwrap();
    let wire = at_the_rate(80, full);
    assert!(
        last + span + bin >= start + wire,
        "A's last packet left {} ms after the start; 80 frames need {} ms",
        (last - start) / 1_000_000,
        wire / 1_000_000
    );
}

#[test]
fn the_calendar_lends_sparse_packets_no_more_than_its_span() {
    // Host A has booked 36 ms ahead. Host B opens 20 new flows, one packet each: each is a
    // sparse flow's and leaves at once, borrowing its wire time, until what the calendar lent
    // stands at what the bins a packet may span hold (4 ms, three frames); the next ones book
    // like any other packet, behind A's bookings.
    let mut h = Harness::new(short_bins_config());
    let bin = h.datapath.config().calendar_bin_ns;
    let full = tx_time_ns(FRAME as u64, ns_per_byte_fp(RATE));
    for _ in 0..30 {
        send(&mut h, CLIENT_A, 1);
    }
    let mut at_once = 0;
    for port in 0..20 {
        let before = monotonic_now_ns();
        if send(&mut h, CLIENT_B, 1_000 + port) <= before + bin {
            at_once += 1;
        }
    }
    let lent = CALENDAR_MAX_SPAN_BINS as u64 * bin;
    assert!(
        at_once >= 1 && at_once * full <= lent + 2 * full,
        "{at_once} of 20 sparse packets left at once; the calendar lends {} ms",
        lent / 1_000_000
    );
    assert!(h.view().stats.sparse >= 20);
}

#[test]
fn a_new_flow_flood_from_one_host_shares_its_overflow_buckets() {
    let mut h = Harness::new(ShaperConfig {
        isolation: Isolation::DualDstHost as u32,
        host_mask_v4: u32::MAX,
        flow_quota: 8,
        ..config(RATE * 1000, 10 * SECOND)
    });
    for port in 0..200 {
        send(&mut h, CLIENT_A, 1000 + port);
    }
    let flows = h.datapath.flows(10_000).unwrap();
    assert!(
        flows.len() <= 8 + 16,
        "quota 8 + 16 overflow buckets, got {} entries",
        flows.len()
    );
    // Another host is unaffected: its flows get entries of their own.
    send(&mut h, CLIENT_B, 1);
    let flows = h.datapath.flows(10_000).unwrap();
    assert!(
        flows
            .iter()
            .any(|(k, _)| k.dst[0] == u32::from_ne_bytes(CLIENT_B))
    );
}

#[test]
fn a_host_of_many_sparse_flows_is_held_to_its_allocation() {
    // Every packet on a flow of its own: each is sparse (its flow's clock is idle) and skips
    // the host's queue, but not the host's rate: once the host has booked a flow's hard limit
    // (here, without AQM, the 1 s horizon) ahead of its allocation, its sparse packets drop.
    let mut h = sparse_harness();
    let tenth = ns_per_byte_fp(RATE / 10);
    set_rate(&mut h, CLIENT_A, tenth, tenth, 0);
    let start = monotonic_now_ns();
    let mut passed = 0u64;
    for port in 0..300 {
        let out = h.run(
            &packet::tcp4_flow(SERVER, CLIENT_A, 2000 + port, 5201, FRAME),
            &SkbContext::default(),
        );
        match out.verdict {
            PASS => {
                passed += 1;
                assert!(
                    out.ctx.tstamp() < monotonic_now_ns() + SECOND / 100,
                    "a sparse packet admitted leaves now"
                );
            }
            DROP => {}
            v => panic!("verdict {v}"),
        }
    }
    let elapsed = monotonic_now_ns() - start;
    // The host's allocation over the time the test took, plus the 1 s it may book ahead.
    let per_frame = tx_time_ns(FRAME as u64, tenth);
    let allowed = (SECOND + elapsed) / per_frame + 1;
    assert!(
        passed <= allowed && passed + 2 >= SECOND / per_frame,
        "{passed} of 300 sparse packets passed, {allowed} allowed"
    );
    assert_eq!(
        h.view().stats.dropped[DropReason::Overlimit as usize],
        300 - passed
    );
    // Another host is not held by it.
    assert!(send(&mut h, CLIENT_B, 1) < monotonic_now_ns() + SECOND / 100);
}

#[test]
fn spoofed_sources_towards_one_destination_are_held_to_one_newcomer_level() {
    // A spoofed flood in triple-isolate: every packet from a source never seen before, so each
    // a host (a source, destination pair) of its own, sparse, at the newcomer level. Together
    // they are held to that level by their destination's guard, as one host of many sparse
    // flows is by its own: once it stands the limit ahead, they drop. A newcomer towards
    // another destination is not held by it.
    let mut h = Harness::new(ShaperConfig {
        isolation: Isolation::TripleIsolate as u32,
        host_mask_v4: u32::MAX,
        flow_quota: 100_000,
        ..config(RATE, SECOND)
    });
    let quarter = ns_per_byte_fp(RATE / 4);
    set_newcomer_level(&mut h, 1, quarter, true);
    const VICTIM: [u8; 4] = [10, 9, 0, 5];
    let start = monotonic_now_ns();
    let mut passed = 0u64;
    for i in 0..400u16 {
        let spoofed = [10, 128, (i >> 8) as u8, i as u8];
        let out = h.run(
            &packet::tcp4_flow(spoofed, VICTIM, 2000, 80, FRAME),
            &SkbContext::default(),
        );
        match out.verdict {
            PASS => passed += 1,
            DROP => {}
            v => panic!("verdict {v}"),
        }
    }
    let flooded = monotonic_now_ns();
    let elapsed = flooded - start;
    // One newcomer level over the time the test took, plus the 1 s it may book ahead.
    let per_frame = tx_time_ns(FRAME as u64, quarter);
    let allowed = (SECOND + elapsed) / per_frame + 1;
    assert!(
        passed <= allowed && passed + 2 >= SECOND / per_frame,
        "{passed} of 400 spoofed hosts' packets passed, {allowed} allowed at one newcomer level"
    );
    assert_eq!(
        h.view().stats.dropped[DropReason::Overlimit as usize],
        400 - passed
    );
    // A new source towards another destination passes; one more towards the victim drops.
    let other = h.run(
        &packet::tcp4_flow([10, 128, 9, 9], CLIENT_B, 2000, 80, FRAME),
        &SkbContext::default(),
    );
    assert_eq!(other.verdict, PASS);
    // Towards the victim the guard stands at its limit: new sources pass only as fast as one
    // newcomer level frees the time that passed since (a run can wait for the CPU).
    let more = (0..20u8)
        .filter(|n| {
            let out = h.run(
                &packet::tcp4_flow([10, 129, 0, *n], VICTIM, 2000, 80, FRAME),
                &SkbContext::default(),
            );
            out.verdict == PASS
        })
        .count() as u64;
    let freed = (monotonic_now_ns() - flooded) / per_frame + 1;
    assert!(
        more <= freed,
        "{more} of 20 more spoofed sources passed; the time since freed {freed}"
    );
}

#[test]
fn sparse_packets_over_the_host_allocation_count_as_waited() {
    // A host of many sparse flows is held by its guard, never by a flow clock: unless the
    // packets it sends over its allocation count as waited, the control plane reads it as
    // limited elsewhere and never raises its level to its share. Packets within the host's slack
    // (the guard lead the control plane allows the host) do not count; a host within its
    // allocation never does.
    let mut h = sparse_harness();
    let tenth = ns_per_byte_fp(RATE / 10);
    for client in [CLIENT_A, CLIENT_B] {
        set_rate(&mut h, client, tenth, tenth, 0);
    }
    let per_frame = tx_time_ns(FRAME as u64, tenth);
    let slack = HostRate::new(h.datapath.config(), tenth, tenth, 0).slack_ns;
    // A: 40 frames at once, each on a flow of its own.
    let start = monotonic_now_ns();
    for port in 0..40 {
        send(&mut h, CLIENT_A, 2000 + port);
    }
    let elapsed = monotonic_now_ns() - start;
    // B: 5 frames, each after the guard has carried the one before.
    for port in 0..5 {
        std::thread::sleep(std::time::Duration::from_nanos(per_frame + 1_000_000));
        send(&mut h, CLIENT_B, 3000 + port);
    }
    let hosts = h.datapath.hosts().unwrap();
    let state = |client| {
        hosts
            .iter()
            .find(|(k, _)| *k == host_key(client))
            .map(|(_, s)| *s)
            .expect("host state")
    };
    let (a, b) = (state(CLIENT_A), state(CLIENT_B));
    let wire = a.bytes / a.packets;
    let unwaited = (a.bytes - a.waited_bytes) / wire;
    // The first packets fill the slack; the guard's lead then shrinks by the time the test took.
    let fit = slack / per_frame + 1;
    assert!(
        unwaited >= fit && unwaited <= fit + elapsed / per_frame + 1,
        "{unwaited} of 40 packets not counted as waited, {fit} fit in the slack"
    );
    assert!(a.backlogged_busy_ns >= (40 - unwaited) * per_frame);
    assert_eq!((b.packets, b.waited_bytes, b.backlogged_busy_ns), (5, 0, 0));
}

#[test]
fn a_newcomer_and_a_host_below_its_allocation_go_ahead_of_earlier_bookings() {
    // Host A's flow level overbooks the link twice over (the control plane has not counted the
    // others yet): the calendar's bins are full for tens of milliseconds ahead. Newcomer B, at
    // the newcomer level, is paced by its own clock at that level, not pushed behind A's
    // bookings; so is C, measured as using less than its allocation (flag AHEAD). Once B is
    // measured as bottlenecked (no flag), it books like any other host.
    let mut h = harness(Isolation::DualDstHost);
    set_rate(&mut h, CLIENT_A, ns_per_byte_fp(2 * RATE), 0, 0);
    let half = ns_per_byte_fp(RATE / 2);
    set_newcomer_level(&mut h, 1, half, true);
    set_rate(&mut h, CLIENT_C, half, half, host_flags::AHEAD);
    let a: Vec<u64> = (0..60).map(|_| send(&mut h, CLIENT_A, 1)).collect();
    let a_last = *a.iter().max().unwrap();
    let spacing = tx_time_ns(FRAME as u64, half);
    for client in [CLIENT_B, CLIENT_C] {
        let t: Vec<u64> = (0..3).map(|_| send(&mut h, client, 1)).collect();
        for w in t.windows(2) {
            assert!(
                w[1] - w[0] >= spacing && w[1] - w[0] <= spacing + 1_000_000,
                "{client:?}: spacing {} ns, its level's {spacing} ns (A booked until {} ms ahead)",
                w[1] - w[0],
                a_last.saturating_sub(t[0]) / 1_000_000
            );
        }
    }
    let before = send(&mut h, CLIENT_B, 1);
    set_rate(&mut h, CLIENT_B, half, half, 0);
    let measured = send(&mut h, CLIENT_B, 1);
    assert!(
        measured > before + spacing + 10_000_000,
        "a bottlenecked host books behind the full bins: {} ms after its previous packet",
        (measured - before) / 1_000_000
    );
}

/// The control plane's flags for the host `dst`, as its last tick wrote them.
fn host_flags_of(h: &Harness, dst: [u8; 4]) -> u64 {
    let rates = h.datapath.host_rates().expect("host rates");
    let key = host_key(dst);
    rates
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, r)| r.flags)
        .expect("a rate for the host")
}

#[test]
fn hosts_go_ahead_only_where_a_bottlenecked_host_can_be_pushed() {
    let mut h = harness(Isolation::DualDstHost);
    let mut control = Controller::new(RATE, Isolation::DualDstHost, Diffserv::Besteffort);
    let mut tick = |h: &mut Harness| {
        std::thread::sleep(std::time::Duration::from_millis(20));
        control.tick(&mut h.datapath).expect("tick");
    };
    tick(&mut h);
    // Two hosts whose flows never wait (one packet each per flow): neither is bottlenecked, so
    // neither goes ahead of the other's bookings, whatever its allocation.
    for port in 0..10 {
        send(&mut h, CLIENT_B, 100 + port);
        send(&mut h, CLIENT_C, 100 + port);
    }
    tick(&mut h);
    assert_eq!(host_flags_of(&h, CLIENT_B) & host_flags::AHEAD, 0);
    assert_eq!(host_flags_of(&h, CLIENT_C) & host_flags::AHEAD, 0);
    // Host A's one flow queues 30 frames: bottlenecked. Now the hosts below their allocation
    // go ahead of its bookings.
    for port in 0..10 {
        send(&mut h, CLIENT_B, 200 + port);
        send(&mut h, CLIENT_C, 200 + port);
    }
    for _ in 0..30 {
        send(&mut h, CLIENT_A, 1);
    }
    tick(&mut h);
    assert_eq!(host_flags_of(&h, CLIENT_A) & host_flags::AHEAD, 0);
    assert_ne!(host_flags_of(&h, CLIENT_B) & host_flags::AHEAD, 0);
    assert_ne!(host_flags_of(&h, CLIENT_C) & host_flags::AHEAD, 0);
}

#[test]
fn a_silent_host_is_removed_from_the_hosts_map() {
    let mut h = harness(Isolation::DualDstHost);
    let mut control = Controller::new(RATE, Isolation::DualDstHost, Diffserv::Besteffort);
    let mut tick = |h: &mut Harness| {
        std::thread::sleep(std::time::Duration::from_millis(12));
        control.tick(&mut h.datapath).expect("tick");
    };
    let hosts = |h: &Harness| {
        let keys: Vec<FlowKey> = h
            .datapath
            .hosts()
            .expect("hosts")
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        (
            keys.contains(&host_key(CLIENT_A)),
            keys.contains(&host_key(CLIENT_B)),
        )
    };
    tick(&mut h);
    send(&mut h, CLIENT_A, 1);
    send(&mut h, CLIENT_B, 1);
    tick(&mut h);
    assert_eq!(hosts(&h), (true, true));
    // B keeps sending a packet a tick; A falls silent. A's entry stays for 10 s of ticks
    // (forgotten, not removed), then goes; B's stays.
    for _ in 0..99 {
        send(&mut h, CLIENT_B, 1);
        tick(&mut h);
    }
    assert_eq!(hosts(&h), (true, true), "removed before 10 s of silence");
    send(&mut h, CLIENT_B, 1);
    tick(&mut h);
    send(&mut h, CLIENT_B, 1);
    tick(&mut h);
    assert_eq!(
        hosts(&h),
        (false, true),
        "the silent host is still in the map"
    );
    // It comes back as a new host, with an entry of its own.
    send(&mut h, CLIENT_A, 1);
    assert_eq!(hosts(&h), (true, true));
}

/// Plays the dequeue observer: the departures stamped up to `now` (oldest first) go through
/// the departure meter (`overrun::meter`) and the link at the rate, whose idle time earns the
/// slack's credit (`overrun::link_idle`, `earned`), as the observer would dequeue them.
struct Observer {
    words: Array<MapData, u64>,
    pending: std::collections::BinaryHeap<std::cmp::Reverse<(u64, u64)>>,
    meter: u64,
    link: u64,
    bin: u64,
}

impl Observer {
    fn new(h: &mut Harness) -> Self {
        h.datapath.set_slack_credit(0).unwrap();
        Self {
            words: departures(h),
            pending: Default::default(),
            meter: 0,
            link: 0,
            bin: h.datapath.config().calendar_bin_ns,
        }
    }

    fn stamped(&mut self, at: u64, tx: u64) {
        self.pending.push(std::cmp::Reverse((at, tx)));
    }

    fn dequeue_until(&mut self, now: u64) {
        let burst = overrun::burst_ns(self.bin);
        while let Some(&std::cmp::Reverse((at, tx))) = self.pending.peek() {
            if at > now {
                break;
            }
            self.pending.pop();
            let (link, idle) = overrun::link_idle(self.link, at, tx);
            self.link = link;
            let credit = self
                .words
                .get(&overrun::departures::SLACK_CREDIT, 0)
                .unwrap();
            let add = overrun::earned(credit, idle, overrun::slack_credit_cap(self.bin));
            self.words
                .set(
                    overrun::departures::SLACK_CREDIT,
                    credit.wrapping_add(add),
                    0,
                )
                .unwrap();
            let floor = overrun::credit_floor(at, burst, overrun::Due::InFront, SECOND);
            self.meter = overrun::meter(self.meter, at, tx, floor).meter_ns;
            self.words
                .set(overrun::departures::METER, self.meter, 0)
                .unwrap();
        }
    }

    /// When the last packet stamped leaves.
    fn last(&self) -> Option<u64> {
        self.pending.iter().map(|r| r.0.0).max()
    }
}

#[test]
fn guarded_bulk_beside_a_stream_of_sparse_newcomers_leaves_at_the_rate() {
    // Three host pairs (server -> a, b, c) with allocations that add up to the rate, two flows
    // each, sending as TCP Small Queues lets a local sender: a flow's next packet comes once
    // all but one of its packets have left. Spoofed sources send small packets to a fourth
    // address, each a newcomer, sparse and lent to. The test plays the dequeue observer
    // (`Observer`). Over 2 s of real time, what was stamped to leave stays within the rate
    // plus the meter's burst, and the bulk still fills what the flood leaves. With the slack
    // granted whenever the meter had some credit left, the lent packets rode on it: 6 % over
    // the rate.
    let mut h = Harness::new(with_short_bins(harness_config(Isolation::TripleIsolate)));
    let bin = h.datapath.config().calendar_bin_ns;
    let clients = [CLIENT_A, CLIENT_B, CLIENT_C];
    for c in clients {
        let key = FlowKey {
            src: [u32::from_ne_bytes(SERVER), 0, 0, 0],
            dst: [u32::from_ne_bytes(c), 0, 0, 0],
            family: 4,
            ..Default::default()
        };
        set_key_rate(
            &mut h,
            &key,
            ns_per_byte_fp(RATE / 6),
            ns_per_byte_fp(RATE / 3),
            0,
        );
    }
    set_newcomer_level(&mut h, 7, ns_per_byte_fp(RATE / 4), true);
    const SMALL: usize = 60;
    const FLOOD_GAP: u64 = 300_000;
    const RUN: u64 = 5 * SECOND / 2;
    const FROM: u64 = SECOND / 2;
    let full_rate = ns_per_byte_fp(RATE);
    let start = monotonic_now_ns();
    let mut queued: Vec<std::collections::VecDeque<u64>> = vec![Default::default(); 6];
    let mut observer = Observer::new(&mut h);
    let (mut bulk, mut flood) = (0u64, 0u64);
    let mut next_flood = start;
    let mut n = 0u32;
    loop {
        let now = monotonic_now_ns();
        if now - start >= RUN {
            break;
        }
        observer.dequeue_until(now);
        let mut stamped = |h: &mut Harness, frame: &[u8], len: usize| -> Option<u64> {
            let out = h.run(frame, &SkbContext::default());
            (out.verdict == PASS).then(|| {
                let at = out.ctx.tstamp().max(now);
                observer.stamped(at, tx_time_ns(len as u64, full_rate));
                at
            })
        };
        for (f, q) in queued.iter_mut().enumerate() {
            while q.front().is_some_and(|&d| d <= now) {
                q.pop_front();
            }
            if q.len() < 2 {
                let frame = packet::tcp4_flow(SERVER, clients[f / 2], 1000 + f as u16, 5201, FRAME);
                if let Some(at) = stamped(&mut h, &frame, FRAME) {
                    q.push_back(at);
                    if at >= start + FROM {
                        bulk += FRAME as u64;
                    }
                }
            }
        }
        if now >= next_flood {
            next_flood += FLOOD_GAP;
            n += 1;
            let src = [10, 128, (n >> 8) as u8, n as u8];
            let frame = packet::tcp4_flow(src, [10, 0, 9, 9], 40_000, 80, SMALL);
            if stamped(&mut h, &frame, SMALL).is_some_and(|at| at >= start + FROM) {
                flood += SMALL as u64;
            }
        }
    }
    // Stamped to leave from FROM on, up to where the last of them leaves.
    let last = observer.last().unwrap_or(start + RUN);
    let span = last.max(start + RUN) - (start + FROM);
    let mbit = |bytes: u64| bytes as f64 * 8e3 / span as f64;
    let burst = overrun::burst_ns(bin);
    let allowed = RATE as f64 / 1e6 * (1.0 + burst as f64 / span as f64);
    assert!(
        mbit(bulk + flood) <= allowed,
        "the bulk ({:.2} Mbit/s) and the lent flood ({:.2}) were stamped to leave at {:.2} Mbit/s, \
         more than the rate and the meter's burst allow ({allowed:.2})",
        mbit(bulk),
        mbit(flood),
        mbit(bulk + flood),
    );
    assert!(
        mbit(bulk + flood) >= 0.97 * RATE as f64 / 1e6,
        "the bulk ({:.2} Mbit/s) left room beside the flood ({:.2})",
        mbit(bulk),
        mbit(flood),
    );
}
