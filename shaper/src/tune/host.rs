//! The advised settings on this host: their values under `/proc/sys`, the sysctl.d file that
//! keeps them across reboots, and the record of what they were before `shaper tune` first
//! changed them, which `--revert` puts back. Every path is under a root (`/`, or a directory in
//! tests).

use std::{
    fs,
    io::{self, ErrorKind},
    path::{Path, PathBuf},
};

use super::advice::{Current, Setting, Step};

/// The sysctl.d file `--persist` writes: after the distribution's own (50-*), so its values win.
pub const PERSISTED: &str = "etc/sysctl.d/90-shaper.conf";
/// Loads BBR's module at boot, before systemd-sysctl sets it.
pub const MODULES_LOAD: &str = "etc/modules-load.d/shaper.conf";
/// The values before `shaper tune` first changed them.
pub const BEFORE: &str = "var/lib/shaper/tune-before.conf";

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path}:{line}: {text:?} is not `name = value` of a setting shaper tune sets")]
    Record {
        path: String,
        line: usize,
        text: String,
    },
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> HostError + '_ {
    move |source| HostError::Io {
        path: path.display().to_string(),
        source,
    }
}

pub struct Host {
    root: PathBuf,
}

impl Host {
    /// This machine.
    pub fn system() -> Self {
        Self::at("/")
    }

    /// A tree rooted at `root`, laid out as `/` is.
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root.join(relative)
    }

    fn sysctl_path(&self, setting: Setting) -> PathBuf {
        self.path(&format!("proc/sys/{}", setting.key().replace('.', "/")))
    }

    /// Each setting's value here (`None` where it cannot be read), and whether BBR can be
    /// chosen: listed by the kernel, or its module loadable (`bbr_module`), which the kernel
    /// loads when BBR is chosen.
    pub fn current(&self, bbr_module: bool) -> Current {
        let listed =
            fs::read_to_string(self.path("proc/sys/net/ipv4/tcp_available_congestion_control"))
                .is_ok_and(|l| l.split_whitespace().any(|c| c == "bbr"));
        Current {
            values: Setting::ALL
                .into_iter()
                .map(|s| {
                    let value = fs::read_to_string(self.sysctl_path(s)).ok();
                    (s, value.map(|v| v.trim().to_string()))
                })
                .collect(),
            bbr_available: listed || bbr_module,
        }
    }

    fn write(&self, setting: Setting, value: &str) -> Result<(), HostError> {
        let path = self.sysctl_path(setting);
        fs::write(&path, value).map_err(io_error(&path))
    }

    /// Sets every `Change` of `steps`, having first recorded the values it replaces (a value
    /// already on record stays: it is the one from before shaper tune). A write that fails puts
    /// back those already made, so the host is as before. Returns the changes made.
    pub fn apply(&self, steps: &[Step]) -> Result<Vec<String>, HostError> {
        let changes: Vec<(Setting, &str)> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Change { setting, from } => Some((*setting, from.as_str())),
                _ => None,
            })
            .collect();
        if changes.is_empty() {
            return Ok(Vec::new());
        }
        let mut before = self.before()?;
        for (setting, from) in &changes {
            if !before.iter().any(|(s, _)| s == setting) {
                before.push((*setting, from.to_string()));
            }
        }
        self.record(&before)?;
        let mut done: Vec<(Setting, String)> = Vec::new();
        for (setting, from) in &changes {
            if let Err(e) = self.write(*setting, &setting.advised()) {
                for (undo, value) in done.iter().rev() {
                    let _ = self.write(*undo, value);
                }
                return Err(e);
            }
            done.push((*setting, from.to_string()));
        }
        Ok(done
            .iter()
            .map(|(s, from)| format!("{s}: {from} -> {}", s.advised()))
            .collect())
    }

    /// Writes the sysctl.d file with the advice for every setting `steps` may set (and BBR's
    /// module to load at boot, when it is a module: `bbr_module`). Returns the files written.
    pub fn persist(&self, steps: &[Step], bbr_module: bool) -> Result<Vec<PathBuf>, HostError> {
        let settings: Vec<Setting> = steps
            .iter()
            .filter(|s| !matches!(s, Step::Unavailable { .. }))
            .map(Step::setting)
            .collect();
        let mut text = String::from(
            "# Written by `shaper tune --persist`; `shaper tune --revert` removes it.\n",
        );
        for s in &settings {
            text.push_str(&format!("# {}\n{} = {}\n", s.why(), s.key(), s.advised()));
        }
        let mut written = vec![self.create(PERSISTED, &text)?];
        if bbr_module && settings.contains(&Setting::CongestionControl) {
            written.push(self.create(
                MODULES_LOAD,
                "# Written by `shaper tune --persist`: BBR, set by 90-shaper.conf.\ntcp_bbr\n",
            )?);
        }
        Ok(written)
    }

    fn create(&self, relative: &str, text: &str) -> Result<PathBuf, HostError> {
        let path = self.path(relative);
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(io_error(dir))?;
        }
        fs::write(&path, text).map_err(io_error(&path))?;
        Ok(path)
    }

    /// Puts back the values on record and removes the files shaper tune wrote. Returns what it
    /// did, one line each.
    pub fn revert(&self) -> Result<Vec<String>, HostError> {
        let mut done = Vec::new();
        for (setting, value) in self.before()? {
            self.write(setting, &value)?;
            done.push(format!("{setting}: back to {value}"));
        }
        for relative in [PERSISTED, MODULES_LOAD, BEFORE] {
            let path = self.path(relative);
            match fs::remove_file(&path) {
                Ok(()) if relative != BEFORE => done.push(format!("removed {}", path.display())),
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(io_error(&path)(e)),
            }
        }
        Ok(done)
    }

    /// The values on record (none: nothing recorded).
    fn before(&self) -> Result<Vec<(Setting, String)>, HostError> {
        let path = self.path(BEFORE);
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_error(&path)(e)),
        };
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .map(|(i, line)| {
                line.split_once('=')
                    .and_then(|(k, v)| Some((Setting::from_key(k.trim())?, v.trim().to_string())))
                    .ok_or_else(|| HostError::Record {
                        path: path.display().to_string(),
                        line: i + 1,
                        text: line.to_string(),
                    })
            })
            .collect()
    }

    fn record(&self, before: &[(Setting, String)]) -> Result<(), HostError> {
        let mut text = String::from(
            "# The values before `shaper tune --apply` first changed them; `shaper tune --revert` puts them back.\n",
        );
        for (s, v) in before {
            text.push_str(&format!("{} = {v}\n", s.key()));
        }
        self.create(BEFORE, &text).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::advice::plan;

    /// A root with the three settings at a stock host's values.
    fn stock() -> (tempdir::Dir, Host) {
        let dir = tempdir::Dir::new();
        let host = Host::at(dir.path());
        for (s, v) in [
            (Setting::DefaultQdisc, "pfifo_fast\n"),
            (Setting::CongestionControl, "cubic\n"),
            (Setting::NotsentLowat, "4294967295\n"),
        ] {
            let p = host.sysctl_path(s);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, v).unwrap();
        }
        (dir, host)
    }

    fn values(host: &Host) -> Vec<String> {
        host.current(true)
            .values
            .into_iter()
            .map(|(_, v)| v.unwrap())
            .collect()
    }

    #[test]
    fn apply_then_revert_returns_the_host_as_it_was() {
        let (_dir, host) = stock();
        let steps = plan(&host.current(true));
        let changed = host.apply(&steps).unwrap();
        assert_eq!(changed.len(), 3);
        assert_eq!(values(&host), ["fq", "bbr", "131072"]);
        // A second apply changes nothing and keeps the first record.
        assert!(host.apply(&plan(&host.current(true))).unwrap().is_empty());
        let files = host.persist(&steps, true).unwrap();
        assert_eq!(files.len(), 2);
        let persisted = fs::read_to_string(host.path(PERSISTED)).unwrap();
        assert!(
            persisted.contains("net.ipv4.tcp_congestion_control = bbr\n"),
            "{persisted}"
        );
        let reverted = host.revert().unwrap();
        assert_eq!(values(&host), ["pfifo_fast", "cubic", "4294967295"]);
        assert_eq!(reverted.len(), 5, "{reverted:?}");
        assert!(!host.path(PERSISTED).exists() && !host.path(BEFORE).exists());
        assert!(host.revert().unwrap().is_empty(), "nothing left to revert");
    }

    #[test]
    fn a_failed_write_puts_back_what_was_written() {
        let (_dir, host) = stock();
        let steps = plan(&host.current(true));
        // The last setting cannot be written: its file is a directory now.
        let lowat = host.sysctl_path(Setting::NotsentLowat);
        fs::remove_file(&lowat).unwrap();
        fs::create_dir(&lowat).unwrap();
        let e = host.apply(&steps).unwrap_err().to_string();
        assert!(e.contains("tcp_notsent_lowat"), "{e}");
        let back: Vec<_> = host.current(true).values[..2]
            .iter()
            .map(|(_, v)| v.clone().unwrap())
            .collect();
        assert_eq!(back, ["pfifo_fast", "cubic"]);
    }

    #[test]
    fn a_damaged_record_is_an_error_naming_its_line() {
        let (_dir, host) = stock();
        host.create(
            BEFORE,
            "# note\nnet.ipv4.tcp_congestion_control = cubic\nvm.swappiness = 1\n",
        )
        .unwrap();
        let e = host.revert().unwrap_err().to_string();
        assert!(e.ends_with("tune-before.conf:3: \"vm.swappiness = 1\" is not `name = value` of a setting shaper tune sets"), "{e}");
    }

    /// A directory removed when dropped.
    mod tempdir {
        use std::path::{Path, PathBuf};

        pub struct Dir(PathBuf);

        impl Dir {
            pub fn new() -> Self {
                use std::sync::atomic::{AtomicU32, Ordering};
                static NEXT: AtomicU32 = AtomicU32::new(0);
                let path = std::env::temp_dir().join(format!(
                    "shaper-tune-test-{}-{}",
                    std::process::id(),
                    NEXT.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&path).unwrap();
                Self(path)
            }

            pub fn path(&self) -> &Path {
                &self.0
            }
        }

        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }
}
