//! PNG plots of a scenario's results, from each contender's first successful repetition:
//! throughput per host over time and the latency probes' CDF idle vs loaded (a panel per
//! contender), and the queues over time (a panel per queue, a line per contender).

use std::{path::Path, sync::OnceLock};

use anyhow::{Context, Result, anyhow};
use plotters::{element::DashedPathElement, prelude::*};

use super::{RunResult, queues::QueueSeries, scenario::ProbeKind};

/// The font the bootstrap installs (Debian's fonts-dejavu-core); plotters' ab_glyph backend
/// draws text with it directly, no fontconfig.
const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

#[derive(Default)]
pub struct Plots {
    /// File names inside the plot directory.
    pub throughput: Option<String>,
    pub latency: Option<String>,
    pub queues: Option<String>,
}

fn register_font() -> Result<()> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let bytes = std::fs::read(FONT).map_err(|e| {
            format!("{FONT}: {e} (run `cargo xtask bootstrap` to install fonts-dejavu-core)")
        })?;
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{FONT} is not a font plotters can read"))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// The first successful repetition of each contender, in run order.
fn panels<'a>(runs: &[&'a RunResult]) -> Vec<&'a RunResult> {
    let mut out: Vec<&RunResult> = Vec::new();
    for r in runs.iter().filter(|r| r.status == "ok") {
        if out.iter().all(|o| o.contender != r.contender) {
            out.push(r);
        }
    }
    out
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing: {e:?}")
}

pub fn draw(scenario: &str, runs: &[&RunResult], dir: &Path) -> Result<Plots> {
    let panels = panels(runs);
    if panels.is_empty() {
        return Ok(Plots::default());
    }
    register_font()?;
    let throughput = format!("{scenario}-throughput.png");
    throughput_plot(scenario, &panels, &dir.join(&throughput))
        .with_context(|| format!("plotting {throughput}"))?;
    let latency = format!("{scenario}-latency.png");
    let has_latency = panels.iter().any(|r| !probe_rtts(r).is_empty());
    if has_latency {
        latency_plot(scenario, &panels, &dir.join(&latency))
            .with_context(|| format!("plotting {latency}"))?;
    }
    let queues = format!("{scenario}-queues.png");
    let queue_panels = queue_panels(&panels);
    if !queue_panels.is_empty() {
        queue_plot(scenario, &panels, &queue_panels, &dir.join(&queues))
            .with_context(|| format!("plotting {queues}"))?;
    }
    Ok(Plots {
        throughput: Some(throughput),
        latency: has_latency.then_some(latency),
        queues: (!queue_panels.is_empty()).then_some(queues),
    })
}

fn throughput_plot(scenario: &str, panels: &[&RunResult], path: &Path) -> Result<()> {
    let root = BitMapBackend::new(path, (1000, 260 * panels.len() as u32 + 40)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root
        .titled(
            &format!("{scenario}: throughput per host (100 ms bins)"),
            ("sans-serif", 22),
        )
        .map_err(err)?;
    let ymax = panels
        .iter()
        .flat_map(|r| r.hosts.iter().flat_map(|h| h.series_bps.iter()))
        .fold(0.0f64, |a, b| a.max(*b))
        / 1e6
        * 1.1;
    let ymax = if ymax > 0.0 { ymax } else { 1.0 };
    for (area, r) in root.split_evenly((panels.len(), 1)).iter().zip(panels) {
        let mut chart = ChartBuilder::on(area)
            .caption(&r.contender, ("sans-serif", 18))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(55)
            .build_cartesian_2d(0f64..r.duration_s, 0f64..ymax)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_desc("Mbit/s")
            .light_line_style(TRANSPARENT)
            .draw()
            .map_err(err)?;
        for (i, h) in r.hosts.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let points = h
                .series_bps
                .iter()
                .enumerate()
                .map(|(b, v)| ((b as f64 + 0.5) * r.bin_s, v / 1e6));
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))
                .map_err(err)?
                .label(&h.name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// (rtt, fraction ≤ rtt) of sorted samples.
fn cdf(mut v: Vec<f64>) -> Vec<(f64, f64)> {
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    v.iter()
        .enumerate()
        .map(|(i, x)| (*x, (i + 1) as f64 / n))
        .collect()
}

/// A colour per probe kind, the same in every panel and plot.
fn probe_color(kind: ProbeKind) -> RGBColor {
    match kind {
        ProbeKind::Ping => RGBColor(31, 119, 180),
        ProbeKind::UdpRr => RGBColor(255, 127, 14),
        ProbeKind::TcpRr => RGBColor(44, 160, 44),
    }
}

/// One kind of latency probe's round trips in a run (ms), split by the rule of the statistics
/// (see `results::classify`).
struct ProbeRtts {
    kind: ProbeKind,
    idle: Vec<f64>,
    loaded: Vec<f64>,
}

/// The latency probes a run measured, in the scenario format's order.
fn probe_rtts(r: &RunResult) -> Vec<ProbeRtts> {
    ProbeKind::ALL
        .into_iter()
        .filter_map(|kind| {
            let samples = match kind {
                ProbeKind::Ping => &r.latency.ping_samples,
                _ => &r.latency.rr.get(kind.as_str())?.samples,
            };
            let (mut idle, mut loaded) = (Vec::new(), Vec::new());
            for (t, rtt) in samples {
                match super::results::classify(*t, &r.flows, r.warmup_s, r.duration_s) {
                    Some(true) => loaded.push(*rtt),
                    Some(false) => idle.push(*rtt),
                    None => {}
                }
            }
            (!idle.is_empty() || !loaded.is_empty()).then_some(ProbeRtts { kind, idle, loaded })
        })
        .collect()
}

/// How a CDF of round trips is drawn: the probe's colour, idle thin and dashed, loaded solid.
fn rtt_style(kind: ProbeKind, loaded: bool) -> ShapeStyle {
    probe_color(kind).stroke_width(if loaded { 2 } else { 1 })
}

/// Dashes of an idle CDF: 6 px drawn, 4 px gap.
const DASH: (u32, u32) = (6, 4);

fn latency_plot(scenario: &str, panels: &[&RunResult], path: &Path) -> Result<()> {
    let cols = panels.len().min(3);
    let rows = panels.len().div_ceil(cols);
    let split: Vec<Vec<ProbeRtts>> = panels.iter().map(|r| probe_rtts(r)).collect();
    let kinds: Vec<ProbeKind> = ProbeKind::ALL
        .into_iter()
        .filter(|k| split.iter().flatten().any(|p| p.kind == *k))
        .collect();
    let root =
        BitMapBackend::new(path, (460 * cols as u32, 340 * rows as u32 + 70)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root
        .titled(
            &format!("{scenario}: round-trip CDF, idle vs loaded"),
            ("sans-serif", 22),
        )
        .map_err(err)?;
    // One legend for all panels, under the title: inside a panel it would hide the curves
    // that end where it sits (a bloated queue's, at the far right).
    let (legend, root) = root.split_vertically(30);
    let mut x = 20;
    for kind in &kinds {
        for loaded in [false, true] {
            let (ends, style) = (vec![(x, 12), (x + 30, 12)], rtt_style(*kind, loaded));
            if loaded {
                legend.draw(&PathElement::new(ends, style)).map_err(err)?;
            } else {
                legend
                    .draw(&DashedPathElement::new(ends, DASH.0, DASH.1, style))
                    .map_err(err)?;
            }
            let label = format!(
                "{} {}",
                kind.as_str(),
                if loaded { "loaded" } else { "idle" }
            );
            legend
                .draw(&Text::new(label, (x + 36, 4), ("sans-serif", 15)))
                .map_err(err)?;
            x += 150;
        }
    }
    // A shared x axis up to the largest 99.9th percentile keeps panels comparable.
    let all: Vec<f64> = split
        .iter()
        .flatten()
        .flat_map(|p| p.idle.iter().chain(&p.loaded))
        .copied()
        .collect();
    // Log scale: idle RTTs of a millisecond and bloated ones of hundreds share the axis.
    let xmax = super::stats::percentile(&all, 99.9).unwrap_or(1.0).max(0.1) * 1.2;
    let xmin = super::stats::percentile(&all, 0.0).unwrap_or(0.1).max(0.01) * 0.8;
    for ((area, r), probes) in root
        .split_evenly((rows, cols))
        .iter()
        .zip(panels)
        .zip(split)
    {
        let mut chart = ChartBuilder::on(area)
            .caption(&r.contender, ("sans-serif", 18))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(45)
            .build_cartesian_2d((xmin..xmax).log_scale(), 0f64..1.0)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("RTT (ms, log scale)")
            .x_labels(6)
            .x_label_formatter(&|v| format!("{v:.0}"))
            .light_line_style(TRANSPARENT)
            .y_desc("fraction")
            .draw()
            .map_err(err)?;
        for ProbeRtts { kind, idle, loaded } in probes {
            if !idle.is_empty() {
                chart
                    .draw_series(DashedLineSeries::new(
                        cdf(idle),
                        DASH.0,
                        DASH.1,
                        rtt_style(kind, false),
                    ))
                    .map_err(err)?;
            }
            if !loaded.is_empty() {
                chart
                    .draw_series(LineSeries::new(cdf(loaded), rtt_style(kind, true)))
                    .map_err(err)?;
            }
        }
    }
    root.present().map_err(err)?;
    Ok(())
}

/// One panel of the queue plot: a line per contender (and placement).
struct QueuePanel<'a> {
    title: String,
    lines: Vec<QueueLine<'a>>,
}

struct QueueLine<'a> {
    /// Picks the colour: a contender's is the same in every panel.
    contender: &'a str,
    label: String,
    series: &'a QueueSeries,
}

/// The modem's token bucket in each direction (where the queue forms when the contender lets
/// more through than the link carries), then the contenders' own root qdiscs.
fn queue_panels<'a>(runs: &[&'a RunResult]) -> Vec<QueuePanel<'a>> {
    let mut panels = Vec::new();
    for (place, direction) in [("bottleneck-down", "download"), ("bottleneck-up", "upload")] {
        let lines: Vec<_> = runs
            .iter()
            .filter_map(|r| {
                let series = r
                    .queues
                    .iter()
                    .find(|q| q.place == place && q.kind == "tbf")?;
                Some(QueueLine {
                    contender: &r.contender,
                    label: r.contender.clone(),
                    series,
                })
            })
            .collect();
        if !lines.is_empty() {
            panels.push(QueuePanel {
                title: format!("the modem's token bucket, {direction} ({place})"),
                lines,
            });
        }
    }
    let mut own = Vec::new();
    for r in runs {
        let roots: Vec<&QueueSeries> = r
            .queues
            .iter()
            .filter(|q| q.place.starts_with("contender-") && q.parent.is_none())
            .collect();
        for q in &roots {
            let label = if roots.len() > 1 {
                let at = q.place.trim_start_matches("contender-");
                format!("{} at {at} ({})", r.contender, q.kind)
            } else {
                format!("{} ({})", r.contender, q.kind)
            };
            own.push(QueueLine {
                contender: &r.contender,
                label,
                series: q,
            });
        }
    }
    if !own.is_empty() {
        panels.push(QueuePanel {
            title: "the contenders' own queues (root qdisc)".into(),
            lines: own,
        });
    }
    panels
}

fn queue_plot(
    scenario: &str,
    runs: &[&RunResult],
    panels: &[QueuePanel],
    path: &Path,
) -> Result<()> {
    let root = BitMapBackend::new(path, (1000, 260 * panels.len() as u32 + 40)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root
        .titled(
            &format!(
                "{scenario}: queues over time (sampled every {} ms)",
                runs[0].queue_interval_ms()
            ),
            ("sans-serif", 22),
        )
        .map_err(err)?;
    let duration = runs.iter().map(|r| r.duration_s).fold(1.0, f64::max);
    for (area, panel) in root.split_evenly((panels.len(), 1)).iter().zip(panels) {
        // As time at the rate when every line has one (the modem's always does), else bytes.
        let in_ms = panel.lines.iter().all(|l| l.series.rate_bps.is_some());
        let y = |q: &QueueSeries, bytes: u64| {
            let bytes = bytes as f64;
            q.ms(bytes).filter(|_| in_ms).unwrap_or(bytes / 1024.0)
        };
        // Room above the highest line for the legend in the upper right (and some height for
        // a panel of empty queues).
        let ymax = (panel
            .lines
            .iter()
            .flat_map(|l| {
                l.series
                    .samples
                    .iter()
                    .map(move |&(_, b, _)| y(l.series, b))
            })
            .fold(0.0f64, f64::max)
            * 1.4)
            .max(1.0);
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, ("sans-serif", 18))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(55)
            // A little below zero, so that an empty queue's line stands off the axis.
            .build_cartesian_2d(0f64..duration, -0.02 * ymax..ymax)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_desc(if in_ms {
                "backlog (ms at its rate)"
            } else {
                "backlog (KB)"
            })
            .light_line_style(TRANSPARENT)
            .draw()
            .map_err(err)?;
        for QueueLine {
            contender,
            label,
            series: q,
        } in &panel.lines
        {
            // A contender has the same colour in every panel.
            let i = runs
                .iter()
                .position(|r| r.contender == *contender)
                .unwrap_or(0);
            let color = Palette99::pick(i).to_rgba();
            let points = q
                .samples
                .iter()
                .filter(|(t, ..)| *t >= 0.0)
                .map(|&(t, b, _)| (t, y(q, b)));
            // One pixel wide: a wider line is drawn with mitred joins, which shoot far past
            // the sharp turns of a series sampled this often.
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(1)))
                .map_err(err)?
                .label(label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}
