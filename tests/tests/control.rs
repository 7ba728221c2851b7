//! The control loop's tick over many hosts, on a data path in the running kernel (needs root):
//! what one tick costs its thread as the hosts map grows.

use std::time::Duration;

use shaper::{config::StateParams, control::Controller};
use shaper_common::{abi::ShaperConfig, diffserv::Diffserv, isolation::Isolation};
use shaper_tests::{Harness, PASS, TEST_STATE, config, packet, skb::SkbContext};

const SECOND: u64 = 1_000_000_000;
const RATE_BPS: u64 = 1_000_000_000;

/// A data path keyed by (source, destination) pair, with room for `hosts` hosts and their flows.
fn harness(hosts: usize) -> Harness {
    Harness::with_state(
        ShaperConfig {
            isolation: Isolation::TripleIsolate as u32,
            host_mask_v4: u32::MAX,
            ..config(RATE_BPS, SECOND)
        },
        &StateParams {
            max_hosts: hosts as u32,
            max_flows: (4 * hosts).max(4_096) as u32,
            ..TEST_STATE
        },
    )
}

/// Host `n`'s frame: spoofed sources towards a few destinations, as a flood's.
fn frame(n: u32) -> Vec<u8> {
    let src = [10, (n >> 16) as u8, (n >> 8) as u8, n as u8];
    let dst = [192, 168, 0, (n % 7) as u8 + 1];
    packet::tcp4_flow(src, dst, 40_000, 80, 100 + (n % 1400) as usize)
}

/// The CPU time of each of `ticks` ticks (ns), each after hosts `first..first + hosts` sent a
/// packet (`first` moving on by `step` every tick: new hosts where `step` is not zero).
fn tick_cpu(
    h: &mut Harness,
    control: &mut Controller,
    hosts: u32,
    step: u32,
    ticks: usize,
) -> Vec<u64> {
    let mut cpu = Vec::with_capacity(ticks);
    let mut first = 0;
    for _ in 0..ticks {
        for n in first..first + hosts {
            let out = h.run(&frame(n), &SkbContext::default());
            assert_eq!(out.verdict, PASS);
        }
        first += step;
        // A tick less than 10 ms after the previous one does nothing.
        std::thread::sleep(Duration::from_millis(11));
        control.tick(&mut h.datapath).expect("tick");
        cpu.push(control.last_tick_ns().1);
    }
    cpu
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// The least CPU time of a tick, per host, over `hosts` hosts that all send every tick.
fn least_cpu_per_host(hosts: u32, ticks: usize) -> f64 {
    let mut h = harness(2 * hosts as usize);
    let mut control = Controller::new(RATE_BPS, Isolation::TripleIsolate, Diffserv::Besteffort);
    let cpu = tick_cpu(&mut h, &mut control, hosts, 0, ticks);
    *cpu[2..].iter().min().unwrap() as f64 / f64::from(hosts)
}

/// The tick's CPU time grows linearly with the hosts in the map, not faster. The least of
/// several ticks is compared (another process on the machine only adds to a tick's CPU time,
/// through its caches): 8 times the hosts may cost at most 3 times as much per host, where a
/// cost that grows with the square of the hosts would cost 8 times as much.
#[test]
fn a_ticks_cpu_time_grows_linearly_with_the_hosts() {
    let small = least_cpu_per_host(500, 8);
    let large = least_cpu_per_host(4_000, 8);
    println!("{small:.0} ns per host a tick over 500 hosts, {large:.0} over 4,000");
    assert!(
        large <= 3.0 * small,
        "{large:.0} ns per host a tick over 4,000 hosts, {small:.0} over 500"
    );
}

/// What a tick costs over a few hundred to a few thousand hosts, all sending every tick, and
/// under a flood that brings new hosts every tick into a full map. Prints only: run it with
/// `--ignored --nocapture` in a release build to follow the tick's cost.
#[test]
#[ignore = "a measurement, not a check"]
fn tick_cost() {
    for hosts in [250u32, 500, 1_000, 2_000, 4_000] {
        // The first two ticks see every host new.
        let show = |cpu: Vec<u64>| {
            let least = *cpu[2..].iter().min().unwrap();
            let median = median(cpu[2..].to_vec());
            format!(
                "{:.3} ms CPU a tick, median ({:.0} ns a host; least {:.0})",
                median as f64 / 1e6,
                median as f64 / f64::from(hosts),
                least as f64 / f64::from(hosts),
            )
        };
        let mut h = harness(2 * hosts as usize);
        let mut control = Controller::new(RATE_BPS, Isolation::TripleIsolate, Diffserv::Besteffort);
        let steady = show(tick_cpu(&mut h, &mut control, hosts, 0, 16));
        let mut h = harness(hosts as usize);
        let mut control = Controller::new(RATE_BPS, Isolation::TripleIsolate, Diffserv::Besteffort);
        let flood = show(tick_cpu(&mut h, &mut control, hosts, hosts / 2, 16));
        println!("hosts {hosts}: all sending: {steady}\nhosts {hosts}: flood: {flood}");
    }
}
