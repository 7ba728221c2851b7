//! `shaper reset`: removes everything shaper installed on an interface (after a crash, or to
//! be sure), putting back what was there before it when that is on record.

use crate::{link::Interface, probe, reset};

#[derive(Debug, clap::Args)]
pub struct ResetArgs {
    /// Interface to clean up; refused while a `shaper run` holds it.
    #[arg(long)]
    pub iface: String,
}

pub fn run(args: ResetArgs) -> anyhow::Result<()> {
    probe::require_privileges()?;
    let iface = Interface::lookup(&args.iface)?;
    let removed = reset::reset(&iface)?;
    if removed.is_empty() {
        println!("{}: nothing of shaper's found", iface.name);
    } else {
        println!("{}: removed {}", iface.name, removed.join(", "));
    }
    Ok(())
}
