//! Handing the data path to the next process (`shaper::handover`), in the running kernel: a
//! successor's object loaded with the maps its predecessor left goes on with their state (its
//! counters, its hosts, each flow's clock), an object whose maps would not fit starts anew,
//! and the programs are replaced in place at a TCX link and at a netlink filter. Needs root.
//! Each test mounts a bpffs of its own.

use std::{ffi::CString, path::PathBuf, sync::Mutex};

use aya::programs::{SchedClassifier, TcAttachType};
use shaper::{
    bpf::{Datapath, NETLINK_PRIORITY, Prior},
    config::StateParams,
    filter::{self, Hook},
    handover::{Leaving, Left},
    link::Interface,
    netlink::Socket,
    qdisc,
    record::AttachMode,
};
use shaper_common::names::map_names;
use shaper_tests::{
    Harness, PASS, TEST_STATE, config,
    packet::{self, Frame},
    skb::SkbContext,
    veth,
};

const SECOND: u64 = 1_000_000_000;
/// A rate at which each 1,000-byte packet of a flow books the next 8 ms later.
const SLOW_BPS: u64 = 1_000_000;

/// A bpffs mounted on a directory of its own, unmounted on drop.
struct Bpffs {
    dir: PathBuf,
}

impl Bpffs {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("shaper-bpffs-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let target = CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
        let bpf = CString::new("bpf").unwrap();
        // SAFETY: NUL-terminated strings; no data.
        let rc = unsafe {
            libc::mount(
                bpf.as_ptr(),
                target.as_ptr(),
                bpf.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        assert_eq!(
            rc,
            0,
            "mounting bpffs on {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
        Self { dir }
    }

    fn dir(&self) -> PathBuf {
        self.dir.clone()
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let target = CString::new(self.dir.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A UDP datagram of `flow`'s from 10.0.0.`host` to 10.0.1.1, 1,000 bytes on the wire.
fn datagram(host: u8, flow: u16) -> Vec<u8> {
    let mut udp = packet::udp_header(flow, 9, 0);
    udp.resize(1_000 - 14 - 20, 0);
    Frame::ether_type(packet::ETH_P_IP)
        .payload(packet::ipv4(
            packet::UDP,
            [10, 0, 0, host],
            [10, 0, 1, 1],
            &udp,
        ))
        .build()
}

#[test]
fn a_successor_goes_on_with_the_state_its_predecessor_left() {
    let fs = Bpffs::new("carry");
    let cfg = config(SLOW_BPS, 10 * SECOND);
    let mut old = Harness::new(cfg);
    let mut last = 0;
    for _ in 0..3 {
        let out = old.run(&datagram(1, 1), &SkbContext::default());
        assert_eq!(out.verdict, PASS);
        last = out.ctx.tstamp();
    }
    old.run(&datagram(2, 2), &SkbContext::default());
    let before = old.view().stats;
    let hosts = old.datapath.hosts().unwrap().len();
    assert_eq!(before.shaped_packets, 4);

    old.datapath
        .leave(&Leaving::at(fs.dir()), AttachMode::Tcx)
        .expect("pin the carried maps");
    // The tail calls' array too: the kernel empties it when no process holds it any more, and
    // the program left attached would pass everything.
    assert!(fs.dir().join(map_names::PROGRAMS).exists());
    let (datapath, carried) =
        Datapath::load_carrying(&TEST_STATE, &Left::at(fs.dir())).expect("load the successor");
    assert!(carried, "every carried map was left and fits");
    let mut new = Harness { datapath };
    new.datapath.configure(&cfg).unwrap();
    assert_eq!(new.view().stats.shaped_packets, 4, "the counters go on");
    assert_eq!(
        new.datapath.hosts().unwrap().len(),
        hosts,
        "the hosts go on"
    );

    // The flow's next packet is booked after the three its predecessor stamped, on the flow's
    // clock; a data path with new maps would send it now, a burst on top of what fq holds.
    let next = new.run(&datagram(1, 1), &SkbContext::default());
    assert_eq!(next.verdict, PASS);
    assert!(
        next.ctx.tstamp() > last,
        "stamped {} ns, not after the predecessor's last departure {last} ns",
        next.ctx.tstamp()
    );
    // One set of maps: what the successor counts, its predecessor's object sees.
    assert_eq!(old.view().stats.shaped_packets, 5);
}

#[test]
fn maps_that_do_not_fit_the_successor_are_not_carried() {
    let fs = Bpffs::new("misfit");
    let mut old = Harness::new(config(SLOW_BPS, 10 * SECOND));
    old.run(&datagram(1, 1), &SkbContext::default());
    old.datapath
        .leave(&Leaving::at(fs.dir()), AttachMode::Tcx)
        .unwrap();
    let larger = StateParams {
        max_flows: TEST_STATE.max_flows * 2,
        ..TEST_STATE
    };
    let (datapath, carried) = Datapath::load_carrying(&larger, &Left::at(fs.dir())).unwrap();
    assert!(!carried, "the flows map has another size");
    assert_eq!(datapath.snapshot().unwrap().stats.shaped_packets, 0);

    // All or none: one map missing, none is carried.
    std::fs::remove_file(fs.dir().join(map_names::CALENDAR)).unwrap();
    let (datapath, carried) = Datapath::load_carrying(&TEST_STATE, &Left::at(fs.dir())).unwrap();
    assert!(!carried, "the calendar was not left");
    assert_eq!(datapath.snapshot().unwrap().stats.shaped_packets, 0);
}

/// The tests below share one veth pair.
static LINK: Mutex<()> = Mutex::new(());
const DEV: &str = "shho0";
const PEER: &str = "shho1";

fn veth() -> std::sync::MutexGuard<'static, ()> {
    let only = LINK.lock().unwrap_or_else(|p| p.into_inner());
    veth::pair(DEV, PEER);
    only
}

fn egress_program_id(datapath: &Datapath) -> u32 {
    datapath
        .attached_id(Hook::Egress)
        .unwrap()
        .expect("attached")
}

#[test]
fn a_tcx_link_left_pinned_is_updated_to_the_successors_program() {
    if !shaper::probe::has_tcx() {
        eprintln!("skipped: this kernel has no TCX (the netlink test covers it)");
        return;
    }
    let _only = veth();
    let fs = Bpffs::new("tcx");
    let mut old = Datapath::load(&TEST_STATE).unwrap();
    old.attach_egress(DEV, AttachMode::Tcx).unwrap();
    let old_id = egress_program_id(&old);
    old.leave(&Leaving::at(fs.dir()), AttachMode::Tcx).unwrap();
    drop(old);
    let (_, attached) = SchedClassifier::query_tcx(DEV, TcAttachType::Egress).unwrap();
    assert_eq!(
        attached.iter().map(|p| p.id()).collect::<Vec<_>>(),
        [old_id],
        "the pinned link keeps the program attached after its process let go"
    );

    let left = Left::at(fs.dir());
    let (mut new, carried) = Datapath::load_carrying(&TEST_STATE, &left).unwrap();
    assert!(carried);
    let link = left.take_link(Hook::Egress).expect("the pinned link");
    new.take_over(Hook::Egress, DEV, Prior::Link(link)).unwrap();
    let new_id = egress_program_id(&new);
    let (_, attached) = SchedClassifier::query_tcx(DEV, TcAttachType::Egress).unwrap();
    assert_eq!(
        attached.iter().map(|p| p.id()).collect::<Vec<_>>(),
        [new_id],
        "one program at egress, the successor's"
    );
    assert_ne!(new_id, old_id);
    assert!(
        !fs.dir().join("link-egress").exists(),
        "the link was taken out of bpffs"
    );
    new.detach().unwrap();
    let (_, attached) = SchedClassifier::query_tcx(DEV, TcAttachType::Egress).unwrap();
    assert!(
        attached.is_empty(),
        "the successor owns the link: detaching removes it"
    );
    veth::ip(&["link", "del", DEV]);
}

#[test]
fn a_netlink_filter_is_changed_in_place_to_the_successors_program() {
    let _only = veth();
    let fs = Bpffs::new("netlink");
    let iface = Interface::lookup(DEV).unwrap();
    let mut sock = Socket::open().unwrap();
    qdisc::add_clsact(&mut sock, iface.ifindex).unwrap();
    let ours = |sock: &mut Socket| -> Vec<(u32, Option<u32>)> {
        filter::list(sock, iface.ifindex, Hook::Egress)
            .unwrap()
            .into_iter()
            // The kernel lists the priority's head too, without a program.
            .filter(|f| f.priority == u32::from(NETLINK_PRIORITY) && f.program_id.is_some())
            .map(|f| (f.handle, f.program_id))
            .collect()
    };
    let mut old = Datapath::load(&TEST_STATE).unwrap();
    old.attach_egress(DEV, AttachMode::Netlink).unwrap();
    let old_id = egress_program_id(&old);
    old.leave(&Leaving::at(fs.dir()), AttachMode::Netlink)
        .unwrap();
    drop(old);
    let before = ours(&mut sock);
    assert_eq!(
        before.len(),
        1,
        "the filter stays after its process let go: {before:?}"
    );
    assert_eq!(before[0].1, Some(old_id));
    assert!(
        !fs.dir().join("link-egress").exists(),
        "a netlink filter needs no pin"
    );

    let (mut new, _) = Datapath::load_carrying(&TEST_STATE, &Left::at(fs.dir())).unwrap();
    new.take_over(
        Hook::Egress,
        DEV,
        Prior::Filter {
            handle: before[0].0,
        },
    )
    .unwrap();
    let new_id = egress_program_id(&new);
    assert_eq!(
        ours(&mut sock),
        [(before[0].0, Some(new_id))],
        "the same filter, running the successor's program"
    );
    new.detach().unwrap();
    assert!(ours(&mut sock).is_empty(), "the successor owns the filter");
    veth::ip(&["link", "del", DEV]);
}

#[test]
fn a_control_loop_takes_up_the_hosts_it_finds_without_reading_their_past_as_one_tick() {
    use shaper::control::Controller;
    use shaper_common::{diffserv::Diffserv, isolation::Isolation};

    let cfg = config(SLOW_BPS, 10 * SECOND);
    let mut h = Harness::new(cfg);
    for _ in 0..50 {
        h.run(&datagram(1, 1), &SkbContext::default());
    }
    let mut predecessor = Controller::new(SLOW_BPS, Isolation::TripleIsolate, Diffserv::Besteffort);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let last = predecessor.tick(&mut h.datapath).unwrap();
    assert_eq!(last.active_hosts, 1);

    // No packet since: a loop that takes the data path up sees an idle host, on the next
    // epoch; one that does not reads its 50 packets as this tick's.
    let mut fresh = Controller::new(SLOW_BPS, Isolation::TripleIsolate, Diffserv::Besteffort);
    let mut resumed = Controller::new(SLOW_BPS, Isolation::TripleIsolate, Diffserv::Besteffort);
    resumed.resume(&h.datapath).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let tick = resumed.tick(&mut h.datapath).unwrap();
    assert_eq!(tick.epoch, last.epoch + 1, "the epochs go on");
    assert_eq!(tick.active_hosts, 0, "nothing was sent during the tick");
    let misread = fresh.tick(&mut h.datapath).unwrap();
    assert_eq!(
        misread.active_hosts, 1,
        "without taking up, the past reads as demand"
    );
}
