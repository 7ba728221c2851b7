//! The clsact qdisc that netlink-attached programs and shaper's own filters (the ingress
//! redirect, the segmenter's) hang under, added when an interface has none.

use crate::{
    link::Interface,
    netlink::{NetlinkError, Socket},
    qdisc,
};

/// The kernel option that builds clsact (with the ingress qdisc).
pub const CLSACT_KCONFIG: &str = "CONFIG_NET_SCH_INGRESS";

#[derive(Debug, thiserror::Error)]
pub enum ClsactError {
    #[error(
        "{iface} has an `ingress` qdisc where shaper needs `clsact` (to attach on kernels without TCX, < 6.6, and for --ingress-rate's redirect). Remove it if nothing needs it: tc qdisc del dev {iface} ingress"
    )]
    IngressQdisc { iface: String },
    #[error(
        "the kernel has no clsact qdisc (sch_ingress), needed to attach on kernels without TCX (< 6.6): load it with `modprobe sch_ingress` or use a kernel built with {}",
        CLSACT_KCONFIG
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

/// Adds clsact to `iface` unless it has one; returns whether it added it. The addition is
/// passed to `record` (true) before it is made, so that a crash while adding leaves it to a
/// successor to remove; when adding fails the record is taken back (false): what holds the slot
/// is not ours to remove (it may be someone's `ingress` qdisc).
pub fn ensure_recorded(
    sock: &mut Socket,
    iface: &Interface,
    record: &mut dyn FnMut(bool) -> anyhow::Result<()>,
) -> anyhow::Result<bool> {
    if qdisc::ingress_slot(sock, iface.ifindex)?.as_deref() == Some("clsact") {
        return Ok(false);
    }
    record(true)?;
    if let Err(e) = ensure(sock, iface) {
        let _ = record(false);
        return Err(e.into());
    }
    Ok(true)
}
