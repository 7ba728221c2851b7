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
    config::{self, CliConfig, ConfigError, FileConfig, Settings},
    live::protocol::{Request, SetOptions},
};

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(
        "shaper on this interface was started without --config FILE: there is nothing to reload (use `shaper set`)"
    )]
    NoConfigFile,
    #[error("nothing to set: give at least one setting, e.g. --rate 40mbit")]
    NothingToSet,
    #[error(transparent)]
    Config(#[from] ConfigError),
}

#[derive(Debug, Clone)]
pub struct Source {
    /// `shaper run`'s own command line.
    command_line: CliConfig,
    /// The config file (`--config`), if any.
    path: Option<PathBuf>,
    /// The command line with `shaper set`'s overrides.
    cli: CliConfig,
    /// The config file as last read, with the overrides a command line cannot express (turning
    /// a flag off, ECN).
    file: FileConfig,
}

impl Source {
    /// The settings `shaper run` starts with.
    pub fn start(
        command_line: CliConfig,
        path: Option<&Path>,
    ) -> Result<(Self, Settings), ConfigError> {
        let file = match path {
            Some(path) => config::load_file(path)?,
            None => FileConfig::default(),
        };
        let source = Self {
            cli: command_line.clone(),
            command_line,
            path: path.map(Path::to_path_buf),
            file,
        };
        let settings = source.settings()?;
        Ok((source, settings))
    }

    /// The source and settings `request` asks for; `self` is left as it is, to be replaced
    /// once the settings are applied.
    pub fn next(&self, request: &Request) -> Result<(Self, Settings), SourceError> {
        let next = match request {
            Request::Set { options } => self.with(options)?,
            Request::Reload {} => {
                let path = self.path.as_deref().ok_or(SourceError::NoConfigFile)?;
                Self {
                    cli: self.command_line.clone(),
                    file: config::load_file(path)?,
                    ..self.clone()
                }
            }
        };
        let settings = next.settings()?;
        Ok((next, settings))
    }

    fn with(&self, options: &SetOptions) -> Result<Self, SourceError> {
        if options.is_empty() {
            return Err(SourceError::NothingToSet);
        }
        let mut next = self.clone();
        let SetOptions {
            rate,
            ingress_rate,
            horizon,
            overhead,
            mpu,
            isolation,
            rtt,
            ecn,
            diffserv,
            wash,
            fwmark,
            ack_filter,
        } = options.clone();
        let cli = &mut next.cli;
        let over = |slot: &mut Option<String>, value: Option<String>| {
            if value.is_some() {
                *slot = value;
            }
        };
        over(&mut cli.rate, rate);
        over(&mut cli.ingress_rate, ingress_rate);
        over(&mut cli.horizon, horizon);
        over(&mut cli.isolation, isolation);
        over(&mut cli.rtt, rtt);
        over(&mut cli.diffserv, diffserv);
        over(&mut cli.fwmark, fwmark);
        over(&mut cli.ack_filter, ack_filter);
        cli.overhead = overhead.or(cli.overhead);
        cli.mpu = mpu.or(cli.mpu);
        // The command line's `--wash` can only turn washing on: off is said in the file's terms.
        if let Some(wash) = wash {
            cli.wash = wash;
            next.file.wash = Some(wash);
        }
        next.file.ecn = ecn.or(next.file.ecn);
        Ok(next)
    }

    fn settings(&self) -> Result<Settings, ConfigError> {
        Settings::resolve_with(self.cli.clone(), self.file.clone())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn command_line(rate: Option<&str>) -> CliConfig {
        CliConfig {
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
