#[derive(clap::Args)]
pub struct Options {}

pub fn run(_o: &Options) -> anyhow::Result<std::path::PathBuf> {
    anyhow::bail!("not implemented yet")
}
