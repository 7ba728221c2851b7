//! Handing an interface's data path to the next shaper process, and taking it up.
//!
//! `shaper run --keep` (or SIGUSR2) exits without restoring: fq, the programs and the flow
//! state stay on the interface, and the data path goes on shaping at the last levels without a
//! control loop. What a successor needs to take it up is pinned in bpffs, under
//! `<bpffs>/shaper/<netns>-<ifindex>/`:
//!
//! - the maps that hold flow and scheduling state (`map_names::CARRIED`), which the
//!   successor's object is loaded with in place of new ones when every one of them fits its
//!   layout (all or none: a calendar without the levels that booked it is not a state);
//! - the TCX links (kernels >= 6.6), which would go with the process otherwise. A netlink
//!   filter outlives its process by itself;
//! - the leaving object's tail-call array, which the kernel empties when no process holds it
//!   any more: its program would then pass every packet unshaped. Not taken up: the
//!   successor's object has its own.
//!
//! The successor replaces the programs in place (a link update, or a filter change at the same
//! priority and handle), so every packet meets one program or the other: none leaves unshaped,
//! and fq keeps what it holds. Once it is shaping, it removes the pins: they are a hand-over
//! only, and a later crash of the successor must not leave programs attached for ever.
//!
//! A process leaves when it is stopped with `--keep`, on SIGUSR2, or when the next one, started
//! with `--replace` while it runs, asks it to over the interface's control socket
//! ([`ask_to_leave`]): then it leaves that interface alone and shapes the others on. Once it has
//! none left it ends, with status 0, or, with `--when-replaced wait`, stays holding nothing
//! until it is stopped ([`WhenReplaced`]).
//!
//! bpffs is per mount: two processes share pins only under the same mount of it (`ip netns
//! exec` mounts /sys anew, without bpffs). `--keep` and `--replace` check for it before
//! anything is shaped.

use std::path::{Path, PathBuf};

use aya::programs::links::{FdLink, PinnedLink};
use tracing::warn;

use crate::{
    filter::Hook,
    link::Interface,
    live::protocol::{self, Request, Response},
    runtime::{self, InterfaceLock},
};

/// What a process does once it has left every interface it shaped to the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum WhenReplaced {
    /// End, with status 0.
    #[default]
    Exit,
    /// Stay, holding nothing and touching nothing, not ready (`/readyz` 503, `/healthz` 200),
    /// until SIGTERM or SIGINT, then end with status 0: for a supervisor that restarts a
    /// process that ends (a container's kubelet, systemd's `Restart=always`), whose restart,
    /// with `--replace`, would take the interfaces back.
    Wait,
}

/// What the run does next, once a request on a control socket was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterRequest {
    /// Shape on.
    Serve,
    /// Every interface was left: end now.
    Exit,
    /// Every interface was left: wait, holding nothing, to be stopped.
    Wait,
}

/// What the run does next with `shaped` interfaces shaped and `given` left to another process
/// at its request: a process with interfaces of its own shapes on, and one that has given all
/// of them away is replaced. One that never gave any away (shaping nothing yet, as when every
/// configured interface is absent) has not been replaced: it waits for them.
pub fn after_request(shaped: usize, given: usize, when: WhenReplaced) -> AfterRequest {
    match (shaped, given, when) {
        (0, 1.., WhenReplaced::Exit) => AfterRequest::Exit,
        (0, 1.., WhenReplaced::Wait) => AfterRequest::Wait,
        _ => AfterRequest::Serve,
    }
}

/// `statfs(2)`'s `f_type` of a bpffs mount.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    #[error(
        "handing over (--keep, --replace) needs bpffs at {0} to leave the data path to the next shaper (mount -t bpf bpf {0}; in a container, mount the host's /sys/fs/bpf)"
    )]
    NoBpffs(String),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
}

/// Where bpffs is mounted (`SHAPER_BPFFS` overrides /sys/fs/bpf).
pub fn bpffs() -> PathBuf {
    std::env::var_os("SHAPER_BPFFS")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/sys/fs/bpf".into())
}

/// Fails unless [`bpffs`] is a bpffs mount, where pins can be left.
pub fn require_bpffs() -> Result<(), HandoverError> {
    let path = bpffs();
    let missing = || HandoverError::NoBpffs(path.display().to_string());
    let c_path =
        std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| missing())?;
    // SAFETY: statfs fills the struct it is given; the path is NUL-terminated.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statfs(c_path.as_ptr(), &mut fs) };
    if rc != 0 || fs.f_type as i64 != BPF_FS_MAGIC {
        return Err(missing());
    }
    Ok(())
}

/// The directory of `iface`'s pins.
fn dir(iface: &Interface) -> PathBuf {
    bpffs().join("shaper").join(runtime::instance_name(iface))
}

fn link_pin(dir: &Path, hook: Hook) -> PathBuf {
    dir.join(match hook {
        Hook::Egress => "link-egress",
        Hook::Ingress => "link-ingress",
    })
}

/// The directory a process leaving `iface` pins into, made private (0700).
pub fn prepare(iface: &Interface) -> Result<Leaving, HandoverError> {
    require_bpffs()?;
    let dir = dir(iface);
    runtime::create_private_dir(&dir).map_err(|e| HandoverError::Io {
        what: "creating",
        path: dir.display().to_string(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(Leaving { dir })
}

/// Where a leaving process pins what its successor takes up.
pub struct Leaving {
    dir: PathBuf,
}

impl Leaving {
    /// Pins into `dir`, which must exist on a bpffs mount.
    pub fn at(dir: PathBuf) -> Self {
        Self { dir }
    }

    pub fn map(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn link(&self, hook: Hook) -> PathBuf {
        link_pin(&self.dir, hook)
    }
}

/// What a predecessor left on an interface.
pub struct Left {
    dir: PathBuf,
}

impl Left {
    /// What was pinned into `dir`.
    pub fn at(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// What was left for `iface`, if anything.
    pub fn find(iface: &Interface) -> Option<Self> {
        let dir = dir(iface);
        dir.is_dir().then_some(Self { dir })
    }

    /// The pin of the map `name`, if it was left.
    pub fn map(&self, name: &str) -> Option<PathBuf> {
        let path = self.dir.join(name);
        path.exists().then_some(path)
    }

    /// The TCX link at `hook`, taken out of bpffs (the caller now holds it), if it was left.
    pub fn take_link(&self, hook: Hook) -> Option<FdLink> {
        let path = link_pin(&self.dir, hook);
        if !path.exists() {
            return None;
        }
        match PinnedLink::from_pin(&path).map(PinnedLink::unpin) {
            Ok(Ok(link)) => Some(link),
            Ok(Err(e)) => {
                warn!("unpinning {}: {e}", path.display());
                None
            }
            Err(e) => {
                warn!("opening {}: {e}", path.display());
                None
            }
        }
    }

    /// Removes what pins remain, and their directory. A link still pinned detaches here.
    pub fn clear(self) {
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for entry in entries.flatten() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        if let Err(e) = std::fs::remove_dir(&self.dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            warn!("removing {}: {e}", self.dir.display());
        }
    }
}

/// Asks the shaper running on `iface`, if one is, to leave it shaped for this process
/// (`Request::Leave`), and waits until it has let it go. With none running, nothing to do.
pub fn ask_to_leave(iface: &Interface) -> anyhow::Result<()> {
    if !InterfaceLock::held(iface)? {
        return Ok(());
    }
    let name = &iface.name;
    let path = runtime::control_socket_path(iface);
    match protocol::ask(&path, &Request::Leave {}) {
        Ok(Response::Left { pid }) => {
            tracing::info!("{name}: the shaper (pid {pid}) left it shaped for this one");
        }
        Ok(Response::Error { message }) => {
            anyhow::bail!("the shaper running on {name} did not leave it: {message}")
        }
        Ok(other) => {
            anyhow::bail!("the shaper running on {name} answered a request to leave with {other:?}")
        }
        Err(e) => anyhow::bail!(
            "asking the shaper running on {name} to leave it ({}): {e}",
            path.display()
        ),
    }
    // It answers once it has let go; its lock goes with its last descriptor.
    InterfaceLock::wait_free(iface, protocol::TIMEOUT)?;
    Ok(())
}

/// Removes what a predecessor left for `iface` (restoring it, or `shaper reset`).
pub fn clear(iface: &Interface) {
    if let Some(left) = Left::find(iface) {
        left.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_that_gave_every_interface_away_exits_or_waits_as_told() {
        use AfterRequest::*;
        use WhenReplaced::{Exit as E, Wait as W};
        for when in [E, W] {
            // Interfaces of its own left, or none ever given away: it shapes on.
            assert_eq!(after_request(1, 1, when), Serve);
            assert_eq!(after_request(2, 0, when), Serve);
            assert_eq!(after_request(0, 0, when), Serve);
        }
        assert_eq!(after_request(0, 1, E), Exit);
        assert_eq!(after_request(0, 3, W), Wait);
        assert_eq!(WhenReplaced::default(), E, "the command line's default");
    }
}
