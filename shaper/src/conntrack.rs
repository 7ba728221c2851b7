//! `--nat`: where the data path finds a packet's conntrack entry and its tuples
//! (`shaper_common::conntrack`), from the running kernel's BTF, and the data path told.

use shaper_common::conntrack::ConntrackLayout;
use tracing::warn;

use shaper_common::names::map_names;

use crate::{
    bpf::{BpfError, Datapath},
    config::StateParams,
    handover,
    kernel_btf::{self, BtfError, KernelBtf},
    link::Interface,
    runtime,
};

/// The running kernel's layout: `nf_conn` from the kernel's own BTF where conntrack is built
/// in, from the `nf_conntrack` module's where it is loaded. Read once per process.
pub fn layout() -> Result<ConntrackLayout, BtfError> {
    static LAYOUT: std::sync::OnceLock<ConntrackLayout> = std::sync::OnceLock::new();
    if let Some(layout) = LAYOUT.get() {
        return Ok(*layout);
    }
    let kernel = KernelBtf::running()?;
    let layout = match KernelBtf::module(&kernel, "nf_conntrack")? {
        Some(module) => kernel_btf::conntrack_layout(&kernel, &module)?,
        None => kernel_btf::conntrack_layout(&kernel, &kernel)?,
    };
    Ok(*LAYOUT.get_or_init(|| layout))
}

/// Tells the data path of `iface` to classify hosts by their addresses before NAT, or not.
/// Where the kernel has no conntrack (the module not loaded), shaping goes on by the packets'
/// own addresses, with a warning: a NAT rule loads the module, and a reload then finds it.
/// `replies`: the data path is the ingress direction's, which finds its packets' hosts in the
/// egress direction's flows ([`load_replies_side`]).
pub fn apply(
    datapath: &mut Datapath,
    wanted: bool,
    replies: bool,
    iface: &str,
) -> Result<(), BpfError> {
    if wanted && replies {
        return datapath.set_conntrack(&ConntrackLayout {
            replies: 1,
            ..ConntrackLayout::default()
        });
    }
    let layout = if wanted {
        layout().unwrap_or_else(|e| {
            warn!(
                "{iface}: --nat: no conntrack in the running kernel ({e}): hosts are told apart \
                 by the packets' own addresses; load nf_conntrack (a NAT rule does) and reload"
            );
            ConntrackLayout::default()
        })
    } else {
        ConntrackLayout::default()
    };
    datapath.set_conntrack(&layout)
}

/// Loads the ingress direction's data path with the egress direction's flows before NAT
/// (`egress`'s `SHAPER_NAT_FLOWS`, handed over through a pin removed once opened): its IFB gets
/// the replies before conntrack sees them. Without a bpffs to pin in, its own map (and with
/// `--nat`, downloads are classified by the router's address), with a warning.
pub fn load_replies_side(
    egress: &Datapath,
    iface: &Interface,
    state: &StateParams,
) -> Result<Datapath, BpfError> {
    let shared = || -> anyhow::Result<std::path::PathBuf> {
        handover::require_bpffs().map_err(|_| {
            anyhow::anyhow!(
                "no bpffs at {} to hand the map over through (mount -t bpf bpf {0}; in a \
                 container, mount the host's /sys/fs/bpf)",
                handover::bpffs().display()
            )
        })?;
        let dir = handover::bpffs().join("shaper");
        runtime::create_private_dir(&dir)?;
        // No dot: bpffs keeps names with one for itself.
        let path = dir.join(format!("{}-nat-flows", runtime::instance_name(iface)));
        let _ = std::fs::remove_file(&path);
        egress.pin_map(map_names::NAT_FLOWS, &path)?;
        Ok(path)
    };
    match shared() {
        Ok(path) => {
            let datapath = Datapath::load_sharing(state, &[(map_names::NAT_FLOWS, path.clone())]);
            let _ = std::fs::remove_file(&path);
            datapath
        }
        Err(e) => {
            warn!(
                "{}: the ingress direction cannot share the egress direction's NAT flows ({e:#}): \
                 with --nat, downloads are told apart by the packets' own addresses",
                iface.name
            );
            Datapath::load(state)
        }
    }
}
