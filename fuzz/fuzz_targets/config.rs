//! The TOML config file: `Options::from_toml`, then `Settings::resolve_with`.
//!
//! - Any text is read or refused with an error, never a panic.
//! - Settings that resolve are within the documented bounds, the ingress direction has the
//!   egress policy at its own rate (no ACK filter), and the data path's configuration is
//!   computed from them without overflow and agrees with them.
//! - The settings written back as a config file resolve to the same settings.
//! - The command line wins: the same file with `--iface` and `--rate` given differs only there
//!   (and in fq's limits, which follow the rate).
#![no_main]

use libfuzzer_sys::fuzz_target;
use shaper::config::{FqOptions, Options, Settings};
use shaper_common::{
    ackfilter::AckFilter,
    aqm,
    rate::{MAX_RATE_BPS, MIN_RATE_BPS},
};
use toml::{Table, Value};

const HOUR_NS: u64 = 3_600_000_000_000;

fn check_bounds(s: &Settings) {
    assert!((MIN_RATE_BPS..=MAX_RATE_BPS).contains(&s.rate_bps));
    assert!((1_000_000..=HOUR_NS).contains(&s.horizon_ns));
    assert!((-64..=256).contains(&s.framing.overhead));
    assert!(s.framing.mpu <= 1_500);
    assert!(s.framing.cells <= 2 && s.framing.from_network <= 1);
    assert!((1..=1_000_000).contains(&s.fq.limit_packets));
    assert!((1..=1_000_000).contains(&s.fq.flow_limit_packets));
    assert_eq!(u64::from(s.fq.horizon_us), s.horizon_ns / 1_000 + 1_000_000);
    assert!((1_000..=HOUR_NS).contains(&s.rtt_ns));
    let st = s.state;
    assert!((1..=32).contains(&st.host_prefix_v4));
    assert!((1..=128).contains(&st.host_prefix_v6));
    assert!((1_024..=1 << 24).contains(&st.max_flows));
    assert!((16..=1 << 22).contains(&st.max_hosts));
    assert!(st.flow_quota <= 1 << 24);
    assert!(s.metrics_top_hosts <= 1_000);
    assert_eq!(s.segmenter, s.split_gso);
    assert!(s.describe().starts_with(&s.iface));

    for (frame, header, largest) in [
        (1_514, 14, 65_536),
        (1_514, 14, 3_028),
        (9_014, 14, 589_824),
        (82, 14, 164),
        (1_420, 0, 65_536),
        (68, 0, 136),
    ] {
        let c = s.datapath_config(frame, header, largest);
        assert_eq!(c.link_header_bytes, header);
        assert_eq!(c.rate_bps, s.rate_bps);
        assert_eq!(c.tins as usize, s.diffserv.tins().len());
        assert_eq!(c.tin_of_dscp, s.diffserv.table());
        assert_eq!(c.fwmark_mask, s.fwmark_mask);
        assert!(s.fwmark_mask == 0 || s.fwmark_mask >> c.fwmark_shift & 1 == 1);
        assert_eq!(c.ack_filter, s.ack_filter as u32);
        assert_eq!(c.framing, s.framing);
        assert_eq!(c.aqm.flags & aqm::flags::ECN != 0, s.ecn);
    }

    if let Some(ingress) = &s.ingress {
        assert!(ingress.ingress.is_none());
        assert_eq!(ingress.ack_filter, AckFilter::Off);
        assert!(ingress.behind_bottleneck && !s.behind_bottleneck);
        let as_egress = Settings {
            rate_bps: s.rate_bps,
            fq: s.fq,
            ack_filter: s.ack_filter,
            behind_bottleneck: s.behind_bottleneck,
            ingress: s.ingress.clone(),
            ..(**ingress).clone()
        };
        assert_eq!(&as_egress, s, "ingress has the egress policy");
        check_bounds(ingress);
        let on_ifb = s.for_ingress("ifb4x", 0).expect("an ingress direction");
        assert!(!on_ifb.segmenter && on_ifb.iface == "ifb4x");
        assert_eq!(on_ifb.link_header_bytes, Some(0));
    }
}

/// The settings as a config file (fq's limits as the original file gave them: unset, they
/// follow each direction's rate).
fn render(s: &Settings, fq_given: &FqOptions) -> String {
    let mut t = Table::new();
    let mut put = |key: &str, value: Value| t.insert(key.into(), value);
    put("iface", s.iface.clone().into());
    put("rate", format!("{}bit", s.rate_bps).into());
    if let Some(ingress) = &s.ingress {
        put("ingress-rate", format!("{}bit", ingress.rate_bps).into());
    }
    put("horizon", format!("{}ns", s.horizon_ns).into());
    // `raw` keeps frames whole whatever overhead follows; the cells by their keyword.
    let f = s.framing;
    let raw = if f.from_network == 0 { "raw" } else { "" };
    let cells = ["noatm", "atm", "ptm"][f.cells as usize];
    put("framing", format!("{raw} {cells}").into());
    put("overhead", i64::from(f.overhead).into());
    put("mpu", i64::from(f.mpu).into());
    put("isolation", s.isolation.name().into());
    put("rtt", format!("{}ns", s.rtt_ns).into());
    put("ecn", s.ecn.into());
    put("split-gso", s.split_gso.into());
    put("diffserv", s.diffserv.name().into());
    put("wash", s.wash.into());
    put("nat", s.nat.into());
    if s.fwmark_mask != 0 {
        put("fwmark", format!("{:#x}", s.fwmark_mask).into());
    }
    put("ack-filter", s.ack_filter.name().into());
    if let Some(addr) = s.metrics {
        put("metrics", addr.to_string().into());
    }
    put("metrics-top-hosts", i64::from(s.metrics_top_hosts).into());
    let mut fq = Table::new();
    for (key, value) in [("limit", fq_given.limit), ("flow-limit", fq_given.flow_limit)] {
        if let Some(v) = value {
            fq.insert(key.into(), i64::from(v).into());
        }
    }
    t.insert("fq".into(), fq.into());
    let st = s.state;
    let state: Table = [
        ("host-prefix-v4", st.host_prefix_v4),
        ("host-prefix-v6", st.host_prefix_v6),
        ("max-flows", st.max_flows),
        ("max-hosts", st.max_hosts),
        ("flow-quota", st.flow_quota),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), Value::from(i64::from(v))))
    .collect();
    t.insert("state".into(), state.into());
    toml::to_string(&t).expect("a table of strings, integers and booleans")
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(file) = Options::from_toml(text) else {
        return;
    };
    let fq_given = file.fq.clone().unwrap_or_default();
    let own = Settings::resolve_with(Options::default(), file);
    let cli = Options {
        iface: Some("cli0".into()),
        rate: Some("1gbit".into()),
        ..Default::default()
    };
    let overridden =
        Settings::resolve_with(cli, Options::from_toml(text).expect("parsed just before"));
    if let Ok(s) = &overridden {
        check_bounds(s);
        assert_eq!((s.iface.as_str(), s.rate_bps), ("cli0", 1_000_000_000));
    }
    let Ok(s) = own else {
        return;
    };
    check_bounds(&s);

    let written = render(&s, &fq_given);
    let again = Options::from_toml(&written)
        .map_err(|e| e.to_string())
        .and_then(|f| Settings::resolve_with(Options::default(), f).map_err(|e| e.to_string()));
    assert_eq!(again.as_ref(), Ok(&s), "{text:?} written as {written:?}");

    let mut o = overridden.expect("the file resolves alone, so with the command line too");
    o.iface = s.iface.clone();
    o.rate_bps = s.rate_bps;
    o.fq = s.fq;
    if let (Some(oi), Some(si)) = (o.ingress.as_mut(), s.ingress.as_ref()) {
        oi.iface = si.iface.clone();
    }
    assert_eq!(o, s);
});
