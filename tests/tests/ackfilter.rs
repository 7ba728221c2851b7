//! The ACK filter in the running kernel (BPF_PROG_TEST_RUN): the egress program hands pure
//! ACKs to the filter by a tail call, the filter drops those a later ACK will certainly cover
//! (data beyond them seen at ingress, enough of the flow's ACKs scheduled) and calls the egress
//! program back for the others. Every eligibility rule, IPv4 and IPv6.

use shaper_common::{
    ackfilter::{AckFilter, KeepReason, tcp_flags::*},
    datapath::ShaperConfig,
};
use shaper_tests::{
    DROP, Harness, PASS, config,
    packet::{ETH_P_IP, ETH_P_IPV6, Frame, TCP, ipv4, ipv6},
    skb::SkbContext,
};

const SECOND: u64 = 1_000_000_000;
/// 1 Mbit/s: a 66-byte ACK takes 0.5 ms, so back-to-back test runs find earlier ones still
/// scheduled.
const RATE: u64 = 1_000_000;
const HOST: [u8; 4] = [10, 0, 0, 1];
const PEER: [u8; 4] = [10, 0, 0, 2];

fn harness(mode: AckFilter) -> Harness {
    Harness::new(ShaperConfig {
        ack_filter: mode as u32,
        ..config(RATE, 10 * SECOND)
    })
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
    // SACK blocks present, and growing.
    let sack = |hi: u32| {
        let mut o = ts.clone();
        o.extend_from_slice(&[1, 1, 5, 10]);
        o.extend_from_slice(&50_001u32.to_be_bytes());
        o.extend_from_slice(&hi.to_be_bytes());
        o
    };
    assert_eq!(
        send(&mut h, &with(40_001, &|s| s.options = sack(60_001))),
        PASS
    );
    assert_eq!(
        send(&mut h, &with(40_001, &|s| s.options = sack(70_001))),
        PASS
    );
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
