//! The programs attached at a device's TCX hook (Linux 6.6), by id, from `BPF_PROG_QUERY`.
//!
//! The query needs CAP_NET_ADMIN, which shaper has. aya's `SchedClassifier::query_tcx` also
//! opens every program it lists by its id, which needs CAP_SYS_ADMIN, which shaper runs
//! without (its DaemonSet and systemd unit): there it fails, and an attached program would
//! read as detached, be attached again each health check, and leave the traffic unshaped
//! between.

use std::{io, mem::size_of};

use crate::filter::Hook;

const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;

/// `union bpf_attr`'s member for `BPF_PROG_QUERY`, up to `revision`.
#[repr(C)]
#[derive(Default)]
struct QueryAttr {
    target_ifindex: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    count: u32,
    _pad: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

/// Programs a first query makes room for; a device with more is asked again with room for all.
const FIRST_ROOM: u32 = 16;

/// The ids of the programs attached at `hook` of the device `ifindex` through TCX, in the order
/// they run. An error says the query failed (ENODEV: the device is gone), not that none is
/// attached.
pub fn attached(ifindex: u32, hook: Hook) -> io::Result<Vec<u32>> {
    let attach_type = match hook {
        Hook::Ingress => BPF_TCX_INGRESS,
        Hook::Egress => BPF_TCX_EGRESS,
    };
    let mut room = FIRST_ROOM;
    loop {
        let mut ids = vec![0u32; room as usize];
        let mut attr = QueryAttr {
            target_ifindex: ifindex,
            attach_type,
            prog_ids: ids.as_mut_ptr() as u64,
            count: room,
            ..Default::default()
        };
        // SAFETY: `attr` is a valid bpf_attr prefix of the size passed; `prog_ids` points at
        // `ids`, room for `count` ids, alive for the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_QUERY,
                &mut attr as *mut QueryAttr,
                size_of::<QueryAttr>() as u32,
            )
        };
        if r == 0 {
            ids.truncate(attr.count.min(room) as usize);
            return Ok(ids);
        }
        let e = io::Error::last_os_error();
        // ENOSPC: more programs than room; `count` says how many there are.
        if e.raw_os_error() == Some(libc::ENOSPC) && attr.count > room {
            room = attr.count;
            continue;
        }
        return Err(e);
    }
}
