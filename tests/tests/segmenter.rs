//! The data path's side of the segmenter (see shaper's `segmenter` module), through
//! BPF_PROG_TEST_RUN: a GSO packet over the split threshold is left unstamped to the
//! segmenter's filter, a frame handed back by the segmenter's IFB is stamped, and nothing loops.

use shaper_common::abi::ShaperConfig;
use shaper_tests::{Harness, PASS, config, packet, skb::SkbContext, stay_on_one_cpu};

const SECOND: u64 = 1_000_000_000;
const RATE_BPS: u64 = 10_000_000;
/// The split threshold at 10 Mbit/s: one frame (`link::GsoLimits::split_segs`).
const SPLIT_SEGS: u32 = 1;
const SEGMENTER_IFINDEX: u32 = 4_242;
/// The device a forwarded packet came in by.
const UPLINK_IFINDEX: u32 = 7;
/// The filter's verdicts (a classifier that is not direct-action), as the kernel returns them.
const MATCH: u32 = u32::MAX;
const NO_MATCH: u32 = 0;
/// A mark the data path would overwrite with a departure time.
const UNSTAMPED: u64 = 12_345;

fn with_segmenter(split_segs: u32, ifindex: u32) -> ShaperConfig {
    ShaperConfig {
        split_gso_segs: split_segs,
        segmenter_ifindex: ifindex,
        ..config(RATE_BPS, SECOND)
    }
}

/// A forwarded TSO super-packet of `segs` segments (a test run takes a page of data at most and
/// a `wire_len` of 64 KB at most; the data path reads the counts from the context, as the
/// kernel's skb has them).
fn forwarded_gso(segs: u32) -> SkbContext {
    SkbContext::default()
        .with_gso(segs, 1448, (segs * 1514).min(65_536))
        .with_ingress_ifindex(UPLINK_IFINDEX)
        .with_tstamp(UNSTAMPED)
}

#[test]
fn super_packets_over_the_threshold_go_to_the_segmenter_unstamped() {
    let mut h = Harness::new(with_segmenter(SPLIT_SEGS, SEGMENTER_IFINDEX));
    let frame = packet::tcp4_frame(1514);
    for segs in [2, 44] {
        let ctx = forwarded_gso(segs);
        let out = h.run(&frame, &ctx);
        assert_eq!(
            out.verdict, PASS,
            "{segs} segments: passed on to the filter"
        );
        assert_eq!(out.ctx.tstamp(), UNSTAMPED, "{segs} segments: not stamped");
        assert_eq!(
            h.run_segment(&frame, &ctx),
            MATCH,
            "{segs} segments: redirected"
        );
    }
    let view = h.view();
    assert_eq!(view.stats.segmented, 2);
    assert_eq!(
        view.stats.shaped_packets, 0,
        "nothing charged to the clocks"
    );
    assert_eq!(view.backlog_ns, 0);
}

#[test]
fn packets_within_the_threshold_are_stamped_whole() {
    let mut h = Harness::new(with_segmenter(4, SEGMENTER_IFINDEX));
    let frame = packet::tcp4_frame(1514);
    for ctx in [
        SkbContext::default().with_tstamp(UNSTAMPED),
        forwarded_gso(1),
        forwarded_gso(4),
    ] {
        let out = h.run(&frame, &ctx);
        assert_eq!(out.verdict, PASS);
        assert_ne!(out.ctx.tstamp(), UNSTAMPED, "{ctx:?}: stamped");
        assert_eq!(h.run_segment(&frame, &ctx), NO_MATCH, "{ctx:?}: stays");
    }
    let view = h.view();
    assert_eq!((view.stats.segmented, view.stats.shaped_packets), (0, 3));
}

#[test]
fn frames_handed_back_are_stamped_and_matched_to_clear_the_skip_mark() {
    let mut h = Harness::new(with_segmenter(SPLIT_SEGS, SEGMENTER_IFINDEX));
    let frame = packet::tcp4_frame(1514);
    let back = SkbContext::default()
        .with_ingress_ifindex(SEGMENTER_IFINDEX)
        .with_tstamp(UNSTAMPED);
    let out = h.run(&frame, &back);
    assert_ne!(
        out.ctx.tstamp(),
        UNSTAMPED,
        "a frame handed back is stamped"
    );
    // The match runs the filter's actions, which the IFB's mark skips (and clears).
    assert_eq!(h.run_segment(&frame, &back), MATCH);
    // A super-packet the IFB could not split is stamped whole, never sent around again.
    let unsplit = back.with_gso(44, 1448, 65_536);
    let out = h.run(&frame, &unsplit);
    assert_ne!(out.ctx.tstamp(), UNSTAMPED, "stamped whole");
    let view = h.view();
    assert_eq!((view.stats.segmented, view.stats.shaped_packets), (0, 2));
}

#[test]
fn without_a_segmenter_super_packets_are_stamped_whole() {
    let mut h = Harness::new(with_segmenter(0, 0));
    let frame = packet::tcp4_frame(1514);
    let ctx = forwarded_gso(44);
    let out = h.run(&frame, &ctx);
    assert_ne!(out.ctx.tstamp(), UNSTAMPED);
    assert_eq!(h.run_segment(&frame, &ctx), NO_MATCH);
    // Not even a frame from device 0 (a local packet) counts as handed back.
    let local = SkbContext::default();
    assert_eq!(h.run_segment(&frame, &local), NO_MATCH);
    assert_eq!(h.view().stats.segmented, 0);
}

#[test]
fn a_flows_packets_follow_its_frames_through_the_segmenter_until_they_are_back() {
    stay_on_one_cpu();
    let mut h = Harness::new(with_segmenter(SPLIT_SEGS, SEGMENTER_IFINDEX));
    let frame = packet::tcp4_frame(1514);
    let single = SkbContext::default()
        .with_ingress_ifindex(UPLINK_IFINDEX)
        .with_tstamp(UNSTAMPED);
    let back = SkbContext::default()
        .with_ingress_ifindex(SEGMENTER_IFINDEX)
        .with_tstamp(UNSTAMPED);

    // A super-packet of 3 segments goes to the segmenter; the flow's next packet follows it
    // there, unstamped, rather than leaving ahead of its frames.
    assert_eq!(h.run(&frame, &forwarded_gso(3)).ctx.tstamp(), UNSTAMPED);
    assert_eq!(h.run_segment(&frame, &forwarded_gso(3)), MATCH);
    let out = h.run(&frame, &single);
    assert_eq!(out.verdict, PASS);
    assert_eq!(
        out.ctx.tstamp(),
        UNSTAMPED,
        "the follower is not stamped here"
    );
    assert_eq!(
        h.run_segment(&frame, &single),
        MATCH,
        "the follower is redirected"
    );

    // Another flow is not held by this one's frames.
    let other = packet::tcp4_flow([10, 0, 0, 3], [10, 0, 0, 2], 40_001, 5201, 1514);
    assert_ne!(h.run(&other, &single).ctx.tstamp(), UNSTAMPED);
    assert_eq!(h.run_segment(&other, &single), NO_MATCH);

    // The three frames and the follower come back and are stamped in their order.
    let mut last = 0;
    for n in 0..4 {
        let out = h.run(&frame, &back);
        assert!(
            out.ctx.tstamp() != UNSTAMPED && out.ctx.tstamp() >= last,
            "frame {n}"
        );
        last = out.ctx.tstamp();
        assert_eq!(h.run_segment(&frame, &back), MATCH);
    }
    // All are back: the flow's next packet is stamped at once.
    assert_ne!(h.run(&frame, &single).ctx.tstamp(), UNSTAMPED);
    assert_eq!(h.run_segment(&frame, &single), NO_MATCH);

    let view = h.view();
    assert_eq!(view.stats.segmented, 1);
    assert_eq!(view.stats.segment_followers, 1);
    assert_eq!(
        view.stats.shaped_packets, 6,
        "four back, the other flow's, the last"
    );
}
