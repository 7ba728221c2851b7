//! DiffServ tins in the running kernel (BPF_PROG_TEST_RUN): classification by DSCP and by
//! fwmark into per-tin hosts, washing the DSCP, and a prioritised tin going ahead of a full
//! calendar while a tin without priority waits behind it, also once the calendar has stopped
//! lending to sparse packets, and sparse packets still lent to while the prioritised tin owes.

use shaper::bpf::monotonic_now_ns;
use shaper_common::{
    abi::{Levels, ShaperConfig},
    diffserv::{Diffserv, dscp},
    edt::{ns_per_byte_fp, tx_time_ns},
    isolation::Isolation,
};
use shaper_tests::{
    Harness, PASS, config,
    packet::{self, ETH_P_IPV6, Frame, UDP},
    skb::SkbContext,
    with_short_bins,
};

const MS: u64 = 1_000_000;
const RATE: u64 = 10_000_000;
const FRAME: usize = 1514;
const VOICE: u8 = 3;

fn harness(wash: bool, fwmark_mask: u32) -> Harness {
    Harness::new(harness_config(wash, fwmark_mask))
}

fn harness_config(wash: bool, fwmark_mask: u32) -> ShaperConfig {
    let mode = Diffserv::Diffserv4;
    ShaperConfig {
        isolation: Isolation::DualDstHost as u32,
        host_mask_v4: u32::MAX,
        host_mask_v6: [u32::MAX, u32::MAX, 0, 0],
        tin_of_dscp: mode.table(),
        tins: mode.tins().len() as u32,
        fwmark_mask,
        fwmark_shift: fwmark_mask.trailing_zeros() % 32,
        wash: wash as u32,
        ..config(RATE, 10_000 * MS)
    }
}

/// The control plane's verdict that voice is within its threshold. No newcomer level: the hosts
/// book as measured, bottlenecked ones do (a newcomer goes ahead of earlier bookings in any
/// tin, see the fairness tests).
fn prioritise_voice(h: &mut Harness) {
    h.datapath
        .set_levels(&Levels {
            epoch: 1,
            priority_tins: 1 << VOICE,
            ..Default::default()
        })
        .unwrap();
}

/// An IPv4 TCP frame with a DS field (DSCP << 2 | ECN) and a valid header checksum.
fn tcp4(port: u16, ds: u8) -> Vec<u8> {
    packet::tcp4_ds(port, ds, FRAME)
}

fn tins_of_hosts(h: &Harness) -> Vec<u8> {
    let mut t: Vec<u8> = h
        .datapath
        .hosts()
        .expect("hosts")
        .iter()
        .map(|(k, _)| k.tin)
        .collect();
    t.sort();
    t
}

#[test]
fn dscp_and_fwmark_pick_the_tin_and_hosts_are_per_tin() {
    let mut h = harness(false, 0xff);
    let run = |h: &mut Harness, f: &[u8], mark: u32| {
        let out = h.run(f, &SkbContext::default().with_mark(mark));
        assert_eq!(out.verdict, PASS);
    };
    run(&mut h, &tcp4(1, dscp::EF << 2), 0);
    run(&mut h, &tcp4(2, 0), 0);
    run(&mut h, &tcp4(3, dscp::CS1 << 2), 0);
    assert_eq!(tins_of_hosts(&h), vec![0, 1, 3], "one host per tin");
    // fwmark 3 means tin 2 (video) whatever the DSCP; a mark beyond the tins is ignored.
    run(&mut h, &tcp4(4, dscp::EF << 2), 3);
    run(&mut h, &tcp4(5, 0), 9);
    assert_eq!(tins_of_hosts(&h), vec![0, 1, 2, 3]);
    let stats = h.view().stats;
    assert_eq!(stats.tin_packets[..4], [2, 1, 1, 1]);
    assert_eq!(stats.tin_packets[4..].iter().sum::<u64>(), 0);
    assert_eq!(stats.tin_bytes[VOICE as usize], FRAME as u64);
}

#[test]
fn wash_clears_the_dscp_and_keeps_ecn() {
    let mut h = harness(true, 0);
    let out = h.run(&tcp4(1, dscp::EF << 2 | 0b10), &SkbContext::default());
    assert_eq!(out.verdict, PASS);
    assert_eq!(out.data[15], 0b10, "DSCP cleared, ECT(0) kept");
    assert_eq!(
        packet::ipv4_checksum(&out.data[14..34]),
        0,
        "header checksum still valid"
    );
    assert_eq!(tins_of_hosts(&h), vec![VOICE], "classified before washing");
    // IPv6: the traffic class spans two bytes; the flow label's top nibble is kept.
    let l4 = packet::udp_datagram(4000, 4001, 100);
    let mut ip = packet::ipv6(UDP, 1, 2, &l4);
    let tc = dscp::AF41 << 2 | 0b01;
    ip[0] |= tc >> 4;
    ip[1] = (tc << 4) | 0x0a;
    let out = h.run(
        &Frame::ether_type(ETH_P_IPV6).payload(ip).build(),
        &SkbContext::default(),
    );
    assert_eq!(out.data[14], 0x60);
    assert_eq!(out.data[15], 0x1a, "ECT(1) and the flow label kept");
}

#[test]
fn a_prioritised_tin_goes_ahead_of_a_full_calendar() {
    let mut h = harness(false, 0);
    prioritise_voice(&mut h);
    // Best effort books the calendar three bins (~80 ms) ahead.
    let bulk = tcp4(1, 0);
    let bin = config(RATE, 10_000 * MS).calendar_bin_ns;
    let frames = (3 * bin / tx_time_ns(FRAME as u64, ns_per_byte_fp(RATE))) as usize;
    for _ in 0..frames {
        assert_eq!(h.run(&bulk, &SkbContext::default()).verdict, PASS);
    }
    let tx = tx_time_ns(FRAME as u64, ns_per_byte_fp(RATE));
    // Two back-to-back packets per tin: the first is sparse (leaves at once in any tin), the
    // second is paced by its own flow clock and books the calendar where that wants it.
    let pair = |h: &mut Harness, ds: u8| {
        let f = tcp4(100 + ds as u16, ds);
        let a = h.run(&f, &SkbContext::default()).ctx.tstamp();
        let b = h.run(&f, &SkbContext::default()).ctx.tstamp();
        (a, b)
    };
    let (v1, v2) = pair(&mut h, dscp::EF << 2);
    assert_eq!(
        v2 - v1,
        tx,
        "voice: its own pace, ahead of best effort's bookings"
    );
    let (w1, w2) = pair(&mut h, dscp::AF41 << 2);
    assert!(
        w2 - w1 > bin,
        "video (not prioritised here) waits behind the booked bins: {} ms",
        (w2 - w1) / MS
    );
}

/// Voice prioritised, bins for full frames (1 ms), and best effort booked 36 ms ahead by one
/// flow's 30 frames. Returns the harness and the bin's width.
fn best_effort_booked_ahead() -> (Harness, u64) {
    let mut h = Harness::new(with_short_bins(harness_config(false, 0)));
    prioritise_voice(&mut h);
    let bin = h.datapath.config().calendar_bin_ns;
    for _ in 0..30 {
        assert_eq!(h.run(&tcp4(1, 0), &SkbContext::default()).verdict, PASS);
    }
    (h, bin)
}

/// 20 new best-effort flows send one packet each; how many left within a bin of being sent
/// (the rest booked behind best effort).
fn new_flows_leaving_at_once(h: &mut Harness, bin: u64) -> u64 {
    (0..20)
        .filter(|port| {
            let before = monotonic_now_ns();
            h.run(&tcp4(2_000 + port, 0), &SkbContext::default())
                .ctx
                .tstamp()
                <= before + bin
        })
        .count() as u64
}

#[test]
fn a_prioritised_tin_is_lent_to_when_sparse_packets_ran_the_debt_up() {
    // Bins for full frames (1 ms): the calendar lends priority packets four of them. Best
    // effort books 36 ms ahead, then 20 new best-effort flows send one packet each: the first
    // few are lent their time, the rest book behind best effort (the calendar's lending is
    // used up). Voice, within its threshold, is still lent to: its own pace, not the bins'.
    let (mut h, bin) = best_effort_booked_ahead();
    let refused = 20 - new_flows_leaving_at_once(&mut h, bin);
    assert!(refused >= 10, "{refused} of 20 sparse packets waited");
    assert_eq!(
        h.view().stats.calendar_refused,
        refused,
        "shaper stats counts the packets the calendar would not lend to"
    );
    let voice = tcp4(100, dscp::EF << 2);
    let v1 = h.run(&voice, &SkbContext::default()).ctx.tstamp();
    let v2 = h.run(&voice, &SkbContext::default()).ctx.tstamp();
    let tx = tx_time_ns(FRAME as u64, ns_per_byte_fp(RATE));
    assert_eq!(v2 - v1, tx, "voice keeps its own pace");
}

#[test]
fn sparse_packets_are_still_lent_to_when_a_prioritised_tin_ran_the_debt_up() {
    // The converse: best effort books 36 ms ahead, voice sends a burst of ten frames (each
    // lent its time, all of it owed: the bins it may span are full), then 20 new best-effort
    // flows send one packet each. Voice's debt is its tin's (its threshold bounds it): the
    // sparse packets are lent to until their own debt reaches what the calendar lends (four
    // bins), as if voice had sent nothing, and only then book behind best effort.
    let (mut h, bin) = best_effort_booked_ahead();
    let tx = tx_time_ns(FRAME as u64, ns_per_byte_fp(RATE));
    let voice = tcp4(100, dscp::EF << 2);
    for _ in 0..10 {
        assert_eq!(h.run(&voice, &SkbContext::default()).verdict, PASS);
    }
    assert!(
        10 * tx > 4 * bin,
        "voice alone owes more than the calendar lends"
    );
    let at_once = new_flows_leaving_at_once(&mut h, bin);
    let lendable = (4 * bin).div_ceil(tx);
    assert!(
        at_once >= lendable && at_once < 20,
        "{at_once} of 20 sparse packets left at once (the calendar lends {lendable} frames)"
    );
    assert_eq!(h.view().stats.calendar_refused, 20 - at_once);
}
