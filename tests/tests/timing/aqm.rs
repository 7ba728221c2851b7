//! The AQM in the running kernel (BPF_PROG_TEST_RUN): CoDel's signal on a flow whose queue
//! stands above target for an interval (a CE mark for ECN-capable packets, IPv4 with its
//! checksum fixed and IPv6; a drop otherwise, which books no wire time), the hard limit with
//! BLUE, and sparse flows leaving ahead of a bulk flow's queue.

use std::{thread::sleep, time::Duration};

use shaper::bpf::monotonic_now_ns;
use shaper_common::{
    abi::{FlowState, ShaperConfig},
    aqm::{AqmParams, flags},
    edt::{ns_per_byte_fp, tx_time_ns},
    isolation::Isolation,
    stats::{DELAY_BUCKETS, DropReason, delay_bucket_upper_ns},
};
use shaper_tests::{
    DROP, Harness, PASS, config, on_time,
    packet::{self, ETH_P_IPV6, Frame, UDP},
    skb::SkbContext,
};

const MS: u64 = 1_000_000;
const RATE: u64 = 10_000_000;
const FRAME: usize = 1514;
/// Full frames queued back to back: 24 ms at 10 Mbit/s, far above the standing floor (four
/// frames at the rate, 4.8 ms) and the target.
const BURST: usize = 20;

const INTERVAL_NS: u64 = 5 * MS;
/// Past the interval, well within the burst's 24 ms.
const PAST_THE_INTERVAL: Duration = Duration::from_millis(7);
/// CoDel's second signal comes an interval over the square root of two after its first.
const SIGNAL_SPACING_NS: u64 = INTERVAL_NS * 1_000 / 1_414;
/// How long after a burst's start its queue may be found standing, and how long after an
/// interval from there the first signal falls due: within the spacing to the second.
const SIGNAL_MARGIN_NS: u64 = MS;

const ECT0: u8 = 0b10;
const ECT1: u8 = 0b01;
const CE: u8 = 0b11;

fn harness(limit_ns: u64) -> Harness {
    harness_isolating(limit_ns, Isolation::Flows)
}

fn harness_isolating(limit_ns: u64, isolation: Isolation) -> Harness {
    Harness::new(ShaperConfig {
        isolation: isolation as u32,
        aqm: AqmParams {
            target_ns: MS,
            interval_ns: INTERVAL_NS,
            limit_ns,
            mtu_bytes: FRAME as u32,
            flags: flags::ECN,
            base_target_ns: MS,
        },
        ..config(RATE, 10_000 * MS)
    })
}

/// The state of the flow whose source port is `port` (the tests' flows differ by it).
fn flow(h: &Harness, port: u16) -> FlowState {
    h.datapath
        .flows(64)
        .expect("flows")
        .into_iter()
        .find(|(k, _)| k.src_port == port)
        .expect("flow")
        .1
}

/// An IPv4 TCP frame of a flow with the given ECN bits and a valid header checksum: a segment
/// that ends its sender's write (PSH).
fn tcp4(port: u16, ecn: u8) -> Vec<u8> {
    packet::tcp4_ds(port, ecn, FRAME)
}

/// The same from the middle of a write: no PSH.
fn tcp4_bulk(port: u16, ecn: u8) -> Vec<u8> {
    let mut f = tcp4(port, ecn);
    f[TCP_FLAGS] &= !PSH;
    f
}

/// Where the TCP sequence number and flags are in the tests' IPv4 frames.
const TCP_SEQ: usize = 14 + 20 + 4;
const TCP_FLAGS: usize = 14 + 20 + 13;
const PSH: u8 = 0x08;

/// An IPv6 UDP frame with the given ECN bits (traffic class 0 otherwise).
fn udp6(ecn: u8) -> Vec<u8> {
    let payload = FRAME - 14 - 40 - 8;
    let l4 = packet::udp_datagram(4000, 4001, payload);
    let mut ip = packet::ipv6(UDP, 1, 2, &l4);
    ip[1] |= ecn << 4;
    Frame::ether_type(ETH_P_IPV6).payload(ip).build()
}

/// The `i`th segment of the flow of `frame`: an IPv4 TCP frame gets the sequence number that
/// follows the `i - 1` before it (the same frame sent again would be a retransmission); any
/// other frame is returned as it is.
fn nth(frame: &[u8], i: usize) -> Vec<u8> {
    let mut f = frame.to_vec();
    if f[12..14] == [0x08, 0x00] && f[23] == 6 {
        let seq = (i * (FRAME - 54)) as u32;
        f[TCP_SEQ..TCP_SEQ + 4].copy_from_slice(&seq.to_be_bytes());
    }
    f
}

/// Queues a burst of the flow of `frame` and waits past the interval: the queue has stood
/// above target for longer than it.
fn standing_queue(h: &mut Harness, frame: &[u8]) {
    for i in 0..BURST {
        assert_eq!(h.run(&nth(frame, i), &SkbContext::default()).verdict, PASS);
    }
    sleep(PAST_THE_INTERVAL);
}

/// `standing_queue`, then the outcome of the next packet (segment `BURST`): the one CoDel
/// signals.
fn standing_queue_then_one_more(h: &mut Harness, frame: &[u8]) -> shaper_tests::Outcome {
    standing_queue(h, frame);
    h.run(&nth(frame, BURST), &SkbContext::default())
}

#[test]
fn ecn_capable_ipv4_is_marked_with_a_valid_checksum() {
    let mut h = harness(1_000 * MS);
    let frame = tcp4(40_000, ECT0);
    let out = standing_queue_then_one_more(&mut h, &frame);
    assert_eq!(out.verdict, PASS, "a marked packet goes on");
    assert_ne!(out.ctx.tstamp(), 0, "and keeps its departure time");
    assert_eq!(out.data[15] & 0b11, CE, "CE set");
    assert_eq!(out.data[15] >> 2, frame[15] >> 2, "DSCP untouched");
    assert_eq!(
        packet::ipv4_checksum(&out.data[14..34]),
        0,
        "header checksum still valid"
    );
    let stats = h.view().stats;
    assert_eq!(stats.ecn_marked, 1);
    assert_eq!(stats.dropped.iter().sum::<u64>(), 0);
    assert_eq!(stats.ecn_capable_dropped, 0);
}

#[test]
fn ecn_capable_ipv6_is_marked() {
    let mut h = harness(1_000 * MS);
    let frame = udp6(ECT1);
    let out = standing_queue_then_one_more(&mut h, &frame);
    assert_eq!(out.verdict, PASS);
    assert_eq!(
        (out.data[14 + 1] >> 4) & 0b11,
        CE,
        "CE in the traffic class"
    );
    assert_eq!(
        out.data[14] & 0x0f,
        frame[14] & 0x0f,
        "the rest of the class kept"
    );
    assert_eq!(h.view().stats.ecn_marked, 1);
}

#[test]
fn without_ecn_the_signal_is_a_drop_that_books_no_wire_time() {
    let frame = tcp4_bulk(40_001, 0);
    // The queue stands from the burst's start; the first signal is due an interval later and
    // the second an interval over the square root of two after that. The packet after the drop
    // must come before the second to show that it books from where the burst ended.
    let (h, next) = on_time("the second signal's time", || {
        let mut h = harness(1_000 * MS);
        let start = monotonic_now_ns();
        for i in 0..BURST {
            assert_eq!(h.run(&nth(&frame, i), &SkbContext::default()).verdict, PASS);
        }
        let stood_from = monotonic_now_ns();
        if stood_from - start >= SIGNAL_MARGIN_NS {
            return Err(stood_from - start);
        }
        // A spin, not a sleep: a timer's wake-up on a busy machine is late by more than the
        // window.
        while monotonic_now_ns() < start + INTERVAL_NS + SIGNAL_MARGIN_NS {
            std::hint::spin_loop();
        }
        let out = h.run(&nth(&frame, BURST), &SkbContext::default());
        assert_eq!(out.verdict, DROP);
        let next = h.run(&nth(&frame, BURST + 1), &SkbContext::default());
        let sent = monotonic_now_ns();
        let second_due = start + INTERVAL_NS + SIGNAL_SPACING_NS;
        if sent >= second_due {
            return Err(sent - second_due);
        }
        Ok((h, next))
    });
    let stats = h.view().stats;
    assert_eq!(stats.dropped[DropReason::Codel as usize], 1);
    assert_eq!(stats.ecn_marked, 0);
    // The flow's clock did not move for the dropped packet: the next one departs right after
    // the burst.
    assert_eq!(next.verdict, PASS);
    let flow = flow(&h, 40_001);
    assert_eq!(
        flow.packets,
        BURST as u64 + 1,
        "dropped packets are not counted as sent"
    );
    let tx = tx_time_ns(FRAME as u64, ns_per_byte_fp(RATE));
    assert_eq!(flow.clock_ns - next.ctx.tstamp(), tx);
}

#[test]
fn a_drop_due_on_a_segment_that_ends_a_write_falls_on_the_flows_next_packet() {
    let mut h = harness(1_000 * MS);
    let pushed = tcp4(40_004, 0);
    let out = standing_queue_then_one_more(&mut h, &pushed);
    assert_eq!(
        out.verdict, PASS,
        "the segment that may be the write's last goes on"
    );
    assert_ne!(out.ctx.tstamp(), 0);
    assert_eq!(h.view().stats.dropped[DropReason::Codel as usize], 0);
    // The drop is still due: the flow's next packet takes it, pushed or not.
    let next = h.run(
        &nth(&tcp4_bulk(40_004, 0), BURST + 1),
        &SkbContext::default(),
    );
    assert_eq!(next.verdict, DROP);
    assert_eq!(h.view().stats.dropped[DropReason::Codel as usize], 1);
    let mut h = harness(1_000 * MS);
    standing_queue_then_one_more(&mut h, &pushed);
    let again = h.run(&nth(&pushed, BURST + 1), &SkbContext::default());
    assert_eq!(
        again.verdict, DROP,
        "moved once: pushing every segment does not escape it"
    );
}

#[test]
fn a_drop_never_falls_on_a_retransmission() {
    let mut h = harness(1_000 * MS);
    let bulk = tcp4_bulk(40_005, 0);
    standing_queue(&mut h, &bulk);
    // The drop is due; the flow's first segment again and one that ends where the flow's data
    // does (retransmissions) both go on.
    for i in [0, BURST - 1] {
        let out = h.run(&nth(&bulk, i), &SkbContext::default());
        assert_eq!(out.verdict, PASS, "retransmission of segment {i}");
    }
    assert_eq!(h.view().stats.dropped[DropReason::Codel as usize], 0);
    // New data takes the drop.
    let new = h.run(&nth(&bulk, BURST), &SkbContext::default());
    assert_eq!(new.verdict, DROP);
    assert_eq!(h.view().stats.dropped[DropReason::Codel as usize], 1);
}

#[test]
fn in_a_flow_of_several_connections_another_connections_segment_is_not_a_retransmission() {
    // Flow-blind: every packet is one flow. Connection A queues; the drop falls due on a
    // segment of connection B whose sequence number lies below A's reach.
    let mut h = harness_isolating(1_000 * MS, Isolation::FlowBlind);
    let a = tcp4_bulk(40_006, 0);
    for i in 0..BURST {
        assert_eq!(h.run(&nth(&a, i + 5), &SkbContext::default()).verdict, PASS);
    }
    sleep(PAST_THE_INTERVAL);
    let b = h.run(&nth(&tcp4_bulk(40_007, 0), 1), &SkbContext::default());
    assert_eq!(
        b.verdict, DROP,
        "B's first segment is new, whatever A's reach"
    );
}

#[test]
fn the_hard_limit_drops_and_raises_blue() {
    // A 10 ms limit: a burst of 20 frames (24 ms) overflows it after 8 or 9 of them, unless
    // the burst itself took a frame's time. BLUE rises only once the overflow has lasted the
    // limit's time.
    let frame = tcp4(40_002, ECT0);
    let (h, verdicts, again) = on_time("a frame's time for the burst", || {
        let mut h = harness(10 * MS);
        let start = monotonic_now_ns();
        let verdicts: Vec<u32> = (0..BURST)
            .map(|i| h.run(&nth(&frame, i), &SkbContext::default()).verdict)
            .collect();
        // The first dropped segment sent again, as a local sender does at once: it never went
        // on, so it is new data and meets the limit; the first segment again is a
        // retransmission and passes it.
        let dropped = verdicts.iter().position(|v| *v != PASS).unwrap_or(0);
        let again = [dropped, 0].map(|i| h.run(&nth(&frame, i), &SkbContext::default()).verdict);
        let took = monotonic_now_ns() - start;
        if took >= tx_time_ns(FRAME as u64, ns_per_byte_fp(RATE)) {
            return Err(took);
        }
        Ok((h, verdicts, again))
    });
    let passed = verdicts.iter().filter(|v| **v == PASS).count();
    assert!((8..=10).contains(&passed), "{verdicts:?}");
    assert_eq!(
        again,
        [DROP, PASS],
        "a dropped segment sent again is dropped; a retransmission passes the limit"
    );
    let stats = h.view().stats;
    assert_eq!(
        stats.dropped[DropReason::Overlimit as usize],
        (BURST - passed) as u64 + 1,
        "ECN-capable or not, beyond the limit is a drop"
    );
    assert_eq!(
        stats.ecn_capable_dropped,
        (BURST - passed) as u64 + 1,
        "and counted as an ECN-capable packet's"
    );
    assert_eq!(
        flow(&h, 40_002).aqm.p_drop,
        0,
        "one burst's overflow is the sender's signal, not yet BLUE's"
    );
    // Overflowing on for more than the limit's time is a flow that does not answer.
    let mut h = h;
    let start = monotonic_now_ns();
    let mut i = BURST;
    while monotonic_now_ns() - start < 3 * 10 * MS {
        h.run(&nth(&frame, i), &SkbContext::default());
        i += 1;
    }
    assert!(flow(&h, 40_002).aqm.p_drop > 0, "BLUE was told");
}

#[test]
fn a_sparse_flow_departs_at_once_behind_a_queued_bulk_flow() {
    let bulk = tcp4(40_003, 0);
    let sparse = tcp4(40_004, 0);
    let tx = tx_time_ns(FRAME as u64, ns_per_byte_fp(RATE));
    // Its second packet must come within its time at its level of the first to find the flow's
    // clock still ahead.
    let (h, sparse_before) = on_time("the sparse flow's time at its level", || {
        let mut h = harness(1_000 * MS);
        let mut last = 0;
        for _ in 0..BURST {
            last = h.run(&bulk, &SkbContext::default()).ctx.tstamp();
        }
        let before = monotonic_now_ns();
        assert!(
            last > before + 15 * MS,
            "the bulk flow is queued ~24 ms ahead"
        );
        // A ping-like packet of another flow: it leaves now, not behind the 24 ms.
        let out = h.run(&sparse, &SkbContext::default());
        assert_eq!(out.verdict, PASS);
        let after = monotonic_now_ns();
        assert!(
            out.ctx.tstamp() >= before && out.ctx.tstamp() <= after,
            "departs at stamping time: {} not in [{before}, {after}]",
            out.ctx.tstamp()
        );
        let sparse_before = h.view().stats.sparse;
        assert!(
            sparse_before >= 2,
            "the bulk flow's first packet and this one"
        );
        h.run(&sparse, &SkbContext::default());
        let again = monotonic_now_ns() - before;
        if again >= tx {
            return Err(again - tx);
        }
        Ok((h, sparse_before))
    });
    // Its very next packet is no longer sparse: its own clock now runs ahead of now.
    assert_eq!(h.view().stats.sparse, sparse_before);
}

/// Flows isolated at 1 Mbit/s, where four bulk flows at the whole rate each (no control plane
/// lowers their levels) overbook the calendar: what comes after them books behind their 80
/// frames. Returns the harness, a 400-byte packet of another flow (port 40,006), carrying data
/// or a pure ACK padded to that size, and its time at its level (3.2 ms).
fn small_flow_beside_overbooked_bulk(pure_ack: bool) -> (Harness, Vec<u8>, u64) {
    const SMALL: usize = 400;
    let rate = 1_000_000;
    let mut h = Harness::new(ShaperConfig {
        isolation: Isolation::Flows as u32,
        aqm: AqmParams {
            target_ns: 5 * MS,
            interval_ns: 1_000 * MS,
            limit_ns: 1_000 * MS,
            mtu_bytes: FRAME as u32,
            flags: 0,
            base_target_ns: 5 * MS,
        },
        ..config(rate, 10_000 * MS)
    });
    for port in 40_010..40_014 {
        let bulk = tcp4(port, 0);
        for _ in 0..BURST {
            h.run(&bulk, &SkbContext::default());
        }
    }
    let mut small = packet::tcp4_ds(40_006, 0, if pure_ack { 54 } else { SMALL });
    // Ethernet padding beyond the IP packet: no TCP payload, the same time on the wire.
    small.resize(SMALL, 0);
    (h, small, tx_time_ns(SMALL as u64, ns_per_byte_fp(rate)))
}

#[test]
fn a_flow_found_idle_does_not_carry_its_next_frame_of_waits_to_its_clock() {
    // At 1 Mbit/s bulk flows book 80 full frames. A flow of 400-byte packets (3.2 ms
    // each at its level): its first leaves at once; its second, right behind it, queues behind
    // the bulk bookings, but its flow's clock stays at its own pace. So a packet after that
    // pace finds the flow idle again and goes as a sparse one, behind its own queued packet (in
    // order), instead of queuing behind the bulk bookings anew. No packet of it leaves before
    // an earlier one.
    let (mut h, small, tx) = small_flow_beside_overbooked_bulk(false);
    let clock = |h: &Harness| flow(h, 40_006).clock_ns;
    let start = monotonic_now_ns();
    let first = h.run(&small, &SkbContext::default()).ctx.tstamp();
    let second = h.run(&small, &SkbContext::default()).ctx.tstamp();
    assert!(first <= monotonic_now_ns(), "the first leaves at once");
    assert!(
        second > start + 100 * MS,
        "the second queues behind the bulk bookings: {} ms",
        (second - start) / MS
    );
    assert!(
        clock(&h) <= start + 3 * tx,
        "its wait is not carried to its flow's clock: {} ms ahead",
        (clock(&h) - start) / MS
    );
    let sparse = h.view().stats.sparse;
    sleep(Duration::from_nanos(
        clock(&h).saturating_sub(monotonic_now_ns()) + tx,
    ));
    let third = h.run(&small, &SkbContext::default()).ctx.tstamp();
    assert_eq!(h.view().stats.sparse, sparse + 1, "idle again: sparse");
    assert!(
        third >= second && third < second + 10 * MS,
        "it leaves behind its flow's queued packet, not behind the bulk anew: {} vs {} ms",
        (third - start) / MS,
        (second - start) / MS
    );
    // Found idle, it has a frame's bytes again. Its next packets, within them and past them,
    // leave in order behind the third, and its clock still advances by each one's own time.
    let before = clock(&h);
    let departs: Vec<u64> = (0..4)
        .map(|_| h.run(&small, &SkbContext::default()).ctx.tstamp())
        .collect();
    assert!(
        departs[0] >= third && departs.windows(2).all(|w| w[0] <= w[1]),
        "in order behind the third ({third}): {departs:?}"
    );
    assert!(clock(&h) >= before + 4 * tx, "its clock keeps its own pace");
}

/// A flow of 400-byte packets (data or padded pure ACKs) beside overbooked bulk flows sends one
/// packet (sparse), then, once its queue is empty but before it has been idle for a packet's
/// time at its level, a second. Returns the harness, the packet, whether the second was sparse,
/// when it was sent and when it departs.
fn second_packet_within_twice_its_pace(pure_ack: bool) -> (Harness, Vec<u8>, bool, u64, u64) {
    on_time("twice its time at its level", || {
        let (mut h, small, tx) = small_flow_beside_overbooked_bulk(pure_ack);
        let first = h.run(&small, &SkbContext::default()).ctx.tstamp();
        assert!(first <= monotonic_now_ns(), "the first leaves at once");
        let sparse = h.view().stats.sparse;
        let clock = flow(&h, 40_006).clock_ns;
        sleep(Duration::from_nanos(
            clock.saturating_sub(monotonic_now_ns()) + tx / 4,
        ));
        let sent = monotonic_now_ns();
        let second = h.run(&small, &SkbContext::default()).ctx.tstamp();
        if sent >= first + 2 * tx {
            return Err(sent - first);
        }
        let was_sparse = h.view().stats.sparse > sparse;
        Ok((h, small, was_sparse, sent, second))
    })
}

#[test]
fn a_flow_found_idle_stays_sparse_while_its_queue_is_empty() {
    // A flow at more than half its level: its second packet comes after the first's time at its
    // level (its queue is empty) but before twice that (it is not idle for a packet's time).
    // Within the frame's bytes of credit it stays sparse and leaves at once, not behind the
    // bulk bookings. A packet right behind that one finds the flow's queue not empty: it is
    // not sparse, and queues behind the bulk.
    let (mut h, small, was_sparse, sent, second) = second_packet_within_twice_its_pace(false);
    assert!(was_sparse, "its queue was empty: sparse");
    assert!(
        second <= monotonic_now_ns(),
        "it leaves at once, not behind the bulk bookings: {} ms ahead",
        second.saturating_sub(sent) / MS
    );
    let sparse = h.view().stats.sparse;
    let third = h.run(&small, &SkbContext::default()).ctx.tstamp();
    assert_eq!(
        h.view().stats.sparse,
        sparse,
        "right behind it, its queue is not empty: not sparse"
    );
    assert!(
        third > sent + 100 * MS,
        "it queues behind the bulk bookings: {} ms",
        (third - sent) / MS
    );
}

#[test]
fn a_pure_ack_flow_takes_the_strict_sparse_test_only() {
    // The same with pure ACKs (no payload, padded to the same size): an ACK flow's pace is its
    // download's, and it is sparse only when idle for an ACK's time at its level, so the second
    // queues behind the bulk bookings.
    let (_, _, was_sparse, sent, second) = second_packet_within_twice_its_pace(true);
    assert!(!was_sparse, "a pure ACK does not stay sparse");
    assert!(
        second > sent + 100 * MS,
        "it queues behind the bulk bookings: {} ms",
        second.saturating_sub(sent) / MS
    );
}

#[test]
fn scheduled_delay_is_histogrammed_per_frame() {
    let mut h = harness(1_000 * MS);
    let frame = tcp4(40_005, 0);
    for _ in 0..BURST {
        h.run(&frame, &SkbContext::default());
    }
    let hist = h.view().stats.delay_hist;
    assert_eq!(hist.iter().sum::<u64>(), BURST as u64);
    // The first waits nothing; the last about 23 ms (bucket [16.4, 32.8) ms).
    assert!(hist[0] >= 1, "{hist:?}");
    assert!(hist[9] >= 1, "{hist:?}");
    // Every frame but the first waits at least one frame's time (1.2 ms), beyond the 1 ms
    // target.
    assert_eq!(h.view().stats.over_target, BURST as u64 - 1);
    // The delays' sum (the metrics' histogram `_sum`) lies within what the buckets bound.
    let sum = h.view().stats.delay_sum_ns;
    let lower: u64 = (1..DELAY_BUCKETS)
        .map(|b| hist[b] * delay_bucket_upper_ns(b - 1))
        .sum();
    let upper = hist
        .iter()
        .enumerate()
        .map(|(b, &n)| n.saturating_mul(delay_bucket_upper_ns(b)))
        .fold(0, u64::saturating_add);
    assert!((lower..upper).contains(&sum), "{lower} <= {sum} < {upper}");
}

#[test]
fn sparse_packets_borrow_their_wire_time_from_the_future() {
    let tx = tx_time_ns(FRAME as u64, ns_per_byte_fp(RATE));
    let bin = config(RATE, 10_000 * MS).calendar_bin_ns;
    let bins_ahead = 3;
    let sparse = 20u16;
    // The bookings below take a fraction of a bin; a run that was descheduled past the bin it
    // began in no longer finds the calendar booked solid ahead of the probe.
    let (booked_end, depart) = on_time("the bin the bookings began in", || {
        let mut h = harness(1_000 * MS);
        let begin = monotonic_now_ns();
        // The calendar booked solid for three bins by bulk flows of their own (each flow's
        // queue stays under the AQM's floor: two frames each).
        let frames = (bins_ahead * (bin + bin / 16) / tx + 1) as u16;
        for port in 0..frames / 2 {
            for _ in 0..2 {
                h.run(&tcp4(41_000 + port, 0), &SkbContext::default());
            }
        }
        // Sparse packets leave at once, each from a flow of its own...
        for port in 0..sparse {
            let out = h.run(&tcp4(42_000 + port, 0), &SkbContext::default());
            assert!(
                out.ctx.tstamp() <= monotonic_now_ns(),
                "sparse leaves at once"
            );
        }
        // ...and a new bulk flow's second packet, pushed past the booked bins, now also
        // queues behind the wire time they took there.
        let probe = tcp4(43_000, 0);
        h.run(&probe, &SkbContext::default());
        let depart = h.run(&probe, &SkbContext::default()).ctx.tstamp();
        let end = monotonic_now_ns();
        if end / bin != begin / bin {
            return Err(end - begin);
        }
        Ok(((begin / bin + bins_ahead) * bin, depart))
    });
    assert!(
        depart >= booked_end + (sparse as u64 - 2) * tx,
        "the bulk packet leaves after the sparse packets' borrowed time: {} ms after the \
         booked bins, expected ≥ {} ms",
        depart.saturating_sub(booked_end) as f64 / MS as f64,
        ((sparse as u64 - 2) * tx) as f64 / MS as f64
    );
}
