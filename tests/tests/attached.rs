//! What shaper's health check reads as attached (`health::attached`), in the running kernel, in
//! a thread with only the capabilities shaper's DaemonSet and systemd unit grant. Reading a
//! program attached through TCX as detached made the check attach it again four times a second,
//! and traffic left unshaped between. Needs root (to create the device, then give the rest up).

use std::sync::Mutex;

use aya::programs::{SchedClassifier, TcAttachType};
use shaper::{
    bpf::Datapath, filter::Hook, health, link::Interface, netlink::Socket, qdisc,
    record::AttachMode,
};
use shaper_tests::{
    TEST_STATE,
    caps::{CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON, CAP_SYS_ADMIN, effective, keep_only},
    veth,
};

/// One device at a time: the tests share its name.
static DEVICE: Mutex<()> = Mutex::new(());
const DEV: &str = "shat0";
const PEER: &str = "shat1";

/// Attaches a fresh data path at DEV's egress in `mode` and checks what the health check reads
/// there, attached and after detaching, as shaper runs: without CAP_SYS_ADMIN.
fn reads_its_own_program(mode: AttachMode) {
    let _only = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    veth::pair(DEV, PEER);
    let iface = Interface::lookup(DEV).unwrap();
    let mut sock = Socket::open().unwrap();
    if mode == AttachMode::Netlink {
        qdisc::add_clsact(&mut sock, iface.ifindex).unwrap();
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            keep_only(&[CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON]);
            assert_eq!(effective() & 1 << CAP_SYS_ADMIN, 0);
            let mut sock = Socket::open().unwrap();
            let mut datapath = Datapath::load(&TEST_STATE).unwrap();
            datapath.attach_egress(DEV, mode).unwrap();
            let id = datapath
                .attached_id(Hook::Egress)
                .unwrap()
                .expect("attached");
            if mode == AttachMode::Tcx {
                // The premise: aya's query opens each program by id, refused here.
                assert!(SchedClassifier::query_tcx(DEV, TcAttachType::Egress).is_err());
            }
            let attached = health::attached(&mut sock, &iface, mode, Hook::Egress).unwrap();
            assert_eq!(attached, [id], "{mode:?}: the program shaper attached");
            assert!(health::is_attached(&mut sock, &iface, mode, Hook::Egress, id).unwrap());
            assert!(
                health::attached(&mut sock, &iface, mode, Hook::Ingress)
                    .unwrap()
                    .is_empty(),
                "{mode:?}: nothing at ingress"
            );
            datapath.detach().unwrap();
            let attached = health::attached(&mut sock, &iface, mode, Hook::Egress).unwrap();
            assert!(attached.is_empty(), "{mode:?}: detached, yet {attached:?}");
        })
        .join()
        .unwrap();
    });
    veth::ip(&["link", "del", DEV]);
}

#[test]
fn the_health_check_reads_a_tcx_program_attached_without_cap_sys_admin() {
    if !shaper::probe::has_tcx() {
        eprintln!("skipped: this kernel has no TCX (netlink is read below)");
        return;
    }
    reads_its_own_program(AttachMode::Tcx);
}

#[test]
fn the_health_check_reads_a_netlink_filter_attached_without_cap_sys_admin() {
    reads_its_own_program(AttachMode::Netlink);
}
