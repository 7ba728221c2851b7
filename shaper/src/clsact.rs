//! The clsact qdisc that netlink-attached programs and shaper's own filters (the ingress
//! redirect, the segmenter's) hang under, added when an interface has none.

use crate::{
    link::Interface,
    netlink::{NetlinkError, Socket},
    qdisc,
};

#[derive(Debug, thiserror::Error)]
pub enum ClsactError {
    #[error(
        "{iface} has an `ingress` qdisc where shaper needs `clsact` (to attach on kernels without TCX, < 6.6, and for --ingress-rate's redirect). Remove it if nothing needs it: tc qdisc del dev {iface} ingress"
    )]
    IngressQdisc { iface: String },
    #[error(
        "the kernel has no clsact qdisc (sch_ingress), needed to attach on kernels without TCX (< 6.6): load it with `modprobe sch_ingress` or use a kernel built with CONFIG_NET_SCH_INGRESS"
    )]
    NoClsact,
    #[error("adding clsact to {iface}: {source}")]
    Clsact { iface: String, source: NetlinkError },
}

pub fn ensure(sock: &mut Socket, iface: &Interface) -> Result<(), ClsactError> {
    if qdisc::ingress_slot(sock, iface.ifindex).is_ok_and(|k| k.as_deref() == Some("ingress")) {
        return Err(ClsactError::IngressQdisc {
            iface: iface.name.clone(),
        });
    }
    qdisc::add_clsact(sock, iface.ifindex).map_err(|source| match source.errno() {
        Some(libc::ENOENT) => ClsactError::NoClsact,
        _ => ClsactError::Clsact {
            iface: iface.name.clone(),
            source,
        },
    })
}

/// Adds clsact to `iface` for a caller that has already recorded it as added (`recorded` true),
/// so that a crash while adding leaves it to a successor to remove. When adding fails the
/// record is taken back: what holds the slot is not ours to remove (it may be someone's
/// `ingress` qdisc).
pub fn add_recorded(
    sock: &mut Socket,
    iface: &Interface,
    recorded: &mut bool,
) -> Result<(), ClsactError> {
    ensure(sock, iface).inspect_err(|_| *recorded = false)
}
