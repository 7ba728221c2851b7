//! Per-interface runtime state: a lock (one shaper per interface) and a state file that lets
//! `shaper stats` find the running instance's maps and lets a restarted shaper undo what a
//! crashed one left behind.
//!
//! Files live in `/run/shaper/<netns>-<ifindex>.{lock,json,sock}` (`SHAPER_RUN_DIR` overrides the
//! directory). `/run` rather than bpffs: `ip netns exec` remounts /sys, so pins under
//! /sys/fs/bpf are not shared between two commands run in the same namespace, while /run is.
//! Maps are found by their kernel ids, which any process with CAP_SYS_ADMIN can open.

use std::{
    fs::{File, OpenOptions},
    io::Write,
    os::{
        fd::AsRawFd,
        unix::fs::{OpenOptionsExt, PermissionsExt},
    },
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use tracing::warn;

use crate::{link::Interface, netlink::Socket, record::State};

pub const DEFAULT_RUN_DIR: &str = "/run/shaper";

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("shaper is already running on {iface}{}; stop it first (or use `shaper stats --iface {iface}`)", pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    AlreadyRunning { iface: String, pid: Option<u32> },
    #[error("no shaper is running on {0}")]
    NotRunning(String),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("state file {path} is unreadable: {message}")]
    BadState { path: String, message: String },
}

/// The run directory and its files are root's alone: the state names the maps (by id, which a
/// privileged process opens), the interface's original qdiscs and the lock of a running shaper.
const PRIVATE_DIR: u32 = 0o700;
const PRIVATE_FILE: u32 = 0o600;

/// Creates `dir` (and its parents) and makes it private, whatever the umask or an older
/// shaper left: an existing directory is tightened too.
pub fn create_private_dir(dir: &Path) -> Result<(), RuntimeError> {
    let io = |source| RuntimeError::Io {
        what: "creating",
        path: dir.display().to_string(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(PRIVATE_DIR)).map_err(io)
}

pub fn run_dir() -> PathBuf {
    std::env::var_os("SHAPER_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| DEFAULT_RUN_DIR.into())
}

/// The name of `iface`'s files: its network namespace and index, which together name one device
/// on the machine.
pub fn instance_name(iface: &Interface) -> String {
    format!("{}-{}", iface.netns_id, iface.ifindex)
}

fn base_path(iface: &Interface) -> PathBuf {
    run_dir().join(instance_name(iface))
}

pub fn state_path(iface: &Interface) -> PathBuf {
    base_path(iface).with_extension("json")
}

/// Where a running shaper listens for `shaper set` and `shaper reload` (`live::server`).
pub fn control_socket_path(iface: &Interface) -> PathBuf {
    base_path(iface).with_extension("sock")
}

/// Held for the life of `shaper run`; released by the kernel even if the process dies.
pub struct InterfaceLock {
    _file: File,
}

impl InterfaceLock {
    pub fn acquire(iface: &Interface) -> Result<Self, RuntimeError> {
        Self::try_acquire(iface)?.ok_or_else(|| already_running(iface))
    }

    /// Whether a shaper holds `iface`'s lock now.
    pub fn held(iface: &Interface) -> Result<bool, RuntimeError> {
        Ok(Self::try_acquire(iface)?.is_none())
    }

    /// Waits up to `timeout` for the shaper holding `iface`'s lock to let it go.
    pub fn wait_free(iface: &Interface, timeout: Duration) -> Result<(), RuntimeError> {
        let started = Instant::now();
        while Self::held(iface)? {
            if started.elapsed() > timeout {
                return Err(already_running(iface));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// The lock, or `None` while another process holds it.
    fn try_acquire(iface: &Interface) -> Result<Option<Self>, RuntimeError> {
        let dir = run_dir();
        create_private_dir(&dir)?;
        let path = base_path(iface).with_extension("lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(PRIVATE_FILE)
            .open(&path)
            .map_err(|source| RuntimeError::Io {
                what: "opening",
                path: path.display().to_string(),
                source,
            })?;
        // SAFETY: flock on a descriptor we own.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        Ok((rc == 0).then_some(Self { _file: file }))
    }
}

/// The error for `iface`'s lock held by another shaper, naming it by its state file's pid.
fn already_running(iface: &Interface) -> RuntimeError {
    RuntimeError::AlreadyRunning {
        iface: iface.name.clone(),
        pid: read_state(iface).ok().flatten().map(|s| s.pid),
    }
}

pub fn read_state(iface: &Interface) -> Result<Option<State>, RuntimeError> {
    let path = state_path(iface);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(RuntimeError::Io {
                what: "reading",
                path: path.display().to_string(),
                source,
            });
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| RuntimeError::BadState {
            path: path.display().to_string(),
            message: e.to_string(),
        })
}

/// Writes the state file atomically (rename), so a reader never sees half of it.
pub fn write_state(iface: &Interface, state: &State) -> Result<(), RuntimeError> {
    let path = state_path(iface);
    let tmp = path.with_extension("json.tmp");
    let io = |what, source| RuntimeError::Io {
        what,
        path: path.display().to_string(),
        source,
    };
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(PRIVATE_FILE)
        .open(&tmp)
        .map_err(|e| io("writing", e))?;
    let text = serde_json::to_string_pretty(state).expect("state serialises");
    file.write_all(text.as_bytes())
        .map_err(|e| io("writing", e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io("writing", e))
}

/// Removes the state file, and the control socket a killed shaper left.
pub fn remove_state(iface: &Interface) {
    let _ = std::fs::remove_file(state_path(iface));
    let _ = std::fs::remove_file(control_socket_path(iface));
}

/// Whether a process with this pid exists.
pub fn process_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Deletes `name` (with the state file of a shaper that ran on it) if it is an IFB: what a
/// crashed shaper left. Anything else of that name is not shaper's and stays.
pub fn delete_leftover_ifb(sock: &mut Socket, name: &str) {
    if let Ok(ifb) = Interface::lookup(name)
        && ifb.kind(sock).is_ok_and(|k| k == "ifb")
    {
        warn!("removing {name} left by a previous shaper");
        remove_state(&ifb);
        if let Err(e) = ifb.delete(sock) {
            warn!("deleting {name}: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_directory_is_made_private_even_when_it_exists() {
        let base = std::env::temp_dir().join(format!("shaper-run-{}", std::process::id()));
        let dir = base.join("nested");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        create_private_dir(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        std::fs::remove_dir_all(&base).unwrap();
        assert_eq!(mode, PRIVATE_DIR);
    }
}
