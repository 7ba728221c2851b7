//! Memory of the flow map in the running kernel: N distinct 5-tuples of one host through the
//! data path (BPF_PROG_TEST_RUN), max-flows N x 5/4, no new-flow quota. The LRU map must keep
//! every one of them, and on kernels that count a hash map's own memory (6.4 and later) what
//! the kernel charges must be what `shaper::mapmem` computes from the element layout. Prints
//! the figures for docs/notebook/reliability-memory.md. Needs root.

use shaper::{
    bpf::MapReader,
    config::{Options, Settings},
    mapmem,
};
use shaper_common::names::map_names;
use shaper_tests::{
    Harness, PASS,
    packet::{self, ETH_P_IP, Frame, UDP},
    skb::SkbContext,
};

/// Kernel version as (major, minor).
fn kernel() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let mut next = || parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (next(), next())
}

fn flows_in_memory(n: u64) {
    let mut settings = Settings::resolve(
        Options {
            iface: Some("lo".into()),
            rate: Some("1gbit".into()),
            ..Default::default()
        },
        None,
    )
    .expect("settings");
    settings.state.max_flows = (n * 5 / 4).max(1024) as u32;
    settings.state.flow_quota = 0;
    let mut h = Harness::with_state(settings.datapath_config(1514, 14, 65_536), &settings.state);
    let l4 = packet::udp_datagram(0, 0, 1);
    let mut frame = Frame::ether_type(ETH_P_IP)
        .payload(packet::ipv4(UDP, [10, 9, 0, 1], [10, 9, 0, 2], &l4))
        .build();
    let ctx = SkbContext::default();
    for j in 0..n {
        // Ethernet 14 + IPv4 20: the UDP ports.
        frame[34..36].copy_from_slice(&(1024 + (j % 64_000) as u16).to_be_bytes());
        frame[36..38].copy_from_slice(&(9 + (j / 64_000) as u16).to_be_bytes());
        // Dropped or not, the packet's flow has its entry.
        let _ = h.run(&frame, &ctx).verdict == PASS;
    }
    let cpus = aya::util::nr_cpus().map_or(1, |c| c as u64);
    // As `shaper stats --maps` opens them: by id.
    let maps = MapReader::by_ids(&h.datapath.map_ids().expect("map ids")).expect("open by id");
    let report = mapmem::report(&maps, cpus).expect("maps");
    let flows = report
        .maps
        .iter()
        .find(|m| m.name == map_names::FLOWS)
        .expect("flows map");
    println!(
        "RESULT kernel={}.{} flows_sent={n} flows_in_map={} max_flows={} computed_bytes={} memlock_bytes={:?} bytes_per_flow={}",
        kernel().0,
        kernel().1,
        flows.entries,
        flows.max_entries,
        flows.computed_bytes,
        flows.memlock_bytes,
        report.bytes_per_flow
    );
    assert_eq!(
        flows.entries, n,
        "the LRU map with room to spare lost flows"
    );
    if kernel() >= (6, 4) {
        let charged = flows.memlock_bytes.expect("memlock in fdinfo");
        // The kernel adds its table header and per-CPU lock counters to the elements and
        // buckets: a few KiB.
        assert!(
            charged >= flows.computed_bytes && charged <= flows.computed_bytes + 64 * 1024,
            "the kernel charges {charged} bytes for the flows, the layout gives {}",
            flows.computed_bytes
        );
    }
}

#[test]
fn a_thousand_flows() {
    flows_in_memory(1_000);
}

#[test]
fn a_hundred_thousand_flows() {
    flows_in_memory(100_000);
}

#[test]
#[ignore = "a million test runs: `cargo test -p shaper-tests --test memory -- --ignored`"]
fn a_million_flows() {
    flows_in_memory(1_000_000);
}
