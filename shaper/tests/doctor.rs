//! `shaper doctor` on the running kernel, as root: the probes find what the kernel has, the
//! exit code follows the failures, and the host is left as it was.
//!
//! What is asserted about the kernel is only what shaper's build and test machines share (see
//! README, "Testing and the VM"): Linux 6.6 or later with BTF, clsact and TCX built in. Whether
//! it has fq is read independently of the doctor, from the module lists and sysfs; the build
//! machines' kernel has not, which the doctor must report as a failure with a remedy.

use std::{path::Path, process::Command};

use serde_json::Value;
use shaper::{link::Interface, netlink::Socket, qdisc};

fn doctor(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shaper"))
        .arg("doctor")
        .args(args)
        .output()
        .expect("running shaper doctor");
    (
        out.status.code().expect("shaper doctor exited by a signal"),
        String::from_utf8(out.stdout).expect("UTF-8 output"),
    )
}

fn doctor_json(args: &[&str]) -> (i32, Value) {
    let (code, stdout) = doctor(&[&["--json"], args].concat());
    let json = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    (code, json)
}

fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .expect("a list of checks")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name} in {report:#}"))
}

fn is_root() -> bool {
    // SAFETY: geteuid(2) has no failure mode.
    unsafe { libc::geteuid() == 0 }
}

/// Whether this kernel has fq, by the module lists and sysfs (not by the doctor's probe).
fn kernel_has_fq() -> bool {
    if Path::new("/sys/module/sch_fq").exists() {
        return true;
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let dir = Path::new("/lib/modules").join(release.trim());
    ["modules.builtin", "modules.dep"]
        .iter()
        .any(|f| std::fs::read_to_string(dir.join(f)).is_ok_and(|t| t.contains("/sch_fq.ko")))
}

/// Every check is well formed, the counts add up and the exit code follows the failures.
fn assert_consistent(code: i32, report: &Value) {
    let checks = report["checks"].as_array().unwrap();
    assert!(!checks.is_empty());
    let mut failed = 0;
    for c in checks {
        let status = c["status"].as_str().unwrap();
        assert!(["pass", "warn", "fail"].contains(&status), "{c}");
        assert!(!c["detail"].as_str().unwrap().is_empty(), "{c}");
        let remedy = c["remedy"].as_str().filter(|r| !r.is_empty());
        assert_eq!(remedy.is_some(), status != "pass", "{c}");
        failed += usize::from(status == "fail");
    }
    assert_eq!(report["failed"], failed);
    assert_eq!(code, if failed == 0 { 0 } else { 1 }, "{report:#}");
}

#[test]
fn the_kernel_checks_find_btf_clsact_and_tcx_and_what_the_kernel_says_of_fq() {
    assert!(
        is_root(),
        "shaper doctor probes as root (as the BPF tests run)"
    );
    let (code, report) = doctor_json(&[]);
    assert_consistent(code, &report);
    for name in ["btf", "clsact", "tcx", "capabilities"] {
        assert_eq!(check(&report, name)["status"], "pass", "{report:#}");
    }
    let fq = check(&report, "sch_fq");
    if kernel_has_fq() {
        assert_eq!(fq["status"], "pass", "{fq}");
    } else {
        assert_eq!(fq["status"], "fail", "{fq}");
        assert!(
            fq["remedy"].as_str().unwrap().contains("CONFIG_NET_SCH_FQ"),
            "{fq}"
        );
        assert_eq!(code, 1);
    }
}

#[test]
fn an_interface_is_checked_and_a_missing_one_fails() {
    let (code, report) = doctor_json(&["--iface", "lo"]);
    assert_consistent(code, &report);
    assert_eq!(check(&report, "interface")["status"], "pass");
    assert_eq!(check(&report, "running_shaper")["detail"], "none");
    assert!(
        check(&report, "tx_queues")["detail"]
            .as_str()
            .unwrap()
            .starts_with("1: ")
    );
    let (code, report) = doctor_json(&["--iface", "nosuch0"]);
    assert_consistent(code, &report);
    assert_eq!(check(&report, "interface")["status"], "fail");
    assert_eq!(code, 1);
    let names: Vec<_> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(!names.contains(&"root_qdisc"), "{names:?}");
}

#[test]
fn text_output_prints_a_line_per_check_and_remedies_under_them() {
    let (code, text) = doctor(&[]);
    let (json_code, report) = doctor_json(&[]);
    assert_eq!(code, json_code);
    let checks = report["checks"].as_array().unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let remedies = checks.iter().filter(|c| c["status"] != "pass").count();
    // One line per check, one per remedy, the summary.
    assert_eq!(lines.len(), checks.len() + remedies + 1, "{text}");
    let mut at = 0;
    for c in checks {
        let line = lines[at];
        assert!(line.contains(c["name"].as_str().unwrap()), "{line}");
        at += 1;
        if let Some(remedy) = c["remedy"].as_str() {
            assert!(lines[at].trim_start().starts_with("-> "), "{}", lines[at]);
            assert!(lines[at].ends_with(remedy), "{}", lines[at]);
            at += 1;
        }
    }
    assert!(lines[at].ends_with(&format!("{} failed", report["failed"])));
}

#[test]
fn the_doctor_leaves_the_interface_it_checks_as_it_was() {
    // Only what the doctor could touch: other tests may add and remove interfaces meanwhile.
    let lo = Interface::lookup("lo").unwrap();
    let lo_qdiscs = || qdisc::list(&mut Socket::open().unwrap(), lo.ifindex).unwrap();
    let before = lo_qdiscs();
    let (code, report) = doctor_json(&["--iface", "lo"]);
    assert_consistent(code, &report);
    assert_eq!(lo_qdiscs(), before);
    // The probes' own device lived in a namespace of their own.
    assert!(!Path::new("/sys/class/net/ifb-probe").exists());
}

#[test]
fn bad_usage_is_clap_s_exit_code() {
    assert_eq!(doctor(&["--no-such-option"]).0, 2);
}
