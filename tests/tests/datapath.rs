//! The data path in the running kernel, through BPF_PROG_TEST_RUN on crafted packets: what it
//! shapes and what it passes untouched. Needs root. Every test loads its own copy of the
//! program, so its maps start empty. Departure times are tested in `timing/datapath.rs`.

use shaper::config::StateParams;
use shaper_common::stats::PassReason;
use shaper_tests::{
    Harness, PASS, TEST_STATE, config,
    packet::{self, Frame},
    skb::SkbContext,
};

const SECOND: u64 = 1_000_000_000;
/// A rate at which every packet of a test books the clock ahead of the next.
const SLOW_BPS: u64 = 1_000_000;

#[test]
fn every_ip_flavour_is_shaped() {
    let mut h = Harness::new(config(SLOW_BPS, 10 * SECOND));
    let tcp = packet::tcp_header(1, 2, packet::ACK);
    let udp = packet::udp_header(1, 2, 0);
    let icmp = vec![8, 0, 0, 0, 0, 1, 0, 1];
    let mut hop_by_hop = vec![packet::UDP, 0, 0, 0, 0, 0, 0, 0];
    hop_by_hop.extend_from_slice(&udp);
    let frames = [
        (
            "ipv4 tcp",
            Frame::ether_type(packet::ETH_P_IP).payload(packet::ipv4(
                packet::TCP,
                [1; 4],
                [2; 4],
                &tcp,
            )),
        ),
        (
            "ipv4 udp",
            Frame::ether_type(packet::ETH_P_IP).payload(packet::ipv4(
                packet::UDP,
                [1; 4],
                [2; 4],
                &udp,
            )),
        ),
        (
            "ipv4 icmp",
            Frame::ether_type(packet::ETH_P_IP).payload(packet::ipv4(
                packet::ICMP,
                [1; 4],
                [2; 4],
                &icmp,
            )),
        ),
        (
            "ipv6 tcp",
            Frame::ether_type(packet::ETH_P_IPV6).payload(packet::ipv6(packet::TCP, 1, 2, &tcp)),
        ),
        (
            "ipv6 icmpv6",
            Frame::ether_type(packet::ETH_P_IPV6).payload(packet::ipv6(
                packet::ICMPV6,
                1,
                2,
                &icmp,
            )),
        ),
        (
            "ipv6 hop-by-hop udp",
            Frame::ether_type(packet::ETH_P_IPV6).payload(packet::ipv6(
                packet::HOPOPTS,
                1,
                2,
                &hop_by_hop,
            )),
        ),
        (
            "vlan ipv4 tcp",
            Frame::ether_type(packet::ETH_P_IP)
                .vlan(packet::ETH_P_8021Q, 7)
                .payload(packet::ipv4(packet::TCP, [1; 4], [2; 4], &tcp)),
        ),
        (
            "qinq ipv6 udp",
            Frame::ether_type(packet::ETH_P_IPV6)
                .vlan(packet::ETH_P_8021AD, 100)
                .vlan(packet::ETH_P_8021Q, 7)
                .payload(packet::ipv6(packet::UDP, 1, 2, &udp)),
        ),
    ];
    let mut last = 0;
    for (name, frame) in &frames {
        let bytes = frame.build();
        let out = h.run(&bytes, &SkbContext::default());
        assert_eq!(out.verdict, PASS, "{name}");
        assert!(
            out.ctx.tstamp() > last,
            "{name} is stamped after the previous packet"
        );
        assert_eq!(out.data, bytes, "{name}: the packet itself is not modified");
        last = out.ctx.tstamp();
    }
    assert_eq!(h.view().stats.shaped_packets, frames.len() as u64);
}

/// PPP, WireGuard and IP tunnels carry no link-layer header: their packets start at the IP
/// header and the kernel's protocol says which IP. (BPF_PROG_TEST_RUN takes the protocol from
/// bytes 12-13 as if they were an Ethernet type: the source addresses below put 0x0800 and
/// 0x86dd there.)
#[test]
fn packets_of_a_device_that_carries_ip_alone_are_read_from_their_ip_header() {
    let mut cfg = config(SLOW_BPS, SECOND);
    cfg.link_header_bytes = 0;
    cfg.isolation = shaper_common::isolation::Isolation::Flows as u32;
    let mut h = Harness::new(cfg);
    let tcp = packet::tcp_header(40000, 5201, packet::ACK);
    let v4 = packet::ipv4(packet::TCP, [8, 0, 0, 1], [10, 0, 0, 2], &tcp);
    let mut v6 = packet::ipv6(packet::UDP, 1, 2, &packet::udp_datagram(5353, 53, 100));
    v6[12..14].copy_from_slice(&[0x86, 0xdd]);
    for (name, bytes) in [("ipv4 tcp", &v4), ("ipv6 udp", &v6)] {
        let out = h.run(bytes, &SkbContext::default());
        assert_eq!(out.verdict, PASS, "{name}");
        assert!(out.ctx.tstamp() > 0, "{name} is stamped");
        assert_eq!(
            &out.data, bytes,
            "{name}: the packet itself is not modified"
        );
    }
    let view = h.view();
    assert_eq!(view.stats.shaped_packets, 2);
    let flows = h.datapath.flows(usize::MAX).unwrap();
    let mut ports: Vec<_> = flows
        .iter()
        .map(|(k, _)| (k.family, k.src_port, k.dst_port))
        .collect();
    ports.sort();
    assert_eq!(ports, [(4, 40000, 5201), (6, 5353, 53)]);
    let v4_flow = flows.iter().find(|(k, _)| k.family == 4).unwrap().0;
    assert_eq!(v4_flow.src[0].to_ne_bytes(), [8, 0, 0, 1]);

    // The same bytes on an Ethernet device are not IP: left unshaped.
    let mut h = Harness::new(config(SLOW_BPS, SECOND));
    let out = h.run(&v4, &SkbContext::default());
    assert_eq!((out.verdict, out.ctx.tstamp()), (PASS, 0));
    assert_eq!(h.view().stats.shaped_packets, 0);
}

#[test]
fn non_ip_and_malformed_packets_pass_untouched_and_are_counted() {
    let mut h = Harness::new(config(SLOW_BPS, SECOND));
    let tcp = packet::tcp_header(1, 2, packet::ACK);
    let mut bad_ihl = packet::ipv4(packet::TCP, [1; 4], [2; 4], &tcp);
    bad_ihl[0] = 0x43;
    let mut bad_version = packet::ipv4(packet::TCP, [1; 4], [2; 4], &tcp);
    bad_version[0] = 0x65;
    let mut bad_doff = packet::ipv4(packet::TCP, [1; 4], [2; 4], &tcp);
    bad_doff[20 + 12] = 3 << 4;
    let mut v6_says_v4 = packet::ipv6(packet::TCP, 1, 2, &tcp);
    v6_says_v4[0] = 0x40;
    let truncated_tcp = packet::ipv4(packet::TCP, [1; 4], [2; 4], &tcp[..10]);
    let mut short_total_len = packet::ipv4(packet::TCP, [1; 4], [2; 4], &tcp);
    short_total_len[2..4].copy_from_slice(&10u16.to_be_bytes());
    // (BPF_PROG_TEST_RUN itself refuses IP frames shorter than an IP header, so truncation is
    // exercised past the fixed header.)
    let cases = [
        ("arp", packet::arp_frame(), PassReason::NonIp),
        (
            "vlan arp",
            Frame::ether_type(packet::ETH_P_ARP)
                .vlan(packet::ETH_P_8021Q, 3)
                .payload(vec![0; 28])
                .build(),
            PassReason::NonIp,
        ),
        (
            "lldp",
            Frame::ether_type(0x88cc).payload(vec![0; 40]).build(),
            PassReason::NonIp,
        ),
        (
            "ipv4 total length < header",
            Frame::ether_type(packet::ETH_P_IP)
                .payload(short_total_len)
                .build(),
            PassReason::Malformed,
        ),
        (
            "ipv4 ihl < 5",
            Frame::ether_type(packet::ETH_P_IP).payload(bad_ihl).build(),
            PassReason::Malformed,
        ),
        (
            "ipv4 version 6",
            Frame::ether_type(packet::ETH_P_IP)
                .payload(bad_version)
                .build(),
            PassReason::Malformed,
        ),
        (
            "tcp doff < 5",
            Frame::ether_type(packet::ETH_P_IP)
                .payload(bad_doff)
                .build(),
            PassReason::Malformed,
        ),
        (
            "truncated tcp",
            Frame::ether_type(packet::ETH_P_IP)
                .payload(truncated_tcp)
                .build(),
            PassReason::Malformed,
        ),
        (
            "ipv6 version 4",
            Frame::ether_type(packet::ETH_P_IPV6)
                .payload(v6_says_v4)
                .build(),
            PassReason::Malformed,
        ),
        (
            "truncated ipv6 extension",
            Frame::ether_type(packet::ETH_P_IPV6)
                .payload(packet::ipv6(packet::HOPOPTS, 1, 2, &[]))
                .build(),
            PassReason::Malformed,
        ),
        (
            "truncated ipv6 udp",
            Frame::ether_type(packet::ETH_P_IPV6)
                .payload(packet::ipv6(packet::UDP, 1, 2, &[0, 53, 0, 53]))
                .build(),
            PassReason::Malformed,
        ),
        (
            "truncated vlan",
            Frame::ether_type(packet::ETH_P_8021Q)
                .payload(vec![0, 1])
                .build(),
            PassReason::Malformed,
        ),
    ];
    let marker = 12_345;
    for (name, bytes, _) in &cases {
        let out = h.run(bytes, &SkbContext::default().with_tstamp(marker));
        assert_eq!(out.verdict, PASS, "{name}");
        assert_eq!(out.ctx.tstamp(), marker, "{name}: tstamp untouched");
        assert_eq!(&out.data, bytes, "{name}: data untouched");
    }
    let view = h.view();
    for reason in PassReason::ALL {
        let expected = cases.iter().filter(|c| c.2 == reason).count() as u64;
        assert_eq!(
            view.stats.passed[reason as usize],
            expected,
            "{}",
            reason.name()
        );
    }
    assert_eq!(view.stats.shaped_packets, 0);
    assert_eq!(view.backlog_ns, 0, "nothing was scheduled");
}

#[test]
fn without_a_configured_rate_everything_passes_unshaped() {
    let mut h = Harness::new(config(SLOW_BPS, SECOND));
    h.datapath.configure(&Default::default()).unwrap();
    let out = h.run(&packet::tcp4_frame(1514), &SkbContext::default());
    assert_eq!((out.verdict, out.ctx.tstamp()), (PASS, 0));
    assert_eq!(h.view().stats.passed[PassReason::Unconfigured as usize], 1);
}

#[test]
fn the_control_plane_reads_and_writes_hosts_in_batches() {
    use shaper_common::{
        abi::{HostRate, ShaperConfig},
        isolation::Isolation,
    };
    // More hosts than the maps hold, as under a flood of spoofed sources; more than a lookup
    // batch asks for at first, too.
    const MAX_HOSTS: usize = 3_000;
    let mut h = Harness::with_state(
        ShaperConfig {
            isolation: Isolation::DualDstHost as u32,
            host_mask_v4: u32::MAX,
            ..config(10_000_000_000, SECOND)
        },
        &StateParams {
            max_hosts: MAX_HOSTS as u32,
            ..TEST_STATE
        },
    );
    let dst = |n: u32| [10, 1, (n >> 8) as u8, n as u8];
    for n in 0..MAX_HOSTS as u32 + 300 {
        let out = h.run(
            &packet::tcp4_flow([10, 0, 0, 1], dst(n), 40_000, 5201, 100),
            &SkbContext::default(),
        );
        assert_eq!(out.verdict, PASS);
    }
    let hosts = h.datapath.hosts().unwrap();
    let mut keys: Vec<_> = hosts.iter().map(|(k, _)| k.dst[0]).collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), hosts.len(), "each host once");
    assert!(
        hosts.len() > MAX_HOSTS / 2 && hosts.len() <= MAX_HOSTS,
        "{} hosts read back, the map holds {MAX_HOSTS}",
        hosts.len()
    );
    for (key, state) in &hosts {
        let addr = key.dst[0].to_ne_bytes();
        assert_eq!(addr[..2], [10, 1], "{key:?}");
        assert!(state.bytes > 0, "{key:?}: {state:?}");
    }
    // Rates for every host sent to and more, 100 more than the rates map holds (the LRU hosts
    // map evicts in batches, so how many hosts it kept varies): the ones it has no room for
    // are left out and counted, the others written.
    let all: Vec<_> = hosts.iter().map(|(k, _)| *k).collect();
    let mut extra = *all.first().unwrap();
    let rate = HostRate::new(h.datapath.config(), 1, 2, 0);
    let mut rates: Vec<_> = all.iter().map(|k| (*k, rate)).collect();
    for n in 10_000..10_000 + (MAX_HOSTS + 100 - all.len()) as u32 {
        extra.dst[0] = u32::from_ne_bytes(dst(n));
        rates.push((extra, rate));
    }
    let left_out = h.datapath.set_host_rates(&rates).unwrap();
    assert_eq!(left_out, 100);
    let written = h.datapath.host_rates().unwrap();
    assert_eq!(written.len(), MAX_HOSTS);
    assert!(written.iter().all(|(_, r)| *r == rate));
    // Removing hosts and rates, some of them long gone.
    let mut gone = all.clone();
    gone.push(extra);
    h.datapath.remove_hosts(&gone).unwrap();
    assert!(h.datapath.hosts().unwrap().is_empty());
    assert_eq!(
        h.datapath.host_rates().unwrap().len(),
        MAX_HOSTS,
        "rates stay"
    );
    h.datapath.remove_host_rates(&gone).unwrap();
    let rated = h.datapath.host_rates().unwrap();
    assert!(
        rated.iter().all(|(k, _)| !gone.contains(k)),
        "{} rates left",
        rated.len()
    );
}

#[test]
fn the_machines_own_addresses_are_one_host_in_either_family() {
    use std::{
        collections::BTreeSet,
        net::{IpAddr, Ipv4Addr},
    };

    use shaper::own;
    use shaper_common::{
        abi::{FlowKey, ShaperConfig},
        isolation::{Isolation, SELF_HOST, prefix_mask},
    };
    // The server: 10.0.0.1 and fd00::1 (`packet::ipv6` addresses are fd00::LAST).
    let server_v4 = Ipv4Addr::new(10, 0, 0, 1);
    let server_v6: IpAddr = "fd00::1".parse().unwrap();
    let both: BTreeSet<_> = [
        own::lookup_key(server_v4.into()),
        own::lookup_key(server_v6),
    ]
    .into();
    let v4_to = |last: u8| packet::tcp4_flow(server_v4.octets(), [10, 0, 0, last], 40_000, 80, 100);
    let v6_from = |src_last: u8, dst_last: u8| {
        let tcp = packet::tcp_header(40_000, 80, packet::ACK);
        Frame::ether_type(packet::ETH_P_IPV6)
            .payload(packet::ipv6(packet::TCP, src_last, dst_last, &tcp))
            .build()
    };
    let harness = |mode: Isolation| {
        let mut h = Harness::new(ShaperConfig {
            isolation: mode as u32,
            host_mask_v4: u32::MAX,
            host_mask_v6: prefix_mask(64, 4),
            ..config(10_000_000_000, SECOND)
        });
        assert_eq!(h.datapath.set_own_addresses(&both).unwrap(), 0);
        h
    };
    let send = |h: &mut Harness, frame: &[u8]| {
        assert_eq!(h.run(frame, &SkbContext::default()).verdict, PASS);
    };
    let keys = |h: &Harness| -> Vec<FlowKey> {
        let mut keys: Vec<_> = h
            .datapath
            .hosts()
            .unwrap()
            .iter()
            .map(|(k, _)| *k)
            .collect();
        keys.sort_by_key(|k| (k.family, k.src, k.dst));
        keys
    };

    // Pairs: the server is the source of both families' pairs; fd00::5, in its /64 but not
    // its own, is a host of its own.
    let mut h = harness(Isolation::TripleIsolate);
    send(&mut h, &v4_to(9));
    send(&mut h, &v6_from(1, 9));
    send(&mut h, &v6_from(5, 9));
    let pairs = keys(&h);
    assert_eq!(pairs.len(), 3, "{pairs:?}");
    assert_eq!((pairs[0].src, pairs[0].family), (SELF_HOST, 4), "{pairs:?}");
    let fd00 = [u32::from_ne_bytes([0xfd, 0, 0, 0]), 0, 0, 0];
    assert_eq!((pairs[1].src, pairs[1].family), (fd00, 6), "{pairs:?}");
    assert_eq!((pairs[2].src, pairs[2].family), (SELF_HOST, 6), "{pairs:?}");

    // Sources alone: the server is one host, with no family.
    let mut h = harness(Isolation::DualSrcHost);
    send(&mut h, &v4_to(9));
    send(&mut h, &v6_from(1, 9));
    let hosts = keys(&h);
    assert_eq!(hosts.len(), 1, "{hosts:?}");
    assert_eq!((hosts[0].src, hosts[0].family), (SELF_HOST, 0));

    // The IPv4 address goes: its packets are a host of their own again.
    let v6_only: BTreeSet<_> = [own::lookup_key(server_v6)].into();
    assert_eq!(h.datapath.set_own_addresses(&v6_only).unwrap(), 0);
    send(&mut h, &v4_to(9));
    let hosts = keys(&h);
    assert_eq!(hosts.len(), 2, "{hosts:?}");
    assert_eq!(
        (hosts[1].src, hosts[1].family),
        ([u32::from_ne_bytes(server_v4.octets()), 0, 0, 0], 4)
    );
}
