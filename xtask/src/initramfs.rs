//! The VM's root file system: busybox for the basics, the host's real iproute2, iperf3, ping,
//! dash and bash (with their libraries), promtool, the static `shaper` and `lab-probe`, the repository's
//! test scripts and scenarios, the kernel modules the tests need, and an `/init` that runs one
//! command.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use crate::{cpio::Archive, kernel::KernelTree, run_quiet};

/// Modules every VM loads: the qdiscs shaper and the references use, clsact and BPF
/// classifiers, veth and IFB for topologies, BBR, and virtio (PCI transport, a module on 6.1,
/// built in on 6.12) and virtio-blk for the results disk.
const MODULES: &[&str] = &[
    "sch_fq",
    "sch_fq_codel",
    "sch_cake",
    "sch_netem",
    "sch_tbf",
    "sch_htb",
    "sch_prio",
    "sch_ingress",
    "cls_bpf",
    "cls_u32",
    "cls_matchall",
    "cls_fw",
    "act_mirred",
    "act_bpf",
    "veth",
    "ifb",
    "tcp_bbr",
    "virtio_pci",
    "virtio_blk",
];

/// Loaded when this kernel has them.
const OPTIONAL_MODULES: &[&str] = &[
    "8021q",
    "sch_sfq",
    "sch_red",
    "sch_pie",
    "sch_fq_pie",
    "tcp_dctcp",
    // A masquerading router (`--nat`'s test): conntrack and NAT through nftables.
    "nf_conntrack",
    "nf_nat",
    "nf_tables",
    "nft_chain_nat",
    "nft_masq",
    // Devices that carry IP alone (the tunnels' test).
    "ipip",
    "wireguard",
];

/// Real tools from the host (busybox's applets are not iproute2, iperf3, a full ping or procps'
/// sysctl, which reads sysctl.d files as the host's boot does; util-linux's setpriv runs shaper
/// with the capabilities a pod or the systemd unit grants, which busybox's may not know).
const HOST_TOOLS: &[&str] = &[
    "ip", "tc", "ss", "bridge", "nstat", "iperf3", "ping", "ethtool", "dash", "bash", "bpftool",
    "sysctl", "nsenter", "unshare", "setpriv", "nft", "wg",
];

/// Diagnostic tools copied in when this machine has them (`apt-get install tcpdump`): a VM
/// script that traces packets checks for them itself.
const OPTIONAL_HOST_TOOLS: &[&str] = &["tcpdump"];

/// Host data the tools need: the dynamic loader's cache, iproute2's tables, netem's
/// distributions.
const HOST_DATA: &[&str] = &[
    "/etc/ld.so.cache",
    "/etc/iproute2",
    "/usr/lib/x86_64-linux-gnu/tc",
    "/usr/share/iproute2",
];

/// Where things live inside the VM.
pub const REPO_DIR: &str = "/shaper";
pub const RUN_DIR: &str = "/shaper/run";
pub const OUT_DIR: &str = "/out";
/// Writes `$SHAPER_OUT` to the results disk; init runs it at the end, and a long command (the
/// lab's runner) may run it after each step so a guest crash loses only the step it was in.
pub const SAVE_COMMAND: &str = "/usr/local/bin/shaper-vm-save";
const MODULE_DIR: &str = "/usr/lib/modules/shaper-vm";
pub const EXIT_MARKER: &str = "@@SHAPER-VM-EXIT ";

pub struct Contents<'a> {
    pub kernel: &'a KernelTree,
    pub shaper: &'a Path,
    /// The lab's static request/response probe.
    pub lab_probe: &'a Path,
    pub repo: &'a Path,
    /// Host files copied into `RUN_DIR` under their file names.
    pub files: &'a [PathBuf],
    /// The command line run by /init (already rewritten to VM paths).
    pub command: &'a [String],
    /// Environment for the command.
    pub env: &'a [(String, String)],
    /// Whether a results disk is attached (`--out`): the command's `$SHAPER_OUT` goes onto it.
    pub results_disk: bool,
}

pub fn build(c: &Contents, out: &Path) -> Result<()> {
    let mut a = Archive::default();
    layout(&mut a)?;
    for tool in HOST_TOOLS {
        let path =
            which(tool).with_context(|| format!("{tool} is not installed on this machine"))?;
        add_host_tool(&mut a, &path)?;
    }
    for path in OPTIONAL_HOST_TOOLS.iter().filter_map(|tool| which(tool)) {
        add_host_tool(&mut a, &path)?;
    }
    // Prometheus's linter of the exposition format, for the metrics endpoint's test: fetched
    // by bootstrap, not installed on this machine.
    let promtool = crate::bootstrap::promtool_path();
    a.copy_file("/usr/bin/promtool", &promtool)
        .context("promtool is missing: run `cargo xtask bootstrap`")?;
    add_libraries(&mut a, &promtool)?;
    a.symlink("/usr/bin/sh", "dash")?;
    busybox(&mut a)?;
    for data in HOST_DATA {
        let p = Path::new(data);
        if p.exists() {
            add_host_tree(&mut a, p, data)?;
        }
    }
    a.copy_file("/usr/local/bin/shaper", c.shaper)?;
    a.copy_file("/usr/local/bin/lab-probe", c.lab_probe)?;
    for sub in ["tests/vm", "lab"] {
        let p = c.repo.join(sub);
        if p.is_dir() {
            add_host_tree(&mut a, &p, &format!("{REPO_DIR}/{sub}"))?;
        }
    }
    for f in c.files {
        let name = f
            .file_name()
            .context("file without a name")?
            .to_string_lossy();
        a.copy_file(&format!("{RUN_DIR}/{name}"), f)?;
    }
    let modules = c.kernel.modules_for(MODULES, OPTIONAL_MODULES)?;
    let mut order = String::new();
    for m in modules {
        let file = format!("{}.ko", m.name);
        a.file(&format!("{MODULE_DIR}/{file}"), m.data, 0o644)?;
        order.push_str(&file);
        order.push('\n');
    }
    a.file("/etc/shaper-vm/modules", order.into_bytes(), 0o644)?;
    if c.results_disk {
        a.file(SAVE_COMMAND, save_script().into_bytes(), 0o755)?;
    }
    a.file("/init", init_script(c).into_bytes(), 0o755)?;

    let mut file = std::io::BufWriter::new(
        std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?,
    );
    a.write_to(&mut file)?;
    Ok(())
}

/// Merged /usr like the host, so host paths of binaries and libraries work unchanged.
fn layout(a: &mut Archive) -> Result<()> {
    for d in [
        "usr/bin",
        "usr/sbin",
        "usr/lib",
        "usr/lib64",
        "usr/local/bin",
    ] {
        a.dir(d)?;
    }
    for (link, target) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        a.symlink(link, target)?;
    }
    for d in [
        "proc", "sys", "dev", "tmp", "run", "root", "mnt", "var/tmp", OUT_DIR, RUN_DIR,
    ] {
        a.dir(d)?;
    }
    a.symlink("var/run", "../run")?;
    a.char_dev("dev/console", 5, 1)?;
    a.char_dev("dev/null", 1, 3)?;
    a.file(
        "etc/passwd",
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
            .to_vec(),
        0o644,
    )?;
    a.file(
        "etc/group",
        b"root:x:0:\nnogroup:x:65534:\n".to_vec(),
        0o644,
    )?;
    a.file(
        "etc/hosts",
        b"127.0.0.1 localhost shaper-vm\n::1 localhost\n".to_vec(),
        0o644,
    )?;
    a.file(
        "etc/nsswitch.conf",
        b"passwd: files\ngroup: files\nhosts: files\n".to_vec(),
        0o644,
    )
}

fn which(tool: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}

/// The path a host path has in the merged-/usr layout of the VM.
fn vm_path(host: &Path) -> String {
    let s = host.to_string_lossy();
    for top in ["/bin/", "/sbin/", "/lib/", "/lib64/"] {
        if s.starts_with(top) {
            return format!("/usr{s}");
        }
    }
    s.into_owned()
}

/// A host binary and the shared libraries it loads.
fn add_host_tool(a: &mut Archive, binary: &Path) -> Result<()> {
    add_host_path(a, binary)?;
    add_libraries(a, binary)
}

/// Adds a host file, following a chain of symlinks and recreating each link.
fn add_host_path(a: &mut Archive, host: &Path) -> Result<()> {
    let mut path = host.to_path_buf();
    for _ in 0..16 {
        let meta =
            std::fs::symlink_metadata(&path).with_context(|| format!("{}", path.display()))?;
        if !meta.file_type().is_symlink() {
            return a.copy_file(&vm_path(&path), &path);
        }
        let target = std::fs::read_link(&path)?;
        a.symlink(&vm_path(&path), &target.to_string_lossy())?;
        // Resolve through the host's real directories (they may be symlinks themselves).
        let next = path.parent().unwrap_or(Path::new("/")).join(&target);
        let dir = std::fs::canonicalize(next.parent().unwrap_or(Path::new("/")))?;
        path = dir.join(next.file_name().context("symlink to a directory")?);
    }
    anyhow::bail!("symlink loop at {}", host.display())
}

fn add_host_tree(a: &mut Archive, host: &Path, at: &str) -> Result<()> {
    if host.is_file() {
        return a.copy_file(at, host);
    }
    for e in std::fs::read_dir(host).with_context(|| format!("reading {}", host.display()))? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let p = e.path();
        if p.is_dir() {
            add_host_tree(a, &p, &format!("{at}/{name}"))?;
        } else if p.is_file() {
            a.copy_file(&format!("{at}/{name}"), &p)?;
        }
    }
    Ok(())
}

/// The shared libraries and loader `binary` needs, as ldd reports them.
fn add_libraries(a: &mut Archive, binary: &Path) -> Result<()> {
    let out = run_quiet(Command::new("ldd").arg(binary))?;
    for line in out.lines() {
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            add_host_path(a, Path::new(p))?;
        }
    }
    Ok(())
}

/// busybox for everything the real tools above do not provide.
fn busybox(a: &mut Archive) -> Result<()> {
    let bb = which("busybox").context("busybox is not installed on this machine")?;
    a.copy_file("/usr/bin/busybox", &bb)?;
    let list = run_quiet(Command::new(&bb).arg("--list"))?;
    for applet in list
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != "busybox")
    {
        if !a.contains(&format!("/usr/bin/{applet}")) && !a.contains(&format!("/usr/sbin/{applet}"))
        {
            a.symlink(&format!("/usr/bin/{applet}"), "busybox")?;
        }
    }
    Ok(())
}

/// Single-quotes a word for sh.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The results disk holds one tar of OUT_DIR, rewritten whole each time: results only grow, so
/// each tar covers the last and a reader stops at the newest end-of-archive.
fn save_script() -> String {
    format!(
        r#"#!/bin/sh
if [ -b /dev/vda ]; then
	tar -cf /dev/vda -C {OUT_DIR} . && sync
else
	echo "shaper-vm: no results disk (/dev/vda)"
fi
"#
    )
}

fn init_script(c: &Contents) -> String {
    let command: Vec<String> = c.command.iter().map(|w| sh_quote(w)).collect();
    let env: String = c
        .env
        .iter()
        .map(|(k, v)| format!("export {k}={}\n", sh_quote(v)))
        .collect();
    format!(
        r#"#!/bin/sh
# PID 1 of the test VM: mount, load modules, run one command, report its status, power off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin HOME=/root TERM=dumb
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
while read -r m; do
	insmod {MODULE_DIR}/"$m" || echo "shaper-vm: insmod $m failed"
done </etc/shaper-vm/modules
ip link set lo up
# Kernel text is never patched while tests run: multi-threaded TCG can run a vCPU's old
# translation of a site the other vCPU is patching, and the guest dies on an int3 no patch owns
# (docs/notebook/vm-crashes.md). So the sites tests would patch all the time stay on for the
# whole boot, held from a namespace no script lists: receive timestamps (each ping), the clsact
# hooks (each start and stop on the only shaped interface), and the qdisc_dequeue tracepoint
# (shaper's dequeue observer). A tracepoint's site changes with its first probe and its second
# (a static call to the one probe, then to the loop over them), so two are held: the trace
# event in two trace instances, soft-disabled (an enable_event trigger on another event behind
# a filter no qdisc matches), each a flag test per dequeue.
unshare --net sh -c 'ip link set lo up && ip link add keys0 type veth peer name keys1 &&
	tc qdisc add dev keys0 clsact && exec ping -q -i 3600 127.0.0.1' >/dev/null 2>&1 &
tracing=/sys/kernel/tracing
mkdir -p $tracing/instances/keys 2>/dev/null
for events in $tracing/events $tracing/instances/keys/events; do
	echo 'enable_event:qdisc:qdisc_dequeue if handle == 4294967295' \
		>$events/qdisc/qdisc_destroy/trigger 2>/dev/null ||
		echo "shaper-vm: qdisc_dequeue not held on in $events"
done
hostname shaper-vm
ulimit -l unlimited
export SHAPER_OUT={OUT_DIR} SHAPER_VM_KERNEL={kernel}{save_env}
{env}cd {REPO_DIR}
{command} </dev/null
rc=$?
sync
{save}
echo
echo "{EXIT_MARKER}$rc@@"
poweroff -f
"#,
        kernel = c.kernel.kernel,
        command = command.join(" "),
        save = if c.results_disk { SAVE_COMMAND } else { "" },
        save_env = if c.results_disk {
            format!(" SHAPER_VM_SAVE={SAVE_COMMAND}")
        } else {
            String::new()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn merged_usr_paths() {
        assert_eq!(
            vm_path(Path::new("/lib64/ld-linux-x86-64.so.2")),
            "/usr/lib64/ld-linux-x86-64.so.2"
        );
        assert_eq!(vm_path(Path::new("/usr/sbin/tc")), "/usr/sbin/tc");
    }
}
