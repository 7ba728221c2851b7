//! `shaper stats`: the counters of the shaper running on an interface, once or refreshed.

use std::{io::IsTerminal, time::Duration};

use crate::{
    bpf::{self, MapReader},
    cost,
    filter::Hook,
    health,
    link::Interface,
    mapmem,
    netlink::Socket,
    probe,
    record::State,
    runtime::{self, RuntimeError},
    stats::{self, Report},
    watch::{self, Display},
};

#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    /// Interface a `shaper run` is shaping.
    #[arg(long)]
    pub iface: String,
    /// The ingress direction (`shaper run --ingress-rate`) instead of egress.
    #[arg(long)]
    pub ingress: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// List hosts (the outer fairness level) by bytes, with their flows' level and queue.
    #[arg(long, conflicts_with = "flows")]
    pub hosts: bool,
    /// List flows by bytes, with their queue.
    #[arg(long)]
    pub flows: bool,
    /// Measure what the data path costs in CPU over this window (e.g. 2s): its programs' runs
    /// per second, nanoseconds per run and share of a CPU, from the kernel's BPF run-time
    /// statistics, enabled for the window only.
    #[arg(long, value_name = "DURATION", conflicts_with_all = ["hosts", "flows"])]
    pub cost: Option<String>,
    /// The per-host and per-flow maps: entries (counted by walking them: seconds for a million
    /// flows; a walk over a map that traffic is churning counts some keys twice), sizes and the
    /// memory the kernel charges for them.
    #[arg(long, conflicts_with_all = ["hosts", "flows", "cost"])]
    pub maps: bool,
    /// How many hosts or flows to list.
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    /// Refresh the report every SECONDS (default 1; 0.1 to 3600), in place on a terminal, else
    /// as reports one after another separated by a blank line, until interrupted; exits
    /// non-zero when the shaper stops.
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "1")]
    pub watch: Option<f64>,
}

/// Flows read for `--flows`: a full walk of a million-entry table takes seconds.
const FLOW_SCAN_LIMIT: usize = 200_000;

pub fn run(args: StatsArgs) -> anyhow::Result<()> {
    probe::require_privileges()?;
    let Some(seconds) = args.watch else {
        print!("{}", report(&args)?);
        return Ok(());
    };
    let interval = watch_interval(seconds)?;
    let display = if std::io::stdout().is_terminal() {
        Display::InPlace
    } else {
        Display::Stream
    };
    let mut shown = false;
    let next = || {
        let result = report(&args);
        // A report that fails once the shaper is gone (its maps freed mid-read, its state file
        // removed) says so, rather than what reading failed on.
        if let (Err(_), true, Err(gone)) = (&result, shown, running_state(&args)) {
            return Err(gone.context(format!("stopped watching {}", args.iface)));
        }
        shown = true;
        result
    };
    watch::run(
        next,
        &mut std::io::stdout().lock(),
        display,
        interval,
        std::thread::sleep,
    )
}

fn watch_interval(seconds: f64) -> anyhow::Result<Duration> {
    if !(0.1..=3_600.0).contains(&seconds) {
        anyhow::bail!("invalid --watch interval {seconds}: use 0.1 to 3600 seconds");
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// The state of the shaper running on the interface (or its ingress IFB), refused when none is
/// running or it is still starting.
fn running_state(args: &StatsArgs) -> anyhow::Result<State> {
    let iface = Interface::lookup(&args.iface)?;
    let mut state =
        runtime::read_state(&iface)?.ok_or_else(|| RuntimeError::NotRunning(args.iface.clone()))?;
    if args.ingress {
        let ifb = state
            .ingress
            .as_ref()
            .map(|i| i.ifb.clone())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "shaper on {} does not shape its ingress (start it with --ingress-rate)",
                    args.iface
                )
            })?;
        state = runtime::read_state(&Interface::lookup(&ifb)?)?
            .ok_or_else(|| RuntimeError::NotRunning(ifb.clone()))?;
    }
    if !state.kept && !runtime::process_alive(state.pid) {
        anyhow::bail!(
            "shaper (pid {}) on {} is no longer running; its state is stale (a new `shaper run` will clean it up)",
            state.pid,
            args.iface
        );
    }
    if state.starting {
        anyhow::bail!(
            "shaper (pid {}) on {} is still starting",
            state.pid,
            state.iface
        );
    }
    Ok(state)
}

/// One report, as text or JSON, as `args` asks.
fn report(args: &StatsArgs) -> anyhow::Result<String> {
    let state = running_state(args)?;
    if let Some(window) = &args.cost {
        let ns = shaper_common::time::parse_duration_ns(window)
            .ok()
            .filter(|ns| (1_000_000..=3_600_000_000_000).contains(ns))
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "invalid --cost window {window:?}: use a duration from 1ms to 1h (e.g. 2s)"
                )
            })?;
        let report = cost::measure(state.maps.stats, std::time::Duration::from_nanos(ns))?;
        return render(&report, args.json, cost::CostReport::to_text);
    }
    let maps = MapReader::by_ids(&state.maps)?;
    let now = bpf::monotonic_now_ns();
    if args.hosts {
        let rows = stats::host_rows(maps.hosts()?, &maps.host_rates()?, now, args.top);
        return render(rows.as_slice(), args.json, stats::host_table);
    }
    if args.flows {
        let rows = stats::flow_rows(maps.flows(FLOW_SCAN_LIMIT)?, now, args.top);
        return render(rows.as_slice(), args.json, stats::flow_table);
    }
    if args.maps {
        let cpus = aya::util::nr_cpus().map_or(1, |n| n as u64);
        let report = mapmem::report(&maps, cpus)?;
        return render(&report, args.json, mapmem::MapsReport::to_text);
    }
    let mut report = Report::read(&state, &maps)?;
    if let Ok(iface) = Interface::lookup(&state.iface) {
        report.egress_programs =
            health::attached(&mut Socket::open()?, &iface, state.attach, Hook::Egress)?;
    }
    render(&report, args.json, Report::to_text)
}

fn render<T: serde::Serialize + ?Sized>(
    value: &T,
    json: bool,
    text: fn(&T) -> String,
) -> anyhow::Result<String> {
    Ok(if json {
        serde_json::to_string_pretty(value)? + "\n"
    } else {
        text(value)
    })
}
