//! Test support: crafted packets and `__sk_buff` contexts for BPF_PROG_TEST_RUN, and a handle
//! on a freshly loaded data path.

pub mod caps;
pub mod fuzz;
pub mod oracle;
pub mod packet;
pub mod skb;
pub mod veth;
pub mod xlated;

use aya::programs::{ProgramError, TestRun, TestRunOptions};
use shaper::{
    bpf::{Datapath, DatapathView},
    config::StateParams,
};
use shaper_common::{
    abi::{HostRate, ShaperConfig},
    names::program_names,
};

/// TC_ACT_UNSPEC as the kernel returns it (u32): "continue", what shaper returns to let a
/// packet through.
pub const PASS: u32 = u32::MAX;
/// TC_ACT_SHOT.
pub const DROP: u32 = 2;

/// A data path loaded into the running kernel with its own maps.
pub struct Harness {
    pub datapath: Datapath,
}

/// What one test run returned.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub verdict: u32,
    pub ctx: skb::SkbContext,
    pub data: Vec<u8>,
}

impl Harness {
    /// Loads the data path; BPF tests need root (CAP_BPF + CAP_NET_ADMIN).
    pub fn new(config: ShaperConfig) -> Self {
        Self::with_state(config, &TEST_STATE)
    }

    /// The same with maps sized by `state` (`TEST_STATE`'s are small).
    pub fn with_state(config: ShaperConfig, state: &StateParams) -> Self {
        if let Err(e) = shaper::probe::require_privileges() {
            panic!("BPF tests load programs into the kernel and must run as root: {e}");
        }
        let mut datapath = Datapath::load(state).expect("load the BPF data path");
        datapath.configure(&config).expect("configure");
        Self { datapath }
    }

    pub fn run(&mut self, packet: &[u8], ctx: &skb::SkbContext) -> Outcome {
        self.run_repeat(packet, ctx, 1).0
    }

    /// Runs the ingress observer once.
    pub fn run_ingress(&mut self, packet: &[u8]) -> u32 {
        let mut data_out = vec![0u8; packet.len() + 256];
        let program = self
            .datapath
            .program(program_names::INGRESS)
            .expect("ingress program");
        program
            .test_run(TestRunOptions {
                data_in: Some(packet),
                data_out: Some(&mut data_out),
                repeat: 1,
                ..Default::default()
            })
            .expect("BPF_PROG_TEST_RUN on the ingress program")
            .return_value
    }

    /// Runs the program `repeat` times; also returns the kernel's average ns per run.
    pub fn run_repeat(
        &mut self,
        packet: &[u8],
        ctx: &skb::SkbContext,
        repeat: u32,
    ) -> (Outcome, f64) {
        self.run_program(program_names::EGRESS, packet, ctx, repeat)
    }

    /// Runs the segmenter's classifier once: its verdict (-1 as u32: match, 0: no match).
    pub fn run_segment(&mut self, packet: &[u8], ctx: &skb::SkbContext) -> u32 {
        self.run_program(program_names::SEGMENT, packet, ctx, 1)
            .0
            .verdict
    }

    fn run_program(
        &mut self,
        name: &'static str,
        packet: &[u8],
        ctx: &skb::SkbContext,
        repeat: u32,
    ) -> (Outcome, f64) {
        self.test_run(name, packet, ctx, repeat)
            .unwrap_or_else(|e| {
                panic!(
                    "BPF_PROG_TEST_RUN of {name} on a {}-byte frame, ctx {ctx:?}: {e}",
                    packet.len()
                )
            })
    }

    /// Runs the program `name` (`program_names`) once. `Err` when the kernel refused the run
    /// (BPF_PROG_TEST_RUN failed): a program cannot make it fail, its input can.
    pub fn try_run_program(
        &mut self,
        name: &'static str,
        packet: &[u8],
        ctx: &skb::SkbContext,
    ) -> Result<Outcome, ProgramError> {
        self.test_run(name, packet, ctx, 1)
            .map(|(outcome, _)| outcome)
    }

    fn test_run(
        &mut self,
        name: &'static str,
        packet: &[u8],
        ctx: &skb::SkbContext,
        repeat: u32,
    ) -> Result<(Outcome, f64), ProgramError> {
        let mut data_out = vec![0u8; packet.len() + 256];
        let mut ctx_out = skb::SkbContext::default();
        let program = self
            .datapath
            .program(name)
            .unwrap_or_else(|e| panic!("program {name}: {e}"));
        let result = program.test_run(TestRunOptions {
            data_in: Some(packet),
            data_out: Some(&mut data_out),
            ctx_in: Some(ctx.as_bytes()),
            ctx_out: Some(ctx_out.as_bytes_mut()),
            repeat,
            ..Default::default()
        })?;
        data_out.truncate(result.data_size_out as usize);
        let per_run_ns = result.duration.as_nanos() as f64;
        Ok((
            Outcome {
                verdict: result.return_value,
                ctx: ctx_out,
                data: data_out,
            },
            per_run_ns,
        ))
    }

    pub fn view(&self) -> DatapathView {
        self.datapath.snapshot().expect("read maps")
    }

    /// Starts a new control epoch, as a tick does: the data path reads its hosts' rates again.
    pub fn start_epoch(&mut self) {
        let mut levels = self.datapath.levels().unwrap();
        levels.epoch += 1;
        self.datapath.set_levels(&levels).unwrap();
    }

    /// Writes `rate` for every host the data path has seen, and starts the epoch in which it
    /// reads them.
    pub fn rate_every_host(&mut self, rate: &HostRate) {
        for (key, _) in self.datapath.hosts().unwrap() {
            self.datapath.set_host_rate(&key, rate).unwrap();
        }
        self.start_epoch();
    }
}

/// A configuration for `rate_bps` with the given horizon and no overhead.
/// Small maps: the tests create a handful of flows.
pub const TEST_STATE: StateParams = StateParams {
    host_prefix_v4: 32,
    host_prefix_v6: 64,
    max_flows: 4_096,
    max_hosts: 256,
    flow_quota: 0,
    log_datapath: false,
};

pub fn config(rate_bps: u64, horizon_ns: u64) -> ShaperConfig {
    ShaperConfig {
        rate_bps,
        ns_per_byte_fp: shaper_common::edt::ns_per_byte_fp(rate_bps),
        horizon_ns,
        framing: shaper_common::framing::Framing::RAW,
        link_header_bytes: 14,
        ack_quantum_bytes: shaper_common::ackfilter::round_quantum_bytes(rate_bps, 1514),
        calendar_bin_ns: shaper_common::sizing::calendar_bin_ns(
            shaper_common::edt::ns_per_byte_fp(rate_bps),
            horizon_ns,
            64 * 1024,
        ),
        // The AQM off (no target), its hard limit at the horizon, as the host guard reads it.
        aqm: shaper_common::aqm::AqmParams {
            limit_ns: horizon_ns,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// `config` with a 1 s horizon and calendar bins sized for full frames (1 ms at 10 Mbit/s): the
/// four bins a packet may span are then short of what a test books, as on a real link.
pub fn with_short_bins(mut config: ShaperConfig) -> ShaperConfig {
    config.horizon_ns = 1_000_000_000;
    config.calendar_bin_ns =
        shaper_common::sizing::calendar_bin_ns(config.ns_per_byte_fp, config.horizon_ns, 1514);
    config
}

/// Runs `attempt` on fresh state until one is on time, and returns its result. A test of a
/// window in time (a packet sent before a signal is due again, within twice its pace) shows
/// nothing about it when the test process was descheduled across the window, as a loaded
/// machine does for milliseconds at a time, and for seconds in spells; such an attempt returns
/// `Err(late_ns)` and is run again, for up to a few seconds.
pub fn on_time<T>(window: &str, mut attempt: impl FnMut() -> Result<T, u64>) -> T {
    const PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);
    let start = std::time::Instant::now();
    let mut late_ms = Vec::new();
    while late_ms.len() < 8 || start.elapsed() < PATIENCE {
        match attempt() {
            Ok(result) => return result,
            Err(late_ns) => {
                eprintln!("late for {window} by {:.1} ms: again", late_ns as f64 / 1e6);
                late_ms.push(late_ns as f64 / 1e6)
            }
        }
    }
    panic!(
        "never within {window} in {} tries over {:?}: {late_ms:.1?} ms",
        late_ms.len(),
        start.elapsed()
    )
}

/// Keeps the calling thread on the CPU it runs on: the data path tells the segmenter's filter
/// about a packet it sends behind its flow's frames through a per-CPU word, which the filter's
/// run must read on the CPU the program's run wrote it.
pub fn stay_on_one_cpu() {
    // SAFETY: a zeroed cpu_set_t with one CPU set, for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(libc::sched_getcpu().max(0) as usize, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0,
            "pinning the test to one CPU"
        );
    }
}
