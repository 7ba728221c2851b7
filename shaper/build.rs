//! Builds the eBPF object (`shaper-ebpf`) with the nightly toolchain and bpf-linker, so that
//! `include_bytes_aligned!` in `bpf.rs` embeds it in the binary; and names the commit the
//! binary is built from (`SHAPER_GIT_COMMIT`, for `--version`).

use std::process::Command;

use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    println!("cargo:rustc-env=SHAPER_GIT_COMMIT={}", git_commit());
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
    // The object's BTF names its sources; named relative to the workspace, as the static
    // build names the rest, a commit builds the same object in any clone (nightly cargo's
    // trim-paths, which the eBPF build's toolchain has).
    // SAFETY: the build script is single-threaded; the variables are for its child cargo.
    unsafe {
        std::env::set_var("CARGO_UNSTABLE_TRIM_PATHS", "true");
        std::env::set_var("CARGO_PROFILE_RELEASE_TRIM_PATHS", "all");
    }
    aya_build::build_ebpf(
        [Package {
            name: ebpf.name.as_str(),
            root_dir: root_dir.as_str(),
            ..Default::default()
        }],
        Toolchain::default(),
    )
}

/// The short hash of HEAD, with `-dirty` when tracked files differ from it; `unknown` outside a
/// git checkout or without git (a source tarball must still build). Cargo reruns this when HEAD
/// moves, the index changes or this package's or `shaper-common`'s sources change, so that an
/// edit to the binary's own code marks it dirty (`shaper-ebpf` is watched by aya-build).
fn git_commit() -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    // HEAD's reflog moves with every commit, checkout and reset, wherever the branch's ref is
    // kept (loose or packed). A watched path that does not exist would rerun this every build.
    // The sources are watched without git too, so that a later build in a checkout names it.
    let mut watched = vec!["src".to_string(), "../shaper-common/src".to_string()];
    for file in ["HEAD", "logs/HEAD", "index"] {
        watched.extend(git(&["rev-parse", "--git-path", file]));
    }
    for path in watched.iter().filter(|p| std::path::Path::new(p).exists()) {
        println!("cargo:rerun-if-changed={path}");
    }
    let Some(hash) = git(&["rev-parse", "--short=7", "HEAD"]) else {
        return "unknown".to_string();
    };
    // `--untracked-files=no`: a stray file beside the sources is not a change to the binary.
    match git(&["status", "--porcelain", "--untracked-files=no"]) {
        Some(changes) if changes.is_empty() => hash,
        Some(_) => format!("{hash}-dirty"),
        None => "unknown".to_string(),
    }
}
