//! The `shaper` binary on this machine: bad input, missing privileges and missing kernel
//! features give a clear message and a non-zero exit, and leave the interface as it was.
//! Needs root (it creates a network namespace and drops privileges itself).

use std::{
    os::unix::process::CommandExt,
    process::{Command, Output},
};

const SHAPER: &str = env!("CARGO_BIN_EXE_shaper");

fn shaper(args: &[&str]) -> Output {
    Command::new(SHAPER)
        .args(args)
        .output()
        .expect("run shaper")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn assert_refused(args: &[&str], expected: &str) {
    let out = shaper(args);
    let err = stderr(&out);
    assert!(!out.status.success(), "{args:?} was accepted");
    assert!(
        err.contains(expected),
        "{args:?}: expected {expected:?} in {err:?}"
    );
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
}

#[test]
fn bad_input_is_refused_with_a_clear_message() {
    assert_refused(
        &["run", "--iface", "lo", "--rate", "0"],
        "rate must be greater than zero",
    );
    assert_refused(
        &["run", "--iface", "lo", "--rate", "fast"],
        "invalid rate \"fast\"",
    );
    assert_refused(
        &["run", "--iface", "lo", "--rate", "10 mbit/s"],
        "unknown unit",
    );
    assert_refused(&["run", "--iface", "lo"], "no rate given");
    assert_refused(&["run", "--rate", "1gbit"], "no interface given");
    assert_refused(
        &["run", "--iface", "no-such-if0", "--rate", "1gbit"],
        "no interface named",
    );
    assert_refused(
        &[
            "run",
            "--iface",
            "lo",
            "--rate",
            "1gbit",
            "--horizon",
            "1us",
        ],
        "at least 1ms",
    );
    assert_refused(
        &[
            "run",
            "--iface",
            "lo",
            "--rate",
            "1gbit",
            "--config",
            "/nonexistent.toml",
        ],
        "cannot read config file",
    );
    assert_refused(&["stats", "--iface", "lo"], "no shaper is running on lo");
    assert_refused(&["stats", "--iface", "no-such-if0"], "no interface named");
    assert_refused(
        &["run", "--iface", "lo", "--rate", "1gbit", "--bogus"],
        "unexpected argument",
    );
}

/// `--version` names the commit the binary was built from: its short hash, `-dirty` when the
/// tree had changes, or `unknown` when it was built without git.
#[test]
fn version_names_the_commit() {
    let out = shaper(&["--version"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let commit = said
        .strip_prefix(concat!("shaper ", env!("CARGO_PKG_VERSION"), " ("))
        .and_then(|rest| rest.strip_suffix(")\n"))
        .unwrap_or_else(|| panic!("{said:?}"));
    let hash = commit.strip_suffix("-dirty").unwrap_or(commit);
    assert!(
        hash == "unknown" || (hash.len() >= 7 && hash.bytes().all(|b| b.is_ascii_hexdigit())),
        "{said:?}"
    );
}

#[test]
fn without_privileges_nothing_is_attempted_and_every_missing_capability_is_named() {
    let out = Command::new(SHAPER)
        .args(["run", "--iface", "lo", "--rate", "1gbit"])
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run shaper as nobody");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("lacks CAP_NET_ADMIN, CAP_BPF, CAP_PERFMON"),
        "{}",
        stderr(&out)
    );
}

fn host_has_fq() -> bool {
    if std::path::Path::new("/sys/module/sch_fq").exists() {
        return true;
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    ["modules.builtin", "modules.dep"].iter().any(|f| {
        std::fs::read_to_string(format!("/lib/modules/{}/{f}", release.trim()))
            .is_ok_and(|t| t.contains("/sch_fq.ko"))
    })
}

/// A private network namespace holding a veth pair `sa0`/`sb0`, both up; deleted on drop.
struct VethNamespace {
    ns: NetnsGuard,
}

impl VethNamespace {
    fn new(tag: &str) -> Self {
        let ns = format!("shaper-{tag}-{}", std::process::id());
        let ip = |args: &[&str]| {
            let status = Command::new("ip").args(args).status().expect("ip");
            assert!(status.success(), "ip {args:?}");
        };
        ip(&["netns", "add", &ns]);
        let guard = NetnsGuard(ns.clone());
        ip(&[
            "-n", &ns, "link", "add", "sa0", "type", "veth", "peer", "name", "sb0",
        ]);
        ip(&["-n", &ns, "link", "set", "sa0", "up"]);
        ip(&["-n", &ns, "link", "set", "sb0", "up"]);
        Self { ns: guard }
    }

    /// `tc qdisc show dev sa0` in the namespace.
    fn qdiscs(&self) -> String {
        let out = Command::new("ip")
            .args([
                "netns", "exec", &self.ns.0, "tc", "qdisc", "show", "dev", "sa0",
            ])
            .output()
            .expect("tc");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `shaper ARGS` in the namespace.
    fn shaper(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns.0, SHAPER]).args(args);
        cmd
    }
}

/// On a host without sch_fq, shaper says so and leaves the interface as it was. (A host with
/// it cannot show this; the test says so and checks nothing.)
#[test]
fn without_fq_shaper_says_so_and_leaves_the_interface_alone() {
    if host_has_fq() {
        eprintln!("skipped: this host has sch_fq, so it cannot be missing");
        return;
    }
    let veth = VethNamespace::new("no-fq");
    let before = veth.qdiscs();
    let out = veth
        .shaper(&["run", "--iface", "sa0", "--rate", "10mbit"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no fq qdisc (sch_fq)"),
        "{}",
        stderr(&out)
    );
    assert_eq!(veth.qdiscs(), before, "the interface changed");
}

/// On a host with sch_fq, shaper starts, and on SIGTERM exits cleanly and leaves the interface
/// as it found it (the VM tests cover this path in depth, on kernels that have fq). A host
/// without it cannot run this; the test says so and checks nothing.
#[test]
fn with_fq_shaper_starts_and_restores_the_interface_on_sigterm() {
    if !host_has_fq() {
        eprintln!("skipped: this host has no sch_fq, which shaper needs to run");
        return;
    }
    let veth = VethNamespace::new("fq");
    let before = veth.qdiscs();
    let mut child = veth
        .shaper(&["run", "--iface", "sa0", "--rate", "10mbit"])
        .spawn()
        .unwrap();
    let started = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        veth.shaper(&["stats", "--iface", "sa0"])
            .output()
            .unwrap()
            .status
            .success()
    });
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(started, "shaper did not start within 10 s");
    assert!(status.success(), "shaper exited with {status} on SIGTERM");
    assert_eq!(veth.qdiscs(), before, "the interface was not restored");
}

/// Without a state file (a crash that lost it, an older version), `shaper reset` removes what
/// carries shaper's marks (its root handle, its IFB and the redirect to it) and nothing else.
#[test]
fn reset_removes_what_carries_shapers_marks_and_nothing_else() {
    let ns = format!("shaper-reset-{}", std::process::id());
    let sh = |script: &str| {
        let status = Command::new("ip")
            .args(["netns", "exec", &ns, "sh", "-ec", script])
            .status()
            .expect("sh");
        assert!(status.success(), "{script}");
    };
    let out = |script: &str| {
        let out = Command::new("ip")
            .args(["netns", "exec", &ns, "sh", "-c", script])
            .output()
            .expect("sh");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let status = Command::new("ip").args(["netns", "add", &ns]).status();
    assert!(status.expect("ip").success());
    let _cleanup = NetnsGuard(ns.clone());
    sh("ip link add sa0 type veth peer name sb0
        ip link set sa0 up; ip link set sb0 up
        tc qdisc add dev sa0 root handle 5348: pfifo
        ip link add ifb4sa0 type ifb; ip link set ifb4sa0 up
        ip link add ifb9 type ifb
        tc qdisc add dev sa0 clsact");
    // Filters need cls_matchall and act_mirred; without them the IFB alone is the mark.
    let filters = Command::new("ip")
        .args(["netns", "exec", &ns, "sh", "-ec"])
        .arg(
            "tc filter add dev sa0 ingress prio 1 matchall action pass
             tc filter add dev sa0 ingress prio 65535 matchall action mirred egress redirect dev ifb4sa0",
        )
        .status()
        .is_ok_and(|s| s.success());
    let reset = Command::new("ip")
        .args(["netns", "exec", &ns, SHAPER, "reset", "--iface", "sa0"])
        .output()
        .expect("shaper reset");
    let said = String::from_utf8_lossy(&reset.stdout).into_owned();
    assert!(reset.status.success(), "{}", stderr(&reset));
    assert!(
        said.contains("ifb4sa0") && said.contains("root qdisc"),
        "{said}"
    );
    assert!(
        !out("tc qdisc show dev sa0").contains("5348:"),
        "shaper's root left"
    );
    assert!(
        !out("ip link show").contains("ifb4sa0"),
        "shaper's IFB left"
    );
    assert!(out("ip link show").contains("ifb9"), "another IFB removed");
    assert!(
        out("tc qdisc show dev sa0").contains("clsact"),
        "clsact is not shaper's"
    );
    if filters {
        let left = out("tc filter show dev sa0 ingress");
        assert!(
            left.contains("pref 1 "),
            "someone else's filter removed: {left}"
        );
        assert!(!left.contains("pref 65535 "), "the redirect left: {left}");
    }
    let again = Command::new("ip")
        .args(["netns", "exec", &ns, SHAPER, "reset", "--iface", "sa0"])
        .output()
        .expect("shaper reset");
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("nothing of shaper's found"));
    assert_refused(&["reset", "--iface", "nosuch0"], "no interface named");
}

struct NetnsGuard(String);

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}
