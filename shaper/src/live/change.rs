//! What differs between the settings a shaper runs with and the settings asked for, and whether
//! each difference can be applied in place: without re-installing the root qdisc or detaching
//! the programs, so that fq keeps its packets.
//!
//! In place: autorate's ranges, reflectors and threshold; everything the data path reads from
//! its configuration map (rate, horizon,
//! framing, isolation, rtt, ecn, DiffServ, wash, fwmark, ACK filter, flow quota), the
//! control loop's policy, fq's limits (`tc qdisc change`) and the GSO/GRO limits that follow
//! the rate. Not in place, each for a reason it names: what sizes or keys the maps when they
//! are created, what the verifier fixed (the data path's debug events), what adds or removes a
//! device (the ingress IFB, the GSO split), and what the process set up once (its interface,
//! its metrics listener).

use std::fmt;

use shaper_common::{autorate, framing::Framing, rate::DisplayRate};

use crate::config::Settings;

/// One setting that differs: its name as in the config file, its value now and asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    pub setting: &'static str,
    pub was: String,
    pub now: String,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} -> {}", self.setting, self.was, self.now)
    }
}

/// Differences that only a restart applies, each with why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{} cannot change while shaper runs; nothing was changed. Restart `shaper run` with the new settings",
    .fixed.iter().map(|(d, why)| format!("{d} ({why})")).collect::<Vec<_>>().join(", ")
)]
pub struct NeedsRestart {
    pub fixed: Vec<(Difference, &'static str)>,
}

/// The differences from `old` to `new`, all of which can be applied in place; or, when any of
/// them cannot, those (and nothing is to be applied).
pub fn differences(old: &Settings, new: &Settings) -> Result<Vec<Difference>, NeedsRestart> {
    let mut d = Differ::default();
    d.fixed("iface", &old.iface, &new.iface, "the interface", |s| {
        s.clone()
    });
    d.fixed(
        "split-gso",
        &old.split_gso,
        &new.split_gso,
        "adds or removes the segmenter's device",
        bool::to_string,
    );
    let (os, ns) = (&old.state, &new.state);
    let sizes = "sizes the maps when they are created";
    let keys = "keys the hosts in the maps";
    d.fixed(
        "max-flows",
        &os.max_flows,
        &ns.max_flows,
        sizes,
        u32::to_string,
    );
    d.fixed(
        "max-hosts",
        &os.max_hosts,
        &ns.max_hosts,
        sizes,
        u32::to_string,
    );
    d.fixed(
        "host-prefix-v4",
        &os.host_prefix_v4,
        &ns.host_prefix_v4,
        keys,
        u32::to_string,
    );
    d.fixed(
        "host-prefix-v6",
        &os.host_prefix_v6,
        &ns.host_prefix_v6,
        keys,
        u32::to_string,
    );
    d.fixed(
        "log-datapath",
        &os.log_datapath,
        &ns.log_datapath,
        "fixed when the programs are verified",
        bool::to_string,
    );
    let listener = "the metrics endpoint is bound at start";
    d.fixed("metrics", &old.metrics, &new.metrics, listener, |a| {
        a.map_or("off".into(), |a| a.to_string())
    });
    d.fixed(
        "metrics-top-hosts",
        &old.metrics_top_hosts,
        &new.metrics_top_hosts,
        listener,
        u32::to_string,
    );

    d.live("rate", &old.rate_bps, &new.rate_bps, rate);
    match (&old.ingress, &new.ingress) {
        (Some(oi), Some(ni)) => {
            d.live("ingress-rate", &oi.rate_bps, &ni.rate_bps, rate);
            d.live(
                "ingress fq limit",
                &oi.fq.limit_packets,
                &ni.fq.limit_packets,
                packets,
            );
            d.live(
                "ingress fq flow-limit",
                &oi.fq.flow_limit_packets,
                &ni.fq.flow_limit_packets,
                packets,
            );
        }
        (oi, ni) => d.fixed(
            "ingress-rate",
            &oi.as_ref().map(|s| s.rate_bps),
            &ni.as_ref().map(|s| s.rate_bps),
            "adds or removes the ingress direction's device",
            |r| r.as_ref().map_or("off".into(), rate),
        ),
    }
    let range = |r: &Option<autorate::Range>| r.map_or("off".into(), |r| r.to_string());
    d.live("autorate", &old.autorate, &new.autorate, range);
    if let (Some(oi), Some(ni)) = (&old.ingress, &new.ingress) {
        d.live("ingress-autorate", &oi.autorate, &ni.autorate, range);
    }
    d.live(
        "autorate-reflectors",
        &old.autorate_reflectors,
        &new.autorate_reflectors,
        |a| {
            a.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        },
    );
    d.live(
        "autorate-threshold",
        &old.autorate_threshold_ns,
        &new.autorate_threshold_ns,
        duration,
    );
    d.live("horizon", &old.horizon_ns, &new.horizon_ns, duration);
    d.live("framing", &old.framing, &new.framing, Framing::to_string);
    d.live("isolation", &old.isolation, &new.isolation, |i| {
        i.name().into()
    });
    d.live("rtt", &old.rtt_ns, &new.rtt_ns, duration);
    d.live("ecn", &old.ecn, &new.ecn, bool::to_string);
    d.live("diffserv", &old.diffserv, &new.diffserv, |m| {
        m.name().into()
    });
    d.live("wash", &old.wash, &new.wash, bool::to_string);
    d.live("nat", &old.nat, &new.nat, bool::to_string);
    d.live("fwmark", &old.fwmark_mask, &new.fwmark_mask, |m| {
        format!("{m:#x}")
    });
    d.live("ack-filter", &old.ack_filter, &new.ack_filter, |m| {
        m.name().into()
    });
    d.live("flow-quota", &os.flow_quota, &ns.flow_quota, u32::to_string);
    d.live(
        "fq limit",
        &old.fq.limit_packets,
        &new.fq.limit_packets,
        packets,
    );
    d.live(
        "fq flow-limit",
        &old.fq.flow_limit_packets,
        &new.fq.flow_limit_packets,
        packets,
    );
    d.finish()
}

fn rate(bps: &u64) -> String {
    DisplayRate(*bps).to_string()
}

fn packets(n: &u32) -> String {
    format!("{n} packets")
}

/// A duration in the largest unit that shows it whole (ns, us, ms, s).
fn duration(ns: &u64) -> String {
    let ns = *ns;
    for (scale, unit) in [(1_000_000_000, "s"), (1_000_000, "ms"), (1_000, "us")] {
        if ns >= scale && ns.is_multiple_of(scale) {
            return format!("{}{unit}", ns / scale);
        }
    }
    format!("{ns}ns")
}

#[derive(Default)]
struct Differ {
    live: Vec<Difference>,
    fixed: Vec<(Difference, &'static str)>,
}

impl Differ {
    fn difference<T: PartialEq>(
        setting: &'static str,
        was: &T,
        now: &T,
        show: impl Fn(&T) -> String,
    ) -> Option<Difference> {
        (was != now).then(|| Difference {
            setting,
            was: show(was),
            now: show(now),
        })
    }

    fn live<T: PartialEq>(
        &mut self,
        setting: &'static str,
        was: &T,
        now: &T,
        show: impl Fn(&T) -> String,
    ) {
        self.live.extend(Self::difference(setting, was, now, show));
    }

    fn fixed<T: PartialEq>(
        &mut self,
        setting: &'static str,
        was: &T,
        now: &T,
        why: &'static str,
        show: impl Fn(&T) -> String,
    ) {
        if let Some(d) = Self::difference(setting, was, now, show) {
            self.fixed.push((d, why));
        }
    }

    fn finish(self) -> Result<Vec<Difference>, NeedsRestart> {
        if self.fixed.is_empty() {
            Ok(self.live)
        } else {
            Err(NeedsRestart { fixed: self.fixed })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Options;

    fn settings(file: &str) -> Settings {
        let cli = Options {
            iface: Some("eth0".into()),
            ..Default::default()
        };
        Settings::resolve_with(cli, Options::from_toml(file).unwrap()).unwrap()
    }

    fn changed(old: &str, new: &str) -> Vec<String> {
        differences(&settings(old), &settings(new))
            .unwrap()
            .iter()
            .map(Difference::to_string)
            .collect()
    }

    #[test]
    fn the_same_settings_differ_in_nothing() {
        let base = "rate = \"20mbit\"\ningress-rate = \"5mbit\"\nack-filter = \"conservative\"";
        assert_eq!(changed(base, base), Vec::<String>::new());
    }

    #[test]
    fn a_rate_change_is_in_place_with_the_fq_limits_that_follow_it() {
        assert_eq!(
            changed("rate = \"5mbit\"", "rate = \"10mbit\""),
            ["rate: 5Mbit -> 10Mbit"]
        );
        // Above fq's floor its limits change with the rate.
        assert_eq!(
            changed("rate = \"20mbit\"", "rate = \"40mbit\""),
            [
                "rate: 20Mbit -> 40Mbit",
                "fq flow-limit: 1000 packets -> 2000 packets"
            ]
        );
        assert_eq!(
            changed("rate = \"20mbit\"", "rate = \"1gbit\""),
            [
                "rate: 20Mbit -> 1Gbit",
                "fq limit: 10000 packets -> 200000 packets",
                "fq flow-limit: 1000 packets -> 50000 packets",
            ]
        );
        assert_eq!(
            changed(
                "rate = \"20mbit\"\ningress-rate = \"5mbit\"",
                "rate = \"20mbit\"\ningress-rate = \"7500kbit\""
            ),
            ["ingress-rate: 5Mbit -> 7.5Mbit"]
        );
    }

    #[test]
    fn every_policy_setting_changes_in_place() {
        let changes = changed(
            "rate = \"20mbit\"",
            "rate = \"20mbit\"\nhorizon = \"500ms\"\nframing = \"pppoe-ptm\"\nmpu = 64\nisolation = \"flows\"\n\
             rtt = \"lan\"\necn = false\ndiffserv = \"diffserv4\"\nwash = true\nfwmark = \"0xff\"\n\
             ack-filter = \"aggressive\"\n[state]\nflow-quota = 100",
        );
        assert_eq!(
            changes,
            [
                "horizon: 2s -> 500ms",
                "framing: raw overhead 0 -> overhead 30 mpu 64 ptm",
                "isolation: triple-isolate -> flows",
                "rtt: 100ms -> 1ms",
                "ecn: true -> false",
                "diffserv: besteffort -> diffserv4",
                "wash: false -> true",
                "fwmark: 0x0 -> 0xff",
                "ack-filter: off -> aggressive",
                "flow-quota: 10000 -> 100",
            ]
        );
    }

    #[test]
    fn what_sizes_the_maps_or_adds_a_device_needs_a_restart_and_nothing_applies() {
        let refused = |old: &str, new: &str| {
            let e = differences(&settings(old), &settings(new)).unwrap_err();
            let names: Vec<_> = e.fixed.iter().map(|(d, _)| d.setting).collect();
            (names, e.to_string())
        };
        let (names, message) = refused(
            "rate = \"20mbit\"",
            "rate = \"40mbit\"\n[state]\nmax-flows = 4096",
        );
        assert_eq!(names, ["max-flows"]);
        assert!(
            message.contains("Restart") && message.contains("nothing was changed"),
            "{message}"
        );
        assert!(
            message.contains("max-flows: 1048576 -> 4096 (sizes the maps"),
            "{message}"
        );
        let (names, _) = refused(
            "rate = \"20mbit\"",
            "rate = \"20mbit\"\ningress-rate = \"5mbit\"",
        );
        assert_eq!(names, ["ingress-rate"]);
        let (names, _) = refused(
            "rate = \"20mbit\"\ningress-rate = \"5mbit\"",
            "rate = \"20mbit\"",
        );
        assert_eq!(names, ["ingress-rate"]);
        let (names, _) = refused(
            "rate = \"20mbit\"",
            "rate = \"20mbit\"\nsplit-gso = false\nmetrics = \"9101\"\n[state]\nhost-prefix-v6 = 56",
        );
        assert_eq!(names, ["split-gso", "host-prefix-v6", "metrics"]);
        let mut other = settings("rate = \"20mbit\"");
        other.iface = "eth1".into();
        assert!(differences(&settings("rate = \"20mbit\""), &other).is_err());
    }
}
