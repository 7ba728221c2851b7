//! `cargo xtask k8s check`: the manifests of `deploy/kubernetes` against a real API server.
//!
//! A control plane of the release the manifests target (`cluster`, from what `tools` fetches
//! and builds) takes `kubectl apply --dry-run=server` of the base and of each example: the
//! server decodes every object strictly, defaults and validates it as it would store it. Then
//! variants of the base, each broken in one way, must each be refused with the error that names
//! that fault: a check that passed them all would prove nothing.

mod cluster;
mod tools;

use std::{
    path::{Path, PathBuf},
    process::Output,
    time::Instant,
};

use anyhow::{Context, Result, bail};

use crate::{run_quiet, workspace_root};
use cluster::Cluster;

#[derive(clap::Args)]
pub struct Options {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Start etcd and kube-apiserver on loopback (built or fetched into the cache the first
    /// time), apply deploy/kubernetes and its examples with --dry-run=server, check that
    /// broken variants are refused, and stop them.
    Check,
}

pub fn run(o: &Options) -> Result<()> {
    match o.command {
        Command::Check => check(),
    }
}

/// What the server must say to one manifest.
enum Expect {
    /// Accepted, with these objects (kubectl's `kind/name`, a name may be a prefix).
    Accepted(&'static [&'static str]),
    /// Refused, with an error that contains this.
    Refused(&'static str),
}

/// A broken copy of the base: one JSON patch on its DaemonSet.
struct Variant {
    name: &'static str,
    patch: &'static str,
    refused_with: &'static str,
}

const BASE_OBJECTS: &[&str] = &[
    "serviceaccount/shaper",
    "clusterrole.rbac.authorization.k8s.io/shaper",
    "clusterrolebinding.rbac.authorization.k8s.io/shaper",
    "configmap/shaper-config-",
    "service/shaper-metrics",
    "daemonset.apps/shaper",
];

const VARIANTS: &[Variant] = &[
    Variant {
        name: "unknown-field",
        patch: "- op: add\n  path: /spec/template/spec/hostNetwrok\n  value: true\n",
        refused_with: "unknown field \"spec.template.spec.hostNetwrok\"",
    },
    Variant {
        name: "selector-not-matching-template",
        patch: "- op: replace\n  path: /spec/selector/matchLabels/app.kubernetes.io~1instance\n  value: another\n",
        refused_with: "`selector` does not match template `labels`",
    },
    Variant {
        name: "rolling-update-without-room",
        patch: "- op: replace\n  path: /spec/updateStrategy/rollingUpdate/maxSurge\n  value: 0\n",
        refused_with: "cannot be 0 when maxSurge is 0",
    },
    Variant {
        name: "unknown-mount-propagation",
        patch: "- op: replace\n  path: /spec/template/spec/containers/0/volumeMounts/1/mountPropagation\n  value: HostToContainr\n",
        refused_with: "Unsupported value: \"HostToContainr\"",
    },
];

fn check() -> Result<()> {
    let start = Instant::now();
    let tools = tools::ensure()?;
    println!(
        "k8s: tools ready after {:.1} s",
        start.elapsed().as_secs_f64()
    );
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from);
    let work = target.join("k8s-check");
    let cluster = Cluster::start(&tools, &work.join("cluster"))?;

    let deploy = workspace_root().join("deploy/kubernetes");
    let mut cases: Vec<(String, Vec<String>, Expect)> = vec![
        (
            "deploy/kubernetes".into(),
            vec!["-k".into(), path_arg(&deploy)],
            Expect::Accepted(BASE_OBJECTS),
        ),
        (
            "examples/rate-95mbit".into(),
            vec!["-k".into(), path_arg(&deploy.join("examples/rate-95mbit"))],
            Expect::Accepted(&[
                "configmap/shaper-config-95mbit-",
                "daemonset.apps/shaper-95mbit",
            ]),
        ),
    ];
    // The example PodMonitor against the operator's own schema: its CRD stored first.
    run_quiet(
        cluster
            .kubectl()
            .args(["create", "-f"])
            .arg(&tools.podmonitor_crd),
    )?;
    run_quiet(cluster.kubectl().args([
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/podmonitors.monitoring.coreos.com",
    ]))?;
    cases.push((
        "examples/podmonitor.yaml".into(),
        vec![
            "-f".into(),
            path_arg(&deploy.join("examples/podmonitor.yaml")),
        ],
        Expect::Accepted(&["podmonitor.monitoring.coreos.com/shaper"]),
    ));
    let rendered = run_quiet(cluster.kubectl().arg("kustomize").arg(&deploy))?;
    for v in VARIANTS {
        let dir = work.join("variants").join(v.name);
        write_variant(&dir, &rendered, v.patch)?;
        cases.push((
            format!("broken: {}", v.name),
            vec!["-k".into(), path_arg(&dir)],
            Expect::Refused(v.refused_with),
        ));
    }

    let mut failures = Vec::new();
    for (name, args, expect) in &cases {
        let out = cluster
            .kubectl()
            .args(["apply", "--dry-run=server", "--validate=strict"])
            .args(args)
            .output()
            .with_context(|| format!("running kubectl for {name}"))?;
        match judge(&out, expect) {
            Ok(verdict) => println!("ok    {name}: {verdict}"),
            Err(why) => {
                println!("FAIL  {name}: {why}");
                failures.push(name.clone());
            }
        }
    }
    let stopped = cluster.stop();
    std::fs::remove_dir_all(&work).ok();
    println!(
        "{} passed, {} failed ({:.1} s)",
        cases.len() - failures.len(),
        failures.len(),
        start.elapsed().as_secs_f64()
    );
    stopped?;
    if !failures.is_empty() {
        bail!(
            "the API server did not answer as expected: {}",
            failures.join(", ")
        );
    }
    Ok(())
}

/// Whether kubectl's answer is the one expected; what it said, or why not.
fn judge(out: &Output, expect: &Expect) -> Result<String, String> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    match (expect, out.status.success()) {
        (Expect::Accepted(objects), true) => {
            let missing: Vec<&str> = objects
                .iter()
                .copied()
                .filter(|o| {
                    !stdout
                        .lines()
                        .any(|l| l.starts_with(o) && l.ends_with("(server dry run)"))
                })
                .collect();
            if missing.is_empty() {
                let names: Vec<&str> = stdout
                    .lines()
                    .filter_map(|l| l.split_whitespace().next())
                    .collect();
                Ok(format!("accepted: {}", names.join(", ")))
            } else {
                Err(format!(
                    "accepted, but without {}:\n{stdout}",
                    missing.join(", ")
                ))
            }
        }
        (Expect::Accepted(_), false) => Err(format!("refused:\n{stderr}")),
        (Expect::Refused(error), false) if stderr.contains(error) => Ok(format!(
            "refused: {}",
            stderr
                .lines()
                .find(|l| l.contains(error))
                .unwrap_or_default()
                .trim()
        )),
        (Expect::Refused(error), false) => {
            Err(format!("refused, but not for {error:?}:\n{stderr}"))
        }
        (Expect::Refused(error), true) => Err(format!(
            "accepted, though it should fail with {error:?}:\n{stdout}"
        )),
    }
}

/// A kustomization of the rendered base with `patch` on its DaemonSet.
fn write_variant(dir: &Path, rendered: &str, patch: &str) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("base.yaml"), rendered)?;
    let indented: String = patch.lines().map(|l| format!("      {l}\n")).collect();
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "resources:\n  - base.yaml\npatches:\n  - target:\n      kind: DaemonSet\n      name: shaper\n    patch: |-\n{indented}"
        ),
    )?;
    Ok(())
}

fn path_arg(path: &Path) -> String {
    path.display().to_string()
}
