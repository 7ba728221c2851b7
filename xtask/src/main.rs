//! Project tasks: `cargo xtask <task>`. Every task installs what it needs first (see `bootstrap`),
//! so a fresh clone goes from nothing to a result with one command.

mod bootstrap;
mod demo;
mod dist;
mod kernel;
mod lab;
mod test;
mod vm;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "shaper project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the toolchain pieces and packages the project needs (idempotent).
    Bootstrap(bootstrap::Options),
    /// Build the static `shaper` binary (x86_64 musl, BPF object embedded).
    Dist(dist::Options),
    /// Boot a Debian kernel in qemu and run SCRIPT inside it with ip, tc, iperf3, ping and shaper.
    Vm(vm::Options),
    /// Run the whole test suite: unit, BPF (BPF_PROG_TEST_RUN) and VM end-to-end tests.
    Test(test::Options),
    /// Shape a link in the VM and print the measured rate unshaped vs shaped.
    Demo(demo::Options),
    /// Run scenarios against shaper, CAKE and no shaping; write results and reports.
    Lab(lab::Options),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Bootstrap(o) => bootstrap::run(&o),
        Task::Dist(o) => dist::run(&o).map(|_| ()),
        Task::Vm(o) => vm::run_cli(&o),
        Task::Test(o) => test::run(&o),
        Task::Demo(o) => demo::run(&o),
        Task::Lab(o) => lab::run(&o),
    }
}
