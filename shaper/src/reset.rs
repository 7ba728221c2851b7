//! `shaper reset`'s work: removing everything shaper installed on an interface, whatever state
//! it was left in.

use crate::{
    bpf,
    filter::{self, Hook},
    handover, ingress,
    link::{self, Interface, restore_limits},
    netlink::{NetlinkError, Socket},
    qdisc::{self, Snapshot},
    runtime::{self, InterfaceLock},
    segmenter,
};

/// `shaper reset`: removes everything shaper installed on `iface`, whatever state it was left
/// in. What a state file records is undone as a crashed run's successor would, restoring the
/// qdiscs and limits from before shaper; without a record, what is recognisably shaper's (its
/// root qdisc handle, its filters, its IFBs) is removed. Refused while a shaper runs there.
/// Returns what was removed, for the report.
pub fn reset(iface: &Interface) -> anyhow::Result<Vec<String>> {
    let _lock = InterfaceLock::acquire(iface)?;
    let mut sock = Socket::open()?;
    let mut done = Vec::new();
    if handover::Left::find(iface).is_some() {
        // First: the pinned links detach with their pins.
        handover::clear(iface);
        done.push("what a shaper left pinned for its successor".into());
    }
    let recorded = runtime::read_state(iface)?;
    if let Some(state) = &recorded {
        if let Some(ingress) = &state.ingress {
            ingress::clean_stale(iface, ingress)?;
            done.push(format!("the ingress redirect and {}", ingress.ifb));
        }
        if let Some(seg) = &state.segmenter {
            segmenter::clean_stale(iface, seg)?;
            done.push(format!("the segmenter and {}", seg.ifb));
        }
        bpf::remove_stale_filter(&iface.name);
        qdisc::restore(&mut sock, iface.ifindex, &iface.name, &state.original)?;
        done.push("the root qdisc (the original put back)".into());
        if state.clsact_added {
            match qdisc::delete_clsact(&mut sock, iface.ifindex) {
                Err(e) if e.errno() != Some(libc::ENOENT) && e.errno() != Some(libc::EINVAL) => {
                    return Err(e.into());
                }
                _ => done.push("clsact".into()),
            }
        }
        if state.original_gso.is_some() {
            restore_limits(&mut sock, iface, state.original_gso);
            done.push("the GSO limits (the original put back)".into());
        }
        runtime::remove_state(iface);
        done.push("the state file".into());
    }

    // Without a record, or beyond it: what carries shaper's marks.
    let filters = |sock: &mut Socket, hook| -> Result<Vec<_>, NetlinkError> {
        Ok(filter::list(sock, iface.ifindex, hook)?
            .into_iter()
            .filter(|f| f.priority == u32::from(bpf::NETLINK_PRIORITY))
            .collect())
    };
    if !filters(&mut sock, Hook::Egress)?.is_empty()
        || !filters(&mut sock, Hook::Ingress)?.is_empty()
    {
        bpf::remove_stale_filter(&iface.name);
        done.push("shaper's programs".into());
    }
    for role in link::IFB_ROLES {
        let name = role.name(iface);
        if Interface::lookup(&name).is_ok_and(|ifb| ifb.kind(&mut sock).is_ok_and(|k| k == "ifb")) {
            // Its redirect would send to a device that is about to go.
            let redirect = role.redirect(iface);
            if redirect.is_present(&mut sock, None)? {
                redirect.remove(&mut sock, false)?;
            }
            if let Ok(ifb) = Interface::lookup(&name) {
                handover::clear(&ifb);
            }
            runtime::delete_leftover_ifb(&mut sock, &name);
            done.push(name);
        }
    }
    if qdisc::list(&mut sock, iface.ifindex)?
        .iter()
        .any(|q| q.parent == qdisc::TC_H_ROOT && q.is_shaper())
    {
        qdisc::restore(&mut sock, iface.ifindex, &iface.name, &Snapshot::default())?;
        done.push("shaper's root qdisc (the kernel's default put back)".into());
    }
    Ok(done)
}
