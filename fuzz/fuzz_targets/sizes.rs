//! The sizes and counts a user gives (`overhead`, `mpu`, `[fq]`'s limits, `[state]`), from the
//! command line or the file, and what the data path makes of them.
//!
//! - Settings resolve exactly when every value is within its documented range (README,
//!   `ConfigError`), and then hold the values given (the file's unless the command line has
//!   one).
//! - A packet's bytes on the link (`Framing::packet_bytes`), for any packet the kernel may hand
//!   over, are computed without overflow, never zero and never under the MPU; a frame without
//!   GSO is its length (from the network header once an overhead is given), plus the overhead.
//! - The data path's configuration for any device frame and GSO limits is computed without
//!   overflow and stays within what the data path relies on.
#![no_main]

use std::ops::RangeInclusive;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use shaper::{
    config::{FqOptions, Options, Settings, StateOptions, defaults},
    link::GsoLimits,
};
use shaper_common::framing::{Cells, Packet};

#[derive(Arbitrary, Debug)]
struct Input {
    rate_bps: u64,
    overhead: Option<i32>,
    mpu: Option<u32>,
    /// Whether `overhead` and `mpu` come from the command line (else from the file).
    on_command_line: bool,
    /// An overhead on the command line that overrides the file's.
    overriding_overhead: Option<i32>,
    fq_limit: Option<u32>,
    fq_flow_limit: Option<u32>,
    host_prefix_v4: Option<u32>,
    host_prefix_v6: Option<u32>,
    max_flows: Option<u32>,
    max_hosts: Option<u32>,
    flow_quota: Option<u32>,
    /// A packet: its length as the qdisc layer counts it and as it is, its GSO segments and
    /// their size, where its network header starts; and the link's cells.
    qdisc_len: u32,
    len: u32,
    gso_segs: u32,
    gso_size: u32,
    network_offset: u8,
    cells: u8,
    /// The device: its MTU and GSO limits.
    mtu: u16,
    gso_max_size: u32,
    gso_max_segs: u16,
}

/// A value given or its default, and whether it is within its documented range.
fn check<T: Copy + PartialOrd>(
    value: Option<T>,
    default: T,
    range: RangeInclusive<T>,
) -> (T, bool) {
    let v = value.unwrap_or(default);
    (v, range.contains(&v))
}

fuzz_target!(|input: Input| {
    let mut cli = Options {
        iface: Some("eth0".into()),
        rate: Some(format!("{}bit", input.rate_bps)),
        ..Default::default()
    };
    let mut file = Options {
        fq: Some(FqOptions {
            limit: input.fq_limit,
            flow_limit: input.fq_flow_limit,
        }),
        state: Some(StateOptions {
            host_prefix_v4: input.host_prefix_v4,
            host_prefix_v6: input.host_prefix_v6,
            max_flows: input.max_flows,
            max_hosts: input.max_hosts,
            flow_quota: input.flow_quota,
        }),
        ..Default::default()
    };
    if input.on_command_line {
        (cli.overhead, cli.mpu) = (input.overhead, input.mpu);
    } else {
        (file.overhead, file.mpu) = (input.overhead, input.mpu);
        cli.overhead = input.overriding_overhead;
    }
    let overhead_given = cli.overhead.or(file.overhead);

    let rate_ok = (1_000..=10_000_000_000_000).contains(&input.rate_bps);
    let (overhead, overhead_ok) = check(overhead_given, 0, -64..=256);
    let (mpu, mpu_ok) = check(input.mpu, 0, 0..=1_500);
    // Unset, fq's limits follow the rate (and are then in range by construction).
    let (_, limit_ok) = check(input.fq_limit, 1, 1..=1_000_000);
    let (_, flow_limit_ok) = check(input.fq_flow_limit, 1, 1..=1_000_000);
    let (v4, v4_ok) = check(input.host_prefix_v4, defaults::HOST_PREFIX_V4, 1..=32);
    let (v6, v6_ok) = check(input.host_prefix_v6, defaults::HOST_PREFIX_V6, 1..=128);
    let (flows, flows_ok) = check(input.max_flows, defaults::MAX_FLOWS, 1_024..=1 << 24);
    let (hosts, hosts_ok) = check(input.max_hosts, defaults::MAX_HOSTS, 16..=1 << 22);
    let (quota, quota_ok) = check(input.flow_quota, defaults::FLOW_QUOTA, 0..=1 << 24);
    let all_ok = rate_ok
        && overhead_ok
        && mpu_ok
        && limit_ok
        && flow_limit_ok
        && v4_ok
        && v6_ok
        && flows_ok
        && hosts_ok
        && quota_ok;

    let resolved = Settings::resolve_with(cli, file);
    let settings = match resolved {
        Ok(s) => s,
        Err(e) => {
            assert!(!all_ok, "{input:?} rejected: {e}");
            return;
        }
    };
    assert!(all_ok, "{input:?} accepted: {settings:?}");
    assert_eq!(settings.rate_bps, input.rate_bps);
    let state = settings.state;
    assert_eq!(
        (
            state.host_prefix_v4,
            state.host_prefix_v6,
            state.max_flows,
            state.max_hosts,
            state.flow_quota
        ),
        (v4, v6, flows, hosts, quota)
    );
    let fq = settings.fq;
    for (given, got) in [
        (input.fq_limit, fq.limit_packets),
        (input.fq_flow_limit, fq.flow_limit_packets),
    ] {
        assert!((1..=1_000_000).contains(&got));
        assert!(given.is_none_or(|g| g == got));
    }

    let framing = settings.framing;
    assert_eq!((framing.overhead, framing.mpu), (overhead, mpu));
    assert_eq!(framing.from_network != 0, overhead_given.is_some());
    let framing = shaper_common::framing::Framing {
        cells: [Cells::None, Cells::Atm, Cells::Ptm][usize::from(input.cells % 3)] as u32,
        ..framing
    };
    let packet = Packet {
        qdisc_len: input.qdisc_len,
        len: input.len,
        segs: input.gso_segs,
        seg_size: input.gso_size,
        network_offset: u32::from(input.network_offset),
    };
    let wire = framing.packet_bytes(packet);
    assert!(wire >= 1 && wire >= u64::from(mpu));
    if input.gso_segs <= 1 && framing.cells == Cells::None as u32 {
        let from = if framing.from_network != 0 {
            input.qdisc_len.saturating_sub(packet.network_offset)
        } else {
            input.qdisc_len
        };
        let adjusted = (i64::from(from) + i64::from(overhead)).max(1);
        assert_eq!(wire as i64, adjusted.max(i64::from(mpu)));
    }

    let frame_bytes = u32::from(input.mtu.max(68)) + 14;
    let gso = GsoLimits {
        max_size: input.gso_max_size,
        max_segs: u32::from(input.gso_max_segs),
    };
    let largest = gso.largest_packet_bytes(frame_bytes);
    assert!(largest >= 2 * u64::from(frame_bytes));
    let config = settings.datapath_config(frame_bytes, 14, largest);
    assert!(config.calendar_bin_ns >= 1_000_000);
    assert!(config.aqm.target_ns > 0 && config.aqm.interval_ns >= 2 * config.aqm.target_ns);
    assert!(config.aqm.limit_ns <= settings.horizon_ns);
    assert!(config.lent_window_ns > 0);
    assert_eq!(config.fwmark_shift, 0);
    assert_eq!(config.host_mask_v4.count_ones(), v4);
    let v6_bits: u32 = config.host_mask_v6.iter().map(|w| w.count_ones()).sum();
    assert_eq!(v6_bits, v6);
});
