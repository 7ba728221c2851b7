//! `shaper tune`: shows, and with `--apply`/`--persist` makes, the host settings advised for a
//! machine that sends through a shaper; `--revert` undoes both.

use crate::{
    doctor::modules::{ModuleLists, ModuleState},
    tune::{
        advice::{self, Step},
        host::Host,
    },
};

#[derive(Debug, clap::Args)]
pub struct TuneArgs {
    /// Set the advised values now (in this network namespace; the default qdisc is global).
    #[arg(long)]
    pub apply: bool,
    /// Keep them across reboots: write /etc/sysctl.d/90-shaper.conf (and load BBR's module at
    /// boot).
    #[arg(long)]
    pub persist: bool,
    /// Put back the values from before the first --apply and remove the files --persist wrote.
    #[arg(long, conflicts_with_all = ["apply", "persist"])]
    pub revert: bool,
}

pub fn run(args: TuneArgs) -> anyhow::Result<()> {
    let host = Host::system();
    if args.revert {
        let done = host.revert()?;
        if done.is_empty() {
            println!("nothing to revert: shaper tune changed nothing here");
        }
        for line in done {
            println!("{line}");
        }
        return Ok(());
    }
    let modules = ModuleLists::read();
    let bbr = modules.state("tcp_bbr");
    let current = host.current(bbr.is_available());
    let steps = advice::plan(&current);
    for step in &steps {
        println!("{step}");
    }
    let changes = steps
        .iter()
        .filter(|s| matches!(s, Step::Change { .. }))
        .count();
    if args.apply {
        host.apply(&steps)?;
        println!("applied {changes} change(s); `shaper tune --revert` undoes them");
        if steps.iter().any(|s| {
            matches!(s, Step::Change { setting, .. } if *setting == advice::Setting::DefaultQdisc)
        }) {
            println!(
                "the default qdisc applies to qdiscs created from now on: an interface keeps its root until it is replaced (tc qdisc replace dev IF root fq)"
            );
        }
    }
    if args.persist {
        let bbr_module = matches!(bbr, ModuleState::Loadable | ModuleState::Loaded);
        for path in host.persist(&steps, bbr_module)? {
            println!("wrote {}", path.display());
        }
    }
    if !args.apply && !args.persist {
        println!(
            "dry run: {changes} to change; --apply sets them now, --persist keeps them across reboots"
        );
    }
    Ok(())
}
