use std::{io::IsTerminal, process::ExitCode};

use clap::Parser;
use shaper::{
    cli::{Cli, Command},
    cmd,
};

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal: a DaemonSet's or a service's log is
        // read as text.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SHAPER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    // A doctor's failed checks are its report, not an error: it picks its own exit code.
    let done = |result: anyhow::Result<()>| result.map(|()| ExitCode::SUCCESS);
    let command = Cli::parse().command;
    if matches!(command, Command::Stats(_) | Command::Doctor(_)) {
        end_quietly_on_a_closed_pipe();
    }
    let result = match command {
        Command::Run(args) => done(cmd::run::run(*args)),
        Command::Stats(args) => done(cmd::stats::run(args)),
        Command::Set(args) => done(cmd::set::run(*args)),
        Command::Reload(args) => done(cmd::reload::run(args)),
        Command::Reset(args) => done(cmd::reset::run(args)),
        Command::Doctor(args) => cmd::doctor::run(args),
        Command::Tune(args) => done(cmd::tune::run(args)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("shaper: error: {}", describe(&e));
            ExitCode::FAILURE
        }
    }
}

/// A report read through a pipe that closes early (`shaper stats | head`) ends the process as
/// it ends any other Unix tool, by SIGPIPE, instead of a panic in `println!`. Only for the
/// commands that just print: `shaper run` keeps ignoring it, so that a closed log pipe never
/// kills it before it restores the interface.
fn end_quietly_on_a_closed_pipe() {
    // SAFETY: sets a signal disposition to its default before any thread is started.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

/// The error and its causes, each once: a message that quotes its cause (`{source}` in its
/// text, as most of shaper's own do) is not followed by that cause again.
fn describe(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read config file {path}: {source}")]
    struct Quoting {
        path: String,
        source: std::io::Error,
    }

    #[test]
    fn a_cause_its_message_quotes_is_said_once() {
        let io = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let e = anyhow::Error::new(Quoting {
            path: "/etc/shaper/shaper.toml".into(),
            source: io(),
        });
        assert_eq!(
            describe(&e),
            format!("cannot read config file /etc/shaper/shaper.toml: {}", io())
        );
        // Context that does not quote its cause still names it.
        let e = anyhow::Error::new(io()).context("starting");
        assert_eq!(describe(&e), format!("starting: {}", io()));
    }
}
