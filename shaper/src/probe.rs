//! Checks that the process and the kernel can do the job, before anything is changed, with
//! messages that say what is missing and what to do about it.

use std::path::Path;

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// What shaper needs, each with what may stand in for it: CAP_NET_ADMIN for qdiscs, links and
/// filters; CAP_BPF to load programs and maps; CAP_PERFMON for the dequeue observer (a tracing
/// program that reads kernel memory). CAP_SYS_ADMIN covers the last two on kernels before 5.8
/// and still does.
const NEEDED: [(&str, u32, Option<u32>); 3] = [
    ("CAP_NET_ADMIN", CAP_NET_ADMIN, None),
    ("CAP_BPF", CAP_BPF, Some(CAP_SYS_ADMIN)),
    ("CAP_PERFMON", CAP_PERFMON, Some(CAP_SYS_ADMIN)),
];

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(
        "shaper needs CAP_NET_ADMIN, CAP_BPF and CAP_PERFMON; this process lacks {}: run it as root, or grant them (e.g. setcap cap_net_admin,cap_bpf,cap_perfmon+ep shaper)",
        .0.join(", ")
    )]
    Privileges(Vec<&'static str>),
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
    let missing = missing_privileges();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(ProbeError::Privileges(missing))
    }
}

/// The capabilities shaper needs that this process has neither of nor a stand-in for.
pub fn missing_privileges() -> Vec<&'static str> {
    missing_capabilities(effective_caps().unwrap_or(0))
}

/// The capabilities of [`NEEDED`] that the effective set `caps` has neither of nor a stand-in.
fn missing_capabilities(caps: u64) -> Vec<&'static str> {
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    NEEDED
        .iter()
        .filter(|(_, cap, instead)| !has(*cap) && !instead.is_some_and(has))
        .map(|(name, _, _)| *name)
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(list: &[u32]) -> u64 {
        list.iter().map(|c| 1u64 << c).sum()
    }

    #[test]
    fn a_process_without_privileges_is_told_every_capability_it_lacks() {
        assert_eq!(
            missing_capabilities(0),
            ["CAP_NET_ADMIN", "CAP_BPF", "CAP_PERFMON"]
        );
        assert_eq!(
            missing_capabilities(caps(&[CAP_NET_ADMIN, CAP_BPF])),
            ["CAP_PERFMON"]
        );
    }

    #[test]
    fn sys_admin_stands_in_for_bpf_and_perfmon_but_not_net_admin() {
        assert_eq!(
            missing_capabilities(caps(&[CAP_SYS_ADMIN])),
            ["CAP_NET_ADMIN"]
        );
        assert!(missing_capabilities(caps(&[CAP_SYS_ADMIN, CAP_NET_ADMIN])).is_empty());
        assert!(missing_capabilities(caps(&[CAP_NET_ADMIN, CAP_BPF, CAP_PERFMON])).is_empty());
    }
}
