//! What a running shaper records in its interface's state file (`runtime`): enough for `shaper
//! stats` to find its maps, for exit to undo what it set up, and for a successor after a crash,
//! or `shaper reset`, to do the same. Plain data, serialised as JSON.

use serde::{Deserialize, Serialize};

use crate::{
    link::{self, GroLimits, GsoLimits, Interface},
    qdisc::Snapshot,
};

/// How the program is attached, so teardown and crash recovery undo the right thing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttachMode {
    Tcx,
    Netlink,
}

/// Kernel ids of the running instance's maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapIds {
    pub config: u32,
    pub stats: u32,
    pub hosts: u32,
    pub flows: u32,
    pub host_rates: u32,
    /// 0 in state files written before it was recorded.
    #[serde(default)]
    pub levels: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    pub pid: u32,
    pub iface: String,
    pub ifindex: u32,
    pub rate_bps: u64,
    pub horizon_ns: u64,
    /// Isolation mode name (see `shaper_common::isolation`).
    pub isolation: String,
    /// DiffServ mode name (see `shaper_common::diffserv`).
    #[serde(default)]
    pub diffserv: String,
    pub started_unix_s: u64,
    /// Written before shaper changes the interface, so that a successor can undo a start that
    /// crashed half-way; `stats` answers once it is false.
    #[serde(default)]
    pub starting: bool,
    /// The process left the interface shaped for the next one (`shaper run --keep`): its
    /// programs run on at the last levels, with no control loop.
    #[serde(default)]
    pub kept: bool,
    pub attach: AttachMode,
    /// shaper added the clsact qdisc (netlink attach) and removes it on exit.
    pub clsact_added: bool,
    /// The interface's qdiscs before shaper, restored on exit.
    pub original: Snapshot,
    /// The device's GSO limits before shaper lowered them (restored on exit); `None` when
    /// shaper left them alone.
    #[serde(default)]
    pub original_gso: Option<GsoLimits>,
    /// The ingress direction's IFB and redirect (`--ingress-rate`), undone on exit.
    #[serde(default)]
    pub ingress: Option<IngressState>,
    /// The segmenter's IFB and filter (`segmenter`), undone on exit.
    #[serde(default)]
    pub segmenter: Option<SegmenterState>,
    pub maps: MapIds,
}

/// What ingress shaping set up, in the interface's state file, so that exit (or the next
/// shaper, after a crash) undoes exactly that.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngressState {
    pub ifb: String,
    /// shaper added clsact to the interface for the redirect and removes it on exit.
    pub clsact_added: bool,
    /// The interface's GRO limits before shaper lowered them; `None` when it left them alone.
    pub original_gro: Option<GroLimits>,
}

impl IngressState {
    /// Recorded before anything is set up, so that a crash half-way leaves a record of the IFB.
    pub fn planned(ifb: &str) -> Self {
        Self {
            ifb: ifb.to_string(),
            clsact_added: false,
            original_gro: None,
        }
    }
}

/// What the segmenter set up, in the interface's state file, so that exit (or the next shaper,
/// after a crash) undoes exactly that.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmenterState {
    pub ifb: String,
    /// shaper added clsact to the interface for the segmenter's filter (TCX attach needs none
    /// of its own) and removes it on exit.
    pub clsact_added: bool,
}

impl SegmenterState {
    /// Recorded before anything is set up, so that a crash half-way leaves a record of the IFB.
    pub fn planned(iface: &Interface) -> Self {
        Self {
            ifb: link::SEGMENTER_IFB.name(iface),
            clsact_added: false,
        }
    }
}

/// A state file's content for tests: shaper on `iface` (ifindex 2, pid 1) at 1 Mbit/s,
/// triple-isolate, TCX, maps 1 to 6.
#[cfg(test)]
pub fn example(iface: &str) -> State {
    State {
        pid: 1,
        iface: iface.into(),
        ifindex: 2,
        rate_bps: 1_000_000,
        horizon_ns: 2_000_000_000,
        isolation: "triple-isolate".into(),
        diffserv: "besteffort".into(),
        started_unix_s: 0,
        starting: false,
        kept: false,
        attach: AttachMode::Tcx,
        clsact_added: false,
        original: Default::default(),
        original_gso: None,
        ingress: None,
        segmenter: None,
        maps: MapIds {
            config: 1,
            stats: 2,
            hosts: 3,
            flows: 4,
            host_rates: 5,
            levels: 6,
        },
    }
}
