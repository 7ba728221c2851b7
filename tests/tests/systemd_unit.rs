//! The systemd unit (deploy/systemd/shaper.service), checked by systemd's own tools:
//! `systemd-analyze verify` (syntax, directives, the executable) and `systemd-analyze
//! security` (its exposure, which must stay at or below the figure in the README).

use std::{path::PathBuf, process::Command};

/// The exposure `systemd-analyze security` gives the unit, in tenths (2.2 when written).
const MAX_EXPOSURE_TENTHS: &str = "25";

fn unit() -> (String, PathBuf) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd/shaper.service");
    (std::fs::read_to_string(&path).unwrap(), path)
}

/// The unit as installed, but running this test's own executable, since verify checks that
/// ExecStart's file exists and this machine need not have shaper installed.
fn installed_copy() -> PathBuf {
    let (text, _) = unit();
    let exe = std::env::current_exe().unwrap();
    let text = text.replace("/usr/local/bin/shaper", exe.to_str().unwrap());
    let dir = std::env::temp_dir().join(format!("shaper-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("shaper.service");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn the_unit_is_what_the_card_asks() {
    let (text, _) = unit();
    let lines: Vec<&str> = text.lines().collect();
    for expected in [
        "Type=notify",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "CapabilityBoundingSet=CAP_BPF CAP_NET_ADMIN CAP_PERFMON",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "RestrictAddressFamilies=AF_UNIX AF_NETLINK AF_INET AF_INET6",
    ] {
        assert!(lines.contains(&expected), "the unit lacks {expected}");
    }
}

#[test]
fn systemd_verifies_the_unit() {
    let copy = installed_copy();
    // --man=no: the man pages come with `cargo xtask dist`, not installed on a build machine.
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&copy)
        .output()
        .expect("systemd-analyze (Debian's systemd; cargo xtask bootstrap installs it)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.trim().is_empty(), "{stderr}");
}

#[test]
fn the_units_exposure_stays_low() {
    let copy = installed_copy();
    let out = Command::new("systemd-analyze")
        .args([
            "security",
            "--offline=true",
            "--no-pager",
            &format!("--threshold={MAX_EXPOSURE_TENTHS}"),
        ])
        .arg(&copy)
        .output()
        .expect("systemd-analyze");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let overall = stdout
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or("no overall exposure line");
    assert!(
        out.status.success(),
        "exposure above {MAX_EXPOSURE_TENTHS} tenths: {overall}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
