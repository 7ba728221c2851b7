use std::{io::IsTerminal, process::ExitCode};

use clap::{Parser, Subcommand};
use shaper::cmd;

/// A CAKE-class traffic shaper on eBPF: EDT stamping in BPF, pacing by fq.
#[derive(Parser)]
#[command(name = "shaper", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Shape an interface until interrupted (SIGINT/SIGTERM), then restore it.
    Run(Box<cmd::run::RunArgs>),
    /// Show the counters of the shaper running on an interface.
    Stats(cmd::stats::StatsArgs),
    /// Change settings of the shaper running on an interface in place (its qdisc and programs
    /// stay, fq keeps its packets); prints what changed. A setting that cannot change in place
    /// is refused, and nothing changes.
    Set(cmd::set::SetArgs),
    /// Make the shaper running on an interface read its --config file again and apply what
    /// differs in place (as SIGHUP does); prints what changed.
    Reload(cmd::reload::ReloadArgs),
    /// Remove everything shaper installed on an interface (e.g. after `kill -9`), putting back
    /// what was there before it when that is on record.
    Reset(cmd::reset::ResetArgs),
    /// Check that this host (and with --iface, an interface) has what shaper needs, and the
    /// settings that help it; each check passes, warns or fails with a remedy. Exits 1 when a
    /// check failed.
    Doctor(cmd::doctor::DoctorArgs),
}

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
        Command::Set(args) => done(cmd::set::run(args)),
        Command::Reload(args) => done(cmd::reload::run(args)),
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
