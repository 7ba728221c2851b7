//! `--nat`: where the data path finds a packet's conntrack entry and its tuples
//! (`shaper_common::conntrack`), from the running kernel's BTF, and the data path told.

use shaper_common::conntrack::ConntrackLayout;
use tracing::warn;

use crate::{
    bpf::{BpfError, Datapath},
    kernel_btf::{self, BtfError, KernelBtf},
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
pub fn apply(datapath: &mut Datapath, wanted: bool, iface: &str) -> Result<(), BpfError> {
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
