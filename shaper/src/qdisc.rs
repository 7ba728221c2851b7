//! The root qdisc reconciler: puts `fq` (which honours the departure times the data path stamps)
//! at the root of an interface, and puts back exactly what was there before.
//!
//! - Multi-queue devices get `mq` with one `fq` per TX queue, single-queue devices a root `fq`.
//! - Idempotent: a root that already is shaper's fq (or mq of fq) is left alone, so a restart
//!   after a crash changes nothing. No link down/up is ever needed.
//! - The original is saved as raw netlink (kind, handle, parent, TCA_OPTIONS, TCA_STAB) and
//!   replayed on exit, so any classless qdisc (and mq with any children) comes back with its exact
//!   parameters; a kernel default root (handle 0) comes back by deleting ours.
//! - A classful tree at the root (htb, hfsc, prio with classes...) is refused rather than
//!   destroyed: its classes and filters could not be restored.

use serde::{Deserialize, Serialize};

use crate::netlink::{
    Attrs, NLM_F_CREATE, NLM_F_REPLACE, NetlinkError, RTM_DELQDISC, RTM_GETQDISC, RTM_GETTCLASS,
    RTM_GETTFILTER, RTM_NEWQDISC, Socket, TCA_KIND, TCA_OPTIONS, TCA_STAB, parse_attrs,
};

pub const TC_H_ROOT: u32 = 0xFFFF_FFFF;
pub const TC_H_INGRESS: u32 = 0xFFFF_FFF1;
/// shaper's qdisc handle major, "5348:" ("SH"), so its own qdiscs are recognisable.
pub const SHAPER_HANDLE: u32 = 0x5348_0000;

const TCA_FQ_PLIMIT: u16 = 1;
const TCA_FQ_FLOW_PLIMIT: u16 = 2;
const TCA_FQ_HORIZON: u16 = 14;
const TCA_FQ_HORIZON_DROP: u16 = 15;

/// Qdisc kinds whose children are per-TX-queue leaves, not classes of a scheduling tree.
const MULTIQUEUE_ROOTS: [&str; 1] = ["mq"];
/// Qdiscs whose classes are user configuration (a class tree shaper could not restore).
const CONFIGURED_CLASS_KINDS: [&str; 10] = [
    "htb", "hfsc", "cbq", "drr", "qfq", "ets", "prio", "multiq", "atm", "dsmark",
];

/// One qdisc as the kernel reports it, with its configuration as raw attributes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Qdisc {
    pub handle: u32,
    pub parent: u32,
    pub kind: String,
    /// Raw TCA_OPTIONS attribute (type with flag bits, payload), hex in the state file.
    #[serde(with = "hex_attr")]
    pub options: Option<(u16, Vec<u8>)>,
    #[serde(with = "hex_attr")]
    pub stab: Option<(u16, Vec<u8>)>,
}

impl Qdisc {
    /// Created by the kernel itself (handle 0), e.g. the default pfifo_fast/fq_codel/noqueue.
    pub fn is_kernel_default(&self) -> bool {
        self.handle & 0xFFFF_0000 == 0
    }

    pub fn is_shaper(&self) -> bool {
        self.handle & 0xFFFF_0000 == SHAPER_HANDLE
    }
}

/// What an interface had before shaper touched it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub root: Option<Qdisc>,
    /// Leaves under an mq root.
    pub leaves: Vec<Qdisc>,
    /// A clsact (or ingress) qdisc was present.
    pub clsact: bool,
}

/// fq parameters for the departure-time queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FqParams {
    /// Total packets fq may hold.
    pub limit_packets: u32,
    /// Packets per flow. TCP Small Queues keeps a local socket's backlog far below this; for
    /// forwarded traffic it is a per-flow tail-drop bound, so it is set high enough not to drop
    /// before the data path's own horizon does.
    pub flow_limit_packets: u32,
    /// fq's own horizon, above the data path's so that it never drops first.
    pub horizon_us: u32,
}

/// The kernel option that builds fq.
pub const FQ_KCONFIG: &str = "CONFIG_NET_SCH_FQ";

#[derive(Debug, thiserror::Error)]
pub enum QdiscError {
    #[error(
        "the kernel has no fq qdisc (sch_fq): shaper needs it to release packets at their departure times. Load it with `modprobe sch_fq` or use a kernel built with {}",
        FQ_KCONFIG
    )]
    NoFq,
    #[error(
        "{iface} has a classful qdisc tree or filters at its root ({kind} {handle:x}: with {children} child qdisc(s), {classes} class(es), {filters} filter(s)); shaper will not destroy it because it could not be restored. Remove it first (tc qdisc del dev {iface} root)"
    )]
    ClassfulRoot {
        iface: String,
        kind: String,
        handle: u32,
        children: usize,
        classes: usize,
        filters: usize,
    },
    #[error("{action} on {iface}: {source}")]
    Netlink {
        action: String,
        iface: String,
        source: NetlinkError,
    },
}

fn tcmsg(ifindex: u32, handle: u32, parent: u32) -> Vec<u8> {
    tcmsg_info(ifindex, handle, parent, 0)
}

/// A `struct tcmsg`; `info` is a filter's priority and protocol.
pub(crate) fn tcmsg_info(ifindex: u32, handle: u32, parent: u32, info: u32) -> Vec<u8> {
    let mut body = Vec::with_capacity(20);
    body.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, 0]);
    body.extend_from_slice(&(ifindex as i32).to_ne_bytes());
    body.extend_from_slice(&handle.to_ne_bytes());
    body.extend_from_slice(&parent.to_ne_bytes());
    body.extend_from_slice(&info.to_ne_bytes());
    body
}

/// Classes (`RTM_GETTCLASS`) or filters (`RTM_GETTFILTER`) of an interface under `parent`
/// (0: all), counting those whose handle has the major number of `major_of` (0: any).
fn count_objects(
    sock: &mut Socket,
    msg_type: u16,
    ifindex: u32,
    parent: u32,
    major_of: u32,
) -> Result<usize, NetlinkError> {
    let replies = sock.dump(msg_type, &tcmsg(ifindex, 0, parent))?;
    Ok(replies
        .iter()
        .filter(|r| r.len() >= 20)
        .filter(|r| i32::from_ne_bytes(r[4..8].try_into().unwrap()) as u32 == ifindex)
        .filter(|r| {
            let handle = u32::from_ne_bytes(r[8..12].try_into().unwrap());
            major_of == 0 || handle & 0xFFFF_0000 == major_of & 0xFFFF_0000
        })
        .count())
}

/// All qdiscs of an interface.
pub fn list(sock: &mut Socket, ifindex: u32) -> Result<Vec<Qdisc>, NetlinkError> {
    let replies = sock.dump(RTM_GETQDISC, &tcmsg(ifindex, 0, 0))?;
    let mut out = Vec::new();
    for reply in replies {
        if reply.len() < 20 {
            return Err(NetlinkError::Malformed);
        }
        let msg_ifindex = i32::from_ne_bytes(reply[4..8].try_into().unwrap());
        if msg_ifindex as u32 != ifindex {
            continue;
        }
        let mut qdisc = Qdisc {
            handle: u32::from_ne_bytes(reply[8..12].try_into().unwrap()),
            parent: u32::from_ne_bytes(reply[12..16].try_into().unwrap()),
            kind: String::new(),
            options: None,
            stab: None,
        };
        for (kind, raw, value) in parse_attrs(&reply[20..]) {
            match kind {
                TCA_KIND => {
                    qdisc.kind = String::from_utf8_lossy(value).trim_end_matches('\0').into()
                }
                TCA_OPTIONS => qdisc.options = Some((raw, value.to_vec())),
                TCA_STAB => qdisc.stab = Some((raw, value.to_vec())),
                _ => {}
            }
        }
        out.push(qdisc);
    }
    Ok(out)
}

/// Records the interface's current root (and mq leaves) and clsact presence.
pub fn snapshot(sock: &mut Socket, ifindex: u32, iface: &str) -> Result<Snapshot, QdiscError> {
    let all = list(sock, ifindex).map_err(|source| QdiscError::Netlink {
        action: "listing qdiscs".into(),
        iface: iface.into(),
        source,
    })?;
    let root = all.iter().find(|q| q.parent == TC_H_ROOT).cloned();
    let clsact = all.iter().any(|q| q.parent == TC_H_INGRESS);
    let leaves = match &root {
        Some(r) if r.handle != 0 || MULTIQUEUE_ROOTS.contains(&r.kind.as_str()) => all
            .iter()
            .filter(|q| {
                q.parent != TC_H_ROOT
                    && q.parent != TC_H_INGRESS
                    && q.parent & 0xFFFF_0000 == r.handle & 0xFFFF_0000
            })
            .cloned()
            .collect(),
        _ => Vec::new(),
    };
    // Only the root's and (under mq) the leaves' own configuration can be replayed. Classes
    // (htb's, even without child qdiscs) and filters attached to the root would be lost.
    if let Some(r) = &root
        && !MULTIQUEUE_ROOTS.contains(&r.kind.as_str())
        && !r.is_shaper()
        && r.handle != 0
    {
        let netlink = |action: &str, source| QdiscError::Netlink {
            action: action.into(),
            iface: iface.into(),
            source,
        };
        // fq_codel, cake and sfq list their internal flows as classes: only the qdiscs whose
        // classes a user configures count.
        let classes = if CONFIGURED_CLASS_KINDS.contains(&r.kind.as_str()) {
            count_objects(sock, RTM_GETTCLASS, ifindex, 0, r.handle)
                .map_err(|e| netlink("listing classes", e))?
                .max(1)
        } else {
            0
        };
        let filters = count_objects(sock, RTM_GETTFILTER, ifindex, r.handle, 0)
            .map_err(|e| netlink("listing filters", e))?;
        if !leaves.is_empty() || classes > 0 || filters > 0 {
            return Err(QdiscError::ClassfulRoot {
                iface: iface.into(),
                kind: r.kind.clone(),
                handle: r.handle >> 16,
                children: leaves.len(),
                classes,
                filters,
            });
        }
    }
    Ok(Snapshot {
        root,
        leaves,
        clsact,
    })
}

fn fq_attrs(params: &FqParams) -> Attrs {
    let mut options = Attrs::default();
    options
        .put_u32(TCA_FQ_PLIMIT, params.limit_packets)
        .put_u32(TCA_FQ_FLOW_PLIMIT, params.flow_limit_packets)
        .put_u32(TCA_FQ_HORIZON, params.horizon_us)
        .put_u8(TCA_FQ_HORIZON_DROP, 1);
    let mut attrs = Attrs::default();
    attrs.put_str(TCA_KIND, "fq").put(TCA_OPTIONS, &options.0);
    attrs
}

fn replace(
    sock: &mut Socket,
    ifindex: u32,
    handle: u32,
    parent: u32,
    attrs: &Attrs,
) -> Result<(), NetlinkError> {
    let mut body = tcmsg(ifindex, handle, parent);
    body.extend_from_slice(&attrs.0);
    sock.request(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_REPLACE, &body)
        .map(drop)
}

/// Puts fq at the root (mq + fq leaves on multi-queue devices). Leaves the interface unchanged
/// when it already is shaper's layout. On failure the caller restores the snapshot.
pub fn install(
    sock: &mut Socket,
    ifindex: u32,
    iface: &str,
    num_tx_queues: u32,
    params: &FqParams,
) -> Result<(), QdiscError> {
    let netlink = |action: &str| {
        let action = action.to_string();
        let iface = iface.to_string();
        move |source: NetlinkError| {
            if source.errno() == Some(libc::ENOENT) && action.contains("fq") {
                QdiscError::NoFq
            } else {
                QdiscError::Netlink {
                    action,
                    iface,
                    source,
                }
            }
        }
    };
    let fq = fq_attrs(params);
    if num_tx_queues <= 1 {
        return replace(sock, ifindex, SHAPER_HANDLE, TC_H_ROOT, &fq)
            .map_err(netlink("installing root fq"));
    }
    let mut mq = Attrs::default();
    mq.put_str(TCA_KIND, "mq");
    replace(sock, ifindex, SHAPER_HANDLE, TC_H_ROOT, &mq).map_err(netlink("installing root mq"))?;
    for queue in 1..=num_tx_queues {
        replace(sock, ifindex, 0, SHAPER_HANDLE | queue, &fq)
            .map_err(netlink("installing fq on a TX queue"))?;
    }
    Ok(())
}

/// Changes the parameters of shaper's fq in place, as `tc qdisc change` does: a request
/// without NLM_F_CREATE for the qdisc that is there (the root fq, or each leaf under the mq)
/// reaches fq's own `change`, so the same qdiscs keep their packets, flows and counters.
pub fn change_fq(
    sock: &mut Socket,
    ifindex: u32,
    iface: &str,
    num_tx_queues: u32,
    params: &FqParams,
) -> Result<(), QdiscError> {
    let fq = fq_attrs(params);
    let mut change = |handle, parent| {
        let mut body = tcmsg(ifindex, handle, parent);
        body.extend_from_slice(&fq.0);
        sock.request(RTM_NEWQDISC, 0, &body)
            .map(drop)
            .map_err(|source| QdiscError::Netlink {
                action: "changing fq".into(),
                iface: iface.to_string(),
                source,
            })
    };
    if num_tx_queues <= 1 {
        return change(SHAPER_HANDLE, TC_H_ROOT);
    }
    for queue in 1..=num_tx_queues {
        change(0, SHAPER_HANDLE | queue)?;
    }
    Ok(())
}

/// Whether the interface's root already is shaper's (so `install` would change nothing).
pub fn is_installed(snapshot: &Snapshot) -> bool {
    snapshot.root.as_ref().is_some_and(|r| r.is_shaper())
}

fn replay(sock: &mut Socket, ifindex: u32, q: &Qdisc) -> Result<(), NetlinkError> {
    let mut attrs = Attrs::default();
    attrs.put_str(TCA_KIND, &q.kind);
    if let Some((raw, value)) = &q.options {
        attrs.put(*raw, value);
    }
    if let Some((raw, value)) = &q.stab {
        attrs.put(*raw, value);
    }
    replace(sock, ifindex, q.handle, q.parent, &attrs)
}

/// Puts back the snapshot's root. A kernel-default root comes back by deleting ours (the kernel
/// re-attaches its default); anything else is re-created from its saved attributes.
pub fn restore(
    sock: &mut Socket,
    ifindex: u32,
    iface: &str,
    original: &Snapshot,
) -> Result<(), QdiscError> {
    let err = |action: &str| {
        let action = action.to_string();
        let iface = iface.to_string();
        move |source| QdiscError::Netlink {
            action,
            iface,
            source,
        }
    };
    let all_default = original.root.as_ref().is_none_or(Qdisc::is_kernel_default)
        && original.leaves.iter().all(Qdisc::is_kernel_default);
    if all_default {
        let body = tcmsg(ifindex, 0, TC_H_ROOT);
        return match sock.request(RTM_DELQDISC, 0, &body) {
            Ok(_) => Ok(()),
            // Already the default: nothing of ours is left to delete.
            Err(e) if matches!(e.errno(), Some(libc::ENOENT) | Some(libc::EINVAL)) => Ok(()),
            Err(e) => Err(err("restoring the default root qdisc")(e)),
        };
    }
    if let Some(root) = &original.root {
        if root.is_kernel_default() {
            // A default mq with customised leaves: recreate a default root first.
            let body = tcmsg(ifindex, 0, TC_H_ROOT);
            let _ = sock.request(RTM_DELQDISC, 0, &body);
        } else {
            replay(sock, ifindex, root).map_err(err(&format!("restoring root {}", root.kind)))?;
        }
    }
    for leaf in original.leaves.iter().filter(|l| !l.is_kernel_default()) {
        replay(sock, ifindex, leaf).map_err(err(&format!("restoring leaf {}", leaf.kind)))?;
    }
    Ok(())
}

/// Adds the clsact qdisc (kernels without TCX attach the program under it).
pub fn add_clsact(sock: &mut Socket, ifindex: u32) -> Result<(), NetlinkError> {
    let mut body = tcmsg(ifindex, 0xFFFF_0000, TC_H_INGRESS);
    let mut attrs = Attrs::default();
    attrs.put_str(TCA_KIND, "clsact");
    body.extend_from_slice(&attrs.0);
    sock.request(
        RTM_NEWQDISC,
        NLM_F_CREATE | crate::netlink::NLM_F_EXCL,
        &body,
    )
    .map(drop)
}

/// Removes the clsact qdisc (only ever one that shaper added itself).
pub fn delete_clsact(sock: &mut Socket, ifindex: u32) -> Result<(), NetlinkError> {
    let mut body = tcmsg(ifindex, 0xFFFF_0000, TC_H_INGRESS);
    let mut attrs = Attrs::default();
    attrs.put_str(TCA_KIND, "clsact");
    body.extend_from_slice(&attrs.0);
    sock.request(RTM_DELQDISC, 0, &body).map(drop)
}

/// The kind of qdisc in the ingress slot (`clsact` or `ingress`), if any.
pub fn ingress_slot(sock: &mut Socket, ifindex: u32) -> Result<Option<String>, NetlinkError> {
    Ok(list(sock, ifindex)?
        .into_iter()
        .find(|q| q.parent == TC_H_INGRESS)
        .map(|q| q.kind))
}

mod hex_attr {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<(u16, Vec<u8>)>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            None => s.serialize_none(),
            Some((raw, bytes)) => {
                let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                s.serialize_some(&format!("{raw}:{hex}"))
            }
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<(u16, Vec<u8>)>, D::Error> {
        let Some(text) = Option::<String>::deserialize(d)? else {
            return Ok(None);
        };
        let bad = || serde::de::Error::custom("expected TYPE:HEX");
        let (raw, hex) = text.split_once(':').ok_or_else(bad)?;
        let raw = raw.parse().map_err(|_| bad())?;
        if hex.len() % 2 != 0 {
            return Err(bad());
        }
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        Ok(Some((raw, bytes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_survives_the_state_file() {
        let snap = Snapshot {
            root: Some(Qdisc {
                handle: 0x8001_0000,
                parent: TC_H_ROOT,
                kind: "fq_codel".into(),
                options: Some((0x8002, vec![8, 0, 1, 0, 0x10, 0x27, 0, 0])),
                stab: None,
            }),
            leaves: vec![],
            clsact: true,
        };
        let json = serde_json::to_string(&snap).unwrap();
        assert!(json.contains("32770:0800010010270000"), "{json}");
        assert_eq!(serde_json::from_str::<Snapshot>(&json).unwrap(), snap);
    }

    #[test]
    fn kernel_defaults_and_shaper_handles_are_recognised() {
        let q = |handle| Qdisc {
            handle,
            parent: TC_H_ROOT,
            kind: "x".into(),
            options: None,
            stab: None,
        };
        assert!(q(0).is_kernel_default());
        assert!(!q(0x8001_0000).is_kernel_default());
        assert!(q(SHAPER_HANDLE).is_shaper());
        assert!(!q(0x0001_0000).is_shaper());
    }
}
