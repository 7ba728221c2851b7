//! Batched operations on BPF hash maps (`BPF_MAP_LOOKUP_BATCH`, `_UPDATE_BATCH`,
//! `_DELETE_BATCH`, Linux 5.6): a system call for many entries, where a walk takes two for each
//! and an update or a delete one. The control loop reads every host each tick and writes the
//! levels of every active one; under a flood of spoofed hosts the map is full and churns, and
//! the tick's system calls grow with it.
//!
//! aya 0.14 has no batch operations; these take the map's descriptor and keep aya's types.

use std::{
    io,
    mem::size_of,
    os::fd::{AsRawFd, BorrowedFd},
};

use aya::Pod;

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
const BPF_MAP_DELETE_BATCH: libc::c_long = 27;

/// `union bpf_attr`'s member for the batch commands.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Runs `cmd`; the kernel writes in `attr.count` how many elements it handled, on error too.
fn sys_bpf(cmd: libc::c_long, attr: &mut BatchAttr) -> io::Result<()> {
    // SAFETY: `attr` is a valid bpf_attr prefix of the size passed; the pointers it holds
    // stay valid for the call (the callers' buffers, sized for `count` elements).
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut BatchAttr,
            size_of::<BatchAttr>() as u32,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Whether `e` says the kernel or the map type has no batch operations (the caller then goes
/// entry by entry).
pub fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::EOPNOTSUPP | 524 /* ENOTSUPP */)
    )
}

fn zeroed<T: Pod>(n: usize) -> Vec<T> {
    // SAFETY: a Pod type is plain data, valid with any bytes, zeros included.
    (0..n).map(|_| unsafe { std::mem::zeroed() }).collect()
}

/// Entries a lookup batch asks for at first: a full map of many thousand hosts takes a few
/// calls, an almost empty one does not clear buffers for all it could hold.
const LOOKUP_CHUNK: u32 = 1024;

/// Every entry of the hash map `fd`, which holds at most `max_entries`. Entries added or removed
/// meanwhile may or may not be in it.
pub fn lookup_all<K: Pod, V: Pod>(fd: BorrowedFd<'_>, max_entries: u32) -> io::Result<Vec<(K, V)>> {
    let mut chunk = LOOKUP_CHUNK.min(max_entries).max(1);
    let mut keys = zeroed::<K>(chunk as usize);
    let mut values = zeroed::<V>(chunk as usize);
    let mut entries = Vec::new();
    // A hash map's batch token is a bucket index (u32), in a word of its own for each side.
    let mut token: u64 = 0;
    let mut next: u64 = 0;
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                &token as *const u64 as u64
            },
            out_batch: &mut next as *mut u64 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk,
            map_fd: fd.as_raw_fd() as u32,
            ..Default::default()
        };
        let result = sys_bpf(BPF_MAP_LOOKUP_BATCH, &mut attr);
        let n = (attr.count as usize).min(chunk as usize);
        entries.extend(keys[..n].iter().copied().zip(values[..n].iter().copied()));
        match result {
            Ok(()) => {}
            // The end of the map.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(entries),
            // A batch is whole buckets: this one holds more than the chunk. Again, with room.
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && n == 0 && chunk < max_entries => {
                chunk = chunk.saturating_mul(2).min(max_entries);
                keys = zeroed::<K>(chunk as usize);
                values = zeroed::<V>(chunk as usize);
                continue;
            }
            Err(e) => return Err(e),
        }
        token = next;
        first = false;
    }
}

/// Writes `entries` into the map `fd`. An entry the kernel refuses with an error `skip`
/// accepts (a full map's E2BIG) is left out and the rest written; any other error stops it.
/// Returns how many were left out.
pub fn update<K: Pod, V: Pod>(
    fd: BorrowedFd<'_>,
    entries: &[(K, V)],
    skip: impl Fn(&io::Error) -> bool,
) -> io::Result<usize> {
    let keys: Vec<K> = entries.iter().map(|(k, _)| *k).collect();
    let values: Vec<V> = entries.iter().map(|(_, v)| *v).collect();
    let mut done = 0;
    let mut skipped = 0;
    while done < entries.len() {
        let mut attr = BatchAttr {
            keys: keys[done..].as_ptr() as u64,
            values: values[done..].as_ptr() as u64,
            count: (entries.len() - done) as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..Default::default()
        };
        let result = sys_bpf(BPF_MAP_UPDATE_BATCH, &mut attr);
        done += (attr.count as usize).min(entries.len() - done);
        match result {
            Ok(()) => {}
            Err(e) if skip(&e) && done < entries.len() => {
                done += 1;
                skipped += 1;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(skipped)
}

/// Deletes `keys` from the map `fd`; keys it no longer holds are no error.
pub fn delete<K: Pod>(fd: BorrowedFd<'_>, keys: &[K]) -> io::Result<()> {
    let mut done = 0;
    while done < keys.len() {
        let mut attr = BatchAttr {
            keys: keys[done..].as_ptr() as u64,
            count: (keys.len() - done) as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..Default::default()
        };
        let result = sys_bpf(BPF_MAP_DELETE_BATCH, &mut attr);
        done += (attr.count as usize).min(keys.len() - done);
        match result {
            Ok(()) => {}
            // The kernel stops at a key that is gone (an LRU evicted it, the data path
            // deleted it): step over it.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && done < keys.len() => done += 1,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
