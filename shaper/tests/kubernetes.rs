//! The Kubernetes manifests (`deploy/kubernetes`) against this build's own command line and
//! config validation: the DaemonSet's arguments are options `shaper run` has, and each
//! shaper.toml the manifests ship passes the validation `shaper run` does before it touches
//! anything. The API server's side is `cargo xtask k8s check`.

use std::path::{Path, PathBuf};

use clap::Parser;
use shaper::{
    cli::{Cli, Command},
    handover::WhenReplaced,
    interfaces::Plan,
};

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

/// The first container's `args:` list of a manifest (plain `- value` items, comments skipped).
fn container_args(manifest: &str) -> Vec<String> {
    let mut lines = manifest.lines().skip_while(|l| l.trim() != "args:").skip(1);
    let mut args = Vec::new();
    for line in lines.by_ref() {
        let item = line.trim();
        if item.starts_with('#') {
            continue;
        }
        match item.strip_prefix("- ") {
            Some(value) => args.push(value.trim_matches('"').to_string()),
            None => break,
        }
    }
    args
}

#[test]
fn the_daemonset_runs_options_that_exist_with_a_config_that_validates() {
    let manifest = std::fs::read_to_string(deploy().join("daemonset/daemonset.yaml")).unwrap();
    let args = container_args(&manifest);
    assert_eq!(args.first().map(String::as_str), Some("run"), "{args:?}");
    // The kubelet puts the pod's (the node's) address in for $(POD_IP).
    let args = args.iter().map(|a| a.replace("$(POD_IP)", "10.1.2.3"));
    let cli = Cli::try_parse_from(std::iter::once("shaper".to_string()).chain(args))
        .unwrap_or_else(|e| panic!("the DaemonSet's arguments: {e}"));
    let Command::Run(run) = cli.command else {
        panic!("the DaemonSet does not run `shaper run`");
    };
    assert!(
        run.keep && run.replace,
        "a rolling update needs --keep and --replace"
    );
    assert_eq!(
        run.when_replaced,
        WhenReplaced::Wait,
        "a replaced shaper that exits is restarted by the kubelet, and takes the interfaces back"
    );
    assert_eq!(
        run.config.as_deref(),
        Some(Path::new("/etc/shaper/shaper.toml")),
        "where the ConfigMap is mounted"
    );
    for config in [
        deploy().join("shaper.toml"),
        deploy().join("examples/rate-95mbit/shaper.toml"),
    ] {
        let plan = Plan::load(run.options.clone(), Some(&config))
            .unwrap_or_else(|e| panic!("{}: {e}", config.display()));
        assert!(plan.has_sections(), "{}", config.display());
        assert_eq!(
            plan.process().metrics,
            Some("10.1.2.3:9101".parse().unwrap()),
            "metrics on the node's own address"
        );
    }
}

#[test]
fn args_are_read_up_to_the_end_of_the_list() {
    let manifest = "containers:\n  - name: x\n    args:\n      - run\n      # a comment\n      - \"--keep\"\n    env:\n      - name: Y\n";
    assert_eq!(container_args(manifest), ["run", "--keep"]);
}
