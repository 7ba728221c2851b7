//! Where a running shaper's settings come from: the command line of `shaper run`, its config
//! file as last read, and what `shaper set` changed since. Every request resolves them again
//! through the start-up code (`Settings::resolve_with`), so the running shaper accepts exactly
//! what `shaper run` would.
//!
//! `shaper set` overrides settings as the command line does (it wins over the file) and its
//! overrides stay until the next reload. `shaper reload` (or SIGHUP) reads the file again and
//! drops them: the settings are then the command line's and the file's, as at a fresh start.

use std::path::{Path, PathBuf};

use crate::{
    config::{self, ConfigError, Options, Settings},
    live::protocol::Request,
};

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(
        "shaper on this interface was started without --config FILE: there is nothing to reload (use `shaper set`)"
    )]
    NoConfigFile,
    #[error("nothing to set: give at least one setting, e.g. --rate 40mbit")]
    NothingToSet,
    #[error("leaving an interface changes no setting")]
    NoSettings,
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// The layers a running shaper's settings are resolved from, highest first: `shaper set`'s
/// overrides, `shaper run`'s command line, the config file as last read.
#[derive(Debug, Clone)]
pub struct Source {
    sets: Options,
    command_line: Options,
    path: Option<PathBuf>,
    file: Options,
}

impl Source {
    /// The settings `shaper run` starts with.
    pub fn start(
        command_line: Options,
        path: Option<&Path>,
    ) -> Result<(Self, Settings), ConfigError> {
        let file = match path {
            Some(path) => config::load_file(path)?,
            None => Options::default(),
        };
        Self::with_file(command_line, path, file)
    }

    /// The settings of an interface whose file layer (its `[[interface]]` section over the
    /// file's top level, or the whole file) is `file`, under the command line.
    pub fn with_file(
        command_line: Options,
        path: Option<&Path>,
        file: Options,
    ) -> Result<(Self, Settings), ConfigError> {
        let source = Self {
            sets: Options::default(),
            command_line,
            path: path.map(Path::to_path_buf),
            file,
        };
        let settings = source.settings()?;
        Ok((source, settings))
    }

    /// The source and settings after a reload whose file layer for this interface is `file`:
    /// `shaper set`'s overrides dropped, as at a fresh start.
    pub fn reloaded(&self, file: Options) -> Result<(Self, Settings), ConfigError> {
        Self::with_file(self.command_line.clone(), self.path.as_deref(), file)
    }

    /// The file layer this interface's settings were resolved with.
    pub fn file(&self) -> &Options {
        &self.file
    }

    /// The source and settings `request` asks for; `self` is left as it is, to be replaced
    /// once the settings are applied.
    pub fn next(&self, request: &Request) -> Result<(Self, Settings), SourceError> {
        let next = match request {
            Request::Set { options } => {
                if options.is_empty() {
                    return Err(SourceError::NothingToSet);
                }
                Self {
                    sets: options.as_options().over(self.sets.clone()),
                    ..self.clone()
                }
            }
            Request::Reload {} => {
                let path = self.path.as_deref().ok_or(SourceError::NoConfigFile)?;
                Self {
                    sets: Options::default(),
                    file: config::load_file(path)?,
                    ..self.clone()
                }
            }
            Request::Leave {} => return Err(SourceError::NoSettings),
        };
        let settings = next.settings()?;
        Ok((next, settings))
    }

    fn settings(&self) -> Result<Settings, ConfigError> {
        let given = self.sets.clone().over(self.command_line.clone());
        Settings::resolve_with(given, self.file.clone())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::live::protocol::SetOptions;

    fn command_line(rate: Option<&str>) -> Options {
        Options {
            iface: Some("eth0".into()),
            rate: rate.map(Into::into),
            ..Default::default()
        }
    }

    fn set(options: SetOptions) -> Request {
        Request::Set {
            options: Box::new(options),
        }
    }

    #[test]
    fn set_overrides_and_is_validated_as_at_start() {
        let (source, s) = Source::start(command_line(Some("20mbit")), None).unwrap();
        assert_eq!(s.rate_bps, 20_000_000);
        let (source, s) = source
            .next(&set(SetOptions {
                rate: Some("40mbit".into()),
                wash: Some(true),
                ecn: Some(false),
                ..Default::default()
            }))
            .unwrap();
        assert_eq!((s.rate_bps, s.wash, s.ecn), (40_000_000, true, false));
        let (_, s) = source
            .next(&set(SetOptions {
                wash: Some(false),
                ..Default::default()
            }))
            .unwrap();
        assert_eq!(
            (s.rate_bps, s.wash, s.ecn),
            (40_000_000, false, false),
            "earlier sets stay"
        );
        let bad = source.next(&set(SetOptions {
            rate: Some("fast".into()),
            ..Default::default()
        }));
        assert!(
            bad.unwrap_err()
                .to_string()
                .contains("invalid rate \"fast\"")
        );
        let nothing = source.next(&set(SetOptions::default())).unwrap_err();
        assert!(matches!(nothing, SourceError::NothingToSet));
    }

    #[test]
    fn reload_reads_the_file_again_and_drops_the_sets() {
        let path =
            std::env::temp_dir().join(format!("shaper-source-test-{}.toml", std::process::id()));
        let write = |text: &str| {
            std::fs::File::create(&path)
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap()
        };
        write("rate = \"20mbit\"\nrtt = \"lan\"");
        let (source, s) = Source::start(command_line(None), Some(&path)).unwrap();
        assert_eq!((s.rate_bps, s.rtt_ns), (20_000_000, 1_000_000));
        let (source, s) = source
            .next(&set(SetOptions {
                rate: Some("30mbit".into()),
                ..Default::default()
            }))
            .unwrap();
        assert_eq!(s.rate_bps, 30_000_000);
        write("rate = \"40mbit\"");
        let (_, s) = source.next(&Request::Reload {}).unwrap();
        assert_eq!((s.rate_bps, s.rtt_ns), (40_000_000, 100_000_000));
        write("rate = \"40mbit\"\nrtt = \"warp\"");
        let e = source.next(&Request::Reload {}).unwrap_err().to_string();
        assert!(e.contains("invalid rtt \"warp\""), "{e}");
        std::fs::remove_file(&path).unwrap();

        let (source, _) = Source::start(command_line(Some("20mbit")), None).unwrap();
        let e = source.next(&Request::Reload {}).unwrap_err();
        assert!(matches!(e, SourceError::NoConfigFile));
    }
}
