//! Settings for one shaped interface: from the command line, a TOML file, or both (the command
//! line wins). Everything is validated here, before anything on the system is touched.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
};

use serde::Deserialize;
use shaper_common::{
    abi::ShaperConfig,
    ackfilter::{self, AckFilter},
    aqm::{self, AqmParams},
    autorate,
    diffserv::Diffserv,
    edt,
    framing::{self, Framing, Keyword, Word},
    isolation::{Isolation, prefix_mask},
    rate::{self, DisplayRate},
    sizing::{LENT_WINDOW_FRAMES, calendar_bin_ns},
    time,
};

use crate::qdisc::FqParams;

/// A full Ethernet frame, for sizing before the device is known.
const FRAME_BYTES: u32 = 1_514;

/// Defaults, with the reasons.
pub mod defaults {
    /// Last-resort bound on how far ahead a departure may be scheduled. The same as Cilium's
    /// bandwidth manager; shorter queues are the AQM's job, not the horizon's.
    pub const HORIZON: &str = "2s";
    /// fq's default total limit: the least shaper asks for (more at high rates, see
    /// `Settings::resolve`).
    pub const FQ_LIMIT_PACKETS: u32 = 10_000;
    /// Per-flow packets in fq: the least shaper asks for; at high rates enough for one flow at
    /// the whole rate for the AQM's hard limit, so that fq never tail-drops before the data
    /// path's AQM does (forwarded traffic is not bounded by TCP Small Queues).
    pub const FQ_FLOW_LIMIT_PACKETS: u32 = 1_000;
    /// A host is an IPv4 address, or an IPv6 /64 (what one site or device usually gets).
    pub const HOST_PREFIX_V4: u32 = 32;
    pub const HOST_PREFIX_V6: u32 = 64;
    /// State sizes: a busy router's worth of flows and hosts (~100 MB of kernel memory at the
    /// maximum; LRU evicts idle entries first).
    pub const MAX_FLOWS: u32 = 1 << 20;
    pub const MAX_HOSTS: u32 = 1 << 16;
    /// New flow entries one host may create per control interval (100 ms) before the rest share
    /// overflow buckets: 100k new flows/s, well above any legitimate client.
    pub const FLOW_QUOTA: u32 = 10_000;
    /// The most hosts per direction the metrics endpoint may list: each is two series, and a
    /// scrape walks the hosts map; a dashboard's top list, not an inventory.
    pub const METRICS_TOP_HOSTS_MAX: u32 = 1_000;
    /// Autorate's reflectors when none are named: anycast resolvers that answer ICMP echo from
    /// a nearby site almost everywhere, run by three operators, so that one's trouble is
    /// outvoted (a tick's delay is the least of its samples').
    pub const AUTORATE_REFLECTORS: &[&str] = &["1.1.1.1", "8.8.8.8", "9.9.9.9", "1.0.0.1"];
}

/// Declares a struct whose fields are all `Option`s, and its `over`: each field from `self`
/// when set, else from `below`. Settings are layered with it (command line over file, the
/// defaults applied to what neither gives), so that a new field needs no merging code.
macro_rules! layered {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$field_meta:meta])* pub $field:ident: Option<$ty:ty>, )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $( $(#[$field_meta])* pub $field: Option<$ty>, )*
        }

        impl $name {
            /// `self`'s settings, and `below`'s where `self` has none.
            pub fn over(self, below: Self) -> Self {
                Self {
                    $( $field: self.$field.or(below.$field), )*
                }
            }
        }
    };
}

layered! {
    /// The settings of `shaper run`, each unset unless given, declared once for the command
    /// line and the config file: a field's long option and its key in the file have the same
    /// kebab-case name (except `--no-split-gso`, the file's `split-gso = false`), its comment is
    /// its `--help`. The fields marked `skip` exist in the file only.
    #[derive(Debug, Default, Clone, clap::Args, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "kebab-case")]
    pub struct Options {
        /// Interface to shape (egress; ingress too with --ingress-rate).
        #[arg(long)]
        pub iface: Option<String>,
        /// Wire rate, in tc/systemd units: 100mbit, 1gbit, 1995M, 12.5MBps, 500kbit.
        #[arg(long)]
        pub rate: Option<String>,
        /// Also shape what arrives on the interface, at this wire rate (through an IFB device,
        /// `ifb4<iface>`, with the same settings; the ACK filter stays on egress).
        #[arg(long)]
        pub ingress_rate: Option<String>,
        /// Follow a link whose speed varies (LTE, 5G, satellite, busy cable): the egress rate
        /// adapts within MIN..MAX (e.g. 10mbit..60mbit) to the delay the reflectors' round
        /// trips show, cut when it rises, raised while the link is loaded and the delay low.
        /// --rate is where it starts (default MAX). `off`: a fixed rate.
        #[arg(long, value_name = "MIN..MAX")]
        pub autorate: Option<String>,
        /// The same for the ingress direction (shaped as with --ingress-rate, which is then
        /// where it starts; default MAX).
        #[arg(long, value_name = "MIN..MAX")]
        pub ingress_autorate: Option<String>,
        /// Where autorate's round trips go: a few IPv4 or IPv6 addresses beyond the link that
        /// answer ICMP echo, comma-separated (default: the public DNS resolvers 1.1.1.1,
        /// 8.8.8.8, 9.9.9.9, 1.0.0.1).
        #[arg(long, value_name = "ADDRS")]
        pub autorate_reflectors: Option<String>,
        /// The delay over the path's own round trip that autorate reads as the link queueing
        /// (default 5ms); over a jittery link, raise it above the jitter.
        #[arg(long, value_name = "DURATION")]
        pub autorate_threshold: Option<String>,
        /// Departures scheduled further ahead than this are dropped (e.g. 2s, 500ms).
        #[arg(long)]
        pub horizon: Option<String>,
        /// The bottleneck link's framing in CAKE's keywords, read in order as tc reads them:
        /// ethernet, docsis, pppoe-ptm, bridged-ptm, pppoa-vcmux, pppoa-llc, pppoe-vcmux,
        /// pppoe-llcsnap, bridged-vcmux, bridged-llcsnap, ipoa-vcmux, ipoa-llcsnap, ether-vlan,
        /// conservative, raw, atm, ptm, noatm (e.g. "pppoe-ptm ether-vlan"; spaces or commas).
        #[arg(long)]
        pub framing: Option<String>,
        /// Bytes the link adds to every IP packet (CAKE's `overhead`; may be negative), after
        /// --framing's: frames are then counted from their network header.
        #[arg(long, allow_hyphen_values = true)]
        pub overhead: Option<i32>,
        /// Minimum accounted frame size in bytes (CAKE's `mpu`), after --framing's.
        #[arg(long)]
        pub mpu: Option<u32>,
        /// Fairness: flowblind, srchost, dsthost, hosts, flows, dual-srchost, dual-dsthost,
        /// triple-isolate (default; CAKE's names, see docs/design.md for each).
        #[arg(long)]
        pub isolation: Option<String>,
        /// The round-trip time the AQM expects (CAKE's `rtt`): a preset (datacentre 100us, lan
        /// 1ms, metro 10ms, regional 30ms, internet 100ms (default), oceanic 300ms, satellite
        /// 1s, interplanetary 1h) or a duration. Its interval; the target is 5% of it.
        #[arg(long)]
        pub rtt: Option<String>,
        /// Mark ECN-capable packets instead of dropping them (default true).
        #[arg(skip)]
        pub ecn: Option<bool>,
        /// Keep the device's GSO limits (CAKE's `no-split-gso`): less CPU, burstier departures.
        #[arg(long = "no-split-gso", num_args = 0, default_missing_value = "false")]
        pub split_gso: Option<bool>,
        /// DiffServ tins (CAKE's): besteffort (default), diffserv3, diffserv4, diffserv8,
        /// precedence. A tin below its bandwidth threshold goes first; above it, it shares.
        #[arg(long)]
        pub diffserv: Option<String>,
        /// Clear the DSCP of every packet after classifying it (ECN bits kept).
        #[arg(long, num_args = 0, default_missing_value = "true")]
        pub wash: Option<bool>,
        /// Tell hosts apart by their addresses before NAT (CAKE's `nat`): on a router that
        /// masquerades, each machine behind it is a host. Read from the packets' conntrack
        /// entries; without conntrack in the kernel, a warning and the packets' own addresses.
        #[arg(long, num_args = 0, default_missing_value = "true")]
        pub nat: Option<bool>,
        /// fwmark bits (a mask, e.g. 0xff) whose value, when non-zero, is the tin plus one and
        /// overrides the DSCP.
        #[arg(long)]
        pub fwmark: Option<String>,
        /// Drop redundant pure ACKs on a congested uplink: off (default), conservative (keeps
        /// two of a flow's ACKs scheduled), aggressive (keeps one). Only ACKs that a later ACK
        /// is certain to cover are dropped (docs/ack-filter.md).
        #[arg(long)]
        pub ack_filter: Option<String>,
        /// Serve Prometheus metrics at http://ADDR/metrics, with /healthz and /readyz: IP:PORT
        /// (e.g. 127.0.0.1:9101, [::]:9101) or a port alone, on 127.0.0.1. Nothing listens
        /// without.
        #[arg(long, value_name = "ADDR")]
        pub metrics: Option<String>,
        /// Also show the N busiest hosts of each direction in the metrics (two series each).
        #[arg(long, value_name = "N")]
        pub metrics_top_hosts: Option<u32>,
        /// Log the data path's decisions: each packet's classification (flow, tin, host), the
        /// AQM's marks and drops, the ACK filter's decisions; at most 10 of each kind per
        /// second per CPU, with how many were not logged. Off, they cost nothing.
        #[arg(long, num_args = 0, default_missing_value = "true")]
        pub log_datapath: Option<bool>,
        /// `[fq]`: the departure-time queue.
        #[arg(skip)]
        pub fq: Option<FqOptions>,
        /// `[state]`: how hosts are told apart and how much state the data path may keep.
        #[arg(skip)]
        pub state: Option<StateOptions>,
        /// `[[interface]]`: the interfaces to shape, each a section naming its interface
        /// (`iface`: a name, a glob or `default-route`) with its own settings over the top
        /// level's (`interfaces`). The file's top level only.
        #[arg(skip)]
        pub interface: Option<Vec<Options>>,
    }
}

impl Options {
    /// Reads a config file's text (only its syntax and types; [`Settings::resolve_with`]
    /// validates the values).
    pub fn from_toml(text: &str) -> Result<Self, toml::de::Error> {
        toml::from_str(text)
    }
}

/// `[state]` of the config file.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct StateOptions {
    pub host_prefix_v4: Option<u32>,
    pub host_prefix_v6: Option<u32>,
    pub max_flows: Option<u32>,
    pub max_hosts: Option<u32>,
    pub flow_quota: Option<u32>,
}

/// `[fq]` of the config file.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FqOptions {
    pub limit: Option<u32>,
    pub flow_limit: Option<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("no interface given: use --iface IF (or `iface` in the config file)")]
    NoIface,
    #[error(
        "`iface` names one interface; the file's [[interface]] sections name theirs: give one or the other"
    )]
    IfaceBesideSections,
    #[error("`{0}` is the process's, not an interface's: give it at the file's top level")]
    ProcessWide(&'static str),
    #[error(
        "[[interface]] section {0} names no interface: give `iface` (a name, a glob such as \"eth*\", or \"default-route\")"
    )]
    SectionWithoutIface(usize),
    #[error("no rate given: use --rate RATE, e.g. --rate 100mbit (or `rate` in the config file)")]
    NoRate,
    #[error("invalid rate {text:?}: {reason}")]
    Rate {
        /// `rate` or `ingress-rate`.
        field: &'static str,
        text: String,
        reason: rate::RateError,
    },
    #[error("invalid {field} {text:?}: {reason}")]
    Autorate {
        /// `autorate` or `ingress-autorate`.
        field: &'static str,
        text: String,
        reason: autorate::RangeError,
    },
    #[error("{field} {rate} lies outside {range}: start the rate within the autorate range")]
    OutsideAutorate {
        /// `rate` or `ingress-rate`.
        field: &'static str,
        rate: String,
        range: autorate::Range,
    },
    #[error("invalid autorate reflector {0:?}: an IPv4 or IPv6 address")]
    Reflector(String),
    #[error("invalid autorate threshold {text:?}: {reason}")]
    AutorateThreshold {
        text: String,
        reason: time::DurationError,
    },
    #[error("invalid horizon {text:?}: {reason}")]
    Horizon {
        text: String,
        reason: time::DurationError,
    },
    #[error("horizon must be at least 1ms (got {text})")]
    HorizonTooShort { text: String },
    #[error("overhead {0} is out of range (-64..=256 bytes)")]
    Overhead(i32),
    #[error("unknown framing keyword {0:?}: use {keywords}", keywords = framing_keywords())]
    Framing(String),
    #[error("mpu {0} is out of range (0..=1500 bytes)")]
    Mpu(u32),
    #[error("fq {what} must be between 1 and 1000000 (got {value})")]
    FqLimit { what: &'static str, value: u32 },
    #[error("invalid rtt {text:?}: {reason}, or one of {presets}", presets = rtt_presets())]
    Rtt {
        text: String,
        reason: time::DurationError,
    },
    #[error("rtt must be between 1us and 1h (got {text})")]
    RttRange { text: String },
    #[error("unknown ack-filter mode {0:?}: use off, conservative or aggressive")]
    AckFilter(String),
    #[error("unknown diffserv mode {0:?}: use one of {modes}", modes = diffserv_names())]
    Diffserv(String),
    #[error("invalid fwmark mask {0:?}: a non-zero 32-bit number (decimal or 0x hex)")]
    Fwmark(String),
    #[error(
        "invalid metrics address {0:?}: use IP:PORT (e.g. 127.0.0.1:9101, [::1]:9101) or a port alone (on 127.0.0.1)"
    )]
    Metrics(String),
    #[error("unknown isolation mode {0:?}: use one of {modes}", modes = isolation_names())]
    Isolation(String),
    #[error("{what} must be between {min} and {max} (got {value})")]
    OutOfRange {
        what: &'static str,
        value: u32,
        min: u32,
        max: u32,
    },
}

impl ConfigError {
    /// The setting whose value is wrong, by its key in the config file (so that the file's
    /// line can be named); `None` for errors about no one setting.
    pub fn field(&self) -> Option<&'static str> {
        Some(match self {
            Self::Rate { field, .. } => field,
            Self::Autorate { field, .. } | Self::OutsideAutorate { field, .. } => field,
            Self::Reflector(_) => "autorate-reflectors",
            Self::AutorateThreshold { .. } => "autorate-threshold",
            Self::Horizon { .. } | Self::HorizonTooShort { .. } => "horizon",
            Self::Overhead(_) => "overhead",
            Self::Framing(_) => "framing",
            Self::Mpu(_) => "mpu",
            Self::FqLimit { what, .. } => what,
            Self::Rtt { .. } | Self::RttRange { .. } => "rtt",
            Self::AckFilter(_) => "ack-filter",
            Self::Diffserv(_) => "diffserv",
            Self::Fwmark(_) => "fwmark",
            Self::Metrics(_) => "metrics",
            Self::Isolation(_) => "isolation",
            Self::OutOfRange { what, .. } => what,
            Self::NoIface | Self::IfaceBesideSections | Self::SectionWithoutIface(_) => "iface",
            Self::ProcessWide(field) => field,
            Self::NoRate => "rate",
            Self::Read { .. } | Self::Parse { .. } => return None,
        })
    }
}

fn framing_keywords() -> String {
    Keyword::ALL
        .iter()
        .map(|k| k.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `--framing`'s keywords, then `--overhead` and `--mpu` as if written after them.
fn parse_framing(
    keywords: Option<&str>,
    overhead: Option<i32>,
    mpu: Option<u32>,
) -> Result<Framing, ConfigError> {
    let mut words = Vec::new();
    for name in keywords
        .unwrap_or("")
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|w| !w.is_empty())
    {
        let keyword = Keyword::parse(name).ok_or_else(|| ConfigError::Framing(name.into()))?;
        words.push(Word::Keyword(keyword));
    }
    if let Some(bytes) = overhead {
        if !(-64..=256).contains(&bytes) {
            return Err(ConfigError::Overhead(bytes));
        }
        words.push(Word::Overhead(bytes));
    }
    if let Some(bytes) = mpu {
        if bytes > 1500 {
            return Err(ConfigError::Mpu(bytes));
        }
        words.push(Word::Mpu(bytes));
    }
    let framing = framing::resolve(words);
    if !(-64..=256).contains(&framing.overhead) {
        return Err(ConfigError::Overhead(framing.overhead));
    }
    Ok(framing)
}

fn rtt_presets() -> String {
    aqm::RTT_PRESETS.map(|(name, _)| name).join(", ")
}

fn diffserv_names() -> String {
    Diffserv::ALL.map(Diffserv::name).join(", ")
}

fn parse_mask(text: &str) -> Option<u32> {
    let t = text.trim();
    let v = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok()?,
        None => t.parse().ok()?,
    };
    (v != 0).then_some(v)
}

fn isolation_names() -> String {
    Isolation::ALL.map(Isolation::name).join(", ")
}

fn in_range(what: &'static str, value: u32, min: u32, max: u32) -> Result<u32, ConfigError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(ConfigError::OutOfRange {
            what,
            value,
            min,
            max,
        })
    }
}

/// What the data path is loaded with: how hosts are told apart, how much state it keeps, and
/// whether it sends debug events. Data paths loaded with different ones are not
/// interchangeable (spares are kept per value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StateParams {
    pub host_prefix_v4: u32,
    pub host_prefix_v6: u32,
    pub max_flows: u32,
    pub max_hosts: u32,
    pub flow_quota: u32,
    /// `--log-datapath`: fixed when the programs are verified (`shaper_common::logs`).
    pub log_datapath: bool,
}

/// Validated settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub iface: String,
    pub rate_bps: u64,
    pub horizon_ns: u64,
    /// How the bottleneck link frames packets (`--framing`, `--overhead`, `--mpu`).
    pub framing: Framing,
    pub isolation: Isolation,
    pub fq: FqParams,
    pub state: StateParams,
    /// The RTT the AQM expects (CAKE's `rtt`): its interval, and 5% of it its target.
    pub rtt_ns: u64,
    /// Mark ECN-capable packets instead of dropping them.
    pub ecn: bool,
    /// Lower the device's GSO limits at low rates (CAKE's `split-gso`).
    pub split_gso: bool,
    /// Split GSO packets built elsewhere (forwarded, GRO) through the segmenter: with
    /// `split_gso`, except on the ingress direction's IFB (see `segmenter`).
    pub segmenter: bool,
    /// The device stands behind the bottleneck (the ingress direction's IFB: its packets
    /// crossed the link already): a packet leaving late after a stall is not charged for its
    /// lateness (`shaper_common::overrun::credit_floor`).
    pub behind_bottleneck: bool,
    /// The link-layer header in front of the packets' network header when it is not the
    /// device's own: the ingress direction's IFB gets packets as the shaped interface received
    /// them. `None`: the device's (`link::Interface::link_header_bytes`).
    pub link_header_bytes: Option<u32>,
    pub diffserv: Diffserv,
    /// Clear the DSCP after classification.
    pub wash: bool,
    /// Hosts by their addresses before NAT (`--nat`).
    pub nat: bool,
    /// fwmark bits that select the tin (0: off).
    pub fwmark_mask: u32,
    pub ack_filter: AckFilter,
    /// Where the metrics endpoint listens (`--metrics`; none: nothing listens), and how many of
    /// the busiest hosts per direction it shows. The process's, not a direction's: only the
    /// egress settings' are read.
    pub metrics: Option<SocketAddr>,
    pub metrics_top_hosts: u32,
    /// The rates autorate may set (`--autorate`; the ingress direction's: `--ingress-autorate`),
    /// `rate_bps` its start; none: the rate is fixed.
    pub autorate: Option<autorate::Range>,
    /// Where autorate's round trips go, and the delay over their baseline that is the link
    /// queueing. The interface's: only the egress settings' are read.
    pub autorate_reflectors: Vec<IpAddr>,
    pub autorate_threshold_ns: u64,
    /// The ingress direction (`--ingress-rate`): the same settings at that rate, shaped on an
    /// IFB device that the interface's incoming traffic is redirected to.
    pub ingress: Option<Box<Settings>>,
}

impl Settings {
    /// The settings of `cli` (the command line), with what it does not give from the config
    /// file at `file`, if any, and the defaults; validated.
    pub fn resolve(cli: Options, file: Option<&Path>) -> Result<Self, ConfigError> {
        let file_options = match file {
            Some(path) => load_file(path)?,
            None => Options::default(),
        };
        Self::resolve_with(cli, file_options)
    }

    /// [`Settings::resolve`] with the file already read (or none: `Options::default()`).
    pub fn resolve_with(cli: Options, file: Options) -> Result<Self, ConfigError> {
        let given = cli.over(file);
        let iface = given.iface.ok_or(ConfigError::NoIface)?;
        let autorate = parse_autorate("autorate", given.autorate)?;
        let ingress_autorate = parse_autorate("ingress-autorate", given.ingress_autorate)?;
        let rate_bps = start_rate("rate", given.rate, autorate)?.ok_or(ConfigError::NoRate)?;
        let ingress_rate_bps = start_rate("ingress-rate", given.ingress_rate, ingress_autorate)?;
        let autorate_reflectors = match given.autorate_reflectors {
            Some(text) => text
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(|t| t.parse().map_err(|_| ConfigError::Reflector(t.to_string())))
                .collect::<Result<Vec<IpAddr>, _>>()?,
            None => Vec::new(),
        };
        let autorate_reflectors = if autorate_reflectors.is_empty() {
            defaults::AUTORATE_REFLECTORS
                .iter()
                .map(|a| a.parse().expect("a default reflector is an address"))
                .collect()
        } else {
            autorate_reflectors
        };
        let autorate_threshold_ns = match given.autorate_threshold {
            Some(text) => time::parse_duration_ns(&text)
                .map_err(|reason| ConfigError::AutorateThreshold { text, reason })?,
            None => autorate::DEFAULT_THRESHOLD_NS,
        };
        let horizon_text = given
            .horizon
            .unwrap_or_else(|| defaults::HORIZON.to_string());
        let horizon_ns =
            time::parse_duration_ns(&horizon_text).map_err(|reason| ConfigError::Horizon {
                text: horizon_text.clone(),
                reason,
            })?;
        if horizon_ns < 1_000_000 {
            return Err(ConfigError::HorizonTooShort { text: horizon_text });
        }
        let framing = parse_framing(given.framing.as_deref(), given.overhead, given.mpu)?;
        let rtt_ns = match given.rtt {
            Some(text) => {
                let ns = aqm::parse_rtt_ns(&text).map_err(|reason| ConfigError::Rtt {
                    text: text.clone(),
                    reason,
                })?;
                if !(1_000..=3_600_000_000_000).contains(&ns) {
                    return Err(ConfigError::RttRange { text });
                }
                ns
            }
            None => aqm::DEFAULT_RTT_NS,
        };
        let fq_given = given.fq.unwrap_or_default();
        // fq holds what the direction's largest rate admits: autorate does not resize it.
        let fq = fq_params(
            autorate.map_or(rate_bps, |r| r.max_bps),
            rtt_ns,
            horizon_ns,
            &fq_given,
        )?;
        let ecn = given.ecn.unwrap_or(true);
        let split_gso = given.split_gso.unwrap_or(true);
        let diffserv = match given.diffserv {
            Some(name) => Diffserv::parse(&name).ok_or(ConfigError::Diffserv(name))?,
            None => Diffserv::default(),
        };
        let wash = given.wash.unwrap_or(false);
        let nat = given.nat.unwrap_or(false);
        let ack_filter = match given.ack_filter {
            Some(name) => AckFilter::parse(&name).ok_or(ConfigError::AckFilter(name))?,
            None => AckFilter::default(),
        };
        let fwmark_mask = match given.fwmark {
            Some(text) => parse_mask(&text).ok_or(ConfigError::Fwmark(text))?,
            None => 0,
        };
        let metrics = match given.metrics {
            Some(text) => Some(parse_listen_addr(&text).ok_or(ConfigError::Metrics(text))?),
            None => None,
        };
        let metrics_top_hosts = in_range(
            "metrics-top-hosts",
            given.metrics_top_hosts.unwrap_or(0),
            0,
            defaults::METRICS_TOP_HOSTS_MAX,
        )?;
        let isolation = match given.isolation {
            Some(name) => Isolation::parse(&name).ok_or(ConfigError::Isolation(name))?,
            None => Isolation::default(),
        };
        let st = given.state.unwrap_or_default();
        let state = StateParams {
            host_prefix_v4: in_range(
                "host-prefix-v4",
                st.host_prefix_v4.unwrap_or(defaults::HOST_PREFIX_V4),
                1,
                32,
            )?,
            host_prefix_v6: in_range(
                "host-prefix-v6",
                st.host_prefix_v6.unwrap_or(defaults::HOST_PREFIX_V6),
                1,
                128,
            )?,
            max_flows: in_range(
                "max-flows",
                st.max_flows.unwrap_or(defaults::MAX_FLOWS),
                1_024,
                1 << 24,
            )?,
            max_hosts: in_range(
                "max-hosts",
                st.max_hosts.unwrap_or(defaults::MAX_HOSTS),
                16,
                1 << 22,
            )?,
            flow_quota: in_range(
                "flow-quota",
                st.flow_quota.unwrap_or(defaults::FLOW_QUOTA),
                0,
                1 << 24,
            )?,
            log_datapath: given.log_datapath.unwrap_or(false),
        };
        let egress = Self {
            iface,
            rate_bps,
            horizon_ns,
            framing,
            isolation,
            fq,
            state,
            rtt_ns,
            ecn,
            split_gso,
            segmenter: split_gso,
            behind_bottleneck: false,
            link_header_bytes: None,
            diffserv,
            wash,
            nat,
            fwmark_mask,
            ack_filter,
            metrics,
            metrics_top_hosts,
            autorate,
            autorate_reflectors,
            autorate_threshold_ns,
            ingress: None,
        };
        let ingress = match ingress_rate_bps {
            Some(rate_bps) => Some(Box::new(Self {
                rate_bps,
                autorate: ingress_autorate,
                fq: fq_params(
                    ingress_autorate.map_or(rate_bps, |r| r.max_bps),
                    rtt_ns,
                    horizon_ns,
                    &fq_given,
                )?,
                // Filtering ACKs is for the direction that carries them out (the uplink).
                ack_filter: AckFilter::Off,
                behind_bottleneck: true,
                ..egress.clone()
            })),
            None => None,
        };
        Ok(Self { ingress, ..egress })
    }

    /// The settings of the ingress direction, shaped on `ifb`'s egress, for an interface
    /// whose link-layer header is `link_header_bytes`.
    pub fn for_ingress(&self, ifb: &str, link_header_bytes: u32) -> Option<Self> {
        self.ingress.as_deref().map(|s| Self {
            iface: ifb.to_string(),
            segmenter: false,
            link_header_bytes: Some(link_header_bytes),
            ..s.clone()
        })
    }

    /// The map value the data path reads, for a device whose full frames are `frame_bytes` as
    /// it sends them, behind `link_header_bytes` of link-layer header (`link::link_header_bytes`),
    /// and whose largest packets (its GSO limits, see `link::GsoLimits`) are
    /// `largest_packet_bytes`.
    pub fn datapath_config(
        &self,
        frame_bytes: u32,
        link_header_bytes: u32,
        largest_packet_bytes: u64,
    ) -> ShaperConfig {
        let ns_per_byte_fp = edt::ns_per_byte_fp(self.rate_bps);
        // Every size below is wire time at the rate: the bytes the bottleneck link sends.
        let device_frame = frame_bytes.max(1);
        let frame_bytes = self
            .framing
            .frame_bytes(device_frame, link_header_bytes)
            .min(u32::MAX as u64) as u32;
        let largest_packet_bytes =
            (largest_packet_bytes * frame_bytes as u64).div_ceil(device_frame as u64);
        let mut aqm =
            AqmParams::for_rate(self.rtt_ns, ns_per_byte_fp, frame_bytes, self.horizon_ns);
        if !self.ecn {
            aqm.flags &= !aqm::flags::ECN;
        }
        ShaperConfig {
            rate_bps: self.rate_bps,
            ns_per_byte_fp: edt::ns_per_byte_fp(self.rate_bps),
            horizon_ns: self.horizon_ns,
            framing: self.framing,
            isolation: self.isolation as u32,
            flow_quota: self.state.flow_quota,
            host_mask_v4: prefix_mask(self.state.host_prefix_v4, 1)[0],
            // A flow the mode keeps at n ACKs scheduled is charged a round for all n: its kept
            // ACKs wait about a round, as CAKE's newest queued ACK does.
            ack_quantum_bytes: ackfilter::round_quantum_bytes(self.rate_bps, frame_bytes)
                / self.ack_filter.scheduled_needed().unwrap_or(1),
            host_mask_v6: prefix_mask(self.state.host_prefix_v6, 4),
            calendar_bin_ns: calendar_bin_ns(ns_per_byte_fp, self.horizon_ns, largest_packet_bytes),
            aqm,
            tin_of_dscp: self.diffserv.table(),
            fwmark_mask: self.fwmark_mask,
            fwmark_shift: self.fwmark_mask.trailing_zeros() % 32,
            tins: self.diffserv.tins().len() as u32,
            wash: self.wash as u32,
            ack_filter: self.ack_filter as u32,
            split_gso_segs: 0,
            segmenter_ifindex: 0,
            lent_window_ns: edt::tx_time_ns(frame_bytes as u64 * LENT_WINDOW_FRAMES, ns_per_byte_fp)
                .min(u32::MAX as u64) as u32,
            link_header_bytes,
            reserved: 0,
        }
    }

    /// The rate the device's packet sizes are planned for (its GSO and GRO limits, the
    /// segmenter): the least the direction may be shaped at, so that they fit every rate
    /// autorate sets and stay as they are while it changes them.
    pub fn sizing_rate_bps(&self) -> u64 {
        self.autorate.map_or(self.rate_bps, |r| r.min_bps)
    }

    pub fn describe(&self) -> String {
        format!(
            "{} at {}{}, {}{}, {}{}, rtt {} us{} (horizon {} ms, framing {})",
            self.iface,
            DisplayRate(self.rate_bps),
            self.autorate
                .map(|r| format!(" (autorate {r})"))
                .unwrap_or_default(),
            self.isolation.name(),
            if self.nat { " nat" } else { "" },
            self.diffserv.name(),
            if self.wash { " wash" } else { "" },
            self.rtt_ns / 1_000,
            if self.ecn { ", ecn" } else { "" },
            self.horizon_ns / 1_000_000,
            self.framing
        )
    }
}

fn parse_autorate(
    field: &'static str,
    text: Option<String>,
) -> Result<Option<autorate::Range>, ConfigError> {
    text.filter(|t| t != "off")
        .map(|text| {
            text.parse().map_err(|reason| ConfigError::Autorate {
                field,
                text,
                reason,
            })
        })
        .transpose()
}

/// A direction's rate, or where its autorate starts: the rate given (within the range), else
/// the range's maximum; none for a direction neither gives.
fn start_rate(
    field: &'static str,
    text: Option<String>,
    autorate: Option<autorate::Range>,
) -> Result<Option<u64>, ConfigError> {
    let Some(text) = text else {
        return Ok(autorate.map(|r| r.max_bps));
    };
    let bps = parse_rate(field, text.clone())?;
    match autorate {
        Some(r) if !(r.min_bps..=r.max_bps).contains(&bps) => Err(ConfigError::OutsideAutorate {
            field,
            rate: text,
            range: r,
        }),
        _ => Ok(Some(bps)),
    }
}

fn parse_rate(field: &'static str, text: String) -> Result<u64, ConfigError> {
    rate::parse_rate(&text).map_err(|reason| ConfigError::Rate {
        field,
        text,
        reason,
    })
}

/// fq's limits for a rate. fq must hold everything the AQM admits, or it tail-drops packets
/// whose wire time is already booked: one flow at the whole rate for its hard limit, in packets
/// of 1000 bytes (a bulk flow's packets are mostly full-sized).
fn fq_params(
    rate_bps: u64,
    rtt_ns: u64,
    horizon_ns: u64,
    file: &FqOptions,
) -> Result<FqParams, ConfigError> {
    let limit = |what, value: Option<u32>, default| match value.unwrap_or(default) {
        v @ 1..=1_000_000 => Ok(v),
        value => Err(ConfigError::FqLimit { what, value }),
    };
    let aqm_limit_ns = AqmParams::for_rate(
        rtt_ns,
        edt::ns_per_byte_fp(rate_bps),
        FRAME_BYTES,
        horizon_ns,
    )
    .limit_ns;
    let flow_packets = (rate_bps as u128 * aqm_limit_ns as u128 / 8_000_000_000_000) as u64;
    let flow_default = flow_packets.clamp(defaults::FQ_FLOW_LIMIT_PACKETS as u64, 1_000_000);
    let total_default = (flow_default * 4).clamp(defaults::FQ_LIMIT_PACKETS as u64, 1_000_000);
    Ok(FqParams {
        limit_packets: limit("limit", file.limit, total_default as u32)?,
        flow_limit_packets: limit("flow-limit", file.flow_limit, flow_default as u32)?,
        // fq must never drop before the data path: its horizon sits a second beyond ours.
        horizon_us: ((horizon_ns / 1_000) + 1_000_000).min(u64::from(u32::MAX)) as u32,
    })
}

/// Reads and parses a config file (its values are validated by [`Settings::resolve_with`]).
pub fn load_file(path: &Path) -> Result<Options, ConfigError> {
    read_file(path).map(|(_, options)| options)
}

/// [`load_file`], with the file's text (to name the line of a value found wrong later).
pub fn read_file(path: &Path) -> Result<(String, Options), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let options = Options::from_toml(&text).map_err(|e| ConfigError::Parse {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    Ok((text, options))
}

/// The address `--metrics` listens on: `HOST:PORT` (`[v6]:PORT` for IPv6), or a bare port on
/// the loopback address, so that exposing the endpoint beyond the machine is always explicit.
pub fn parse_listen_addr(text: &str) -> Option<SocketAddr> {
    let text = text.trim();
    match text.parse::<u16>() {
        Ok(port) => Some(SocketAddr::from((Ipv4Addr::LOCALHOST, port))),
        Err(_) => text.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn cli(iface: &str, rate: &str) -> Options {
        Options {
            iface: Some(iface.into()),
            rate: Some(rate.into()),
            ..Default::default()
        }
    }

    #[test]
    fn command_line_alone() {
        let s = Settings::resolve(cli("eth0", "100mbit"), None).unwrap();
        assert_eq!(s.rate_bps, 100_000_000);
        assert_eq!(s.horizon_ns, 2_000_000_000);
        assert_eq!(s.fq.horizon_us, 3_000_000);
        assert_eq!(
            s.datapath_config(1514, 14, 65_536).ns_per_byte_fp,
            edt::ns_per_byte_fp(100_000_000)
        );
    }

    #[test]
    fn bad_values_are_named_in_the_error() {
        let err = |c| Settings::resolve(c, None).unwrap_err().to_string();
        assert!(err(cli("eth0", "0")).contains("greater than zero"));
        assert!(err(cli("eth0", "fast")).contains("invalid rate \"fast\""));
        assert!(
            err(Options {
                rate: Some("1gbit".into()),
                ..Default::default()
            })
            .contains("--iface")
        );
        assert!(
            err(Options {
                iface: Some("x".into()),
                ..Default::default()
            })
            .contains("--rate")
        );
        let mut c = cli("eth0", "1gbit");
        c.horizon = Some("10us".into());
        assert!(err(c.clone()).contains("at least 1ms"));
        c.horizon = Some("2 weeks".into());
        assert!(err(c).contains("invalid horizon"));
        let mut c = cli("eth0", "1gbit");
        c.overhead = Some(1000);
        assert!(err(c).contains("overhead"));
    }

    #[test]
    fn framing_reads_cakes_keywords_then_overhead_and_mpu() {
        let framing = |words: &str, overhead, mpu| {
            let mut c = cli("eth0", "1gbit");
            (c.framing, c.overhead, c.mpu) = (Some(words.into()), overhead, mpu);
            Settings::resolve(c, None).map(|s| s.framing.to_string())
        };
        assert_eq!(framing("docsis", None, None).unwrap(), "overhead 18 mpu 64");
        assert_eq!(
            framing("pppoe-ptm, ether-vlan", None, None).unwrap(),
            "overhead 34 ptm"
        );
        assert_eq!(framing("docsis", Some(22), Some(0)).unwrap(), "overhead 22");
        assert_eq!(framing("", Some(8), None).unwrap(), "overhead 8");
        assert_eq!(framing("", None, None).unwrap(), "raw overhead 0");
        let err = framing("docsis pppoe", None, None).unwrap_err();
        assert_eq!(err.field(), Some("framing"));
        assert!(err.to_string().contains("\"pppoe\"") && err.to_string().contains("pppoe-ptm"));
        // The sum is held to CAKE's range like a number given.
        let many = ["pppoe-llcsnap"; 7].join(" ");
        assert!(matches!(
            framing(&many, None, None),
            Err(ConfigError::Overhead(280))
        ));
    }

    #[test]
    fn file_fills_in_and_command_line_wins() {
        let mut f = tempfile();
        writeln!(
            f.1,
            "iface = \"eth1\"\nrate = \"50mbit\"\nhorizon = \"500ms\"\n[fq]\nflow-limit = 200"
        )
        .unwrap();
        let s = Settings::resolve(Options::default(), Some(&f.0)).unwrap();
        assert_eq!(
            (s.iface.as_str(), s.rate_bps, s.horizon_ns),
            ("eth1", 50_000_000, 500_000_000)
        );
        assert_eq!(s.fq.flow_limit_packets, 200);
        let s = Settings::resolve(cli("eth2", "1gbit"), Some(&f.0)).unwrap();
        assert_eq!((s.iface.as_str(), s.rate_bps), ("eth2", 1_000_000_000));
    }

    #[test]
    fn unknown_keys_in_the_file_are_rejected() {
        let mut f = tempfile();
        writeln!(f.1, "rate = \"1gbit\"\nrat = \"2gbit\"").unwrap();
        let err = Settings::resolve(cli("eth0", "1gbit"), Some(&f.0))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `rat`"), "{err}");
        let err = Settings::resolve(cli("eth0", "1gbit"), Some(Path::new("/nonexistent/x.toml")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot read config file"), "{err}");
    }

    #[test]
    fn an_option_is_a_flag_and_a_key_of_the_same_name_and_the_command_line_wins() {
        #[derive(clap::Parser)]
        struct Line {
            #[command(flatten)]
            options: Options,
        }
        let line = |args: &[&str]| {
            use clap::Parser;
            Line::try_parse_from([&["run"], args].concat())
                .unwrap()
                .options
        };
        let given = line(&[
            "--no-split-gso",
            "--wash",
            "--overhead",
            "-5",
            "--rtt",
            "lan",
        ]);
        assert_eq!(
            (
                given.split_gso,
                given.wash,
                given.overhead,
                given.rtt.as_deref()
            ),
            (Some(false), Some(true), Some(-5), Some("lan"))
        );
        let file = Options::from_toml(
            "iface = \"eth1\"\nrate = \"1mbit\"\nsplit-gso = true\nwash = true\necn = false\nrtt = \"metro\"",
        )
        .unwrap();
        let s = Settings::resolve_with(given, file.clone()).unwrap();
        assert!(!s.split_gso && s.wash && !s.ecn, "{s:?}");
        assert_eq!((s.iface.as_str(), s.rtt_ns), ("eth1", 1_000_000));
        // Flags absent, the file's values stand (a flag can only say what the default does not).
        let s = Settings::resolve_with(line(&[]), file).unwrap();
        assert!(s.split_gso && s.wash, "{s:?}");
        assert_eq!(s.rtt_ns, 10_000_000);
        // Defaults where neither gives a value.
        let s = Settings::resolve_with(
            line(&["--iface", "x", "--rate", "1gbit"]),
            Options::default(),
        )
        .unwrap();
        assert!(s.split_gso && !s.wash && s.ecn, "{s:?}");
    }

    #[test]
    fn a_bad_file_is_named_with_the_field_and_its_line() {
        let mut f = tempfile();
        writeln!(f.1, "rate = \"1gbit\"\nmpu = \"x\"").unwrap();
        let err = Settings::resolve(cli("eth0", "1gbit"), Some(&f.0))
            .unwrap_err()
            .to_string();
        let path = f.0.display().to_string();
        assert!(
            err.contains(&path) && err.contains("line 2") && err.contains("mpu = "),
            "{err}"
        );
        // `--config` is the command line's only: not a key of the file.
        let mut f = tempfile();
        writeln!(f.1, "config = \"other.toml\"").unwrap();
        let err = Settings::resolve(cli("eth0", "1gbit"), Some(&f.0))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `config`"), "{err}");
    }

    #[test]
    fn a_lent_packet_counts_as_ahead_for_two_frames_at_the_rate() {
        // 2 × 1514 bytes at 950 kbit/s: 25.5 ms; at 50 Mbit/s 0.48 ms; at 1 kbit/s the u32
        // saturates (24 s would not fit) rather than wrapping to a short window.
        let window = |rate: &str| {
            Settings::resolve(cli("eth0", rate), None)
                .unwrap()
                .datapath_config(1514, 14, 65_536)
                .lent_window_ns
        };
        assert!((25_498_000..25_500_000).contains(&window("950kbit")));
        assert!((484_000..485_000).contains(&window("50mbit")));
        assert_eq!(window("1kbit"), u32::MAX);
    }

    #[test]
    fn isolation_and_state() {
        let s = Settings::resolve(cli("eth0", "1gbit"), None).unwrap();
        assert_eq!(s.isolation, Isolation::TripleIsolate);
        let c = s.datapath_config(1514, 14, 65_536);
        assert_eq!(c.isolation, Isolation::TripleIsolate as u32);
        assert_eq!(c.host_mask_v4, u32::MAX);
        assert_eq!(c.host_mask_v6, [u32::MAX, u32::MAX, 0, 0]);
        assert!(c.calendar_bin_ns >= 1_000_000);

        let mut f = tempfile();
        writeln!(
            f.1,
            "isolation = \"flows\"\n[state]\nhost-prefix-v4 = 24\nmax-flows = 4096"
        )
        .unwrap();
        let s = Settings::resolve(cli("eth0", "1gbit"), Some(&f.0)).unwrap();
        assert_eq!(s.isolation, Isolation::Flows);
        assert_eq!((s.state.host_prefix_v4, s.state.max_flows), (24, 4096));
        let mut c = cli("eth0", "1gbit");
        c.isolation = Some("dual-dsthost".into());
        let s = Settings::resolve(c, Some(&f.0)).unwrap();
        assert_eq!(s.isolation, Isolation::DualDstHost, "the command line wins");

        let err = |c| Settings::resolve(c, None).unwrap_err().to_string();
        let mut c = cli("eth0", "1gbit");
        c.isolation = Some("triple".into());
        let e = err(c);
        assert!(
            e.contains("unknown isolation mode") && e.contains("dual-srchost"),
            "{e}"
        );
        let mut f = tempfile();
        writeln!(f.1, "[state]\nhost-prefix-v6 = 129").unwrap();
        let e = Settings::resolve(cli("eth0", "1gbit"), Some(&f.0))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("host-prefix-v6 must be between 1 and 128"),
            "{e}"
        );
    }

    #[test]
    fn a_thinned_ack_flow_is_charged_a_round_for_the_acks_its_mode_keeps_scheduled() {
        let charge = |mode: &str| {
            let mut c = cli("eth0", "1mbit");
            c.ack_filter = Some(mode.into());
            let s = Settings::resolve(c, None).unwrap();
            s.datapath_config(1514, 14, 65_536).ack_quantum_bytes
        };
        // CAKE's quantum at 1 Mbit/s is 300 bytes: one ACK a round kept in aggressive mode,
        // two in conservative.
        assert_eq!(charge("aggressive"), 300);
        assert_eq!(charge("conservative"), 150);
    }

    #[test]
    fn autorate_starts_at_the_rate_given_or_its_maximum_and_sizes_for_its_range() {
        let mut c = cli("eth0", "50mbit");
        c.autorate = Some("10mbit..60mbit".into());
        c.ingress_autorate = Some("20mbit..100mbit".into());
        c.autorate_reflectors = Some("192.0.2.1, 2001:db8::1".into());
        c.autorate_threshold = Some("8ms".into());
        let s = Settings::resolve(c, None).unwrap();
        assert_eq!(s.rate_bps, 50_000_000);
        assert_eq!(s.autorate.unwrap().to_string(), "10Mbit..60Mbit");
        assert_eq!(s.autorate_reflectors.len(), 2);
        assert_eq!(s.autorate_threshold_ns, 8_000_000);
        // fq holds what the most rate admits; packet sizes fit the least.
        assert_eq!(
            s.fq,
            fq_params(60_000_000, s.rtt_ns, s.horizon_ns, &FqOptions::default()).unwrap()
        );
        assert_eq!(s.sizing_rate_bps(), 10_000_000);
        // --ingress-autorate alone shapes the ingress, from its maximum.
        let i = s.ingress.as_deref().unwrap();
        assert_eq!((i.rate_bps, i.sizing_rate_bps()), (100_000_000, 20_000_000));
        assert!(s.describe().contains("(autorate 10Mbit..60Mbit)"));

        // Without --rate: from the maximum; without reflectors: the public resolvers.
        let mut c = cli("eth0", "1mbit");
        c.rate = None;
        c.autorate = Some("10mbit..60mbit".into());
        let s = Settings::resolve(c, None).unwrap();
        assert_eq!(s.rate_bps, 60_000_000);
        assert_eq!(
            s.autorate_reflectors.len(),
            defaults::AUTORATE_REFLECTORS.len()
        );
        assert_eq!(s.autorate_threshold_ns, autorate::DEFAULT_THRESHOLD_NS);

        let err = |f: fn(&mut Options)| {
            let mut c = cli("eth0", "50mbit");
            f(&mut c);
            Settings::resolve(c, None).unwrap_err()
        };
        let e = err(|c| c.autorate = Some("60mbit..10mbit".into()));
        assert_eq!(e.field(), Some("autorate"));
        assert!(
            e.to_string().contains("minimum is above the maximum"),
            "{e}"
        );
        let e = err(|c| c.autorate = Some("10mbit..40mbit".into()));
        assert_eq!(e.field(), Some("rate"));
        assert!(e.to_string().contains("lies outside 10Mbit..40Mbit"), "{e}");
        let e = err(|c| {
            c.autorate = Some("10mbit..60mbit".into());
            c.autorate_reflectors = Some("1.1.1.1,dns.google".into());
        });
        assert_eq!(e.field(), Some("autorate-reflectors"));
        let e = err(|c| c.autorate_threshold = Some("5 parsecs".into()));
        assert_eq!(e.field(), Some("autorate-threshold"));
    }

    #[test]
    fn ingress_rate_shapes_the_other_direction_with_the_same_policy() {
        let s = Settings::resolve(cli("eth0", "1mbit"), None).unwrap();
        assert!(s.ingress.is_none() && s.for_ingress("ifb4eth0", 14).is_none());
        let mut c = cli("eth0", "1mbit");
        c.ingress_rate = Some("30mbit".into());
        c.ack_filter = Some("aggressive".into());
        c.isolation = Some("dual-dsthost".into());
        let s = Settings::resolve(c, None).unwrap();
        let i = s.for_ingress("ifb4eth0", 14).unwrap();
        assert_eq!(
            (i.iface.as_str(), i.rate_bps, i.isolation),
            ("ifb4eth0", 30_000_000, Isolation::DualDstHost)
        );
        assert_eq!(
            (s.ack_filter, i.ack_filter),
            (AckFilter::Aggressive, AckFilter::Off)
        );
        assert!(i.ingress.is_none());
        // fq's limits follow the ingress rate, not the egress one.
        assert_eq!(
            i.fq,
            fq_params(30_000_000, i.rtt_ns, i.horizon_ns, &FqOptions::default()).unwrap()
        );

        let mut c = cli("eth0", "1mbit");
        c.ingress_rate = Some("0".into());
        let e = Settings::resolve(c, None).unwrap_err().to_string();
        assert!(e.contains("invalid rate \"0\""), "{e}");
        let mut f = tempfile();
        writeln!(f.1, "ingress-rate = \"20mbit\"").unwrap();
        let s = Settings::resolve(cli("eth0", "1mbit"), Some(&f.0)).unwrap();
        assert_eq!(s.ingress.map(|i| i.rate_bps), Some(20_000_000));
    }

    #[test]
    fn metrics_listen_only_when_asked_and_the_command_line_wins() {
        let s = Settings::resolve(cli("eth0", "1gbit"), None).unwrap();
        assert_eq!((s.metrics, s.metrics_top_hosts), (None, 0));
        let mut f = tempfile();
        writeln!(f.1, "metrics = \"9101\"\nmetrics-top-hosts = 5").unwrap();
        let s = Settings::resolve(cli("eth0", "1gbit"), Some(&f.0)).unwrap();
        assert_eq!(s.metrics, Some("127.0.0.1:9101".parse().unwrap()));
        assert_eq!(s.metrics_top_hosts, 5);
        let c = Options {
            metrics: Some("[::]:9200".into()),
            metrics_top_hosts: Some(0),
            ..cli("eth0", "1gbit")
        };
        let s = Settings::resolve(c, Some(&f.0)).unwrap();
        assert_eq!(s.metrics, Some("[::]:9200".parse().unwrap()));
        assert_eq!(s.metrics_top_hosts, 0);
        let bad = |c: Options| Settings::resolve(c, None).unwrap_err().to_string();
        let e = bad(Options {
            metrics: Some("localhost:9101".into()),
            ..cli("eth0", "1gbit")
        });
        assert!(
            e.contains("invalid metrics address \"localhost:9101\""),
            "{e}"
        );
        let e = bad(Options {
            metrics_top_hosts: Some(1_001),
            ..cli("eth0", "1gbit")
        });
        assert!(
            e.contains("metrics-top-hosts must be between 0 and 1000"),
            "{e}"
        );
    }

    /// A configuration file of the test's own, removed when the test ends.
    struct TempFile(std::path::PathBuf, std::fs::File);

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn tempfile() -> TempFile {
        let path = std::env::temp_dir().join(format!(
            "shaper-config-test-{}-{:?}.toml",
            std::process::id(),
            std::thread::current().id()
        ));
        let file = std::fs::File::create(&path).unwrap();
        TempFile(path, file)
    }

    #[test]
    fn rtt_presets_durations_and_mistakes() {
        let with_rtt = |rtt: &str| {
            Settings::resolve(
                Options {
                    rtt: Some(rtt.into()),
                    ..cli("eth0", "100mbit")
                },
                None,
            )
        };
        assert_eq!(
            Settings::resolve(cli("eth0", "100mbit"), None)
                .unwrap()
                .rtt_ns,
            100_000_000
        );
        assert_eq!(with_rtt("lan").unwrap().rtt_ns, 1_000_000);
        assert_eq!(with_rtt("30ms").unwrap().rtt_ns, 30_000_000);
        let e = with_rtt("intranet").unwrap_err().to_string();
        assert!(e.contains("intranet") && e.contains("datacentre"), "{e}");
        assert!(with_rtt("0us").is_err());
        // The AQM's parameters follow: internet at 100 Mbit/s is CoDel's 5 ms / 100 ms.
        let c = with_rtt("internet")
            .unwrap()
            .datapath_config(1514, 14, 65_536);
        assert_eq!(
            (c.aqm.target_ns, c.aqm.interval_ns),
            (5_000_000, 100_000_000)
        );
        assert_ne!(c.aqm.flags & shaper_common::aqm::flags::ECN, 0);
    }

    #[test]
    fn fq_holds_what_the_aqm_admits() {
        // 1 Gbit/s, internet: one flow at the rate for 400 ms is 50,000 packets of 1000 bytes.
        let s = Settings::resolve(cli("eth0", "1gbit"), None).unwrap();
        assert_eq!(s.fq.flow_limit_packets, 50_000);
        assert_eq!(s.fq.limit_packets, 200_000);
        // Slow links keep fq's usual floor.
        let s = Settings::resolve(cli("eth0", "10mbit"), None).unwrap();
        assert_eq!(
            (s.fq.flow_limit_packets, s.fq.limit_packets),
            (1_000, 10_000)
        );
    }

    #[test]
    fn a_bare_port_listens_on_loopback_only() {
        assert_eq!(
            parse_listen_addr("9101"),
            Some("127.0.0.1:9101".parse().unwrap())
        );
        assert_eq!(
            parse_listen_addr("0.0.0.0:9101"),
            Some("0.0.0.0:9101".parse().unwrap())
        );
        assert_eq!(
            parse_listen_addr("[::1]:9101"),
            Some("[::1]:9101".parse().unwrap())
        );
        for bad in [
            "",
            "localhost:9101",
            "127.0.0.1",
            "65536",
            "::1:9101",
            "127.0.0.1:x",
        ] {
            assert_eq!(parse_listen_addr(bad), None, "{bad:?}");
        }
    }
}
