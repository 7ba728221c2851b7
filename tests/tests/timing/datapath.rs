//! Departure times the data path stamps in the running kernel (BPF_PROG_TEST_RUN on crafted
//! packets): spacing by wire time, per GSO segment, with overhead and MPU; the horizon; TCP's
//! own pacing; and the cost of a packet. Every test loads its own copy of the program, so its
//! maps start empty.

use shaper::{bpf::monotonic_now_ns, config::StateParams};
use shaper_common::{
    abi::HostRate,
    edt::{ns_per_byte_fp, tx_time_ns},
    framing::{self, Keyword, Word},
    stats::DropReason,
};
use shaper_tests::{DROP, Harness, PASS, TEST_STATE, config, packet, skb::SkbContext};

const SECOND: u64 = 1_000_000_000;
/// A rate at which each full frame takes ~12 ms and the smallest ~0.5 ms, so back-to-back test
/// runs find the clock ahead of now even on a loaded machine (a test run is a syscall).
const SLOW_BPS: u64 = 1_000_000;

fn stamped(h: &mut Harness, frame: &[u8]) -> u64 {
    let out = h.run(frame, &SkbContext::default());
    assert_eq!(out.verdict, PASS, "shaped packets continue");
    assert_ne!(out.ctx.tstamp(), 0, "an IP packet gets a departure time");
    out.ctx.tstamp()
}

#[test]
fn back_to_back_packets_are_spaced_by_their_wire_time() {
    let mut h = Harness::new(config(SLOW_BPS, SECOND));
    let fp = ns_per_byte_fp(SLOW_BPS);
    let big = packet::tcp4_frame(1514);
    let small = packet::tcp4_frame(66);
    let before = monotonic_now_ns();
    let t1 = stamped(&mut h, &big);
    let t2 = stamped(&mut h, &small);
    let t3 = stamped(&mut h, &big);
    let t4 = stamped(&mut h, &packet::udp6_frame(100));
    assert!(
        t1 >= before && t1 < before + SECOND / 10,
        "the first packet departs now"
    );
    assert_eq!(t2 - t1, tx_time_ns(1514, fp), "1514 bytes at 1 Mbit/s");
    assert_eq!(t3 - t2, tx_time_ns(66, fp));
    assert_eq!(t4 - t3, tx_time_ns(1514, fp));
    assert_eq!(t2 - t1, 12_112_000);
    let view = h.view();
    assert_eq!(view.stats.shaped_packets, 4);
    assert_eq!(
        view.stats.shaped_bytes,
        1514 + 66 + 1514 + (14 + 40 + 8 + 100)
    );
    assert!(view.backlog_ns > 0, "the clock is ahead of now");
}

#[test]
fn gso_packets_are_accounted_per_segment_as_the_qdisc_layer_counts_them() {
    let mut h = Harness::new(config(SLOW_BPS, 10 * SECOND));
    let fp = ns_per_byte_fp(SLOW_BPS);
    // 4 segments of 900 bytes: 66 header bytes in the buffer once, on the wire four times.
    // (Test runs take at most a page of data, hence the small segments.)
    let frame = packet::tcp4_frame(66 + 4 * 900);
    let wire_len = 4 * (66 + 900);
    let gso = SkbContext::default().with_gso(4, 900, wire_len);
    let t1 = h.run(&frame, &gso).ctx.tstamp();
    let t2 = h.run(&frame, &gso).ctx.tstamp();
    assert_eq!(t2 - t1, tx_time_ns(u64::from(wire_len), fp));
    assert_eq!(h.view().stats.shaped_bytes, 2 * u64::from(wire_len));
}

#[test]
fn framing_counts_what_the_link_sends_per_segment() {
    // 100 kbit/s, and a full frame first: the clock is then 120 ms ahead of now and stays
    // ahead, so each departure follows the last by exactly its wire time however slowly the
    // runs follow one another.
    let rate = SLOW_BPS / 10;
    let mut cfg = config(rate, 10 * SECOND);
    // Counted from the network header: the 14-byte Ethernet header is replaced by 24.
    cfg.framing = framing::resolve([Word::Overhead(24), Word::Mpu(84)]);
    let mut h = Harness::new(cfg);
    let fp = ns_per_byte_fp(rate);
    let tiny = packet::tcp4_frame(54);
    stamped(&mut h, &packet::tcp4_frame(1514));
    let t1 = stamped(&mut h, &tiny);
    let t2 = stamped(&mut h, &tiny);
    assert_eq!(t2 - t1, tx_time_ns(84, fp), "40 + 24 < mpu 84");
    // Four segments of 900 behind 66 bytes of headers: four frames of 952 IP bytes.
    let gso = SkbContext::default().with_gso(4, 900, 4 * 966);
    let t3 = h.run(&packet::tcp4_frame(66 + 4 * 900), &gso).ctx.tstamp();
    let t4 = stamped(&mut h, &tiny);
    assert_eq!(t3 - t2, tx_time_ns(84, fp));
    assert_eq!(t4 - t3, tx_time_ns(4 * (952 + 24), fp));

    // ATM (pppoa-vcmux): each segment in whole cells, the short last one on its own.
    let mut cfg = config(rate, 10 * SECOND);
    cfg.framing = framing::resolve([Word::Keyword(Keyword::PppoaVcmux)]);
    let mut h = Harness::new(cfg);
    stamped(&mut h, &packet::tcp4_frame(1514));
    let t1 = stamped(&mut h, &tiny);
    let gso = SkbContext::default().with_gso(3, 900, 2 * 966 + 166);
    let t2 = h
        .run(&packet::tcp4_frame(66 + 2 * 900 + 100), &gso)
        .ctx
        .tstamp();
    let t3 = stamped(&mut h, &tiny);
    assert_eq!(t2 - t1, tx_time_ns(2 * 53, fp), "40 + 10 bytes: two cells");
    // 952 + 10 bytes: 21 cells; the last, 152 + 10: 4.
    assert_eq!(t3 - t2, tx_time_ns(2 * 21 * 53 + 4 * 53, fp));
}

#[test]
fn departures_beyond_the_horizon_are_dropped_and_counted() {
    // 1 Mbit/s: 12.1 ms per frame; a 50 ms horizon admits departures up to 50 ms ahead.
    let mut h = Harness::new(config(1_000_000, 50_000_000));
    let frame = packet::tcp4_frame(1514);
    let verdicts: Vec<u32> = (0..8)
        .map(|_| h.run(&frame, &SkbContext::default()).verdict)
        .collect();
    assert_eq!(&verdicts[..5], &[PASS; 5], "0, 12, 24, 36, 48 ms ahead fit");
    assert_eq!(&verdicts[5..], &[DROP; 3], "60 ms ahead and beyond do not");
    let view = h.view();
    assert_eq!(view.stats.dropped[DropReason::Horizon as usize], 3);
    assert_eq!(view.stats.shaped_packets, 5);
    // Dropped packets did not advance the clock: the last departure is four frames ahead.
    assert!(view.backlog_ns <= 4 * 12_112_000 && view.backlog_ns > 3 * 12_112_000);
}

#[test]
fn tcp_pacing_timestamps_are_honoured() {
    let mut h = Harness::new(config(SLOW_BPS, SECOND));
    let frame = packet::tcp4_frame(1514);
    let paced = monotonic_now_ns() + 300_000_000;
    let out = h.run(&frame, &SkbContext::default().with_tstamp(paced));
    assert_eq!(
        out.ctx.tstamp(),
        paced,
        "a later departure chosen by TCP stands"
    );
    // A timestamp from another clock base (wall clock) is not a reason to hold or drop.
    let wall_clock = 1_700_000_000 * SECOND;
    let out = h.run(&frame, &SkbContext::default().with_tstamp(wall_clock));
    assert_eq!(out.verdict, PASS);
    assert!(out.ctx.tstamp() < monotonic_now_ns() + SECOND);
}

/// Per-packet cost, as the kernel measures it over many runs, without and with the data path's
/// debug events (`--log-datapath`: past their first burst, each packet is refused by its CPU's
/// budget). Printed for docs/benchmarks.md; the bound only catches pathologies (the budget in
/// the design is 250 ns on the host kernel).
#[test]
fn per_packet_cost() {
    for log_datapath in [false, true] {
        // A rate so high that the clock never runs ahead: every run takes the stamping path.
        let mut h = Harness::with_state(
            config(10_000_000_000_000, SECOND),
            &StateParams {
                log_datapath,
                ..TEST_STATE
            },
        );
        let logs = if log_datapath { ", --log-datapath" } else { "" };
        let cases = [
            ("ipv4 tcp 1514", packet::tcp4_frame(1514)),
            ("ipv6 udp 100", packet::udp6_frame(100)),
            ("arp", packet::arp_frame()),
        ];
        for (name, frame) in cases {
            as_measured(&mut h, &frame);
            let (out, ns) = h.run_repeat(&frame, &SkbContext::default(), 1_000_000);
            assert_eq!(out.verdict, PASS);
            println!("BPF_PROG_TEST_RUN {name}{logs}: {ns:.0} ns/packet (repeat 1000000)");
            assert!(ns < 2_000.0, "{name}{logs}: {ns} ns per packet");
        }
    }
}

/// Runs `frame` once and writes its host's rates as a control tick would (flows and guard at
/// the whole rate), then starts a new epoch: the runs after it take the path of a host the
/// control plane measured (its rates read, its guard booked), as on a loaded link.
fn as_measured(h: &mut Harness, frame: &[u8]) {
    h.run(frame, &SkbContext::default());
    let config = *h.datapath.config();
    h.rate_every_host(&HostRate::new(
        &config,
        config.ns_per_byte_fp,
        config.ns_per_byte_fp,
        0,
    ));
}

/// A new, lower rate (`shaper set --rate`, autorate) widens the calendar's bins: the bookings
/// made at the old width still place the next packet near where the rate puts it, not beyond
/// the horizon.
#[test]
fn a_lower_rate_with_wider_bins_keeps_departures_where_the_rate_puts_them() {
    let fast = config(50_000_000, SECOND);
    let slow = config(10_000_000, SECOND);
    assert!(slow.calendar_bin_ns > 2 * fast.calendar_bin_ns);
    let mut h = Harness::new(fast);
    let frame = |host: u8| packet::tcp4_flow([10, 0, 0, host], [10, 0, 0, 100], 40000, 5201, 1514);
    // Eight hosts' flows, each wanting to leave now: the later ones book behind the earlier
    // ones' bins, several bins ahead.
    for _ in 0..20 {
        for host in 1..=8 {
            stamped(&mut h, &frame(host));
        }
    }
    h.datapath.configure(&slow).unwrap();
    let now = monotonic_now_ns();
    let out = h.run(&frame(1), &SkbContext::default());
    assert_eq!(out.verdict, PASS, "dropped at the horizon");
    // 160 frames (39 ms at 50 Mbit/s) were booked ahead; the new bins may round that up to a
    // few of their widths.
    let ahead = out.ctx.tstamp().saturating_sub(now);
    assert!(ahead < SECOND / 5, "departs {} ms ahead", ahead / 1_000_000);
}
