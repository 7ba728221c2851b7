//! Installs what the project needs on a fresh machine of this kind (Debian 12, rustup with a
//! stable and a nightly toolchain): Debian packages, the nightly's `rust-src`, the musl target,
//! bpf-linker built against the nightly's own libLLVM, cargo-fuzz, and promtool for the VM.
//! Idempotent and quick when
//! everything is present; every task calls it first.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{cache_dir, run_quiet, run_status};

/// Debian packages: the VM (qemu, busybox, cpio, module decompressors) and the tools the VM
/// and the lab run (iproute2, iperf3, ping, dash, procps, ethtool, bpftool, util-linux's
/// nsenter and setpriv), systemd's
/// systemd-analyze for the unit file's test, fonts for the lab's plots, skopeo to read the OCI
/// image back as the engines do, nftables for the VM's masquerading router, wireguard-tools
/// for its WireGuard tunnel.
const PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "busybox-static",
    "cpio",
    "iproute2",
    "iperf3",
    "iputils-ping",
    "dash",
    "bash",
    "procps",
    "systemd",
    "ethtool",
    "bpftool",
    "util-linux",
    "file",
    "xz-utils",
    "zstd",
    "fonts-dejavu-core",
    "skopeo",
    "nftables",
    "wireguard-tools",
];

const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";
const NIGHTLY: &str = "nightly";
const BPF_LINKER_VERSION: &str = "0.13.0";
/// Pinned, as bpf-linker is: `cargo xtask fuzz` builds the targets with it on the nightly.
const CARGO_FUZZ_VERSION: &str = "0.13.2";
/// The Debian package with promtool, Prometheus's own parser and linter of the exposition
/// format, which the VM's metrics test runs on shaper's output.
const PROMTOOL_PACKAGE: &str = "prometheus";

#[derive(clap::Args)]
pub struct Options {}

pub fn run(_o: &Options) -> Result<()> {
    ensure()
}

pub fn ensure() -> Result<()> {
    ensure_packages()?;
    ensure_rust()?;
    ensure_bpf_linker()?;
    ensure_cargo_fuzz()?;
    ensure_promtool()
}

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

fn ensure_packages() -> Result<()> {
    ensure_debian(PACKAGES)
}

/// Installs those of `packages` that are missing.
pub fn ensure_debian(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    println!(
        "bootstrap: installing Debian packages: {}",
        missing.join(" ")
    );
    run_status(Command::new("apt-get").args(["update", "-qq"]))
        .context("apt-get update (are you root?)")?;
    run_status(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .context("apt-get install")
}

fn ensure_rust() -> Result<()> {
    let components = run_quiet(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        NIGHTLY,
    ]))
    .context("rustup: is the nightly toolchain installed? (rustup toolchain install nightly)")?;
    if !components.lines().any(|l| l.starts_with("rust-src")) {
        println!("bootstrap: adding rust-src to the nightly toolchain");
        run_status(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            NIGHTLY,
        ]))?;
    }
    let sysroot = run_quiet(Command::new("rustc").args(["--print", "sysroot"]))?;
    if !PathBuf::from(sysroot.trim())
        .join("lib/rustlib")
        .join(MUSL_TARGET)
        .exists()
    {
        println!("bootstrap: adding the {MUSL_TARGET} target");
        run_status(Command::new("rustup").args(["target", "add", MUSL_TARGET]))?;
    }
    Ok(())
}

/// The nightly's libLLVM: (file name, LLVM major).
fn nightly_llvm() -> Result<(PathBuf, String)> {
    let sysroot =
        run_quiet(Command::new("rustc").args([&format!("+{NIGHTLY}"), "--print", "sysroot"]))?;
    let lib = PathBuf::from(sysroot.trim()).join("lib");
    let file = std::fs::read_dir(&lib)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with("libLLVM.so.") || (n.starts_with("libLLVM-") && n.ends_with(".so"))
            })
        })
        .with_context(|| format!("no libLLVM in {}", lib.display()))?;
    let name = file.file_name().unwrap().to_string_lossy().to_string();
    let major = name
        .trim_start_matches("libLLVM.so.")
        .trim_start_matches("libLLVM-")
        .split(['.', '-'])
        .next()
        .unwrap_or_default()
        .to_string();
    Ok((file, major))
}

fn ensure_bpf_linker() -> Result<()> {
    let works = Command::new("bpf-linker")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if works {
        return Ok(());
    }
    let (libllvm, major) = nightly_llvm()?;
    if major.is_empty() {
        bail!("cannot tell the LLVM version of {}", libllvm.display());
    }
    println!(
        "bootstrap: building bpf-linker {BPF_LINKER_VERSION} against the nightly's LLVM {major}"
    );
    // bpf-linker links libLLVM dynamically; point it at the nightly's own copy, under both the
    // generic name and its SONAME.
    let prefix = cache_dir().join("llvm-prefix");
    let prefix_lib = prefix.join("lib");
    std::fs::create_dir_all(&prefix_lib)?;
    for name in [
        "libLLVM.so".to_string(),
        libllvm.file_name().unwrap().to_string_lossy().to_string(),
    ] {
        let link = prefix_lib.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&libllvm, &link)?;
    }
    run_status(
        Command::new("cargo")
            .args([
                "install",
                "--force",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
            ])
            .args([
                "--no-default-features",
                "--features",
                &format!("llvm-{major}"),
            ])
            .env("LLVM_PREFIX", &prefix),
    )
    .context("building bpf-linker")
}

fn ensure_cargo_fuzz() -> Result<()> {
    let version = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if version.split_whitespace().any(|w| w == CARGO_FUZZ_VERSION) {
        return Ok(());
    }
    println!("bootstrap: installing cargo-fuzz {CARGO_FUZZ_VERSION}");
    run_status(Command::new("cargo").args([
        "install",
        "--force",
        "--locked",
        "cargo-fuzz",
        "--version",
        CARGO_FUZZ_VERSION,
    ]))
    .context("installing cargo-fuzz")
}

/// Where bootstrap keeps promtool (the VM image carries it as /usr/bin/promtool).
pub fn promtool_path() -> PathBuf {
    cache_dir().join("promtool").join("promtool")
}

/// promtool, unpacked from its Debian package into the cache: installing the package would
/// also install, and start, a Prometheus server on this machine.
fn ensure_promtool() -> Result<()> {
    let path = promtool_path();
    if path.is_file() {
        return Ok(());
    }
    println!("bootstrap: fetching promtool (Debian's {PROMTOOL_PACKAGE} package)");
    unpack_debian_file(PROMTOOL_PACKAGE, "usr/bin/promtool", &path)
}

/// Copies `file` out of the Debian package `package` to `path`, through a download beside it:
/// the package's program without installing the package (which may start a service).
pub fn unpack_debian_file(package: &str, file: &str, path: &Path) -> Result<()> {
    let dir = path.parent().context("no directory to unpack into")?;
    let download = dir.join("download");
    let _ = std::fs::remove_dir_all(&download);
    std::fs::create_dir_all(&download)?;
    let fetch = || {
        run_status(
            Command::new("apt-get")
                .args(["download", "-qq", package])
                .current_dir(&download),
        )
    };
    if fetch().is_err() {
        // A machine whose package lists were never read (every other package was there).
        run_status(Command::new("apt-get").args(["update", "-qq"]))
            .context("apt-get update (are you root?)")?;
        fetch().with_context(|| format!("apt-get download {package}"))?;
    }
    let deb = std::fs::read_dir(&download)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .with_context(|| format!("apt-get download left no .deb in {}", download.display()))?;
    let unpacked = download.join("unpacked");
    run_status(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))?;
    let tmp = path.with_extension("tmp");
    std::fs::copy(unpacked.join(file), &tmp)
        .with_context(|| format!("the package {package} has no {file}"))?;
    std::fs::rename(&tmp, path)?;
    std::fs::remove_dir_all(&download)?;
    Ok(())
}
