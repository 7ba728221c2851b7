//! A thread's capabilities (`capset(2)`, `capget(2)`): the tests that run as shaper does, with
//! only what its DaemonSet and systemd unit grant. Capabilities belong to a thread, so such a
//! test gives them up on a thread of its own.

pub const CAP_NET_ADMIN: u32 = 12;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// `capset(2)`'s header and one of its two 32-bit words of each set (version 3).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Leaves the calling thread with exactly `caps`, effective and permitted (for good: what is
/// no longer permitted cannot be taken back).
pub fn keep_only(caps: &[u32]) {
    let mut data = [CapData::default(); 2];
    for &cap in caps {
        let word = &mut data[(cap / 32) as usize];
        word.effective |= 1 << (cap % 32);
        word.permitted |= 1 << (cap % 32);
    }
    let header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: a version-3 header and its two data words, as capset(2) reads them.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) };
    assert_eq!(rc, 0, "capset: {}", std::io::Error::last_os_error());
}

/// The calling thread's effective set, from the kernel.
pub fn effective() -> u64 {
    let header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: as above; capget(2) writes the two words.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &header, data.as_mut_ptr()) };
    assert_eq!(rc, 0, "capget: {}", std::io::Error::last_os_error());
    u64::from(data[0].effective) | u64::from(data[1].effective) << 32
}
