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
    let result = match Cli::parse().command {
        Command::Run(args) => done(cmd::run::run(*args)),
        Command::Stats(args) => done(cmd::stats::run(args)),
        Command::Reset(args) => done(cmd::reset::run(args)),
        Command::Doctor(args) => cmd::doctor::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("shaper: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
