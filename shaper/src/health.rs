//! Keeping what `shaper run` installed in place while it runs.
//!
//! Others change an interface behind shaper's back: an administrator replaces its root qdisc
//! or flushes its filters, a network manager changes its MTU or deletes and re-creates it. Each
//! check compares what is installed with what shaper put there. What shaper owns (its qdisc,
//! its programs and filters, its configuration) is put back; the device itself it cannot own,
//! so a device that is gone ends the run with an error, after shaper removed the rest. Either
//! way nothing is left half-shaped without a word.

use std::{fmt, time::Duration};

use anyhow::Context;

use crate::{
    bpf,
    filter::{self, Hook},
    link::Interface,
    netlink::Socket,
    qdisc::{Qdisc, TC_H_ROOT},
    record::AttachMode,
    tcx,
};

/// How often the checks run: a change is found (and repaired) within this, plus one check's
/// work, well within a second.
pub const INTERVAL: Duration = Duration::from_millis(250);

/// Something changed behind shaper's back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// No interface of the name any more (deleted, or moved to another namespace).
    Gone,
    /// An interface of the same name with another index: a new device, not shaper's.
    Recreated { ifindex: u32 },
    /// The frame size the configuration was computed for changed.
    Mtu { was: u32, now: u32 },
    /// The root is no longer shaper's fq (or mq of fq): replaced, or deleted back to the
    /// kernel's default. Departure times are then ignored.
    Qdisc { now: String },
    /// A program of shaper's is no longer attached (detached, or its clsact deleted).
    Detached { program: &'static str },
    /// A filter of shaper's (the ingress redirect, the segmenter's) is gone.
    Filter { what: &'static str },
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Gone => write!(f, "the interface was deleted (or left this namespace)"),
            Self::Recreated { ifindex } => write!(
                f,
                "the interface was deleted and re-created (now index {ifindex}); start shaper again to shape the new one"
            ),
            Self::Mtu { was, now } => write!(f, "frames changed from {was} to {now} bytes (MTU)"),
            Self::Qdisc { now } => write!(f, "the root qdisc was replaced by `{now}`"),
            Self::Detached { program } => write!(f, "{program} was detached"),
            Self::Filter { what } => write!(f, "{what} filter was removed"),
        }
    }
}

/// Checks that fail in a row before the run ends: a repair that keeps failing leaves the
/// interface half-shaped, which is not to be left without a word.
pub const MAX_FAILED_CHECKS: u32 = 4;

/// The device itself went away: ends the run at once.
#[derive(Debug, thiserror::Error)]
#[error("{iface}: {fault}")]
pub struct Lost {
    pub iface: String,
    pub fault: Fault,
}

/// Whether `recorded` is still the interface of its name.
pub fn link_fault(recorded: &Interface) -> Option<Fault> {
    match Interface::lookup(&recorded.name) {
        Err(_) => Some(Fault::Gone),
        Ok(now) if now.ifindex != recorded.ifindex => Some(Fault::Recreated {
            ifindex: now.ifindex,
        }),
        Ok(_) => None,
    }
}

/// Whether `qdiscs` (all of an interface's) still have shaper's layout at the root: its fq, or
/// its mq with an fq on every leaf.
pub fn qdisc_fault(qdiscs: &[Qdisc]) -> Option<Fault> {
    let describe = |q: &Qdisc| format!("{} {:x}:", q.kind, q.handle >> 16);
    let Some(root) = qdiscs.iter().find(|q| q.parent == TC_H_ROOT) else {
        return Some(Fault::Qdisc { now: "none".into() });
    };
    if !root.is_shaper() {
        return Some(Fault::Qdisc {
            now: describe(root),
        });
    }
    let foreign_leaf = qdiscs
        .iter()
        .find(|q| q.parent != TC_H_ROOT && q.parent & 0xFFFF_0000 == root.handle && q.kind != "fq");
    match (root.kind.as_str(), foreign_leaf) {
        ("fq", _) => None,
        ("mq", Some(leaf)) => Some(Fault::Qdisc {
            now: format!("mq with {} on a leaf", describe(leaf)),
        }),
        ("mq", None) => None,
        _ => Some(Fault::Qdisc {
            now: describe(root),
        }),
    }
}

/// Whether the program `program_id` is attached at `hook` of `iface` (in `mode`).
pub fn is_attached(
    sock: &mut Socket,
    iface: &Interface,
    mode: AttachMode,
    hook: Hook,
    program_id: u32,
) -> anyhow::Result<bool> {
    Ok(attached(sock, iface, mode, hook)?.contains(&program_id))
}

/// The ids of the programs attached at `hook` of `iface` in `mode`: with TCX, every program
/// there (none when the device went away; the link check tells that); with netlink, shaper's
/// filter's (at [`bpf::NETLINK_PRIORITY`]). A query that fails otherwise is an error, not
/// "detached": attaching again would not mend it.
pub fn attached(
    sock: &mut Socket,
    iface: &Interface,
    mode: AttachMode,
    hook: Hook,
) -> anyhow::Result<Vec<u32>> {
    match mode {
        AttachMode::Tcx => match tcx::attached(iface.ifindex, hook) {
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(Vec::new()),
            found => found.with_context(|| {
                format!(
                    "{}: listing the programs at its TCX {hook:?} hook (BPF_PROG_QUERY)",
                    iface.name
                )
            }),
        },
        AttachMode::Netlink => Ok(filter::list(sock, iface.ifindex, hook)?
            .into_iter()
            .filter(|f| f.priority == u32::from(bpf::NETLINK_PRIORITY))
            .filter_map(|f| f.program_id)
            .collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qdisc::SHAPER_HANDLE;

    fn qdisc(kind: &str, handle: u32, parent: u32) -> Qdisc {
        Qdisc {
            handle,
            parent,
            kind: kind.into(),
            options: None,
            stab: None,
        }
    }

    #[test]
    fn shapers_layouts_are_healthy() {
        assert_eq!(qdisc_fault(&[qdisc("fq", SHAPER_HANDLE, TC_H_ROOT)]), None);
        let mq = [
            qdisc("mq", SHAPER_HANDLE, TC_H_ROOT),
            qdisc("fq", 0x8001_0000, SHAPER_HANDLE | 1),
            qdisc("fq", 0x8002_0000, SHAPER_HANDLE | 2),
            qdisc("clsact", 0xFFFF_0000, 0xFFFF_FFF1),
        ];
        assert_eq!(qdisc_fault(&mq), None);
    }

    #[test]
    fn a_replaced_or_deleted_root_is_a_fault() {
        let replaced = [qdisc("pfifo_fast", 0x0001_0000, TC_H_ROOT)];
        assert_eq!(
            qdisc_fault(&replaced),
            Some(Fault::Qdisc {
                now: "pfifo_fast 1:".into()
            })
        );
        // `tc qdisc del dev IF root`: the kernel's default (handle 0) comes back.
        let default = [qdisc("noqueue", 0, TC_H_ROOT)];
        assert!(matches!(qdisc_fault(&default), Some(Fault::Qdisc { .. })));
        assert!(matches!(qdisc_fault(&[]), Some(Fault::Qdisc { .. })));
    }

    #[test]
    fn a_replaced_leaf_under_shapers_mq_is_a_fault() {
        let mq = [
            qdisc("mq", SHAPER_HANDLE, TC_H_ROOT),
            qdisc("fq", 0x8001_0000, SHAPER_HANDLE | 1),
            qdisc("pfifo", 0x0007_0000, SHAPER_HANDLE | 2),
        ];
        assert_eq!(
            qdisc_fault(&mq),
            Some(Fault::Qdisc {
                now: "mq with pfifo 7: on a leaf".into()
            })
        );
    }

    #[test]
    fn an_interface_of_another_index_is_a_new_device() {
        let lo = Interface::lookup("lo").unwrap();
        assert_eq!(link_fault(&lo), None);
        let moved = Interface {
            ifindex: lo.ifindex + 1000,
            ..lo.clone()
        };
        assert_eq!(
            link_fault(&moved),
            Some(Fault::Recreated {
                ifindex: lo.ifindex
            })
        );
        let gone = Interface {
            name: "nosuchif0".into(),
            ..lo
        };
        assert_eq!(link_fault(&gone), Some(Fault::Gone));
    }
}
