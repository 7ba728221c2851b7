//! A veth pair of a test's own in the running kernel, through `ip` (needs root).

use std::process::{Command, Stdio};

/// Runs `ip ARGS`; panics if it fails.
pub fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("ip");
    assert!(status.success(), "ip {args:?}");
}

/// Creates the veth pair `dev`-`peer` afresh, both up: a pair an earlier run left is deleted
/// first. The caller holds whatever keeps its other tests off the same names.
pub fn pair(dev: &str, peer: &str) {
    let _ = Command::new("ip")
        .args(["link", "del", dev])
        .stderr(Stdio::null())
        .status();
    ip(&["link", "add", dev, "type", "veth", "peer", "name", peer]);
    ip(&["link", "set", dev, "up"]);
    ip(&["link", "set", peer, "up"]);
}
