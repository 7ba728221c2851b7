#[derive(clap::Args)]
pub struct Options {}

pub fn run_cli(_o: &Options) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
