//! What `shaper doctor` observed, as plain data: the input of [`super::verdict`]. A fact that
//! could not be read is an `Err` with the reason, so the verdict can say so rather than guess.

use super::modules::ModuleState;
use crate::link::{GroLimits, GsoLimits};

/// A kernel piece shaper uses through tc or rtnetlink, found by creating it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// The qdisc that releases packets at their stamped departure times.
    Fq,
    /// The qdisc that programs and filters hang under without TCX.
    Clsact,
    /// The BPF classifier: the netlink attachment, and the segmenter's filter.
    ClsBpf,
    /// The devices of the segmenter and of ingress shaping.
    Ifb,
    /// The action that redirects to those devices.
    Mirred,
    /// The classifier of the ingress redirect.
    Matchall,
}

impl Feature {
    pub const ALL: [Feature; 6] = [
        Self::Fq,
        Self::Clsact,
        Self::ClsBpf,
        Self::Ifb,
        Self::Mirred,
        Self::Matchall,
    ];

    /// The check's name, as `tc` and the module lists call it.
    pub fn check_name(self) -> &'static str {
        match self {
            Self::Fq => "sch_fq",
            Self::Clsact => "clsact",
            Self::ClsBpf => "cls_bpf",
            Self::Ifb => "ifb",
            Self::Mirred => "act_mirred",
            Self::Matchall => "cls_matchall",
        }
    }

    /// The module that provides it.
    pub fn module(self) -> &'static str {
        match self {
            Self::Clsact => "sch_ingress",
            other => other.check_name(),
        }
    }

    /// The kernel option that builds it.
    pub fn config(self) -> &'static str {
        match self {
            Self::Fq => crate::qdisc::FQ_KCONFIG,
            Self::Clsact => crate::clsact::CLSACT_KCONFIG,
            Self::ClsBpf => "CONFIG_NET_CLS_BPF",
            Self::Ifb => "CONFIG_IFB",
            Self::Mirred => "CONFIG_NET_ACT_MIRRED",
            Self::Matchall => "CONFIG_NET_CLS_MATCHALL",
        }
    }
}

/// What creating a feature's object in a throwaway network namespace gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The kernel created it (or looked its kind up).
    Works,
    /// The kernel has no such kind.
    Missing,
    /// Not tried: it is a module not loaded, which trying would load.
    Skipped,
    /// The probe could not run or ended in another error (no privileges, a feature it needs
    /// missing).
    Failed(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureFacts {
    pub feature: Feature,
    pub module: ModuleState,
    pub probe: ProbeOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BtfFacts {
    /// /sys/kernel/btf/vmlinux exists.
    pub present: bool,
    /// The members the dequeue observer reads were found in it.
    pub layout: Result<(), String>,
}

/// The host's TCP settings that shape what reaches the shaper (sysctls; `None`: unreadable,
/// e.g. a global one outside the initial network namespace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpFacts {
    pub default_qdisc: Option<String>,
    pub congestion_control: Option<String>,
    pub available_congestion_control: Option<Vec<String>>,
    pub bbr_module: ModuleState,
    /// As the kernel prints it: an unsigned int (4294967295 when unset), -1 on old kernels.
    pub notsent_lowat: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClockFacts {
    pub current: Option<String>,
    pub available: Vec<String>,
}

/// The interface's TSO, GSO and GRO offloads (`None`: the device does not say).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Offloads {
    pub tso: Option<bool>,
    pub gso: Option<bool>,
    pub gro: Option<bool>,
}

/// The interface's root qdisc as it bears on shaper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootFacts {
    /// A root shaper can replace and put back: its kind, and the kinds of its per-queue
    /// leaves under `mq`.
    Replaceable {
        kind: String,
        leaves: Vec<String>,
        shapers: bool,
    },
    /// Classes or filters shaper could not restore: it refuses the interface.
    Classful {
        kind: String,
        classes: usize,
        filters: usize,
        children: usize,
    },
}

/// A shaper's record of the interface (its state file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShaperFacts {
    None,
    Running {
        pid: u32,
        rate_bps: u64,
    },
    Starting {
        pid: u32,
    },
    /// The process that wrote it is gone (killed): what it installed may still be there.
    Stale {
        pid: u32,
    },
    /// The process that wrote it exited leaving the interface shaped for the next one
    /// (`shaper run --keep`, SIGUSR2): its data path runs on at the last levels.
    Left {
        pid: u32,
        rate_bps: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkFacts {
    pub root: Result<RootFacts, String>,
    /// The kind of qdisc in the ingress slot (`clsact`, `ingress`), if any.
    pub ingress_slot: Result<Option<String>, String>,
    pub tx_queues: Result<u32, String>,
    pub offloads: Offloads,
    pub gso: Result<GsoLimits, String>,
    /// `None` on kernels without GRO limits (< 5.19).
    pub gro: Result<Option<GroLimits>, String>,
    pub shaper: Result<ShaperFacts, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfaceFacts {
    pub name: String,
    /// `None`: no such interface in this network namespace.
    pub link: Option<LinkFacts>,
}

/// Everything `shaper doctor` looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub kernel_release: String,
    /// Programs attach through TCX (what `shaper run` decides from the kernel's version).
    pub tcx: bool,
    /// The kernel loads modules (it has /proc/modules): a missing piece may be a modprobe away.
    pub loadable_modules: bool,
    pub btf: BtfFacts,
    /// Capabilities shaper needs that this process lacks.
    pub missing_capabilities: Vec<&'static str>,
    pub features: Vec<FeatureFacts>,
    pub tcp: TcpFacts,
    pub clock: ClockFacts,
    pub iface: Option<IfaceFacts>,
}
