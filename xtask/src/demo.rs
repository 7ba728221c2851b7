#[derive(clap::Args)]
pub struct Options {}

pub fn run(_o: &Options) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
