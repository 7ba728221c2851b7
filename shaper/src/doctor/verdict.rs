//! From facts to checks: what passes, warns or fails, and the remedy for each that does not
//! pass. Pure: every decision here is a function of [`Facts`].
//!
//! A check fails when `shaper run` with its default settings would refuse or could not shape
//! (no fq, no BTF, missing privileges, an attachment path the kernel lacks, no such interface,
//! a root it will not replace); it warns when a fallback or an option is affected, or when the host departs
//! from the advice for hosts behind a shaper (fq, BBR, a bounded unsent queue, a fast clock).

use shaper_common::rate::DisplayRate;

use crate::tune::advice::{NOTSENT_LOWAT_BYTES, notsent_lowat_bounded};

use super::{
    facts::{
        BtfFacts, ClockFacts, Facts, Feature, FeatureFacts, IfaceFacts, LinkFacts, Offloads,
        ProbeOutcome, RootFacts, ShaperFacts, TcpFacts,
    },
    modules::ModuleState,
    report::{Check, Report},
};

/// Clock sources read with one instruction or a page of shared memory.
const FAST_CLOCKS: [&str; 3] = ["tsc", "arch_sys_counter", "kvm-clock"];
/// Clock sources that cost a device read (microseconds) or tick at the timer's resolution.
const SLOW_CLOCKS: [&str; 3] = ["hpet", "acpi_pm", "jiffies"];

/// All the checks, in the order they print: the process and the kernel, the interface, the
/// host's TCP settings, the clock.
pub fn judge(facts: &Facts) -> Report {
    let mut checks = vec![capabilities(&facts.missing_capabilities), btf(&facts.btf)];
    checks.push(tcx(&facts.kernel_release, facts.tcx));
    checks.extend(
        facts
            .features
            .iter()
            .map(|f| feature(f, facts.tcx, facts.loadable_modules)),
    );
    if let Some(iface) = &facts.iface {
        checks.extend(interface(
            iface,
            facts.tcx,
            facts.missing_capabilities.is_empty(),
        ));
    }
    checks.extend(tcp(&facts.tcp));
    checks.push(clocksource(&facts.clock));
    Report::new(checks)
}

fn capabilities(missing: &[&str]) -> Check {
    const NAME: &str = "capabilities";
    if missing.is_empty() {
        Check::pass(
            NAME,
            "CAP_NET_ADMIN, CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN)",
        )
    } else {
        Check::fail(
            NAME,
            format!("this process lacks {}", missing.join(", ")),
            "run shaper as root, or grant them: setcap cap_net_admin,cap_bpf,cap_perfmon+ep shaper",
        )
    }
}

fn btf(btf: &BtfFacts) -> Check {
    const NAME: &str = "btf";
    match (&btf.present, &btf.layout) {
        (false, _) => Check::fail(
            NAME,
            "/sys/kernel/btf/vmlinux is missing: shaper's programs cannot load",
            "use a kernel built with CONFIG_DEBUG_INFO_BTF=y",
        ),
        (true, Ok(())) => Check::pass(NAME, "/sys/kernel/btf/vmlinux"),
        (true, Err(e)) => Check::warn(
            NAME,
            format!(
                "/sys/kernel/btf/vmlinux, but {e}: packets leaving late (a stalled CPU) go uncharged"
            ),
            "none needed to shape; report this kernel's version to shaper",
        ),
    }
}

fn tcx(release: &str, tcx: bool) -> Check {
    const NAME: &str = "tcx";
    if tcx {
        Check::pass(
            NAME,
            format!("Linux {release}: programs attach through TCX"),
        )
    } else {
        Check::warn(
            NAME,
            format!(
                "not available on Linux {release} (6.6+): programs attach through clsact and a cls_bpf filter"
            ),
            "none needed (the netlink fallback works); Linux 6.6 or later attaches through TCX",
        )
    }
}

/// How much shaper depends on a feature, on this kernel.
enum Need {
    /// `shaper run` cannot shape without it.
    Required(&'static str),
    /// A fallback or an option needs it.
    Optional(&'static str),
}

fn need(feature: Feature, tcx: bool) -> Need {
    const SEGMENTER_AND_INGRESS: &str =
        "the segmenter (splits GSO at low rates) and --ingress-rate need it";
    match feature {
        Feature::Fq => Need::Required("packets would leave at once, not at their departure times"),
        Feature::Clsact if !tcx => Need::Required("programs attach under clsact without TCX"),
        Feature::ClsBpf if !tcx => Need::Required("programs attach as cls_bpf filters without TCX"),
        Feature::Clsact | Feature::Ifb | Feature::Mirred => Need::Optional(SEGMENTER_AND_INGRESS),
        Feature::ClsBpf => Need::Optional("the segmenter (splits GSO at low rates) needs it"),
        Feature::Matchall => Need::Optional("--ingress-rate needs it"),
    }
}

fn feature(f: &FeatureFacts, tcx: bool, loadable_modules: bool) -> Check {
    let name = f.feature.check_name();
    let module = f.feature.module();
    let source = match f.module {
        ModuleState::Loaded => format!("module {module} loaded"),
        ModuleState::BuiltIn => "built in".to_string(),
        ModuleState::Loadable => format!("module {module}, loaded on first use"),
        ModuleState::Absent | ModuleState::Unknown => String::new(),
    };
    match &f.probe {
        ProbeOutcome::Works if source.is_empty() => Check::pass(name, "works"),
        ProbeOutcome::Works => Check::pass(name, format!("works ({source})")),
        ProbeOutcome::Skipped | ProbeOutcome::Failed(_) if f.module.is_available() => {
            Check::pass(name, source)
        }
        ProbeOutcome::Missing => missing(f.feature, tcx, loadable_modules, "not in this kernel"),
        _ if f.module == ModuleState::Absent => missing(
            f.feature,
            tcx,
            loadable_modules,
            "not in this kernel's modules",
        ),
        ProbeOutcome::Failed(e) => Check::warn(
            name,
            format!("could not tell: {e}, and no module list names it"),
            "run shaper doctor as root: it creates one in a throwaway network namespace",
        ),
        ProbeOutcome::Skipped => Check::warn(
            name,
            "not probed, and no module list names it",
            "run shaper doctor as root: it creates one in a throwaway network namespace",
        ),
    }
}

fn missing(feature: Feature, tcx: bool, loadable_modules: bool, what: &str) -> Check {
    let (module, config) = (feature.module(), feature.config());
    let remedy = if loadable_modules {
        format!("modprobe {module}, or use a kernel built with {config}=y or =m")
    } else {
        format!("use a kernel built with {config}=y (this one loads no modules)")
    };
    match need(feature, tcx) {
        Need::Required(why) => Check::fail(feature.check_name(), format!("{what}: {why}"), remedy),
        Need::Optional(why) => Check::warn(feature.check_name(), format!("{what}: {why}"), remedy),
    }
}

fn interface(iface: &IfaceFacts, tcx: bool, privileged: bool) -> Vec<Check> {
    let Some(link) = &iface.link else {
        return vec![Check::fail(
            "interface",
            format!(
                "no interface named {:?} in this network namespace",
                iface.name
            ),
            "check the name with `ip link`; run doctor in the interface's namespace",
        )];
    };
    let name = &iface.name;
    vec![
        Check::pass("interface", format!("{name} exists")),
        root_qdisc(name, &link.root),
        ingress_qdisc(name, &link.ingress_slot, tcx),
        tx_queues(&link.tx_queues),
        offloads(link),
        running_shaper(name, link, privileged),
    ]
}

fn unreadable(name: &str, e: &str) -> Check {
    Check::warn(
        name,
        format!("could not read: {e}"),
        "run shaper doctor as root",
    )
}

fn root_qdisc(iface: &str, root: &Result<RootFacts, String>) -> Check {
    const NAME: &str = "root_qdisc";
    let root = match root {
        Ok(r) => r,
        Err(e) => return unreadable(NAME, e),
    };
    match root {
        RootFacts::Classful {
            kind,
            classes,
            filters,
            children,
        } => Check::fail(
            NAME,
            format!(
                "{kind} with {classes} class(es), {filters} filter(s), {children} child qdisc(s): shaper will not replace what it could not restore"
            ),
            format!("remove it if nothing needs it: tc qdisc del dev {iface} root"),
        ),
        RootFacts::Replaceable {
            kind,
            leaves,
            shapers: true,
        } => Check::pass(NAME, format!("shaper's {}", describe_root(kind, leaves))),
        RootFacts::Replaceable { kind, leaves, .. } if paces(kind, leaves) => {
            Check::pass(NAME, describe_root(kind, leaves))
        }
        RootFacts::Replaceable { kind, leaves, .. } => {
            let remedy = if kind == "mq" {
                format!(
                    "shaper puts mq with fq in its place while it runs; for pacing without it: sysctl -w net.core.default_qdisc=fq; tc qdisc replace dev {iface} root handle 1: mq"
                )
            } else {
                format!(
                    "shaper puts fq in its place while it runs; for pacing without it: tc qdisc replace dev {iface} root fq"
                )
            };
            Check::warn(
                NAME,
                format!(
                    "{}: does not pace by departure time",
                    describe_root(kind, leaves)
                ),
                remedy,
            )
        }
    }
}

/// fq at the root, or mq with fq on every queue.
fn paces(kind: &str, leaves: &[String]) -> bool {
    kind == "fq" || (kind == "mq" && !leaves.is_empty() && leaves.iter().all(|l| l == "fq"))
}

fn describe_root(kind: &str, leaves: &[String]) -> String {
    if leaves.is_empty() {
        return kind.to_string();
    }
    let mut kinds: Vec<&str> = leaves.iter().map(String::as_str).collect();
    kinds.sort_unstable();
    kinds.dedup();
    format!(
        "{kind} with {} on {} queue(s)",
        kinds.join("/"),
        leaves.len()
    )
}

fn ingress_qdisc(iface: &str, slot: &Result<Option<String>, String>, tcx: bool) -> Check {
    const NAME: &str = "ingress_qdisc";
    match slot {
        Err(e) => unreadable(NAME, e),
        Ok(None) => Check::pass(
            NAME,
            "none (shaper adds clsact when it needs it, and removes it)",
        ),
        Ok(Some(kind)) if kind == "ingress" => {
            let (detail, remedy) = (
                "an `ingress` qdisc holds the slot shaper needs for clsact",
                format!("remove it if nothing needs it: tc qdisc del dev {iface} ingress"),
            );
            if tcx {
                Check::warn(
                    NAME,
                    format!("{detail} (the segmenter and --ingress-rate)"),
                    remedy,
                )
            } else {
                Check::fail(NAME, format!("{detail} (to attach, without TCX)"), remedy)
            }
        }
        Ok(Some(kind)) => Check::pass(NAME, kind.as_str()),
    }
}

fn tx_queues(queues: &Result<u32, String>) -> Check {
    const NAME: &str = "tx_queues";
    match queues {
        Err(e) => unreadable(NAME, e),
        Ok(n) if *n > 1 => Check::pass(NAME, format!("{n}: shaper installs mq with an fq on each")),
        Ok(n) => Check::pass(NAME, format!("{n}: shaper installs one fq at the root")),
    }
}

fn offloads(link: &LinkFacts) -> Check {
    const NAME: &str = "offloads";
    let gso = match &link.gso {
        Ok(g) => g,
        Err(e) => return unreadable(NAME, e),
    };
    let Offloads {
        tso,
        gso: gso_on,
        gro,
    } = link.offloads;
    let state = |v: Option<bool>| match v {
        Some(true) => "on",
        Some(false) => "off",
        None => "n/a",
    };
    let mut detail = format!(
        "TSO {}, GSO {}, GRO {}; gso_max_size {}, gso_max_segs {}",
        state(tso),
        state(gso_on),
        state(gro),
        gso.max_size,
        gso.max_segs
    );
    if let Ok(Some(gro)) = &link.gro {
        detail += &format!(", gro_max_size {}", gro.max_size);
    }
    Check::pass(NAME, detail)
}

/// `privileged`: the process has shaper's capabilities, so its state files are readable to it.
fn running_shaper(iface: &str, link: &LinkFacts, privileged: bool) -> Check {
    const NAME: &str = "running_shaper";
    let reset = format!("shaper reset --iface {iface} (or start a shaper there: it takes over)");
    let root_is_shapers = matches!(link.root, Ok(RootFacts::Replaceable { shapers: true, .. }));
    match &link.shaper {
        Err(e) if !privileged => Check::warn(
            NAME,
            format!("could not read: {e}"),
            "run shaper doctor as root (shaper's state is root's alone)",
        ),
        // `shaper reset` needs the record too: a broken one goes first.
        Err(e) => Check::warn(
            NAME,
            format!("state file unreadable: {e}"),
            format!("remove that file, then: shaper reset --iface {iface}"),
        ),
        Ok(ShaperFacts::None) if root_is_shapers => Check::warn(
            NAME,
            "shaper's qdisc is installed, but no shaper has a record of it",
            reset,
        ),
        Ok(ShaperFacts::None) => Check::pass(NAME, "none"),
        Ok(ShaperFacts::Running { pid, rate_bps }) => Check::pass(
            NAME,
            format!(
                "shaper (pid {pid}) shapes it at {}: shaper stats --iface {iface}",
                DisplayRate(*rate_bps)
            ),
        ),
        Ok(ShaperFacts::Starting { pid }) => {
            Check::pass(NAME, format!("shaper (pid {pid}) is starting"))
        }
        Ok(ShaperFacts::Left { pid, rate_bps }) => Check::warn(
            NAME,
            format!(
                "shaper (pid {pid}) exited leaving it shaped at {} for the next one, with no control loop",
                DisplayRate(*rate_bps)
            ),
            format!(
                "start shaper there (it takes over in place), or: shaper reset --iface {iface}"
            ),
        ),
        Ok(ShaperFacts::Stale { pid }) => Check::warn(
            NAME,
            format!("shaper (pid {pid}) was killed: what it installed may be left, unshaped"),
            reset,
        ),
    }
}

fn tcp(tcp: &TcpFacts) -> Vec<Check> {
    let bbr_listed = tcp
        .available_congestion_control
        .as_ref()
        .map(|l| l.iter().any(|c| c == "bbr"));
    let bbr_available = bbr_listed == Some(true) || tcp.bbr_module.is_available();
    vec![
        default_qdisc(tcp.default_qdisc.as_deref()),
        congestion_control(
            tcp.congestion_control.as_deref(),
            bbr_available,
            bbr_listed == Some(true),
        ),
        bbr(bbr_listed, tcp.bbr_module),
        notsent_lowat(tcp.notsent_lowat),
    ]
}

fn default_qdisc(qdisc: Option<&str>) -> Check {
    const NAME: &str = "default_qdisc";
    match qdisc {
        Some("fq") => Check::pass(NAME, "fq"),
        Some(other) => Check::warn(
            NAME,
            format!("{other}: interfaces without shaper do not pace TCP"),
            "sysctl -w net.core.default_qdisc=fq (and in /etc/sysctl.d to keep it), or shaper tune --apply --persist",
        ),
        None => Check::warn(
            NAME,
            "not readable here: the setting is global, seen only in the initial network namespace",
            "run shaper doctor in the host's initial network namespace to check it",
        ),
    }
}

fn congestion_control(cc: Option<&str>, bbr_available: bool, bbr_listed: bool) -> Check {
    const NAME: &str = "congestion_control";
    match cc {
        Some("bbr") => Check::pass(NAME, "bbr"),
        Some(cc) if bbr_available => Check::warn(
            NAME,
            format!(
                "{cc}, with BBR available: BBR keeps the queue it builds at a bottleneck short"
            ),
            format!(
                "{}sysctl -w net.ipv4.tcp_congestion_control=bbr (and in /etc/sysctl.d to keep it), or shaper tune --apply --persist",
                if bbr_listed { "" } else { "modprobe tcp_bbr; " }
            ),
        ),
        Some(cc) => Check::pass(NAME, format!("{cc} (BBR is not available)")),
        None => Check::warn(
            NAME,
            "net.ipv4.tcp_congestion_control is not readable",
            "run shaper doctor as root in the host's network namespace",
        ),
    }
}

fn bbr(listed: Option<bool>, module: ModuleState) -> Check {
    const NAME: &str = "bbr";
    match (listed, module) {
        (Some(true), _) => Check::pass(NAME, "available"),
        (_, ModuleState::Loaded) => Check::pass(NAME, "available (module tcp_bbr loaded)"),
        (_, ModuleState::BuiltIn) => Check::pass(NAME, "available (built in)"),
        (_, ModuleState::Loadable) => Check::pass(NAME, "module tcp_bbr, loaded on first use"),
        (None, ModuleState::Unknown) => Check::warn(
            NAME,
            "could not tell: net.ipv4.tcp_available_congestion_control is not readable",
            "run shaper doctor in the host's network namespace",
        ),
        _ => Check::warn(
            NAME,
            "not in this kernel",
            "use a kernel built with CONFIG_TCP_CONG_BBR=y or =m",
        ),
    }
}

fn notsent_lowat(value: Option<i64>) -> Check {
    const NAME: &str = "tcp_notsent_lowat";
    let remedy = format!(
        "on servers: sysctl -w net.ipv4.tcp_notsent_lowat={NOTSENT_LOWAT_BYTES} (and in /etc/sysctl.d to keep it), or shaper tune --apply --persist"
    );
    match value {
        None => Check::warn(NAME, "not readable", remedy),
        Some(v) if !notsent_lowat_bounded(v) => Check::warn(
            NAME,
            "unset: each socket may queue its whole send buffer unsent, ahead of its newest data",
            remedy,
        ),
        Some(v) if v > NOTSENT_LOWAT_BYTES => Check::warn(
            NAME,
            format!("{v} bytes of unsent data per socket, above {NOTSENT_LOWAT_BYTES}"),
            remedy,
        ),
        Some(v) => Check::pass(NAME, format!("{v} bytes")),
    }
}

fn clocksource(clock: &ClockFacts) -> Check {
    const NAME: &str = "clocksource";
    let Some(current) = clock.current.as_deref() else {
        return Check::warn(
            NAME,
            "/sys/devices/system/clocksource/clocksource0/current_clocksource is not readable",
            "mount sysfs at /sys",
        );
    };
    if !SLOW_CLOCKS.contains(&current) {
        return Check::pass(NAME, current);
    }
    let detail = format!("{current}: slow to read, and shaper reads the clock for every packet");
    let faster = FAST_CLOCKS
        .iter()
        .find(|fast| clock.available.iter().any(|a| a == *fast));
    let remedy = match faster {
        Some(fast) => format!(
            "echo {fast} > /sys/devices/system/clocksource/clocksource0/current_clocksource (if the kernel did not reject it as unstable: dmesg | grep clocksource)"
        ),
        None => "none of tsc, arch_sys_counter, kvm-clock is available: a VM needs its host to offer kvm-clock or a stable TSC".to_string(),
    };
    Check::warn(NAME, detail, remedy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        doctor::report::Status,
        link::{GroLimits, GsoLimits},
    };

    fn healthy() -> Facts {
        Facts {
            kernel_release: "6.12.0".into(),
            tcx: true,
            loadable_modules: true,
            btf: BtfFacts {
                present: true,
                layout: Ok(()),
            },
            missing_capabilities: vec![],
            features: Feature::ALL
                .iter()
                .map(|&feature| FeatureFacts {
                    feature,
                    module: ModuleState::Loaded,
                    probe: ProbeOutcome::Works,
                })
                .collect(),
            tcp: TcpFacts {
                default_qdisc: Some("fq".into()),
                congestion_control: Some("bbr".into()),
                available_congestion_control: Some(vec!["reno".into(), "bbr".into()]),
                bbr_module: ModuleState::Loaded,
                notsent_lowat: Some(131_072),
            },
            clock: ClockFacts {
                current: Some("tsc".into()),
                available: vec!["tsc".into(), "hpet".into()],
            },
            iface: None,
        }
    }

    fn link() -> LinkFacts {
        LinkFacts {
            root: Ok(RootFacts::Replaceable {
                kind: "fq".into(),
                leaves: vec![],
                shapers: false,
            }),
            ingress_slot: Ok(None),
            tx_queues: Ok(1),
            offloads: Offloads {
                tso: Some(true),
                gso: Some(true),
                gro: Some(false),
            },
            gso: Ok(GsoLimits::UNKNOWN),
            gro: Ok(Some(GroLimits {
                max_size: 65_536,
                ipv4_max_size: Some(65_536),
            })),
            shaper: Ok(ShaperFacts::None),
        }
    }

    fn with_link(link: LinkFacts) -> Facts {
        Facts {
            iface: Some(IfaceFacts {
                name: "eth0".into(),
                link: Some(link),
            }),
            ..healthy()
        }
    }

    fn check<'a>(report: &'a Report, name: &str) -> &'a Check {
        report
            .checks
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no check {name} in {report:#?}"))
    }

    fn status(facts: &Facts, name: &str) -> Status {
        check(&judge(facts), name).status
    }

    fn set_feature(facts: &mut Facts, feature: Feature, module: ModuleState, probe: ProbeOutcome) {
        let f = facts
            .features
            .iter_mut()
            .find(|f| f.feature == feature)
            .unwrap();
        f.module = module;
        f.probe = probe;
    }

    #[test]
    fn a_healthy_host_passes_everything() {
        let report = judge(&with_link(link()));
        let not_passed: Vec<_> = report
            .checks
            .iter()
            .filter(|c| c.status != Status::Pass)
            .collect();
        assert!(not_passed.is_empty(), "{not_passed:#?}");
        assert_eq!((report.failed, report.warned), (0, 0));
        assert!(report.checks.iter().all(|c| c.remedy.is_none()));
    }

    #[test]
    fn every_check_that_does_not_pass_has_a_remedy() {
        let mut facts = with_link(LinkFacts {
            root: Err("EPERM".into()),
            ingress_slot: Ok(Some("ingress".into())),
            shaper: Ok(ShaperFacts::Stale { pid: 7 }),
            ..link()
        });
        facts.tcx = false;
        facts.missing_capabilities = vec!["CAP_BPF"];
        facts.btf.present = false;
        for feature in Feature::ALL {
            set_feature(
                &mut facts,
                feature,
                ModuleState::Absent,
                ProbeOutcome::Missing,
            );
        }
        facts.tcp = TcpFacts {
            default_qdisc: None,
            congestion_control: Some("cubic".into()),
            available_congestion_control: None,
            bbr_module: ModuleState::Unknown,
            notsent_lowat: Some(-1),
        };
        facts.clock.current = Some("hpet".into());
        let report = judge(&facts);
        for c in &report.checks {
            assert_eq!(
                c.remedy.is_some(),
                c.status != Status::Pass,
                "{c:#?} (a remedy exactly where it does not pass)"
            );
            assert!(!c.remedy.as_deref().is_some_and(str::is_empty));
        }
        assert!(report.failed >= 5, "{report:#?}");
    }

    #[test]
    fn missing_fq_fails_and_says_how_to_get_it() {
        let mut facts = healthy();
        set_feature(
            &mut facts,
            Feature::Fq,
            ModuleState::Unknown,
            ProbeOutcome::Missing,
        );
        facts.loadable_modules = false;
        let report = judge(&facts);
        let fq = check(&report, "sch_fq");
        assert_eq!(fq.status, Status::Fail);
        assert!(
            fq.remedy
                .as_deref()
                .unwrap()
                .contains("CONFIG_NET_SCH_FQ=y")
        );
        assert_eq!(report.failed, 1);
        // A kernel that loads modules is told to load it first.
        facts.loadable_modules = true;
        let report = judge(&facts);
        assert!(
            check(&report, "sch_fq")
                .remedy
                .as_deref()
                .unwrap()
                .starts_with("modprobe sch_fq")
        );
    }

    #[test]
    fn the_attachment_pieces_are_required_only_without_tcx() {
        for feature in [Feature::Clsact, Feature::ClsBpf] {
            let mut facts = healthy();
            set_feature(
                &mut facts,
                feature,
                ModuleState::Absent,
                ProbeOutcome::Missing,
            );
            assert_eq!(status(&facts, feature.check_name()), Status::Warn);
            facts.tcx = false;
            assert_eq!(status(&facts, feature.check_name()), Status::Fail);
        }
        // The ingress and segmenter pieces only ever warn.
        for feature in [Feature::Ifb, Feature::Mirred, Feature::Matchall] {
            let mut facts = healthy();
            facts.tcx = false;
            set_feature(
                &mut facts,
                feature,
                ModuleState::Absent,
                ProbeOutcome::Missing,
            );
            assert_eq!(status(&facts, feature.check_name()), Status::Warn);
        }
    }

    #[test]
    fn without_tcx_the_netlink_fallback_warns() {
        let mut facts = healthy();
        facts.tcx = false;
        facts.kernel_release = "6.1.0-28-cloud-amd64".into();
        let report = judge(&facts);
        let tcx = check(&report, "tcx");
        assert_eq!(tcx.status, Status::Warn);
        assert!(tcx.detail.contains("6.1.0-28"), "{tcx:?}");
        assert_eq!(report.failed, 0);
    }

    #[test]
    fn a_loadable_module_passes_unprobed_and_the_module_lists_decide_when_the_probe_cannot() {
        let mut facts = healthy();
        set_feature(
            &mut facts,
            Feature::Fq,
            ModuleState::Loadable,
            ProbeOutcome::Skipped,
        );
        assert_eq!(status(&facts, "sch_fq"), Status::Pass);
        let denied = || ProbeOutcome::Failed("creating a network namespace: EPERM".into());
        set_feature(&mut facts, Feature::Fq, ModuleState::BuiltIn, denied());
        assert_eq!(status(&facts, "sch_fq"), Status::Pass);
        set_feature(&mut facts, Feature::Fq, ModuleState::Absent, denied());
        assert_eq!(status(&facts, "sch_fq"), Status::Fail);
        // Neither the probe nor the lists can tell: a warning, not a guess.
        set_feature(&mut facts, Feature::Fq, ModuleState::Unknown, denied());
        let report = judge(&facts);
        assert_eq!(check(&report, "sch_fq").status, Status::Warn);
        assert!(check(&report, "sch_fq").detail.contains("EPERM"));
        // The probe's word wins over the lists'.
        set_feature(
            &mut facts,
            Feature::Fq,
            ModuleState::Absent,
            ProbeOutcome::Works,
        );
        assert_eq!(status(&facts, "sch_fq"), Status::Pass);
        set_feature(
            &mut facts,
            Feature::Fq,
            ModuleState::Unknown,
            ProbeOutcome::Missing,
        );
        assert_eq!(status(&facts, "sch_fq"), Status::Fail);
    }

    #[test]
    fn btf_and_privileges_fail_when_missing_and_the_layout_only_warns() {
        let mut facts = healthy();
        facts.missing_capabilities = vec!["CAP_NET_ADMIN", "CAP_PERFMON"];
        let report = judge(&facts);
        let caps = check(&report, "capabilities");
        assert_eq!(caps.status, Status::Fail);
        assert!(caps.detail.contains("CAP_NET_ADMIN, CAP_PERFMON"));
        let mut facts = healthy();
        facts.btf.layout = Err("struct net has no member ns".into());
        assert_eq!(status(&facts, "btf"), Status::Warn);
        facts.btf.present = false;
        assert_eq!(status(&facts, "btf"), Status::Fail);
    }

    #[test]
    fn a_missing_interface_fails_and_stops_its_other_checks() {
        let mut facts = healthy();
        facts.iface = Some(IfaceFacts {
            name: "nosuch0".into(),
            link: None,
        });
        let report = judge(&facts);
        assert_eq!(check(&report, "interface").status, Status::Fail);
        assert!(report.checks.iter().all(|c| c.name != "root_qdisc"));
        assert_eq!(report.failed, 1);
    }

    fn root(kind: &str, leaves: &[&str], shapers: bool) -> LinkFacts {
        LinkFacts {
            root: Ok(RootFacts::Replaceable {
                kind: kind.into(),
                leaves: leaves.iter().map(|l| l.to_string()).collect(),
                shapers,
            }),
            ..link()
        }
    }

    #[test]
    fn fq_or_mq_of_fq_pass_and_other_roots_warn_with_the_way_to_fq() {
        assert_eq!(
            status(&with_link(root("fq", &[], false)), "root_qdisc"),
            Status::Pass
        );
        let mq_fq = with_link(root("mq", &["fq", "fq"], false));
        assert_eq!(status(&mq_fq, "root_qdisc"), Status::Pass);
        let report = judge(&with_link(root("mq", &["fq", "fq_codel"], false)));
        let mixed = check(&report, "root_qdisc");
        assert_eq!(mixed.status, Status::Warn);
        assert!(
            mixed.detail.contains("fq/fq_codel on 2 queue(s)"),
            "{mixed:?}"
        );
        assert!(
            mixed
                .remedy
                .as_deref()
                .unwrap()
                .contains("default_qdisc=fq")
        );
        // An mq without leaves listed does not pace.
        assert_eq!(
            status(&with_link(root("mq", &[], false)), "root_qdisc"),
            Status::Warn
        );
        let report = judge(&with_link(root("noqueue", &[], false)));
        let noqueue = check(&report, "root_qdisc");
        assert_eq!(noqueue.status, Status::Warn);
        assert!(
            noqueue
                .remedy
                .as_deref()
                .unwrap()
                .contains("tc qdisc replace dev eth0 root fq")
        );
        // A root shaper put there passes whatever it is.
        let report = judge(&with_link(root("mq", &["fq"; 4], true)));
        assert!(
            check(&report, "root_qdisc")
                .detail
                .starts_with("shaper's mq")
        );
    }

    #[test]
    fn a_classful_root_fails_as_shaper_refuses_it() {
        let facts = with_link(LinkFacts {
            root: Ok(RootFacts::Classful {
                kind: "htb".into(),
                classes: 2,
                filters: 0,
                children: 0,
            }),
            ..link()
        });
        let report = judge(&facts);
        let root = check(&report, "root_qdisc");
        assert_eq!(root.status, Status::Fail);
        assert_eq!(
            root.remedy.as_deref(),
            Some("remove it if nothing needs it: tc qdisc del dev eth0 root")
        );
    }

    #[test]
    fn an_ingress_qdisc_fails_only_where_attaching_needs_clsact() {
        let mut facts = with_link(LinkFacts {
            ingress_slot: Ok(Some("ingress".into())),
            ..link()
        });
        assert_eq!(status(&facts, "ingress_qdisc"), Status::Warn);
        facts.tcx = false;
        assert_eq!(status(&facts, "ingress_qdisc"), Status::Fail);
        let clsact = with_link(LinkFacts {
            ingress_slot: Ok(Some("clsact".into())),
            ..link()
        });
        assert_eq!(status(&clsact, "ingress_qdisc"), Status::Pass);
    }

    #[test]
    fn queues_and_offloads_are_reported() {
        let report = judge(&with_link(LinkFacts {
            tx_queues: Ok(8),
            ..link()
        }));
        assert!(
            check(&report, "tx_queues")
                .detail
                .starts_with("8: shaper installs mq")
        );
        assert_eq!(
            check(&report, "offloads").detail,
            "TSO on, GSO on, GRO off; gso_max_size 65536, gso_max_segs 65535, gro_max_size 65536"
        );
        let report = judge(&with_link(LinkFacts {
            offloads: Offloads::default(),
            gro: Ok(None),
            ..link()
        }));
        assert_eq!(
            check(&report, "offloads").detail,
            "TSO n/a, GSO n/a, GRO n/a; gso_max_size 65536, gso_max_segs 65535"
        );
    }

    #[test]
    fn a_killed_shaper_or_its_orphaned_qdisc_warns_to_reset() {
        let stale = with_link(LinkFacts {
            shaper: Ok(ShaperFacts::Stale { pid: 42 }),
            ..link()
        });
        let report = judge(&stale);
        let running = check(&report, "running_shaper");
        assert_eq!(running.status, Status::Warn);
        assert!(running.detail.contains("pid 42"));
        assert!(
            running
                .remedy
                .as_deref()
                .unwrap()
                .starts_with("shaper reset --iface eth0")
        );
        // Left for a successor: taking over is the remedy, resetting the other way.
        let left = with_link(LinkFacts {
            shaper: Ok(ShaperFacts::Left {
                pid: 42,
                rate_bps: 50_000_000,
            }),
            ..link()
        });
        let report = judge(&left);
        let running = check(&report, "running_shaper");
        assert_eq!(running.status, Status::Warn);
        assert!(running.detail.contains("pid 42") && running.detail.contains("50Mbit"));
        assert!(
            running
                .remedy
                .as_deref()
                .unwrap()
                .starts_with("start shaper there")
        );
        // A record that cannot be read: as root, it is broken and goes before a reset.
        let broken = with_link(LinkFacts {
            shaper: Err("state file /run/shaper/1-2.json is unreadable: EOF".into()),
            ..link()
        });
        let report = judge(&broken);
        assert!(
            check(&report, "running_shaper")
                .remedy
                .as_deref()
                .unwrap()
                .starts_with("remove that file")
        );
        let mut denied = broken.clone();
        denied.missing_capabilities = vec!["CAP_NET_ADMIN"];
        let report = judge(&denied);
        assert!(
            check(&report, "running_shaper")
                .remedy
                .as_deref()
                .unwrap()
                .starts_with("run shaper doctor as root")
        );
        let orphan = with_link(root("fq", &[], true));
        assert_eq!(status(&orphan, "running_shaper"), Status::Warn);
        let live = with_link(LinkFacts {
            shaper: Ok(ShaperFacts::Running {
                pid: 9,
                rate_bps: 100_000_000,
            }),
            ..root("fq", &[], true)
        });
        let report = judge(&live);
        assert_eq!(check(&report, "running_shaper").status, Status::Pass);
        assert_eq!(check(&report, "root_qdisc").status, Status::Pass);
    }

    fn with_tcp(edit: impl FnOnce(&mut TcpFacts)) -> Report {
        let mut facts = healthy();
        edit(&mut facts.tcp);
        judge(&facts)
    }

    #[test]
    fn default_qdisc_other_than_fq_warns_and_unreadable_says_where_to_look() {
        let report = with_tcp(|t| t.default_qdisc = Some("pfifo_fast".into()));
        let dq = check(&report, "default_qdisc");
        assert_eq!(dq.status, Status::Warn);
        assert!(
            dq.remedy
                .as_deref()
                .unwrap()
                .starts_with("sysctl -w net.core.default_qdisc=fq")
        );
        let report = with_tcp(|t| t.default_qdisc = None);
        let dq = check(&report, "default_qdisc");
        assert_eq!(dq.status, Status::Warn);
        assert!(dq.detail.contains("initial network namespace"));
    }

    #[test]
    fn congestion_control_other_than_bbr_warns_only_when_bbr_can_be_had() {
        let report = with_tcp(|t| t.congestion_control = Some("cubic".into()));
        let cc = check(&report, "congestion_control");
        assert_eq!(cc.status, Status::Warn);
        assert!(
            cc.remedy
                .as_deref()
                .unwrap()
                .starts_with("sysctl -w net.ipv4.tcp_congestion_control=bbr")
        );
        // BBR as a module not loaded yet: load it first.
        let report = with_tcp(|t| {
            t.congestion_control = Some("cubic".into());
            t.available_congestion_control = Some(vec!["reno".into(), "cubic".into()]);
            t.bbr_module = ModuleState::Loadable;
        });
        assert!(
            check(&report, "congestion_control")
                .remedy
                .as_deref()
                .unwrap()
                .starts_with("modprobe tcp_bbr; sysctl")
        );
        assert_eq!(check(&report, "bbr").status, Status::Pass);
        // No BBR at all: cubic is the best there is.
        let report = with_tcp(|t| {
            t.congestion_control = Some("cubic".into());
            t.available_congestion_control = Some(vec!["reno".into(), "cubic".into()]);
            t.bbr_module = ModuleState::Absent;
        });
        assert_eq!(check(&report, "congestion_control").status, Status::Pass);
        assert_eq!(check(&report, "bbr").status, Status::Warn);
        // The module lists speak when the sysctl cannot be read, and only they cannot tell.
        for (module, expected) in [
            (ModuleState::Loaded, Status::Pass),
            (ModuleState::BuiltIn, Status::Pass),
            (ModuleState::Absent, Status::Warn),
            (ModuleState::Unknown, Status::Warn),
        ] {
            let report = with_tcp(|t| {
                t.available_congestion_control = None;
                t.bbr_module = module;
            });
            assert_eq!(check(&report, "bbr").status, expected, "{module:?}");
        }
    }

    #[test]
    fn notsent_lowat_unset_or_above_128k_warns() {
        for (value, expected) in [
            (Some(4_294_967_295), Status::Warn),
            (Some(-1), Status::Warn),
            (Some(131_073), Status::Warn),
            (None, Status::Warn),
            (Some(131_072), Status::Pass),
            (Some(16_384), Status::Pass),
            (Some(0), Status::Pass),
        ] {
            let report = with_tcp(|t| t.notsent_lowat = value);
            let c = check(&report, "tcp_notsent_lowat");
            assert_eq!(c.status, expected, "{value:?}: {c:?}");
            if expected == Status::Warn {
                assert!(
                    c.remedy
                        .as_deref()
                        .unwrap()
                        .contains("sysctl -w net.ipv4.tcp_notsent_lowat=131072")
                );
            }
        }
    }

    #[test]
    fn slow_clock_sources_warn_and_point_to_a_fast_one_when_there_is_one() {
        let clock = |current: &str, available: &[&str]| {
            let mut facts = healthy();
            facts.clock = ClockFacts {
                current: Some(current.into()),
                available: available.iter().map(|a| a.to_string()).collect(),
            };
            judge(&facts)
        };
        for fast in ["tsc", "arch_sys_counter", "kvm-clock"] {
            assert_eq!(
                check(&clock(fast, &[fast]), "clocksource").status,
                Status::Pass
            );
        }
        let report = clock("hpet", &["hpet", "acpi_pm", "tsc"]);
        let c = check(&report, "clocksource");
        assert_eq!(c.status, Status::Warn);
        assert!(c.remedy.as_deref().unwrap().starts_with("echo tsc > "));
        let report = clock("acpi_pm", &["acpi_pm", "jiffies"]);
        let c = check(&report, "clocksource");
        assert_eq!(c.status, Status::Warn);
        assert!(c.remedy.as_deref().unwrap().starts_with("none of tsc"));
        assert_eq!(
            check(&clock("jiffies", &[]), "clocksource").status,
            Status::Warn
        );
        // One not known to be slow is not second-guessed.
        assert_eq!(
            check(&clock("xen", &["xen"]), "clocksource").status,
            Status::Pass
        );
    }
}
