//! Checks that the process and the kernel can do the job, before anything is changed, with
//! messages that say what is missing and what to do about it.

use std::path::Path;

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_BPF: u32 = 39;

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(
        "shaper needs CAP_NET_ADMIN and CAP_BPF (or CAP_SYS_ADMIN): run it as root, or grant them (e.g. setcap cap_net_admin,cap_bpf+ep shaper)"
    )]
    Privileges,
    #[error(
        "the kernel exposes no BTF (/sys/kernel/btf/vmlinux is missing): use a kernel built with CONFIG_DEBUG_INFO_BTF=y (every major distribution kernel since 2020 has it)"
    )]
    NoBtf,
}

/// Effective capability set of this process (from /proc/self/status).
fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    u64::from_str_radix(hex, 16).ok()
}

pub fn require_privileges() -> Result<(), ProbeError> {
    let caps = effective_caps().unwrap_or(0);
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    if has(CAP_NET_ADMIN) && (has(CAP_BPF) || has(CAP_SYS_ADMIN)) {
        Ok(())
    } else {
        Err(ProbeError::Privileges)
    }
}

pub fn require_btf() -> Result<(), ProbeError> {
    if Path::new("/sys/kernel/btf/vmlinux").exists() {
        Ok(())
    } else {
        Err(ProbeError::NoBtf)
    }
}

/// TCX (multi-program tc attachment through BPF links) arrived in 6.6; older kernels need the
/// clsact qdisc and a netlink filter.
pub fn has_tcx() -> bool {
    aya::util::KernelVersion::current().is_ok_and(|v| v >= aya::util::KernelVersion::new(6, 6, 0))
}
