//! Observes this host into [`Facts`]: reads only, except for what [`netns_probe`] creates in a
//! namespace of its own.

use std::path::Path;

use super::{
    facts::{
        BtfFacts, ClockFacts, Facts, Feature, FeatureFacts, IfaceFacts, LinkFacts, Offloads,
        ProbeOutcome, RootFacts, ShaperFacts, TcpFacts,
    },
    modules::{ModuleLists, ModuleState},
    netns_probe,
};
use crate::{
    kernel_btf::{self, KernelBtf},
    link::{Interface, Offload},
    netlink::Socket,
    probe,
    qdisc::{self, QdiscError},
    runtime,
};

const CLOCKSOURCE_DIR: &str = "/sys/devices/system/clocksource/clocksource0";

/// Everything the checks need; with `iface`, that interface's facts too.
pub fn gather(iface: Option<&str>) -> Facts {
    let modules = ModuleLists::read();
    Facts {
        kernel_release: read("/proc/sys/kernel/osrelease").unwrap_or_default(),
        tcx: probe::has_tcx(),
        loadable_modules: Path::new("/proc/modules").exists(),
        btf: BtfFacts {
            present: Path::new(kernel_btf::VMLINUX).exists(),
            layout: KernelBtf::running()
                .and_then(|btf| kernel_btf::dequeue_watch(&btf))
                .map(drop)
                .map_err(|e| e.to_string()),
        },
        missing_capabilities: probe::missing_privileges(),
        features: features(&modules),
        tcp: TcpFacts {
            default_qdisc: read("/proc/sys/net/core/default_qdisc"),
            congestion_control: read("/proc/sys/net/ipv4/tcp_congestion_control"),
            available_congestion_control: read(
                "/proc/sys/net/ipv4/tcp_available_congestion_control",
            )
            .map(|l| l.split_whitespace().map(String::from).collect()),
            bbr_module: modules.state("tcp_bbr"),
            notsent_lowat: read("/proc/sys/net/ipv4/tcp_notsent_lowat")
                .and_then(|v| v.parse().ok()),
        },
        clock: ClockFacts {
            current: read(&format!("{CLOCKSOURCE_DIR}/current_clocksource")),
            available: read(&format!("{CLOCKSOURCE_DIR}/available_clocksource"))
                .map(|l| l.split_whitespace().map(String::from).collect())
                .unwrap_or_default(),
        },
        iface: iface.map(|name| IfaceFacts {
            name: name.to_string(),
            link: Interface::lookup(name).ok().map(|i| link(&i)),
        }),
    }
}

/// A file's contents, trimmed; `None` when it cannot be read.
fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|t| t.trim().to_string())
}

/// Each feature's module state and probe. A module on disk and not loaded is not probed:
/// creating its object would load it.
fn features(modules: &ModuleLists) -> Vec<FeatureFacts> {
    let states: Vec<(Feature, ModuleState)> = Feature::ALL
        .iter()
        .map(|&f| (f, modules.state(f.module())))
        .collect();
    let skip: Vec<Feature> = states
        .iter()
        .filter(|(_, m)| *m == ModuleState::Loadable)
        .map(|(f, _)| *f)
        .collect();
    let probed = netns_probe::probe(&skip);
    states
        .into_iter()
        .map(|(feature, module)| FeatureFacts {
            feature,
            module,
            probe: probed
                .iter()
                .find(|(f, _)| *f == feature)
                .map(|(_, p)| p.clone())
                .unwrap_or(ProbeOutcome::Skipped),
        })
        .collect()
}

fn link(iface: &Interface) -> LinkFacts {
    let mut sock = match Socket::open() {
        Ok(s) => s,
        Err(e) => return unreadable_link(&e.to_string()),
    };
    let sock = &mut sock;
    let text = |e: &dyn std::fmt::Display| e.to_string();
    LinkFacts {
        root: root(sock, iface),
        ingress_slot: qdisc::ingress_slot(sock, iface.ifindex).map_err(|e| text(&e)),
        tx_queues: iface.num_tx_queues(sock).map_err(|e| text(&e)),
        offloads: Offloads {
            tso: iface.offload(Offload::Tso),
            gso: iface.offload(Offload::Gso),
            gro: iface.offload(Offload::Gro),
        },
        gso: iface.gso_limits(sock).map_err(|e| text(&e)),
        gro: iface.gro_limits(sock).map_err(|e| text(&e)),
        shaper: shaper(iface),
    }
}

fn unreadable_link(e: &str) -> LinkFacts {
    LinkFacts {
        root: Err(e.into()),
        ingress_slot: Err(e.into()),
        tx_queues: Err(e.into()),
        offloads: Offloads::default(),
        gso: Err(e.into()),
        gro: Err(e.into()),
        shaper: Err(e.into()),
    }
}

/// The root as shaper's reconciler sees it (the same snapshot `shaper run` takes).
fn root(sock: &mut Socket, iface: &Interface) -> Result<RootFacts, String> {
    match qdisc::snapshot(sock, iface.ifindex, &iface.name) {
        Ok(snapshot) => {
            let root = snapshot.root.as_ref();
            Ok(RootFacts::Replaceable {
                kind: root.map_or_else(|| "none".to_string(), |r| r.kind.clone()),
                leaves: snapshot.leaves.iter().map(|l| l.kind.clone()).collect(),
                shapers: root.is_some_and(|r| r.is_shaper()),
            })
        }
        Err(QdiscError::ClassfulRoot {
            kind,
            children,
            classes,
            filters,
            ..
        }) => Ok(RootFacts::Classful {
            kind,
            classes,
            filters,
            children,
        }),
        Err(e) => Err(e.to_string()),
    }
}

fn shaper(iface: &Interface) -> Result<ShaperFacts, String> {
    let Some(state) = runtime::read_state(iface).map_err(|e| e.to_string())? else {
        return Ok(ShaperFacts::None);
    };
    Ok(if state.kept && !runtime::process_alive(state.pid) {
        ShaperFacts::Left {
            pid: state.pid,
            rate_bps: state.rate_bps,
        }
    } else if !runtime::process_alive(state.pid) {
        ShaperFacts::Stale { pid: state.pid }
    } else if state.starting {
        ShaperFacts::Starting { pid: state.pid }
    } else {
        ShaperFacts::Running {
            pid: state.pid,
            rate_bps: state.rate_bps,
        }
    })
}
