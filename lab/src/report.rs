//! The comparison table (terminal and Markdown) and the reports built around it: a run's own
//! `report.md`, and the lab section of docs/lab-results.md.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use anyhow::{Context, Result};

use super::{
    RunResult, joins, load_results, plot,
    queues::{Levels, QueueSummary},
    results::{ProbeLatency, over_target_share, scheduled_delay_ms},
    scenario::{FlowDirection, ProbeKind},
    stats::{self, Spread},
    transfers::{self, Pooled},
};

const BEGIN: &str = "<!-- lab:begin -->";
const END: &str = "<!-- lab:end -->";
/// Each scenario's block inside the lab section starts with this and its name, so reporting
/// one scenario replaces its block and keeps the others.
const SCENARIO_MARK: &str = "<!-- lab:scenario ";

/// Results of one scenario, in run order.
struct ScenarioResults<'a> {
    name: String,
    runs: Vec<&'a RunResult>,
}

fn by_scenario(all: &[RunResult]) -> Vec<ScenarioResults<'_>> {
    let mut out: Vec<ScenarioResults> = Vec::new();
    for r in all {
        match out.iter_mut().find(|s| s.name == r.scenario) {
            Some(s) => s.runs.push(r),
            None => out.push(ScenarioResults {
                name: r.scenario.clone(),
                runs: vec![r],
            }),
        }
    }
    out
}

/// Contenders of a scenario in run order, each with its repetitions.
fn by_contender<'a>(runs: &[&'a RunResult]) -> Vec<(String, Vec<&'a RunResult>)> {
    let mut out: Vec<(String, Vec<&RunResult>)> = Vec::new();
    for r in runs {
        match out.iter_mut().find(|(n, _)| *n == r.contender) {
            Some((_, v)) => v.push(r),
            None => out.push((r.contender.clone(), vec![r])),
        }
    }
    out
}

/// The repetitions' values that exist, their mean and spread.
fn spread(xs: impl Iterator<Item = Option<f64>>) -> Option<Spread> {
    stats::spread(&xs.flatten().collect::<Vec<f64>>())
}

fn num(x: Option<f64>, digits: usize) -> String {
    x.map_or("-".into(), |v| format!("{v:.digits$}"))
}

/// The mean to `digits`, then `±` the sample standard deviation when more than one repetition
/// measured it (`95.4 ±0.3`), then the unit: one repetition reads as it always did.
fn cell(x: Option<Spread>, digits: usize, unit: &str) -> String {
    match x {
        None => "-".into(),
        Some(Spread { mean, sd: None }) => format!("{mean:.digits$}{unit}"),
        Some(Spread { mean, sd: Some(sd) }) => format!("{mean:.digits$} ±{sd:.digits$}{unit}"),
    }
}

/// The columns before the request/response probes' (two per kind the scenario has: see
/// `Table::of`) and the transfers' (when it has some), and after them.
const HEADER_LEAD: &[&str] = &[
    "contender",
    "runs",
    "down Mbit/s (util)",
    "up Mbit/s (util)",
    "per host Mbit/s",
    "hosts min/max down/up",
    "Jain hosts",
    "Jain flows",
    "ping idle p50",
    "ping loaded p50/p99",
    "ping p99 pooled",
    "induced",
];
const HEADER_TRANSFERS: &[&str] = &[
    "transfers done/failed",
    "transfer p50/p90/p99",
    "RTOs own/sender's",
];
const HEADER_TAIL: &[&str] = &[
    "TCP RTT p50",
    "retrans",
    "drops path/contender",
    "ECN marks",
    "scheduled delay p50/p99",
    "VM CPU",
    "host CPU, others",
];

/// One scenario's comparison: a row per contender, averaged over its successful repetitions;
/// a contender with none says why it failed.
struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn of(runs: &[&RunResult]) -> Table {
        // The request/response kinds any successful run measured, in the scenario format's
        // order.
        let measured: BTreeSet<&str> = runs
            .iter()
            .filter(|r| r.status == "ok")
            .flat_map(|r| r.latency.rr.keys().map(String::as_str))
            .collect();
        let kinds: Vec<&str> = ProbeKind::ALL
            .iter()
            .map(|k| k.as_str())
            .filter(|k| measured.contains(k))
            .collect();
        let with_transfers = runs
            .iter()
            .any(|r| r.status == "ok" && !r.transfers.is_empty());
        let mut header: Vec<String> = HEADER_LEAD.iter().map(|h| h.to_string()).collect();
        for k in &kinds {
            header.extend([format!("{k} idle p50"), format!("{k} loaded p50/p99")]);
        }
        if with_transfers {
            header.extend(HEADER_TRANSFERS.iter().map(|h| h.to_string()));
        }
        header.extend(HEADER_TAIL.iter().map(|h| h.to_string()));
        let rows = by_contender(runs)
            .into_iter()
            .map(|(name, reps)| row(name, &reps, &kinds, with_transfers, header.len()))
            .collect();
        Table { header, rows }
    }
}

fn row(
    name: String,
    reps: &[&RunResult],
    kinds: &[&str],
    with_transfers: bool,
    width: usize,
) -> Vec<String> {
    let ok: Vec<&RunResult> = reps.iter().copied().filter(|r| r.status == "ok").collect();
    let runs_cell = format!("{}/{}", ok.len(), reps.len());
    if ok.is_empty() {
        let why = reps
            .first()
            .map(|r| short(&r.message, 120))
            .unwrap_or_default();
        let mut row = vec![name, runs_cell, format!("FAILED: {why}")];
        row.resize(width, String::new());
        return row;
    }
    // The main columns show how far the repetitions spread; the counters and the contention
    // columns after them only their mean.
    let sp = |f: &dyn Fn(&RunResult) -> Option<f64>| spread(ok.iter().map(|r| f(r)));
    let m = |f: &dyn Fn(&RunResult) -> Option<f64>| sp(f).map(|s| s.mean);
    let direction = |d: &dyn Fn(&RunResult) -> &super::results::DirectionResult| {
        if d(ok[0]).flows == 0 {
            return "-".to_string();
        }
        let bps = cell(sp(&|r| Some(d(r).mean_bps / 1e6)), 1, "");
        match sp(&|r| d(r).utilisation.map(|u| u * 100.0)) {
            Some(u) => format!("{bps} ({})", cell(Some(u), 0, "%")),
            None => bps,
        }
    };
    let hosts: Vec<String> = ok[0]
        .hosts
        .iter()
        .map(|h| {
            let v = sp(&|r| {
                r.hosts
                    .iter()
                    .find(|x| x.name == h.name)
                    .map(|x| x.mean_bps / 1e6)
            });
            format!("{} {}", h.name, cell(v, 1, ""))
        })
        .collect();
    let ms = |x: Option<Spread>| cell(x, 1, " ms");
    let mut row = vec![
        name,
        runs_cell,
        direction(&|r| &r.download),
        direction(&|r| &r.upload),
        hosts.join(", "),
        format!(
            "{} / {}",
            cell(sp(&|r| r.host_share(FlowDirection::Download)), 2, ""),
            cell(sp(&|r| r.host_share(FlowDirection::Upload)), 2, "")
        ),
        cell(sp(&|r| r.jain_hosts), 3, ""),
        cell(sp(&|r| r.jain_flows), 3, ""),
        ms(sp(&|r| r.latency.ping_idle.p50)),
        format!(
            "{} / {}",
            ms(sp(&|r| r.latency.ping_loaded.p50)),
            ms(sp(&|r| r.latency.ping_loaded.p99))
        ),
        ms(pooled_ping_p99(&ok)),
        ms(sp(&|r| r.latency.induced_ms)),
    ];
    for k in kinds {
        let rr = |f: &dyn Fn(&ProbeLatency) -> Option<f64>| {
            ms(sp(&|r| r.latency.rr.get(*k).and_then(f)))
        };
        row.extend([
            rr(&|l| l.idle.p50),
            format!("{} / {}", rr(&|l| l.loaded.p50), rr(&|l| l.loaded.p99)),
        ]);
    }
    if with_transfers {
        let t = |f: &dyn Fn(&Pooled) -> Option<f64>| {
            m(&|r| transfers::pooled(&r.transfers).as_ref().and_then(f))
        };
        let (done, failed) = (
            t(&|p| Some(p.completed as f64)),
            t(&|p| Some(p.failed as f64)),
        );
        let asked = t(&|p| Some(p.count as f64));
        // Those neither done nor failed were cut off at the end, or never started.
        let short = match (done, failed, asked) {
            (Some(d), Some(f), Some(a)) if d + f < a => format!(" of {a:.0}"),
            _ => String::new(),
        };
        row.extend([
            format!("{}/{}{short}", num(done, 0), num(failed, 0)),
            format!(
                "{} / {} / {} ms",
                num(t(&|p| p.completion_ms.p50), 0),
                num(t(&|p| p.completion_ms.p90), 0),
                num(t(&|p| p.completion_ms.p99), 0)
            ),
            format!(
                "{} / {}",
                num(t(&|p| p.own_rtos.map(|x| x as f64)), 0),
                num(t(&|p| p.rtos.map(|x| x as f64)), 0)
            ),
        ]);
    }
    row.extend([
        m(&|r| r.latency.tcp_rtt.p50).map_or("-".into(), |v| format!("{v:.1} ms")),
        num(m(&|r| Some(r.retransmits as f64)), 0),
        format!(
            "{}/{}",
            num(m(&|r| Some(r.drops_bottleneck as f64)), 0),
            num(m(&|r| Some(r.drops_contender as f64)), 0)
        ),
        num(m(&|r| Some(r.marks_contender as f64)), 0),
        scheduled_delay(&ok),
        format!("{}%", num(m(&|r| Some(r.cpu_busy_share * 100.0)), 0)),
        m(&|r| r.host_others_cpu.map(|x| x * 100.0)).map_or("-".into(), |v| format!("{v:.0}%")),
    ]);
    row
}

/// The 99th percentile of the loaded pings of every repetition together. A run's p99 of a
/// few thousand pings rests on its few dozen slowest, which the emulator's stalls set as often
/// as the contender; a mean of such p99s still moves with how the stalls fell, and pooling
/// the pings of repetitions that took turns with the other contenders' weighs each ping once.
fn pooled_ping_p99(ok: &[&RunResult]) -> Option<Spread> {
    let pings: Vec<f64> = ok.iter().flat_map(|r| r.loaded_pings()).collect();
    stats::percentile(&pings, 99.0).map(|mean| Spread { mean, sd: None })
}

/// shaper's scheduled delay (pooled over the repetitions) as the bounds of the histogram
/// buckets its median and 99th percentile fall in, and the share of frames beyond the AQM's
/// target, which says on which side of the target the median is: "< 512 µs / < 16.4 ms,
/// 3% > target".
fn scheduled_delay(ok: &[&RunResult]) -> String {
    let bound = |per_mille| {
        scheduled_delay_ms(ok, per_mille).map(|ms| match ms {
            ms if ms.is_infinite() => "> 1 s".to_string(),
            ms if ms < 1.0 => format!("< {:.0} µs", ms * 1e3),
            ms => format!("< {ms:.1} ms"),
        })
    };
    let over = over_target_share(ok).map_or(String::new(), |share| {
        format!(", {}% > target", num(Some(share * 100.0), 0))
    });
    match (bound(500), bound(990)) {
        (Some(p50), Some(p99)) => format!("{p50} / {p99}{over}"),
        _ => "-".into(),
    }
}

/// The groups of a side table (queues, joins): each distinct item among the successful runs,
/// in the order first seen (by `same`), with the contenders that have it: their name, how many
/// repetitions they ran, and their successful repetitions' matching items.
type Group<'a, T> = (&'a T, Vec<(String, usize, Vec<&'a T>)>);

fn groups<'a, T>(
    runs: &[&'a RunResult],
    items: impl Fn(&'a RunResult) -> &'a [T],
    same: impl Fn(&T, &T) -> bool,
) -> Vec<Group<'a, T>> {
    let ok = || runs.iter().filter(|r| r.status == "ok");
    let mut firsts: Vec<&T> = Vec::new();
    for x in ok().flat_map(|r| items(r)) {
        if !firsts.iter().any(|f| same(f, x)) {
            firsts.push(x);
        }
    }
    let contenders = by_contender(runs);
    firsts
        .into_iter()
        .map(|first| {
            let per_contender = contenders
                .iter()
                .filter_map(|(name, reps)| {
                    let found: Vec<&T> = reps
                        .iter()
                        .filter(|r| r.status == "ok")
                        .filter_map(|r| items(r).iter().find(|x| same(first, x)))
                        .collect();
                    (!found.is_empty()).then(|| (name.clone(), reps.len(), found))
                })
                .collect();
            (first, per_contender)
        })
        .collect()
}

const QUEUE_HEADER: &[&str] = &[
    "queue",
    "contender",
    "runs",
    "backlog p50/p99/max",
    "at its rate p50/p99/max",
];

impl Table {
    /// The sampled queues while loaded: a row per qdisc and contender, the qdiscs in the order
    /// of their interfaces (the modem's first), so that the contenders' queues in the modem sit
    /// together. None when no run sampled any.
    fn queues(runs: &[&RunResult]) -> Option<Table> {
        let groups = groups(runs, |r| &r.queues, |a, b| a.key() == b.key());
        if groups.is_empty() {
            return None;
        }
        let mut rows = Vec::new();
        for (q, contenders) in groups {
            for (name, reps, found) in contenders {
                let summaries: Vec<&QueueSummary> = found.iter().map(|x| &x.loaded).collect();
                let levels = |f: &dyn Fn(&QueueSummary) -> Option<Levels>, scale: f64, unit| {
                    let at = |l: &dyn Fn(Levels) -> f64| {
                        spread(summaries.iter().map(|s| f(s).map(|x| l(x) * scale)))
                    };
                    let cells = [at(&|l| l.p50), at(&|l| l.p99), at(&|l| l.max)];
                    if cells.iter().all(Option::is_none) {
                        return "-".to_string();
                    }
                    let cells: Vec<String> = cells.into_iter().map(|c| cell(c, 1, "")).collect();
                    format!("{}{unit}", cells.join(" / "))
                };
                rows.push(vec![
                    format!("{} {} {}", q.place, q.kind, q.handle),
                    name,
                    format!("{}/{}", summaries.len(), reps),
                    levels(&|s| s.bytes, 1.0 / 1024.0, " KB"),
                    levels(&|s| s.ms, 1.0, " ms"),
                ]);
            }
        }
        Some(Table {
            header: QUEUE_HEADER.iter().map(|h| h.to_string()).collect(),
            rows,
        })
    }
}

const JOIN_HEADER: &[&str] = &[
    "joining host",
    "contender",
    "runs",
    "others",
    "share Mbit/s",
    "reached 90% of it after",
    "steady / share",
];

impl Table {
    /// Hosts that joined a loaded link (see `joins`): a row per joining host, direction and
    /// contender. None when no run had any.
    fn joins(runs: &[&RunResult]) -> Option<Table> {
        let groups = groups(
            runs,
            |r| &r.joins,
            |a, b| a.host == b.host && a.direction == b.direction,
        );
        if groups.is_empty() {
            return None;
        }
        let mut rows = Vec::new();
        for (first, contenders) in groups {
            for (name, reps, joins) in contenders {
                let never = joins.iter().filter(|j| j.reached_s.is_none()).count();
                let mut reached = cell(
                    spread(joins.iter().map(|j| j.reached_s.map(|s| s * 1e3))),
                    0,
                    " ms",
                );
                if never > 0 {
                    reached = match never == joins.len() {
                        true => "never".into(),
                        false => format!("{reached} (never in {never})"),
                    };
                }
                rows.push(vec![
                    format!("{} ({})", first.host, first.direction.as_str()),
                    name,
                    format!("{}/{}", joins.len(), reps),
                    cell(
                        spread(joins.iter().map(|j| Some(j.hosts as f64 - 1.0))),
                        0,
                        "",
                    ),
                    cell(spread(joins.iter().map(|j| Some(j.share_bps / 1e6))), 1, ""),
                    reached,
                    cell(spread(joins.iter().map(|j| Some(j.steady_ratio))), 2, ""),
                ]);
            }
        }
        Some(Table {
            header: JOIN_HEADER.iter().map(|h| h.to_string()).collect(),
            rows,
        })
    }
}

fn short(s: &str, n: usize) -> String {
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if s.chars().count() <= n {
        s
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

fn terminal_table(t: &Table) -> String {
    let mut widths: Vec<usize> = t.header.iter().map(|h| h.chars().count()).collect();
    for r in &t.rows {
        for (i, c) in r.iter().enumerate() {
            // A failure message spans the rest of the row; it does not widen a column.
            if !c.starts_with("FAILED") {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
    }
    let fmt = |cells: &[String]| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = fmt(&t.header);
    out.push('\n');
    for r in &t.rows {
        out.push_str(&fmt(r));
        out.push('\n');
    }
    out
}

fn markdown_table(t: &Table) -> String {
    let mut out = format!(
        "| {} |\n|{}\n",
        t.header.join(" | "),
        "---|".repeat(t.header.len())
    );
    for r in &t.rows {
        let cells: Vec<String> = r.iter().map(|c| c.replace('|', "\\|")).collect();
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    out
}

/// The Markdown of one scenario: provenance, table, plots, failures in full.
fn scenario_markdown(
    s: &ScenarioResults,
    command: &str,
    plot_prefix: &str,
    plots: &plot::Plots,
) -> String {
    let first = s.runs[0];
    let mut md = format!("### {}\n\n", s.name);
    if !first.description.is_empty() {
        md.push_str(&format!("{}\n\n", first.description.trim()));
    }
    md.push_str(&format!(
        "Linux {}, commit `{}`, scenario sha256 `{}`, {} s per run ({} s warm-up discarded), \
         host load average {:.1} before and {:.1} after the VM ran. \
         Throughput is TCP/UDP goodput at the receivers; utilisation is relative to the \
         contender's rate (or the bottleneck's for `none`), both wire rates; latencies are \
         round trips between host and server: ICMP echo (ping), and where there are such \
         columns a 64-byte request and its echo over UDP (udp-rr) or one TCP connection \
         (tcp-rr).\n\n",
        first.kernel,
        first.git_commit,
        &first.scenario_hash[..first.scenario_hash.len().min(16)],
        first.duration_s,
        first.warmup_s,
        first.host_load.0,
        first.host_load.1,
    ));
    if s.runs.iter().any(|r| !r.transfers.is_empty()) {
        md.push_str(
            "Transfers are short TCP transfers, each on a new connection, next to the flows: \
             how many completed and failed, their completion time from connect() to the last \
             byte, and the retransmission timeouts (TcpExtTCPTimeouts) in the namespace of the \
             side sending their data while they ran (all its connections count).\n\n",
        );
    }
    if by_contender(&s.runs).iter().any(|(_, reps)| reps.len() > 1) {
        md.push_str(
            "Each row is the mean of its successful repetitions (`runs`: successful of all); \
             `±` is their sample standard deviation, shown where more than one succeeded. \
             Plots show each contender's first successful repetition.\n\n",
        );
    }
    md.push_str(&format!("```sh\n{}\n```\n\n", command.trim()));
    md.push_str(&markdown_table(&Table::of(&s.runs)));
    md.push('\n');
    if let Some(t) = Table::queues(&s.runs) {
        md.push_str(&format!(
            "Queues while loaded: every qdisc of the emulated modem's interfaces and of the \
             contender's, sampled every {} ms; its backlog (KB of 1024 bytes), and the time that \
             takes to drain at the link's or the contender's rate (none for netem, whose backlog \
             is mostly packets held for their delay).\n\n",
            first.queue_interval_ms()
        ));
        md.push_str(&markdown_table(&t));
        md.push('\n');
    }
    if let Some(t) = Table::joins(&s.runs) {
        md.push_str(&format!(
            "Hosts joining a loaded link: a host whose first flow in a direction started while \
             others had been sending there for a second. Its share is an equal part of what \
             every host sending there carried together from a second after it started until \
             the first of them stopped; it reached {:.0} % of that at the end of the first 100 ms \
             of its own life (its flows' intervals from their start) in which it received that \
             much; `steady / share` is its mean over that window against the share.\n\n",
            joins::REACHED * 100.0
        ));
        md.push_str(&markdown_table(&t));
        md.push('\n');
    }
    if let Some(t) = &plots.throughput {
        md.push_str(&format!(
            "![throughput per host over time]({plot_prefix}{t})\n"
        ));
    }
    if let Some(l) = &plots.latency {
        md.push_str(&format!(
            "![latency CDF idle vs loaded]({plot_prefix}{l})\n"
        ));
    }
    if let Some(q) = &plots.queues {
        md.push_str(&format!("![queues over time]({plot_prefix}{q})\n"));
    }
    let failures: Vec<String> = s
        .runs
        .iter()
        .filter(|r| r.status != "ok" || !r.message.is_empty())
        .map(|r| {
            format!(
                "- {} (repetition {}): {}: {}",
                r.contender,
                r.repetition,
                r.status,
                short(&r.message, 600)
            )
        })
        .collect();
    if !failures.is_empty() {
        md.push_str("\nNotes:\n\n");
        md.push_str(&failures.join("\n"));
        md.push('\n');
    }
    md
}

/// After `lab run`: the table on the terminal, report.md and plots in the output directory.
pub fn write_run_report(out: &Path, all: &[RunResult], command: &str) -> Result<()> {
    let plots_dir = out.join("plots");
    std::fs::create_dir_all(&plots_dir)?;
    let mut md = format!("# Lab results\n\n```sh\n{command}\n```\n\n");
    for s in by_scenario(all) {
        println!("\n== {}", s.name);
        print!("{}", terminal_table(&Table::of(&s.runs)));
        if let Some(t) = Table::queues(&s.runs) {
            println!("queues while loaded:");
            print!("{}", terminal_table(&t));
        }
        if let Some(t) = Table::joins(&s.runs) {
            println!("hosts joining a loaded link:");
            print!("{}", terminal_table(&t));
        }
        for r in s.runs.iter().filter(|r| !r.message.is_empty()) {
            println!(
                "  {} (repetition {}): {}",
                r.contender,
                r.repetition,
                short(&r.message, 400)
            );
        }
        let plots = plot::draw(&s.name, &s.runs, &plots_dir)?;
        md.push_str(&scenario_markdown(&s, command, "plots/", &plots));
        md.push('\n');
    }
    let report = out.join("report.md");
    std::fs::write(&report, md)?;
    println!(
        "\nlab: per-run JSON in {}, report in {}, plots in {}",
        out.join("results").display(),
        report.display(),
        plots_dir.display()
    );
    Ok(())
}

/// `lab report DIR`: rewrites the blocks of DIR's scenarios in the lab section of `doc`,
/// keeping other scenarios' blocks and everything outside the markers.
pub fn update_doc(dir: &Path, doc: &Path, png_dir: &Path) -> Result<()> {
    let all = load_results(dir)?;
    let command = std::fs::read_to_string(dir.join("command.txt"))
        .unwrap_or_else(|_| format!("cargo xtask lab run ... --out {}", dir.display()));
    std::fs::create_dir_all(png_dir)?;
    let prefix = format!(
        "{}/",
        png_dir
            .strip_prefix(doc.parent().unwrap_or(Path::new(".")))
            .unwrap_or(png_dir)
            .display()
    );
    let text = std::fs::read_to_string(doc).unwrap_or_default();
    let (before, section, after) = split_section(&text);
    let mut blocks = parse_blocks(section);
    for s in by_scenario(&all) {
        let plots = plot::draw(&s.name, &s.runs, png_dir)?;
        blocks.insert(
            s.name.clone(),
            scenario_markdown(&s, &command, &prefix, &plots),
        );
    }
    let mut new = String::from(before);
    if !new.is_empty() && !new.ends_with('\n') {
        new.push('\n');
    }
    new.push_str(BEGIN);
    new.push_str(
        "\n\n## Lab results\n\n_Generated by `cargo xtask lab report`; edit outside the lab markers only._\n\n",
    );
    for (name, block) in &blocks {
        new.push_str(&format!(
            "{SCENARIO_MARK}{name} -->\n{}\n",
            block.trim_end()
        ));
        new.push('\n');
    }
    new.push_str(END);
    new.push('\n');
    new.push_str(after.trim_start_matches('\n'));
    std::fs::write(doc, new).with_context(|| format!("writing {}", doc.display()))?;
    println!(
        "lab: updated {} ({} scenario(s) from {})",
        doc.display(),
        by_scenario(&all).len(),
        dir.display()
    );
    Ok(())
}

/// Text before the lab section, the section's inside, text after it. Without markers the
/// section is empty and goes at the end.
fn split_section(text: &str) -> (&str, &str, &str) {
    match (text.find(BEGIN), text.find(END)) {
        (Some(b), Some(e)) if b < e => (
            &text[..b],
            &text[b + BEGIN.len()..e],
            &text[e + END.len()..],
        ),
        _ => (text, "", ""),
    }
}

fn parse_blocks(section: &str) -> BTreeMap<String, String> {
    let mut blocks = BTreeMap::new();
    for part in section.split(SCENARIO_MARK).skip(1) {
        if let Some((name, body)) = part.split_once(" -->") {
            blocks.insert(name.trim().to_string(), body.trim().to_string() + "\n");
        }
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queues::QueueSeries;

    fn run(contender: &str, status: &str, rr: serde_json::Value) -> RunResult {
        let summary = |p50: f64| serde_json::json!({"count": 1, "p50": p50, "p90": p50, "p99": p50, "mean": p50});
        let direction = serde_json::json!({"flows": 0, "mean_bps": 0.0, "reference_bps": null, "utilisation": null});
        serde_json::from_value(serde_json::json!({
            "scenario": "s", "scenario_hash": "h", "description": "", "contender": contender,
            "kind": "cake", "repetition": 1, "status": status, "message": "no such option",
            "kernel": "k", "git_commit": "c", "duration_s": 10.0, "warmup_s": 2.0, "bin_s": 0.1,
            "hosts": [], "flows": [], "download": direction, "upload": direction,
            "jain_hosts": null, "jain_flows": null,
            "latency": {
                "ping_idle": summary(0.4), "ping_loaded": summary(5.0), "induced_ms": 4.6,
                "ping_lost": 0, "ping_sent": 1, "tcp_rtt": summary(6.0), "ping_samples": [],
                "rr": rr,
            },
            "retransmits": 0, "drops_bottleneck": 0, "drops_contender": 3, "marks_contender": 7,
            "cpu_busy_s": 1.0, "cpu_busy_share": 0.5, "qdisc": {}, "shaper": {},
        }))
        .unwrap()
    }

    #[test]
    fn table_has_a_pair_of_columns_per_request_response_kind() {
        let summary = |p50: f64| serde_json::json!({"count": 1, "p50": p50, "p90": p50, "p99": p50, "mean": p50});
        let rr = serde_json::json!({"udp-rr": {
            "idle": summary(0.5), "loaded": summary(3.0), "induced_ms": 2.5,
            "lost": 0, "sent": 2, "samples": [],
        }});
        let (a, b) = (
            run("cake", "ok", rr),
            run("shaper", "failed", serde_json::json!({})),
        );
        let t = Table::of(&[&a, &b]);
        let at = |name: &str| t.header.iter().position(|h| h == name).unwrap();
        assert_eq!(at("udp-rr idle p50"), at("induced") + 1);
        assert_eq!(t.rows[0][at("udp-rr idle p50")], "0.5 ms");
        assert_eq!(t.rows[0][at("udp-rr loaded p50/p99")], "3.0 ms / 3.0 ms");
        assert_eq!(t.rows[0][at("ECN marks")], "7");
        assert!(t.rows.iter().all(|r| r.len() == t.header.len()));
        assert!(t.rows[1][2].starts_with("FAILED: no such option"));
        // Without request/response probes the table is as it always was.
        let t = Table::of(&[&b]);
        assert_eq!(t.header.len(), HEADER_LEAD.len() + HEADER_TAIL.len());
    }

    /// A successful run with traffic: 2 hosts downloading `down` Mbit/s between them (60 %
    /// for a) of a 100 Mbit/s reference, pings at `ping` ms loaded (p99 one more), udp-rr.
    fn loaded(down: f64, jain: f64, ping: f64, rep: u32) -> RunResult {
        let summary = |p50: f64, p99: f64| serde_json::json!({"count": 1, "p50": p50, "p90": p50, "p99": p99, "mean": p50});
        let rr = serde_json::json!({"udp-rr": {
            "idle": summary(0.5, 0.5), "loaded": summary(ping - 2.0, ping + 2.25),
            "induced_ms": ping - 2.5, "lost": 0, "sent": 2, "samples": [],
        }});
        let mut r = run("cake", "ok", rr);
        r.repetition = rep;
        r.download = serde_json::from_value(serde_json::json!({
            "flows": 2, "mean_bps": down * 1e6, "reference_bps": 100e6, "utilisation": down / 100.0,
        }))
        .unwrap();
        r.hosts = serde_json::from_value(serde_json::json!([
            {"name": "a", "mean_bps": down * 0.6e6, "series_bps": []},
            {"name": "b", "mean_bps": down * 0.4e6, "series_bps": []},
        ]))
        .unwrap();
        let flow = |id: &str, host: &str, share: f64| {
            serde_json::json!({
                "id": id, "host": host, "direction": "download", "protocol": "tcp", "cc": null,
                "parallel": 1, "started_s": 0.0, "stopped_s": 10.0, "mean_bps": down * share * 1e6,
                "connections_mean_bps": [], "retransmits": 0, "lost_packets": null,
                "packets": null, "series_bps": [], "error": null,
            })
        };
        // b's download in two flows: a host's share adds up its flows.
        r.flows = serde_json::from_value(serde_json::json!([
            flow("a", "a", 0.6),
            flow("b", "b", 0.1),
            flow("b.2", "b", 0.3),
        ]))
        .unwrap();
        r.jain_hosts = Some(jain);
        r.jain_flows = Some(0.8);
        r.latency.ping_loaded.p50 = Some(ping);
        r.latency.ping_loaded.p99 = Some(ping + 1.0);
        r.latency.induced_ms = Some(ping - 0.4);
        r
    }

    #[test]
    fn one_repetition_reads_as_before() {
        let t = Table::of(&[&loaded(95.44, 0.9234, 5.0, 1)]);
        // The row as the table printed it before repetitions showed their spread.
        let before = [
            "cake",
            "1/1",
            "95.4 (95%)",
            "-",
            "a 57.3, b 38.2",
            "0.67 / -",
            "0.923",
            "0.800",
            "0.4 ms",
            "5.0 ms / 6.0 ms",
            "-",
            "4.6 ms",
            "0.5 ms",
            "3.0 ms / 7.2 ms",
            "6.0 ms",
            "0",
            "0/3",
            "7",
            "-",
            "50%",
            "-",
        ];
        assert_eq!(t.rows[0], before);
    }

    #[test]
    fn scheduled_delay_pools_the_repetitions_and_the_places() {
        // Buckets as `shaper stats --json` writes them: below 64 µs, below 128 µs, open.
        let hist = |a: u64, b: u64, c: u64| {
            serde_json::json!({"delay_hist": [
                {"below_us": 64, "frames": a}, {"below_us": 128, "frames": b},
                {"below_us": null, "frames": c},
            ]})
        };
        let mut one = loaded(95.0, 1.0, 5.0, 1);
        one.shaper.insert("server".into(), hist(10, 0, 0));
        one.shaper.insert("server-ingress".into(), hist(0, 9, 0));
        let mut two = loaded(95.0, 1.0, 5.0, 2);
        two.shaper.insert("server".into(), hist(0, 0, 1));
        // 20 frames: the 10th is in the first bucket, the 20th in the open one.
        assert_eq!(scheduled_delay_ms(&[&one, &two], 500), Some(0.064));
        assert_eq!(scheduled_delay_ms(&[&one, &two], 990), Some(f64::INFINITY));
        let cell = |runs: &[&RunResult]| {
            let t = Table::of(runs);
            let at = t.header.iter().position(|h| h == "scheduled delay p50/p99");
            t.rows[0][at.unwrap()].clone()
        };
        assert_eq!(cell(&[&one, &two]), "< 64 µs / > 1 s");
        assert_eq!(cell(&[&one]), "< 64 µs / < 128 µs");
        // With the count of frames beyond the AQM's target: 5 of the 20.
        let mut counted = hist(10, 9, 1);
        counted["over_target_frames"] = 5.into();
        let mut three = loaded(95.0, 1.0, 5.0, 3);
        three.shaper.insert("server".into(), counted);
        assert_eq!(over_target_share(&[&one, &three]), Some(0.25));
        assert_eq!(cell(&[&three]), "< 64 µs / > 1 s, 25% > target");
    }

    #[test]
    fn the_pooled_ping_p99_weighs_every_loaded_ping_once() {
        // One flow from 0 to 10 s, warm-up 2 s: pings before 2 s are neither idle nor loaded.
        let with_pings = |rep: u32, pings: &[(f64, f64)]| {
            let mut r = loaded(95.0, 1.0, 5.0, rep);
            r.flows = serde_json::from_value(serde_json::json!([{
                "id": "f", "host": "a", "direction": "download", "protocol": "tcp", "cc": null,
                "parallel": 1, "started_s": 0.0, "stopped_s": 10.0, "mean_bps": 1.0,
                "connections_mean_bps": [], "retransmits": 0, "lost_packets": null,
                "packets": null, "series_bps": [],
            }]))
            .unwrap();
            r.latency.ping_samples = pings.to_vec();
            r
        };
        // 100 loaded pings of 1 ms in one repetition, one of 50 ms in the other, and a slow
        // one in warm-up that does not count.
        let fast: Vec<(f64, f64)> = (0..100).map(|i| (2.0 + i as f64 * 0.05, 1.0)).collect();
        let (one, two) = (
            with_pings(1, &fast),
            with_pings(2, &[(1.0, 900.0), (5.0, 50.0)]),
        );
        assert_eq!(one.loaded_pings().count(), 100);
        assert_eq!(two.loaded_pings().collect::<Vec<_>>(), [50.0]);
        let t = Table::of(&[&one, &two]);
        let at = |name: &str| t.rows[0][t.header.iter().position(|h| h == name).unwrap()].clone();
        // Pooled, the slow ping is the 101st of 101: the p99 (rank 99 of 0..=100) is 1 ms, where
        // the repetitions' p99s average 25.5 ms.
        assert_eq!(at("ping p99 pooled"), "1.0 ms");
    }

    #[test]
    fn repetitions_show_their_mean_and_spread() {
        // Sample standard deviations: 90/95/100 -> 5; 0.90/0.95/1.00 -> 0.05; 4/5/9 -> sqrt(7).
        let reps = [
            loaded(90.0, 0.90, 4.0, 1),
            loaded(95.0, 0.95, 5.0, 2),
            loaded(100.0, 1.0, 9.0, 3),
        ];
        let mut failed = run("cake", "failed", serde_json::json!({}));
        failed.repetition = 4;
        let runs: Vec<&RunResult> = reps.iter().chain([&failed]).collect();
        let t = Table::of(&runs);
        let at = |name: &str| t.rows[0][t.header.iter().position(|h| h == name).unwrap()].clone();
        assert_eq!(at("runs"), "3/4");
        assert_eq!(at("down Mbit/s (util)"), "95.0 ±5.0 (95 ±5%)");
        assert_eq!(at("per host Mbit/s"), "a 57.0 ±3.0, b 38.0 ±2.0");
        assert_eq!(at("Jain hosts"), "0.950 ±0.050");
        // The same in every repetition: no spread, but a sample standard deviation of 0.
        assert_eq!(at("Jain flows"), "0.800 ±0.000");
        assert_eq!(at("ping loaded p50/p99"), "6.0 ±2.6 ms / 7.0 ±2.6 ms");
        assert_eq!(at("induced"), "5.6 ±2.6 ms");
        assert_eq!(at("udp-rr loaded p50/p99"), "4.0 ±2.6 ms / 8.2 ±2.6 ms");
        // Counters show their mean only.
        assert_eq!(at("ECN marks"), "7");
        assert_eq!(at("TCP RTT p50"), "6.0 ms");
        let md = scenario_markdown(
            &ScenarioResults {
                name: "s".into(),
                runs,
            },
            "cargo xtask lab run s.toml",
            "plots/",
            &plot::Plots::default(),
        );
        assert!(
            md.contains("the mean of its successful repetitions"),
            "{md}"
        );
    }

    #[test]
    fn table_has_transfers_columns_when_a_run_has_transfers() {
        let transfers = |completed: u64, rtos: u64, ms: f64| {
            serde_json::json!({
                "id": "a.1", "host": "a", "server": "server", "direction": "download",
                "count": 10, "concurrency": 1, "min_bytes": 1, "max_bytes": 2,
                "start_s": 0.0, "stop_s": 10.0, "started": 10, "completed": completed,
                "failed": 1, "unfinished": 9 - completed,
                "completion_ms": {"count": completed},
                "rtos": rtos, "own_rtos": rtos / 2, "counters": {}, "failures": [],
                "samples": (0..completed).map(|i| (i as f64, 1, ms)).collect::<Vec<_>>(),
                "error": null,
            })
        };
        let with = |mut r: RunResult, t: serde_json::Value| {
            r.transfers = vec![serde_json::from_value(t).unwrap()];
            r
        };
        let a = with(
            run("shaper", "ok", serde_json::json!({})),
            transfers(9, 2, 40.0),
        );
        let b = with(
            run("cake", "ok", serde_json::json!({})),
            transfers(5, 4, 80.0),
        );
        let t = Table::of(&[&a, &b]);
        let at = |name: &str| t.header.iter().position(|h| h == name).unwrap();
        assert_eq!(at("transfers done/failed"), at("induced") + 1);
        assert_eq!(at("TCP RTT p50"), at("RTOs own/sender's") + 1);
        assert_eq!(t.rows[0][at("transfers done/failed")], "9/1");
        assert_eq!(t.rows[0][at("transfer p50/p90/p99")], "40 / 40 / 40 ms");
        assert_eq!(t.rows[0][at("RTOs own/sender's")], "1 / 2");
        assert_eq!(t.rows[1][at("transfers done/failed")], "5/1 of 10");
        assert!(t.rows.iter().all(|r| r.len() == t.header.len()));
        let plain = run("none", "ok", serde_json::json!({}));
        assert!(
            !Table::of(&[&plain])
                .header
                .iter()
                .any(|h| h.contains("transfer"))
        );
        // The JSON of a run without transfers has no transfers field at all.
        assert!(
            serde_json::to_value(&plain)
                .unwrap()
                .get("transfers")
                .is_none()
        );
    }

    #[test]
    fn queue_table_has_a_row_per_qdisc_and_contender() {
        // A modem token bucket at 100 Mbit/s and the contender's fq without a rate.
        let queues = |modem: f64, own: f64| {
            let series = |place: &str, kind: &str, rate: Option<f64>, bytes: f64| {
                serde_json::json!({
                    "place": place, "dev": "eth0", "kind": kind, "handle": "1:", "parent": null,
                    "rate_bps": rate, "samples": [],
                    "loaded": {
                        "count": 3,
                        "bytes": {"p50": bytes, "p99": 2.0 * bytes, "max": 3.0 * bytes},
                        "packets": {"p50": 1.0, "p99": 2.0, "max": 3.0},
                        "ms": rate.map(|r| {
                            let ms = bytes * 8e3 / r;
                            serde_json::json!({"p50": ms, "p99": 2.0 * ms, "max": 3.0 * ms})
                        }),
                    },
                })
            };
            serde_json::from_value::<Vec<QueueSeries>>(serde_json::json!([
                series("bottleneck-down", "tbf", Some(100e6), modem),
                series("contender-server", "fq", None, own),
            ]))
            .unwrap()
        };
        let mut shaper = [
            run("shaper", "ok", serde_json::json!({})),
            run("shaper", "ok", serde_json::json!({})),
        ];
        shaper[0].queues = queues(0.0, 10240.0);
        shaper[1].queues = queues(0.0, 30720.0);
        let mut none = run("none", "ok", serde_json::json!({}));
        // 1.25 MB: 100 ms at 100 Mbit/s.
        none.queues = queues(1_250_000.0, 0.0);
        none.queues.truncate(1);
        let t = Table::queues(&[&shaper[0], &shaper[1], &none]).unwrap();
        let rows: Vec<Vec<&str>> = t
            .rows
            .iter()
            .map(|r| r.iter().map(String::as_str).collect())
            .collect();
        assert_eq!(
            rows,
            [
                vec![
                    "bottleneck-down tbf 1:",
                    "shaper",
                    "2/2",
                    "0.0 ±0.0 / 0.0 ±0.0 / 0.0 ±0.0 KB",
                    "0.0 ±0.0 / 0.0 ±0.0 / 0.0 ±0.0 ms"
                ],
                vec![
                    "bottleneck-down tbf 1:",
                    "none",
                    "1/1",
                    "1220.7 / 2441.4 / 3662.1 KB",
                    "100.0 / 200.0 / 300.0 ms"
                ],
                // 10 and 30 KB: a mean of 20, a standard deviation of 14.1.
                vec![
                    "contender-server fq 1:",
                    "shaper",
                    "2/2",
                    "20.0 ±14.1 / 40.0 ±28.3 / 60.0 ±42.4 KB",
                    "-"
                ],
            ]
        );
        let plain = run("none", "ok", serde_json::json!({}));
        assert!(Table::queues(&[&plain]).is_none());
    }

    #[test]
    fn section_is_replaced_and_the_rest_kept() {
        let doc = "# Benchmarks\n\nhand written\n\n<!-- lab:begin -->\nold\n<!-- lab:scenario a -->\n### a\nA\n<!-- lab:scenario b -->\n### b\nB\n<!-- lab:end -->\n\ntail\n";
        let (before, section, after) = split_section(doc);
        assert_eq!(before, "# Benchmarks\n\nhand written\n\n");
        assert!(after.contains("tail"));
        let blocks = parse_blocks(section);
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks["b"], "### b\nB\n");
        let (before, section, after) = split_section("no markers\n");
        assert_eq!((before, section, after), ("no markers\n", "", ""));
    }
}
