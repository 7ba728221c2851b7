//! Builds the eBPF object (`shaper-ebpf`) with the nightly toolchain and bpf-linker, so that
//! `include_bytes_aligned!` in `bpf.rs` embeds it in the binary.

use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = metadata
        .packages
        .iter()
        .find(|p| p.name.as_str() == "shaper-ebpf")
        .ok_or_else(|| anyhow!("shaper-ebpf package not found in the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("shaper-ebpf manifest has no parent directory"))?;
    aya_build::build_ebpf(
        [Package {
            name: ebpf.name.as_str(),
            root_dir: root_dir.as_str(),
            ..Default::default()
        }],
        Toolchain::default(),
    )
}
