//! Scenario files: the TOML a user writes (documented in docs/lab.md), parsed strictly and
//! checked into a `Scenario` whose values are already in numbers, so nothing downstream can
//! fail on a typo.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use anyhow::{Context, Result, bail, ensure};
use serde::Deserialize;

use super::{dscp, units};

// ---- the file as written -------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    name: Option<String>,
    description: Option<String>,
    duration: String,
    #[serde(default)]
    warmup: Option<String>,
    #[serde(default)]
    repetitions: Option<u32>,
    #[serde(default)]
    queue_interval: Option<String>,
    topology: TopologyFile,
    #[serde(default)]
    bottleneck: BottleneckFile,
    #[serde(default)]
    contender: Vec<ContenderFile>,
    #[serde(default)]
    flow: Vec<FlowFile>,
    #[serde(default)]
    probe: Vec<ProbeFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TopologyFile {
    #[serde(default)]
    servers: Option<Vec<String>>,
    hosts: Vec<String>,
    #[serde(default)]
    mtu_frames: bool,
    #[serde(default)]
    router_gro: bool,
    #[serde(default)]
    nat: bool,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct BottleneckFile {
    down: Option<LinkFile>,
    up: Option<LinkFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LinkFile {
    rate: Option<String>,
    buffer: Option<String>,
    delay: Option<String>,
    jitter: Option<String>,
    loss: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ContenderFile {
    name: String,
    kind: Kind,
    #[serde(default)]
    options: Vec<String>,
    on: Vec<PlacementFile>,
    #[serde(default)]
    tune: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlacementFile {
    at: String,
    #[serde(default)]
    direction: Direction,
    rate: Option<String>,
    #[serde(default)]
    options: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FlowFile {
    host: String,
    server: Option<String>,
    direction: FlowDirection,
    #[serde(default)]
    protocol: Protocol,
    #[serde(default)]
    cc: Option<String>,
    #[serde(default)]
    parallel: Option<u32>,
    rate: Option<String>,
    start: Option<String>,
    stop: Option<String>,
    #[serde(default)]
    family: Family,
    ecn: Option<bool>,
    /// A name or a number, so it is checked by hand (see `dscp`).
    dscp: Option<toml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProbeFile {
    host: String,
    server: Option<String>,
    kind: ProbeFileKind,
    interval: Option<String>,
    #[serde(default)]
    family: Family,
    // Transfers only.
    count: Option<u32>,
    size: Option<String>,
    direction: Option<FlowDirection>,
    concurrency: Option<u32>,
    start: Option<String>,
    stop: Option<String>,
}

/// A probe's kind as files name it: a latency probe's, or transfers (which become a
/// `Transfers`, not a `Probe`).
#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum ProbeFileKind {
    Ping,
    UdpRr,
    TcpRr,
    Transfers,
}

// ---- the checked scenario ------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Shaper,
    Cake,
    FqCodel,
    Fq,
    None,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Shaper => "shaper",
            Kind::Cake => "cake",
            Kind::FqCodel => "fq_codel",
            Kind::Fq => "fq",
            Kind::None => "none",
        }
    }
}

/// Which way through the interface the contender acts on: what it sends (egress), or what it
/// receives (ingress: a qdisc on an IFB the interface's ingress is redirected to, as
/// sqm-scripts does; shaper's own `--ingress-rate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    #[default]
    Egress,
    Ingress,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FlowDirection {
    /// Server to host.
    Download,
    /// Host to server.
    Upload,
}

impl FlowDirection {
    /// As scenario files name it.
    pub fn as_str(self) -> &'static str {
        match self {
            FlowDirection::Download => "download",
            FlowDirection::Upload => "upload",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    #[default]
    Ipv4,
    Ipv6,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProbeKind {
    /// ICMP echo (`ping -D`).
    Ping,
    /// A UDP request and its echo (`lab-probe`).
    UdpRr,
    /// A request and its echo on one TCP connection (`lab-probe`).
    TcpRr,
}

impl ProbeKind {
    pub const ALL: [ProbeKind; 3] = [ProbeKind::Ping, ProbeKind::UdpRr, ProbeKind::TcpRr];

    /// As scenario files and result files name it.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeKind::Ping => "ping",
            ProbeKind::UdpRr => "udp-rr",
            ProbeKind::TcpRr => "tcp-rr",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    pub duration: f64,
    pub warmup: f64,
    pub repetitions: u32,
    /// How often the runner samples the queues (s); 0: never.
    pub queue_interval: f64,
    pub servers: Vec<String>,
    pub hosts: Vec<String>,
    /// The hosts and servers send MTU-sized frames, as onto physical links into a router that
    /// does not aggregate them (GRO off). Otherwise veth hands the router the endpoints' TSO
    /// super-packets whole, which is what a router with GRO on forwards.
    pub mtu_frames: bool,
    /// The router's ports aggregate what arrives (GRO on, as on a real router; veth does not by
    /// default): with `mtu_frames`, frames that crossed a "wire" become super-packets again.
    pub router_gro: bool,
    /// The router masquerades IPv4 out of its WAN port (nftables), as a home router does: the
    /// servers see one address, the router's, and have no route to the hosts' own. IPv6 stays
    /// routed, as home networks have it.
    pub nat: bool,
    pub down: Option<Link>,
    pub up: Option<Link>,
    pub contenders: Vec<Contender>,
    pub flows: Vec<Flow>,
    pub probes: Vec<Probe>,
    pub transfers: Vec<Transfers>,
    /// `net.ipv4.tcp_ecn` for the hosts whose TCP flows set `ecn` (true: 1, the client asks
    /// for ECN; false: 0). Hosts not listed keep the kernel's default.
    pub host_ecn: BTreeMap<String, bool>,
    /// SHA-256 of the file's bytes, so results name exactly what produced them.
    pub hash: String,
}

/// One direction of the emulated path (netem and a token bucket).
#[derive(Debug, Clone, PartialEq)]
pub struct Link {
    pub rate_bps: Option<f64>,
    /// Token bucket queue in bytes (only with a rate).
    pub buffer_bytes: Option<u64>,
    pub delay: f64,
    pub jitter: f64,
    pub loss_percent: f64,
}

#[derive(Debug, Clone)]
pub struct Contender {
    pub name: String,
    pub kind: Kind,
    pub options: Vec<String>,
    pub placements: Vec<Placement>,
    /// For a shaper contender, the file beside the plans that runs instead of the `shaper` on
    /// the VM's PATH: a baseline build (`lab run --baseline`).
    pub binary: Option<String>,
    /// `shaper tune --apply` in each namespace the contender shapes in, before the traffic:
    /// its connections then use the host settings shaper advises (`tune = true`).
    pub tune: bool,
}

#[derive(Debug, Clone)]
pub struct Placement {
    pub at: Location,
    pub direction: Direction,
    pub rate: Option<(String, f64)>,
    pub options: Vec<String>,
}

/// Where in the topology a contender sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// The router's interface toward the servers (upload direction).
    RouterWan,
    /// The router's LAN bridge (download direction).
    RouterLan,
    /// A server's or a host's own interface.
    Node(String),
}

impl Location {
    pub fn label(&self) -> String {
        match self {
            Location::RouterWan => "router-wan".into(),
            Location::RouterLan => "router-lan".into(),
            Location::Node(n) => n.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Flow {
    /// "a.0": the host and the flow's index among that host's flows.
    pub id: String,
    pub host: String,
    pub server: String,
    pub direction: FlowDirection,
    pub protocol: Protocol,
    pub cc: Option<String>,
    pub parallel: u32,
    pub rate_bps: Option<f64>,
    pub start: f64,
    pub stop: f64,
    pub family: Family,
    /// Whether the connections negotiate ECN (TCP only; None: the kernel's default).
    pub ecn: Option<bool>,
    /// The DSCP its packets carry, both ways (None: 0, iperf3's default).
    pub dscp: Option<u8>,
}

#[derive(Debug, Clone)]
pub struct Probe {
    pub id: String,
    pub host: String,
    pub server: String,
    pub kind: ProbeKind,
    pub interval: f64,
    pub family: Family,
}

/// Short TCP transfers, each on a new connection, back to back (`lab-probe transfers`): how
/// short flows fare next to the bulk ones.
#[derive(Debug, Clone)]
pub struct Transfers {
    /// Numbered with the host's other probes ("a.1").
    pub id: String,
    pub host: String,
    pub server: String,
    /// Download: the server sends each transfer's bytes; upload: the host does.
    pub direction: FlowDirection,
    pub family: Family,
    pub count: u32,
    /// Sizes are drawn uniformly from [min_bytes, max_bytes].
    pub min_bytes: u64,
    pub max_bytes: u64,
    /// Transfers at once.
    pub concurrency: u32,
    /// When the first may start and when the last is cut off, on the run's clock.
    pub start: f64,
    pub stop: f64,
}

const CONGESTION_CONTROLS: &[&str] = &["cubic", "bbr", "reno"];
/// The queue sampler's period unless the file says: off, because sampling costs the VM CPU
/// time that shows in the last milliseconds of a contender's latency (docs/lab.md, Queues).
const DEFAULT_QUEUE_INTERVAL: f64 = 0.0;
/// The largest transfer (lab-probe's limit) and the most transfers at once (a thread each).
const MAX_TRANSFER_BYTES: u64 = 1 << 30;
const MAX_CONCURRENCY: u32 = 256;
const MAX_TRANSFERS: u32 = 1_000_000;
/// Names the topology uses itself.
const RESERVED: &[&str] = &["router", "modem", "wan", "lan", "router-wan", "router-lan"];
/// Servers and hosts each get a /24 of 10.1/16 and 10.2/16.
const MAX_NODES: usize = 250;

pub fn load(path: &Path) -> Result<Scenario> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let text = String::from_utf8(bytes.clone())
        .with_context(|| format!("{} is not UTF-8", path.display()))?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    parse(&text, &stem, &bytes).with_context(|| format!("in scenario {}", path.display()))
}

pub fn parse(text: &str, default_name: &str, raw: &[u8]) -> Result<Scenario> {
    let file: File = toml::from_str(text)?;
    check(file, default_name, sha256(raw))
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn check_name(what: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 12
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && name.starts_with(|c: char| c.is_ascii_lowercase());
    ensure!(
        ok,
        "{what} {name:?}: names are 1-12 characters of a-z, 0-9 and -, starting with a letter"
    );
    ensure!(
        !RESERVED.contains(&name),
        "{what} {name:?}: the name is reserved"
    );
    Ok(())
}

/// An optional duration field, `default` when absent; errors name the field as `what`.
/// A queue sampling interval (s), from a scenario or `lab run --queue-interval`: 0 (never) or
/// 10 ms to 10 s (tc's answers take a few milliseconds to read).
pub fn checked_queue_interval(seconds: f64) -> Result<f64> {
    ensure!(
        seconds == 0.0 || (0.01..=10.0).contains(&seconds),
        "a queue sampling interval must be between 10ms and 10s, or 0s for none"
    );
    Ok(seconds)
}

fn optional_seconds(
    v: Option<&str>,
    default: f64,
    what: impl std::fmt::Display + Send + Sync + 'static,
) -> Result<f64> {
    Ok(v.map(units::seconds)
        .transpose()
        .context(what)?
        .unwrap_or(default))
}

fn check(f: File, default_name: &str, hash: String) -> Result<Scenario> {
    let name = f.name.unwrap_or_else(|| default_name.to_string());
    ensure!(
        !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "scenario name {name:?}: use letters, digits, - and _"
    );
    let duration = units::seconds(&f.duration).context("duration")?;
    ensure!(
        (1.0..=3600.0).contains(&duration),
        "duration must be between 1s and 1h"
    );
    let warmup = optional_seconds(f.warmup.as_deref(), 0.0, "warmup")?;
    ensure!(
        warmup < duration,
        "warmup must be shorter than the duration"
    );
    let repetitions = f.repetitions.unwrap_or(1);
    ensure!(
        (1..=100).contains(&repetitions),
        "repetitions must be between 1 and 100"
    );
    let queue_interval = checked_queue_interval(optional_seconds(
        f.queue_interval.as_deref(),
        DEFAULT_QUEUE_INTERVAL,
        "queue_interval",
    )?)
    .context("queue_interval")?;

    let servers = f.topology.servers.unwrap_or_else(|| vec!["server".into()]);
    let hosts = f.topology.hosts;
    let mtu_frames = f.topology.mtu_frames;
    let router_gro = f.topology.router_gro;
    let nat = f.topology.nat;
    ensure!(!servers.is_empty(), "topology.servers: at least one server");
    ensure!(!hosts.is_empty(), "topology.hosts: at least one host");
    ensure!(
        servers.len() <= MAX_NODES && hosts.len() <= MAX_NODES,
        "topology: at most {MAX_NODES} servers and {MAX_NODES} hosts"
    );
    let mut seen = BTreeSet::new();
    for n in servers.iter().chain(&hosts) {
        check_name("topology", n)?;
        ensure!(seen.insert(n.clone()), "topology: {n:?} is named twice");
    }

    let down = f
        .bottleneck
        .down
        .map(|l| link(l, "bottleneck.down"))
        .transpose()?;
    let up = f
        .bottleneck
        .up
        .map(|l| link(l, "bottleneck.up"))
        .transpose()?;

    let mut contenders = Vec::new();
    let mut names = BTreeSet::new();
    for c in f.contender {
        let what = format!("contender {:?}", c.name);
        ensure!(
            !c.name.is_empty()
                && c.name
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_'),
            "{what}: names use letters, digits, - and _"
        );
        ensure!(names.insert(c.name.clone()), "{what} is defined twice");
        ensure!(
            !c.on.is_empty(),
            "{what}: `on` needs at least one placement"
        );
        ensure!(
            c.kind != Kind::None || (c.options.is_empty() && c.on.len() == 1),
            "{what}: kind none takes no options and one placement"
        );
        let mut placements = Vec::new();
        let mut places = BTreeSet::new();
        for p in c.on {
            let at = match p.at.as_str() {
                "router-wan" => Location::RouterWan,
                "router-lan" => Location::RouterLan,
                n if seen.contains(n) => Location::Node(n.to_string()),
                other => bail!(
                    "{what}: at = {other:?} is not router-wan, router-lan or a server or host of the topology"
                ),
            };
            ensure!(
                places.insert((at.label(), p.direction == Direction::Ingress)),
                "{what}: two placements on {} {:?}",
                at.label(),
                p.direction
            );
            let rate = match p.rate {
                Some(r) => {
                    ensure!(c.kind != Kind::None, "{what}: kind none takes no rate");
                    let bps = units::rate_bps(&r).with_context(|| format!("{what}: rate"))?;
                    Some((r, bps))
                }
                None => {
                    ensure!(
                        c.kind != Kind::FqCodel,
                        "{what}: fq_codel runs under htb and needs a rate"
                    );
                    None
                }
            };
            placements.push(Placement {
                at,
                direction: p.direction,
                rate,
                options: p.options,
            });
        }
        ensure!(
            !c.tune || c.kind == Kind::Shaper,
            "contender {}: tune = true is shaper's (`shaper tune --apply`)",
            c.name
        );
        if c.kind == Kind::Shaper {
            // One shaper per interface: its ingress is `--ingress-rate` of the shaper that
            // shapes the interface's egress.
            for pl in placements
                .iter()
                .filter(|p| p.direction == Direction::Ingress)
            {
                let at = pl.at.label();
                ensure!(
                    pl.rate.is_some(),
                    "{what}: shaper on {at} ingress needs a rate (its --ingress-rate)"
                );
                ensure!(
                    placements
                        .iter()
                        .any(|e| e.at == pl.at && e.direction == Direction::Egress),
                    "{what}: shaper shapes {at}'s ingress together with its egress \
                     (--ingress-rate beside --rate): add an egress placement on {at}"
                );
            }
        }
        contenders.push(Contender {
            name: c.name,
            kind: c.kind,
            options: c.options,
            placements,
            binary: None,
            tune: c.tune,
        });
    }
    ensure!(
        !contenders.is_empty(),
        "no [[contender]]: nothing to compare"
    );

    let server_of = |given: Option<String>, what: &str| -> Result<String> {
        match given {
            Some(s) => {
                ensure!(
                    servers.contains(&s),
                    "{what}: server {s:?} is not in topology.servers"
                );
                Ok(s)
            }
            None if servers.len() == 1 => Ok(servers[0].clone()),
            None => bail!("{what}: there are several servers; say which with server = \"...\""),
        }
    };

    let mut flows = Vec::new();
    for (i, fl) in f.flow.into_iter().enumerate() {
        let what = format!("flow {} (host {:?})", i + 1, fl.host);
        ensure!(
            hosts.contains(&fl.host),
            "{what}: host {:?} is not in topology.hosts",
            fl.host
        );
        let server = server_of(fl.server, &what)?;
        let (start, stop) = window(&fl.start, &fl.stop, 0.0, duration, &what)?;
        ensure!(stop - start >= 1.0, "{what}: runs for less than 1 s");
        let parallel = fl.parallel.unwrap_or(1);
        ensure!(
            (1..=128).contains(&parallel),
            "{what}: parallel must be 1-128"
        );
        if let Some(cc) = &fl.cc {
            ensure!(
                CONGESTION_CONTROLS.contains(&cc.as_str()),
                "{what}: cc = {cc:?}; use one of {CONGESTION_CONTROLS:?}"
            );
            ensure!(fl.protocol == Protocol::Tcp, "{what}: cc is for TCP flows");
        }
        let rate_bps = match (&fl.protocol, &fl.rate) {
            (Protocol::Udp, Some(r)) => {
                Some(units::rate_bps(r).with_context(|| format!("{what}: rate"))?)
            }
            (Protocol::Udp, None) => bail!("{what}: a UDP flow needs a rate"),
            (Protocol::Tcp, Some(_)) => {
                bail!("{what}: rate is for UDP flows (TCP flows are bulk)")
            }
            (Protocol::Tcp, None) => None,
        };
        ensure!(
            fl.ecn.is_none() || fl.protocol == Protocol::Tcp,
            "{what}: ecn is for TCP flows (a UDP sender does not react to marks)"
        );
        let dscp = fl
            .dscp
            .as_ref()
            .map(dscp::parse)
            .transpose()
            .with_context(|| format!("{what}: dscp"))?;
        let index = flows.iter().filter(|x: &&Flow| x.host == fl.host).count();
        flows.push(Flow {
            id: format!("{}.{index}", fl.host),
            host: fl.host,
            server,
            direction: fl.direction,
            protocol: fl.protocol,
            cc: fl.cc,
            parallel,
            rate_bps,
            start,
            stop,
            family: fl.family,
            ecn: fl.ecn,
            dscp,
        });
    }
    let host_ecn = host_ecn(&flows)?;

    let mut probes = Vec::new();
    let mut transfers = Vec::new();
    for (i, p) in f.probe.into_iter().enumerate() {
        let what = format!("probe {} (host {:?})", i + 1, p.host);
        ensure!(
            hosts.contains(&p.host),
            "{what}: host {:?} is not in topology.hosts",
            p.host
        );
        let server = server_of(p.server.clone(), &what)?;
        // Ids count all of a host's probes, so a file's every probe has its own.
        let index = probes.iter().filter(|x: &&Probe| x.host == p.host).count()
            + transfers
                .iter()
                .filter(|x: &&Transfers| x.host == p.host)
                .count();
        let id = format!("{}.{index}", p.host);
        let kind = match p.kind {
            ProbeFileKind::Ping => ProbeKind::Ping,
            ProbeFileKind::UdpRr => ProbeKind::UdpRr,
            ProbeFileKind::TcpRr => ProbeKind::TcpRr,
            ProbeFileKind::Transfers => {
                transfers.push(transfers_probe(p, id, server, warmup, duration, &what)?);
                continue;
            }
        };
        ensure!(
            p.count.is_none()
                && p.size.is_none()
                && p.direction.is_none()
                && p.concurrency.is_none()
                && p.start.is_none()
                && p.stop.is_none(),
            "{what}: count, size, direction, concurrency, start and stop are for kind = \"transfers\" \
             (a {} probe runs for the whole run at its interval)",
            kind.as_str()
        );
        let interval = optional_seconds(p.interval.as_deref(), 0.1, format!("{what}: interval"))?;
        ensure!(
            (0.01..=10.0).contains(&interval),
            "{what}: interval must be between 10ms and 10s"
        );
        probes.push(Probe {
            id,
            host: p.host,
            server,
            kind,
            interval,
            family: p.family,
        });
    }

    ensure!(
        !flows.is_empty() || !probes.is_empty() || !transfers.is_empty(),
        "no [[flow]] and no [[probe]]: nothing to measure"
    );
    // The server logs a transfer by the address it came from, which masquerade replaces.
    ensure!(
        !nat || transfers.iter().all(|t| t.family == Family::Ipv6),
        "topology.nat: IPv4 transfers probes are told apart by the host's address, which the \
         router's masquerade hides from the server; use family = \"ipv6\" for them"
    );
    Ok(Scenario {
        name,
        description: f.description.unwrap_or_default(),
        duration,
        warmup,
        repetitions,
        queue_interval,
        servers,
        hosts,
        mtu_frames,
        router_gro,
        nat,
        down,
        up,
        contenders,
        flows,
        probes,
        transfers,
        host_ecn,
        hash,
    })
}

/// A flow's or transfers probe's `start` and `stop`: defaults, units, and start < stop <=
/// duration.
fn window(
    start: &Option<String>,
    stop: &Option<String>,
    default_start: f64,
    duration: f64,
    what: &str,
) -> Result<(f64, f64)> {
    let at = |v: &Option<String>, field: &str, default: f64| {
        optional_seconds(v.as_deref(), default, format!("{what}: {field}"))
    };
    let (start, stop) = (
        at(start, "start", default_start)?,
        at(stop, "stop", duration)?,
    );
    ensure!(
        start < stop && stop <= duration,
        "{what}: needs start < stop <= duration ({start} s, {stop} s, {duration} s)"
    );
    Ok((start, stop))
}

fn transfers_probe(
    p: ProbeFile,
    id: String,
    server: String,
    warmup: f64,
    duration: f64,
    what: &str,
) -> Result<Transfers> {
    ensure!(
        p.interval.is_none(),
        "{what}: interval is for ping, udp-rr and tcp-rr; transfers run back to back"
    );
    let count = p
        .count
        .with_context(|| format!("{what}: transfers need a count (how many)"))?;
    ensure!(
        (1..=MAX_TRANSFERS).contains(&count),
        "{what}: count must be 1-{MAX_TRANSFERS}"
    );
    let size = p.size.with_context(|| {
        format!("{what}: transfers need a size, a range (\"10kb-100kb\") or one size")
    })?;
    let (min_bytes, max_bytes) = size_range(&size).with_context(|| format!("{what}: size"))?;
    let direction = p.direction.with_context(|| {
        format!("{what}: transfers need a direction, \"download\" (server -> host) or \"upload\"")
    })?;
    let concurrency = p.concurrency.unwrap_or(1);
    ensure!(
        (1..=MAX_CONCURRENCY).contains(&concurrency),
        "{what}: concurrency must be 1-{MAX_CONCURRENCY}"
    );
    // By default they start once the flows have warmed up: they measure a loaded path.
    let (start, stop) = window(&p.start, &p.stop, warmup, duration, what)?;
    Ok(Transfers {
        id,
        host: p.host,
        server,
        direction,
        family: p.family,
        count,
        min_bytes,
        max_bytes,
        concurrency,
        start,
        stop,
    })
}

/// "10kb-100kb" or one size "64kb": the smallest and the largest, in bytes.
fn size_range(s: &str) -> Result<(u64, u64)> {
    let (lo, hi) = s.split_once('-').unwrap_or((s, s));
    let (min, max) = (units::bytes(lo)?, units::bytes(hi)?);
    ensure!(
        min >= 1 && max <= MAX_TRANSFER_BYTES,
        "{s:?}: transfers are 1 byte to 1gb"
    );
    ensure!(min <= max, "{s:?}: the smallest size is above the largest");
    Ok((min, max))
}

/// The `net.ipv4.tcp_ecn` each host needs. The sysctl is per network namespace, and every
/// TCP connection of a host is opened by its iperf3 client (downloads too: iperf3 -R), so all
/// TCP flows of a host must agree; an unset `ecn` counts as not asking, the kernel's default
/// for a client. The servers keep the default (2), which accepts ECN when the client asks.
fn host_ecn(flows: &[Flow]) -> Result<BTreeMap<String, bool>> {
    let mut out = BTreeMap::new();
    let hosts: BTreeSet<&str> = flows.iter().map(|f| f.host.as_str()).collect();
    for host in hosts {
        // Flows are numbered by their position in the file, as in every other message.
        let tcp: Vec<(usize, &Flow)> = flows
            .iter()
            .enumerate()
            .filter(|(_, f)| f.host == host && f.protocol == Protocol::Tcp)
            .map(|(i, f)| (i + 1, f))
            .collect();
        if tcp.iter().all(|(_, f)| f.ecn.is_none()) {
            continue;
        }
        let (asking, not_asking): (Vec<_>, Vec<_>) =
            tcp.iter().partition(|(_, f)| f.ecn == Some(true));
        let names = |v: &[&(usize, &Flow)]| {
            v.iter()
                .map(|(n, f)| format!("{n} ({})", f.id))
                .collect::<Vec<_>>()
                .join(", ")
        };
        ensure!(
            asking.is_empty() || not_asking.is_empty(),
            "host {host:?}: flow(s) {} set ecn = true but flow(s) {} do not (unset counts as \
             false); ECN is set per host (net.ipv4.tcp_ecn of its namespace), so give all of \
             its TCP flows the same ecn",
            names(&asking),
            names(&not_asking)
        );
        out.insert(host.to_string(), !asking.is_empty());
    }
    Ok(out)
}

fn link(l: LinkFile, what: &str) -> Result<Link> {
    let rate_bps = l
        .rate
        .as_deref()
        .map(units::rate_bps)
        .transpose()
        .with_context(|| format!("{what}.rate"))?;
    let secs = |v: &Option<String>, field: &str| {
        optional_seconds(v.as_deref(), 0.0, format!("{what}.{field}"))
    };
    let delay = secs(&l.delay, "delay")?;
    let jitter = secs(&l.jitter, "jitter")?;
    ensure!(jitter <= delay, "{what}: jitter larger than the delay");
    let loss_percent = l
        .loss
        .as_deref()
        .map(units::percent)
        .transpose()
        .with_context(|| format!("{what}.loss"))?
        .unwrap_or(0.0);
    // A buffer is a size ("4mb") or the time it takes to drain at the rate ("500ms").
    let buffer_bytes = match (&l.buffer, rate_bps) {
        (Some(_), None) => bail!("{what}: a buffer needs a rate"),
        (Some(b), Some(r)) => Some(match units::bytes(b) {
            Ok(n) => n,
            Err(_) => {
                let t = units::seconds(b).with_context(|| {
                    format!("{what}.buffer {b:?}: neither a size (4mb) nor a time (500ms)")
                })?;
                (t * r / 8.0) as u64
            }
        }),
        // Default: 100 ms at the rate, a modest modem.
        (None, Some(r)) => Some((0.1 * r / 8.0) as u64),
        (None, None) => None,
    };
    if let Some(b) = buffer_bytes {
        ensure!(
            b >= 3028,
            "{what}: the buffer must hold at least two full frames (3028 bytes)"
        );
    }
    Ok(Link {
        rate_bps,
        buffer_bytes,
        delay,
        jitter,
        loss_percent,
    })
}

impl Scenario {
    /// Contenders selected by `--compare` (matching a contender's kind or its name); all when
    /// the list is empty.
    pub fn selected(&self, compare: &[String]) -> Vec<&Contender> {
        self.contenders
            .iter()
            .filter(|c| {
                compare.is_empty() || compare.iter().any(|w| w == c.kind.as_str() || *w == c.name)
            })
            .collect()
    }

    /// Whether the flows of `direction` pass through `placement` (the way it acts on them).
    pub fn carries(&self, placement: &Placement, direction: FlowDirection) -> bool {
        // What a placement's interface sends, in flow terms; its ingress is the other way.
        let sends = match &placement.at {
            Location::RouterWan => FlowDirection::Upload,
            Location::RouterLan => FlowDirection::Download,
            Location::Node(n) if self.servers.contains(n) => FlowDirection::Download,
            Location::Node(_) => FlowDirection::Upload,
        };
        match placement.direction {
            Direction::Egress => sends == direction,
            Direction::Ingress => sends != direction,
        }
    }

    /// The rate the contender is set to in the direction of most flows, or the bottleneck's;
    /// what "utilisation" is measured against.
    pub fn reference_rate(&self, c: &Contender, direction: FlowDirection) -> Option<f64> {
        let from_contender: Vec<f64> = c
            .placements
            .iter()
            .filter(|p| self.carries(p, direction))
            .filter_map(|p| p.rate.as_ref().map(|r| r.1))
            .collect();
        // Several shapers in one direction (one per server) add up.
        if !from_contender.is_empty() {
            return Some(from_contender.iter().sum());
        }
        let link = match direction {
            FlowDirection::Download => &self.down,
            FlowDirection::Upload => &self.up,
        };
        link.as_ref().and_then(|l| l.rate_bps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
        description = "two hosts"
        duration = "10s"
        warmup = "2s"
        [topology]
        hosts = ["a", "b"]
        [bottleneck.down]
        rate = "100mbit"
        buffer = "500ms"
        delay = "10ms"
        [bottleneck.up]
        delay = "10ms"
        loss = "0.1%"
        [[contender]]
        name = "cake"
        kind = "cake"
        options = ["besteffort"]
        on = [{ at = "server", rate = "95mbit" }]
        [[contender]]
        name = "none"
        kind = "none"
        on = [{ at = "server" }]
        [[flow]]
        host = "a"
        direction = "download"
        cc = "bbr"
        [[flow]]
        host = "b"
        direction = "upload"
        protocol = "udp"
        rate = "5mbit"
        start = "2s"
        stop = "8s"
        [[probe]]
        host = "a"
        kind = "ping"
    "#;

    fn parse_str(s: &str) -> Result<Scenario> {
        parse(s, "test", s.as_bytes())
    }

    fn err(s: &str) -> String {
        format!("{:#}", parse_str(s).expect_err("should be rejected"))
    }

    #[test]
    fn good_file() {
        let s = parse_str(GOOD).unwrap();
        assert_eq!(s.name, "test");
        assert_eq!(s.servers, vec!["server"]);
        assert_eq!(s.duration, 10.0);
        assert_eq!(s.queue_interval, 0.0);
        let queues = |v: &str| {
            parse_str(&GOOD.replace("warmup", &format!("queue_interval = \"{v}\"\nwarmup")))
        };
        assert_eq!(queues("50ms").unwrap().queue_interval, 0.05);
        assert_eq!(queues("0s").unwrap().queue_interval, 0.0);
        assert!(format!("{:#}", queues("1ms").unwrap_err()).contains("queue_interval"));
        let down = s.down.as_ref().unwrap();
        assert_eq!(down.buffer_bytes, Some(6_250_000));
        assert_eq!(s.up.as_ref().unwrap().loss_percent, 0.1);
        assert_eq!(s.flows[1].id, "b.0");
        assert_eq!(s.flows[1].start, 2.0);
        assert_eq!(s.flows[0].stop, 10.0);
        assert_eq!(s.probes[0].interval, 0.1);
        assert_eq!(
            s.contenders[0].placements[0].at,
            Location::Node("server".into())
        );
        assert_eq!(
            s.reference_rate(&s.contenders[0], FlowDirection::Download),
            Some(95e6)
        );
        assert_eq!(
            s.reference_rate(&s.contenders[1], FlowDirection::Download),
            Some(100e6)
        );
        assert_eq!(s.selected(&["none".into()]).len(), 1);
        assert_eq!(s.selected(&[]).len(), 2);
        assert_eq!(s.hash.len(), 64);
    }

    #[test]
    fn ingress_placements() {
        // A qdisc on the server's ingress carries the uploads; the download's reference stays
        // the bottleneck's.
        let s = parse_str(&GOOD.replace(
            "at = \"server\", rate = \"95mbit\"",
            "at = \"server\", direction = \"ingress\", rate = \"40mbit\"",
        ))
        .unwrap();
        let cake = &s.contenders[0];
        assert_eq!(cake.placements[0].direction, Direction::Ingress);
        assert_eq!(s.reference_rate(cake, FlowDirection::Upload), Some(40e6));
        assert_eq!(s.reference_rate(cake, FlowDirection::Download), Some(100e6));
        // shaper: an ingress rate beside the egress of the same interface.
        let shaper = |on: &str| {
            GOOD.replace("kind = \"cake\"", "kind = \"shaper\"")
                .replace("options = [\"besteffort\"]\n", "")
                .replace("on = [{ at = \"server\", rate = \"95mbit\" }]", on)
        };
        let both = parse_str(&shaper(
            r#"on = [{ at = "server", rate = "95mbit" }, { at = "server", direction = "ingress", rate = "40mbit" }]"#,
        ))
        .unwrap();
        assert_eq!(both.contenders[0].placements.len(), 2);
        assert!(
            err(&shaper(
                r#"on = [{ at = "server", direction = "ingress", rate = "40mbit" }]"#
            ))
            .contains("add an egress placement on server")
        );
        assert!(
            err(&shaper(
                r#"on = [{ at = "server", rate = "95mbit" }, { at = "server", direction = "ingress" }]"#
            ))
            .contains("needs a rate")
        );
        assert!(
            err(&shaper(
                r#"on = [{ at = "server", rate = "95mbit" }, { at = "server", rate = "40mbit" }]"#
            ))
            .contains("two placements")
        );
    }

    /// GOOD with more flows for host "a" (appended after its download "a.0").
    fn with_flows_of_a(flows: &str) -> String {
        format!("{GOOD}{flows}")
    }

    #[test]
    fn ecn() {
        // Unset everywhere: no host is touched.
        assert!(parse_str(GOOD).unwrap().host_ecn.is_empty());
        let s =
            parse_str(&GOOD.replace("cc = \"bbr\"", "cc = \"bbr\"\n        ecn = true")).unwrap();
        assert_eq!(s.flows[0].ecn, Some(true));
        assert_eq!(s.host_ecn, BTreeMap::from([("a".to_string(), true)]));
        // Explicitly off on every TCP flow of a host; a UDP flow of it does not take part.
        let s = parse_str(&with_flows_of_a(
            r#"
            [[flow]]
            host = "a"
            direction = "upload"
            ecn = false
            [[flow]]
            host = "a"
            direction = "download"
            protocol = "udp"
            rate = "1mbit"
            "#,
        ))
        .unwrap();
        assert_eq!(s.host_ecn.get("a"), Some(&false));
    }

    #[test]
    fn dscp() {
        let s = parse_str(
            &GOOD
                .replace("cc = \"bbr\"", "cc = \"bbr\"\n        dscp = \"EF\"")
                .replace("rate = \"5mbit\"", "rate = \"5mbit\"\n        dscp = 8"),
        )
        .unwrap();
        assert_eq!(s.flows[0].dscp, Some(46));
        assert_eq!(s.flows[1].dscp, Some(8));
        assert_eq!(parse_str(GOOD).unwrap().flows[0].dscp, None);
    }

    #[test]
    fn ecn_errors() {
        assert!(
            err(&GOOD.replace("rate = \"5mbit\"", "rate = \"5mbit\"\n        ecn = true"))
                .contains("flow 2 (host \"b\"): ecn is for TCP flows")
        );
        // Host a: flow 1 (a.0) leaves ecn unset, flow 3 (a.1) asks for it.
        let e = err(&with_flows_of_a(
            r#"
            [[flow]]
            host = "a"
            direction = "upload"
            ecn = true
            "#,
        ));
        assert!(e.contains("host \"a\""), "{e}");
        assert!(e.contains("flow(s) 3 (a.1) set ecn = true"), "{e}");
        assert!(e.contains("flow(s) 1 (a.0) do not"), "{e}");
    }

    /// GOOD with a transfers probe for host "a" (after its ping, so "a.1"), its fields
    /// replaced or added by `fields`.
    fn with_transfers(fields: &str) -> String {
        format!(
            "{GOOD}
            [[probe]]
            host = \"a\"
            kind = \"transfers\"
            {fields}
            "
        )
    }

    #[test]
    fn nat_hides_the_hosts_ipv4_addresses_from_transfers() {
        let natted = |fields: &str| {
            parse_str(&with_transfers(&format!("{TRANSFERS}\n{fields}")).replace(
                "hosts = [\"a\", \"b\"]",
                "hosts = [\"a\", \"b\"]\nnat = true",
            ))
        };
        let e = format!("{:#}", natted("").unwrap_err());
        assert!(e.contains("topology.nat") && e.contains("ipv6"), "{e}");
        let s = natted("family = \"ipv6\"").unwrap();
        assert!(s.nat);
        assert!(!parse_str(GOOD).unwrap().nat);
    }

    const TRANSFERS: &str = r#"count = 1000
            size = "10KB-100KB"
            direction = "download""#;

    #[test]
    fn transfers() {
        let s = parse_str(&with_transfers(TRANSFERS)).unwrap();
        assert_eq!(s.probes.len(), 1);
        let t = &s.transfers[0];
        assert_eq!(
            (t.id.as_str(), t.server.as_str(), t.direction),
            ("a.1", "server", FlowDirection::Download)
        );
        assert_eq!((t.count, t.min_bytes, t.max_bytes), (1000, 10_240, 102_400));
        // Defaults: one at a time, from the end of warm-up to the end of the run.
        assert_eq!((t.concurrency, t.start, t.stop), (1, 2.0, 10.0));
        let s = parse_str(&with_transfers(
            r#"count = 5
            size = "64kb"
            direction = "upload"
            concurrency = 4
            start = "1s"
            stop = "9s"
            family = "ipv6"
            [[probe]]
            host = "a"
            kind = "tcp-rr""#,
        ))
        .unwrap();
        let t = &s.transfers[0];
        assert_eq!(
            (t.min_bytes, t.max_bytes, t.concurrency),
            (65_536, 65_536, 4)
        );
        assert_eq!((t.start, t.stop, t.family), (1.0, 9.0, Family::Ipv6));
        // The next probe of the host is numbered after the transfers.
        assert_eq!(s.probes[1].id, "a.2");
        // Transfers alone are something to measure.
        let alone = r#"
            duration = "10s"
            [topology]
            hosts = ["a"]
            [[contender]]
            name = "none"
            kind = "none"
            on = [{ at = "server" }]
            [[probe]]
            host = "a"
            kind = "transfers"
            count = 1
            size = "1kb"
            direction = "download"
        "#;
        assert_eq!(parse_str(alone).unwrap().transfers.len(), 1);
    }

    #[test]
    fn bad_transfers() {
        let bad = |fields: &str| err(&with_transfers(fields));
        let replaced = |from: &str, to: &str| bad(&TRANSFERS.replace(from, to));
        assert!(replaced("1000", "0").contains("probe 2 (host \"a\"): count must be 1-"));
        assert!(replaced("count = 1000", "").contains("need a count"));
        assert!(replaced("size = \"10KB-100KB\"", "").contains("need a size"));
        assert!(replaced("direction = \"download\"", "").contains("need a direction"));
        assert!(replaced("\"download\"", "\"sideways\"").contains("unknown variant"));
        assert!(replaced("10KB-100KB", "100KB-10KB").contains("smallest size is above"));
        assert!(replaced("10KB-100KB", "0-10KB").contains("1 byte to 1gb"));
        assert!(replaced("10KB-100KB", "1KB-2gb").contains("1 byte to 1gb"));
        assert!(replaced("10KB-100KB", "10 furlongs").contains("size"));
        assert!(replaced("10KB-100KB", "10KB-").contains("size"));
        let e = bad(&format!("{TRANSFERS}\nconcurrency = 0"));
        assert!(e.contains("concurrency must be 1-256"), "{e}");
        let e = bad(&format!("{TRANSFERS}\nstop = \"11s\""));
        assert!(e.contains("start < stop <= duration"), "{e}");
        // Starts at the warm-up's end by default, so a stop before it is an error.
        let e = bad(&format!("{TRANSFERS}\nstop = \"1s\""));
        assert!(e.contains("start < stop"), "{e}");
        let e = bad(&format!("{TRANSFERS}\ninterval = \"1s\""));
        assert!(e.contains("interval is for ping"), "{e}");
        let e = bad(&format!("{TRANSFERS}\nsizes = \"1kb\""));
        assert!(e.contains("unknown field `sizes`"), "{e}");
        // And the transfers' fields on a latency probe.
        let e = err(&GOOD.replace("kind = \"ping\"", "kind = \"ping\"\n        count = 3"));
        assert!(
            e.contains("probe 1 (host \"a\"): count, size, direction, concurrency, start and stop are for kind = \"transfers\""),
            "{e}"
        );
    }

    #[test]
    fn shipped_scenarios_parse() {
        let dir = crate::workspace_root().join("lab/scenarios");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                load(&p).unwrap_or_else(|e| panic!("{}: {e:#}", p.display()));
                n += 1;
            }
        }
        assert!(n >= 13, "expected the 13 shipped scenarios, found {n}");
    }

    #[test]
    fn bad_files() {
        assert!(err(&GOOD.replace("warmup", "warmpu")).contains("unknown field `warmpu`"));
        assert!(
            err(&GOOD.replace("kind = \"cake\"", "kind = \"sfq\"")).contains("unknown variant")
        );
        assert!(err(&GOOD.replace("cc = \"bbr\"", "cc = \"vegas\"")).contains("vegas"));
        assert!(err(&GOOD.replace("\"5mbit\"", "\"5 furlongs\"")).contains("rate"));
        assert!(
            err(&GOOD.replace(
                "host = \"a\"\n        direction",
                "host = \"z\"\n        direction"
            ))
            .contains("not in topology.hosts")
        );
        assert!(
            err(&GOOD.replace("at = \"server\", rate", "at = \"moon\", rate")).contains("moon")
        );
        assert!(err(&GOOD.replace("stop = \"8s\"", "stop = \"80s\"")).contains("stop"));
        assert!(err(&GOOD.replace("\"0.1%\"", "\"0.1\"")).contains("%"));
        assert!(err(&GOOD.replace("[\"a\", \"b\"]", "[\"a\", \"a\"]")).contains("twice"));
        assert!(err(&GOOD.replace("[\"a\", \"b\"]", "[\"a\", \"router\"]")).contains("reserved"));
        assert!(
            err(&GOOD.replace(
                "protocol = \"udp\"\n        rate = \"5mbit\"",
                "protocol = \"udp\""
            ))
            .contains("needs a rate")
        );
        assert!(err("duration = \"10s\"").contains("topology"));
        assert!(
            err(&GOOD.replace("cc = \"bbr\"", "cc = \"bbr\"\n        dscp = \"AF5\""))
                .contains("flow 1 (host \"a\"): dscp")
        );
        assert!(
            err(&GOOD.replace("cc = \"bbr\"", "cc = \"bbr\"\n        dscp = 64")).contains("0-63")
        );
        assert!(
            err(&GOOD.replace("cc = \"bbr\"", "cc = \"bbr\"\n        ecn = \"yes\""))
                .contains("ecn")
        );
        assert!(err(&GOOD.replace("duration = \"10s\"", "duration = \"10\"")).contains("no unit"));
    }
}
