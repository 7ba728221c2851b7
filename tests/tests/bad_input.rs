//! Bad input: random and mutated frames (`shaper_tests::fuzz`) through every packet program of
//! the data path by BPF_PROG_TEST_RUN. The verifier proves that no program reads past the
//! packet; these tests show what the programs do with what they read. Every run is one the
//! kernel takes; every verdict is one the design allows; each frame is counted under the fate
//! the oracle (`shaper_tests::oracle`) gives it; a malformed or non-IP frame passes with its
//! bytes and context untouched; an IP packet is rewritten at most in its DS field (CE, wash).
//!
//! `SHAPER_FUZZ_PACKETS` sets the frames each test runs (default [`DEFAULT_PACKETS`]; in the
//! VM, tests/vm/bpf-fuzz.sh runs them on each test kernel), `SHAPER_FUZZ_SEED` the generator's
//! seed. A failure names both and the case, whose frames the same seed brings back (the
//! clock, which the data path reads, differs).
//!
//! Not here: `shaper_dequeue`, a raw tracepoint whose input is the qdisc's own pointers (read
//! through `bpf_probe_read_kernel`, which fails cleanly on a bad address), not packet bytes;
//! frames whose headers are paged (a test run builds a linear skb), so the parser's pull is
//! not reached.

use std::time::Instant;

use shaper::{
    bpf::monotonic_now_ns,
    config::{Options, Settings},
};
use shaper_common::{
    abi::{FlowKey, HostRate, ShaperConfig, host_flags},
    names::program_names,
    stats::{DatapathStats, DropReason, PassReason},
};
use shaper_tests::{
    DROP, Harness, Outcome, PASS, TEST_STATE,
    fuzz::{Case, Generator, SEGMENTER_IFINDEX},
    oracle::{self, Expected, Rewrites},
    skb::SkbContext,
};

/// Frames per test without `SHAPER_FUZZ_PACKETS`.
const DEFAULT_PACKETS: u64 = 1_000_000;
const DEFAULT_SEED: u64 = 44;
/// The segmenter's classifier's verdicts (not direct-action).
const MATCH: u32 = u32::MAX;
const NO_MATCH: u32 = 0;
/// `skb->priority` the scheduler gives a kept ACK sent ahead of its flow.
const TC_PRIO_CONTROL: u32 = 7;
/// What `shaper_mark` is told to do in `cb[1]` (shaper-ebpf's `ecn`).
const SET_CE: u32 = 1;
const WASH: u32 = 2;
/// Packets of one setup between two control ticks.
const TICK_PACKETS: u64 = 4_096;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| {
        v.replace('_', "")
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

fn packets() -> u64 {
    env_u64("SHAPER_FUZZ_PACKETS", DEFAULT_PACKETS)
}

fn seed() -> u64 {
    env_u64("SHAPER_FUZZ_SEED", DEFAULT_SEED)
}

/// A configuration as `shaper run` builds it from its options.
struct Setup {
    name: &'static str,
    cli: Options,
    /// The segmenter on, splitting everything over this many segments.
    split_segs: Option<u32>,
}

fn cli(rate: &str) -> Options {
    Options {
        iface: Some("fuzz0".into()),
        rate: Some(rate.into()),
        ..Default::default()
    }
}

/// The configurations the frames are spread over, as `shaper run` would get them: the
/// defaults; a link the test's own frames keep busy, with every option on (the AQM marks, the
/// ACK filter drops, the segmenter takes super-packets); and one they flood (the horizon and
/// the flows' limits drop), in the other modes.
fn setups() -> Vec<Setup> {
    vec![
        Setup {
            name: "defaults at 1gbit",
            cli: cli("1gbit"),
            split_segs: None,
        },
        Setup {
            name: "100mbit, every option",
            cli: Options {
                overhead: Some(-30),
                mpu: Some(64),
                isolation: Some("flows".into()),
                rtt: Some("metro".into()),
                horizon: Some("500ms".into()),
                diffserv: Some("diffserv4".into()),
                wash: Some(true),
                fwmark: Some("0xf".into()),
                ack_filter: Some("aggressive".into()),
                ..cli("100mbit")
            },
            split_segs: Some(1),
        },
        Setup {
            name: "2mbit, the other modes",
            cli: Options {
                overhead: Some(256),
                mpu: Some(1_500),
                isolation: Some("dual-srchost".into()),
                rtt: Some("datacentre".into()),
                diffserv: Some("diffserv8".into()),
                fwmark: Some("0xff00".into()),
                ack_filter: Some("conservative".into()),
                ..cli("2mbit")
            },
            split_segs: Some(44),
        },
    ]
}

/// Counts by what the oracle expected and what the run did.
#[derive(Default)]
struct Tally {
    packets: u64,
    non_ip: u64,
    malformed: u64,
    segmented: u64,
    /// Sent to the segmenter behind their flow's frames (see `Fate::Followed`).
    followed: u64,
    shaped_passed: u64,
    /// Passed without a departure time (no flow state could be had).
    unstamped: u64,
    shaped_dropped: u64,
    marked: u64,
    washed: u64,
    sent_ahead: u64,
}

/// Where the counters say a packet went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Shaped,
    Segmented,
    /// Left unstamped to the segmenter behind a super-packet of its flow (or of a flow in the
    /// same slot of the order table) still there: the oracle, which reads one frame, cannot
    /// tell; allowed for a packet it expects shaped once a super-packet has gone before.
    Followed,
    Passed(PassReason),
    Dropped(DropReason),
    AckFiltered,
}

impl Fate {
    /// The one counter of a packet's fate that its run moved, by one.
    fn of(before: &DatapathStats, after: &DatapathStats) -> Result<Self, String> {
        let mut moved = Vec::new();
        let mut count = |fate, before: u64, after: u64| {
            if after != before {
                moved.push((fate, after.wrapping_sub(before) as i64));
            }
        };
        count(Fate::Shaped, before.shaped_packets, after.shaped_packets);
        count(Fate::Segmented, before.segmented, after.segmented);
        count(
            Fate::Followed,
            before.segment_followers,
            after.segment_followers,
        );
        count(Fate::AckFiltered, before.ack_dropped, after.ack_dropped);
        for r in PassReason::ALL {
            let i = r as usize;
            count(Fate::Passed(r), before.passed[i], after.passed[i]);
        }
        for r in DropReason::ALL {
            let i = r as usize;
            count(Fate::Dropped(r), before.dropped[i], after.dropped[i]);
        }
        match moved[..] {
            [(fate, 1)] => Ok(fate),
            _ => Err(format!(
                "the counters of a packet's fate moved {moved:?}, not one of them by one"
            )),
        }
    }
}

/// One configuration's data path, and what its frames did.
struct Run {
    name: &'static str,
    h: Harness,
    config: ShaperConfig,
    tally: Tally,
    /// The counters after the last run `egress` accounted for.
    stats: DatapathStats,
    /// Hosts given rates at the last tick.
    rated: Vec<FlowKey>,
}

impl Run {
    fn new(setup: Setup) -> Self {
        let settings = Settings::resolve(setup.cli, None).expect("a valid configuration");
        let mut h = Harness::with_state(settings.datapath_config(1_514, 14, 65_536), &TEST_STATE);
        if let Some(segs) = setup.split_segs {
            h.datapath
                .set_segmenter(Some((segs, SEGMENTER_IFINDEX)))
                .unwrap();
        }
        let config = *h.datapath.config();
        Self {
            name: setup.name,
            h,
            config,
            tally: Tally::default(),
            stats: DatapathStats::default(),
            rated: Vec::new(),
        }
    }

    fn run(&mut self, name: &'static str, case: &Case) -> Result<Outcome, String> {
        self.h
            .try_run_program(name, &case.frame, &case.ctx)
            .map_err(|e| format!("{name}: the kernel refused the run: {e}"))
    }

    /// The frame through the egress program (and the programs it tail-calls), the ingress
    /// observer and the segmenter's classifier, each checked against the oracle.
    fn every_program(&mut self, case: &Case) -> Result<(), String> {
        let followed = self.egress(case)? == Fate::Followed;
        let out = self.run(program_names::INGRESS, case)?;
        verdict_in(program_names::INGRESS, out.verdict, &[PASS])?;
        untouched(program_names::INGRESS, case, &out)?;
        let out = self.run(program_names::SEGMENT, case)?;
        let expected = if followed || oracle::segmenter_matches(&case.ctx, &self.config) {
            MATCH
        } else {
            NO_MATCH
        };
        verdict_in(program_names::SEGMENT, out.verdict, &[expected])?;
        untouched(program_names::SEGMENT, case, &out)
    }

    /// The frame through the egress program: what it returned, what it counted, what it did
    /// to the frame and its context, against what the oracle expects; returns the fate.
    fn egress(&mut self, case: &Case) -> Result<Fate, String> {
        let name = program_names::EGRESS;
        let expected = oracle::egress(&case.frame, &case.ctx, &self.config);
        let out = self.run(name, case)?;
        let stats = self.h.view().stats;
        let before = std::mem::replace(&mut self.stats, stats);
        let moved = |counter: fn(&DatapathStats) -> u64| counter(&stats) != counter(&before);
        let fate = Fate::of(&before, &stats).map_err(|e| {
            format!(
                "{name}: {e} (expected {expected:?}, returned {:#x})",
                out.verdict
            )
        })?;
        let t = &mut self.tally;
        t.packets += 1;
        match (expected, out.verdict, fate) {
            (Expected::Unshaped(reason), PASS, Fate::Passed(counted)) if counted == reason => {
                untouched(name, case, &out).map_err(|e| format!("{e} ({expected:?})"))?;
                match reason {
                    PassReason::NonIp => t.non_ip += 1,
                    _ => t.malformed += 1,
                }
            }
            (Expected::Segmented, PASS, Fate::Segmented) => {
                untouched(name, case, &out).map_err(|e| format!("{e} ({expected:?})"))?;
                t.segmented += 1;
            }
            (Expected::Shaped { .. }, PASS, Fate::Followed) if t.segmented > 0 => {
                untouched(name, case, &out).map_err(|e| format!("{e} ({expected:?})"))?;
                t.followed += 1;
            }
            (Expected::Shaped { .. }, DROP, Fate::Dropped(_) | Fate::AckFiltered) => {
                t.shaped_dropped += 1;
            }
            (Expected::Shaped { l3 }, PASS, Fate::Shaped | Fate::Passed(PassReason::NoState)) => {
                let may = Rewrites {
                    mark: self.config.aqm.enabled(),
                    mark_not_ect: false,
                    wash: self.config.wash != 0,
                };
                let change = oracle::ds_rewrite(&case.frame, &out.data, l3, may)
                    .map_err(|e| format!("{name}, a shaped packet: {e}"))?;
                let (ctx_in, ctx_out) = (&case.ctx, &out.ctx);
                if (
                    ctx_out.mark(),
                    ctx_out.gso_segs(),
                    ctx_out.ingress_ifindex(),
                ) != (ctx_in.mark(), ctx_in.gso_segs(), ctx_in.ingress_ifindex())
                {
                    return Err(format!(
                        "{name}: a shaped packet's context changed beyond its departure time \
                         and priority: {ctx_out:?}"
                    ));
                }
                // A CE already set is counted as a mark and changes nothing.
                if change.marked && !moved(|s| s.ecn_marked) {
                    return Err(format!("{name}: a CE mark not counted"));
                }
                // The priority changes only for an ACK sent ahead, and only to control's.
                let jumped = moved(|s| s.ack_jumped);
                let raised = ctx_out.priority() != ctx_in.priority();
                if (jumped && ctx_out.priority() != TC_PRIO_CONTROL) || (raised && !jumped) {
                    return Err(format!(
                        "{name}: priority {} became {} (sent ahead: {jumped})",
                        ctx_in.priority(),
                        ctx_out.priority()
                    ));
                }
                t.shaped_passed += 1;
                t.unstamped += u64::from(fate != Fate::Shaped);
                t.marked += u64::from(change.marked);
                t.washed += u64::from(change.washed);
                t.sent_ahead += u64::from(jumped);
            }
            _ => {
                return Err(format!(
                    "{name}: expected {expected:?}; returned {:#x}, counted as {fate:?}",
                    out.verdict
                ));
            }
        }
        Ok(fate)
    }

    /// As a control tick does: rates for every host seen (alternately going ahead of the
    /// calendar), none for the hosts gone from the LRU map, then a new epoch.
    fn tick(&mut self, n: u64) {
        let hosts: Vec<FlowKey> = self
            .h
            .datapath
            .hosts()
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        for gone in self.rated.iter().filter(|k| !hosts.contains(k)) {
            self.h.datapath.remove_host_rate(gone).unwrap();
        }
        self.rated = hosts;
        let fp = self.config.ns_per_byte_fp;
        let flags = if n.is_multiple_of(2) {
            host_flags::AHEAD
        } else {
            0
        };
        let rate = HostRate::new(&self.config, fp * (1 + n % 4), fp, flags);
        self.h.rate_every_host(&rate);
    }

    fn summary(&self) -> String {
        let (s, t) = (self.h.view().stats, &self.tally);
        let drop = |r: DropReason| s.dropped[r as usize];
        format!(
            "{}: {} frames: non-IP {}, malformed {}, left to the segmenter {} (and {} behind their \
             flow's frames); IP passed {} \
             (CE {}, washed {}, sent ahead {}, unstamped {}), dropped {} (horizon {}, codel {}, \
             blue {}, overlimit {}, ACK filter {})",
            self.name,
            t.packets,
            t.non_ip,
            t.malformed,
            t.segmented,
            t.followed,
            t.shaped_passed,
            t.marked,
            t.washed,
            t.sent_ahead,
            t.unstamped,
            t.shaped_dropped,
            drop(DropReason::Horizon),
            drop(DropReason::Codel),
            drop(DropReason::Blue),
            drop(DropReason::Overlimit),
            s.ack_dropped,
        )
    }
}

fn verdict_in(program: &str, verdict: u32, allowed: &[u32]) -> Result<(), String> {
    if allowed.contains(&verdict) {
        Ok(())
    } else {
        Err(format!(
            "{program} returned {verdict:#x}, not one of {allowed:x?}"
        ))
    }
}

/// The frame came back as it went in, and so did its context: every field a test run returns
/// (`ifindex`, which the kernel sets, aside).
fn untouched(program: &str, case: &Case, out: &Outcome) -> Result<(), String> {
    if out.data != case.frame {
        let at = out
            .data
            .iter()
            .zip(&case.frame)
            .position(|(a, b)| a != b)
            .unwrap_or(out.data.len().min(case.frame.len()));
        return Err(format!(
            "{program} changed the frame (first at byte {at}; {} bytes came back)",
            out.data.len()
        ));
    }
    let (before, after) = (&case.ctx, &out.ctx);
    let fields = |c: &SkbContext| {
        (
            c.tstamp(),
            c.mark(),
            c.priority(),
            c.cb(),
            c.gso_segs(),
            c.ingress_ifindex(),
        )
    };
    // A run without a `wire_len` gets the frame's length, as the qdisc layer counts it.
    let wire_len = match before.wire_len() {
        0 => case.frame.len() as u32,
        given => given,
    };
    if fields(before) != fields(after) || after.wire_len() != wire_len {
        return Err(format!("{program} changed the context: {after:?}"));
    }
    Ok(())
}

fn report(programs: &str, count: u64, started: Instant, loaded: Instant) {
    println!(
        "bad input: {count} frames through {programs} in {:.1} s (loading the data path: {:.1} s)",
        loaded.elapsed().as_secs_f64(),
        (loaded - started).as_secs_f64()
    );
}

fn fail(e: String, seed: u64, i: u64, setup: &str, case: &Case) -> ! {
    panic!(
        "{e}\n(case {i} of SHAPER_FUZZ_SEED={seed}, setup {setup:?}: SHAPER_FUZZ_PACKETS={} \
         replays up to it)\n{case:?}",
        i + 1
    )
}

#[test]
fn random_and_mutated_frames_get_designed_verdicts_and_malformed_ones_pass_untouched() {
    shaper_tests::stay_on_one_cpu();
    let (count, seed) = (packets(), seed());
    let started = Instant::now();
    let mut runs: Vec<Run> = setups().into_iter().map(Run::new).collect();
    let loaded = Instant::now();
    let mut generator = Generator::new(seed);
    let setups = runs.len() as u64;
    for i in 0..count {
        let case = generator.case(monotonic_now_ns());
        let run = &mut runs[(i % setups) as usize];
        run.every_program(&case)
            .unwrap_or_else(|e| fail(e, seed, i, run.name, &case));
        let nth = i / setups;
        if nth % TICK_PACKETS == TICK_PACKETS - 1 {
            run.tick(nth / TICK_PACKETS);
        }
    }
    for run in &runs {
        println!("bad input, seed {seed}: {}", run.summary());
    }
    report(
        "shaper_egress (and its tail calls), shaper_ingress and shaper_segment",
        count,
        started,
        loaded,
    );
}

/// The programs `shaper_egress` tail-calls, run on their own: the per-CPU slot holds whatever
/// packet the egress program parsed last on this CPU, and the control block whatever the
/// frame's context brought, so each runs on another packet's instructions. They still return
/// only their verdicts, and write nothing but a DS field at the offset they were handed.
#[test]
fn tail_called_programs_run_on_their_own_rewrite_only_the_ds_field_they_are_handed() {
    let (count, seed) = (packets(), seed());
    let started = Instant::now();
    let setup = setups().remove(1);
    let mut run = Run::new(setup);
    let loaded = Instant::now();
    // Another stream of frames than the first test's.
    let mut generator = Generator::new(seed ^ 0x7a11_ca11);
    for i in 0..count {
        let case = generator.case(monotonic_now_ns());
        tail_called_on_their_own(&mut run, &case)
            .unwrap_or_else(|e| fail(e, seed, i, run.name, &case));
        // Fills this CPU's slot for the next frame's runs (the first test checks what it
        // does; the counters here move with the runs above too).
        run.run(program_names::EGRESS, &case)
            .and_then(|out| verdict_in(program_names::EGRESS, out.verdict, &[PASS, DROP]))
            .unwrap_or_else(|e| fail(e, seed, i, run.name, &case));
    }
    report(
        "shaper_schedule, shaper_ack_filter and shaper_mark on their own, and shaper_egress",
        count,
        started,
        loaded,
    );
}

fn tail_called_on_their_own(run: &mut Run, case: &Case) -> Result<(), String> {
    let wash = run.config.wash != 0;
    for name in [program_names::SCHEDULE, program_names::ACK_FILTER] {
        let out = run.run(name, case)?;
        verdict_in(name, out.verdict, &[PASS, DROP])?;
        if out.verdict == PASS {
            // The scheduler hands the marker the offset of the packet it scheduled in cb[0].
            let l3 = out.ctx.cb()[0] as usize;
            let may = Rewrites {
                mark: true,
                mark_not_ect: true,
                wash,
            };
            oracle::ds_rewrite(&case.frame, &out.data, l3, may)
                .map_err(|e| format!("{name}: {e}"))?;
        }
    }
    let name = program_names::MARK;
    let out = run.run(name, case)?;
    verdict_in(name, out.verdict, &[PASS, DROP])?;
    let [l3, what, ..] = case.ctx.cb();
    let may = Rewrites {
        mark: what & SET_CE != 0,
        mark_not_ect: true,
        wash: what & WASH != 0,
    };
    if out.verdict == PASS {
        oracle::ds_rewrite(&case.frame, &out.data, l3 as usize, may)
            .map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(())
}
