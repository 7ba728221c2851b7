//! The metrics endpoint of a shaper that has only the capabilities its DaemonSet and systemd
//! unit grant (CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON): it reads its maps through the descriptors
//! it holds, since opening a map by id takes CAP_SYS_ADMIN. Needs root (to give the rest up).
//!
//! Capabilities belong to a thread: the test gives them up on a thread of its own, which loads
//! the data path, shapes a packet and serves the endpoint from there (the server's thread is
//! created by it, with its capabilities).

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    sync::Arc,
    time::Duration,
};

use shaper::{
    bpf::{BpfError, MapReader},
    metrics::{Direction, http, status::Monitor},
    record::{AttachMode, State},
};
use shaper_tests::{Harness, PASS, config, packet, skb::SkbContext};

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// `capset(2)`'s header and one of its two 32-bit words of each set (version 3).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Leaves the calling thread with exactly `caps`, effective and permitted (for good: what is
/// no longer permitted cannot be taken back).
fn keep_only(caps: &[u32]) {
    let mut data = [CapData::default(); 2];
    for &cap in caps {
        let word = &mut data[(cap / 32) as usize];
        word.effective |= 1 << (cap % 32);
        word.permitted |= 1 << (cap % 32);
    }
    let header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: a version-3 header and its two data words, as capset(2) reads them.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) };
    assert_eq!(rc, 0, "capset: {}", std::io::Error::last_os_error());
}

/// The calling thread's effective set, from the kernel.
fn effective() -> u64 {
    let header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: as above; capget(2) writes the two words.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &header, data.as_mut_ptr()) };
    assert_eq!(rc, 0, "capget: {}", std::io::Error::last_os_error());
    u64::from(data[0].effective) | u64::from(data[1].effective) << 32
}

fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn the_endpoint_reads_its_maps_without_cap_sys_admin() {
    std::thread::spawn(|| {
        keep_only(&[CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON]);
        let bit = |cap: u32| 1u64 << cap;
        assert_eq!(
            effective(),
            bit(CAP_BPF) | bit(CAP_NET_ADMIN) | bit(CAP_PERFMON)
        );
        assert_eq!(effective() & bit(CAP_SYS_ADMIN), 0);

        let mut h = Harness::new(config(1_000_000, 10_000_000_000));
        let out = h.run(&packet::tcp4_frame(1_514), &SkbContext::default());
        assert_eq!(out.verdict, PASS);
        let ids = h.datapath.map_ids().unwrap();
        // What the endpoint read before: by id, refused without CAP_SYS_ADMIN.
        let by_id = MapReader::by_ids(&ids).unwrap_err();
        assert!(matches!(by_id, BpfError::ById(_)), "{by_id}");

        let monitor = Monitor::default();
        monitor.configured(["s0".to_string()]);
        monitor.holds(
            "s0",
            Direction::Egress,
            Arc::new(h.datapath.reader().unwrap()),
        );
        monitor.checked("s0", vec![(Direction::Egress, state(ids))], true);
        let listener = http::listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        http::spawn(listener, monitor.clone(), 5).unwrap();

        let health = get(addr, "/healthz");
        assert!(health.starts_with("HTTP/1.1 200 "), "{health}");
        let ready = get(addr, "/readyz");
        assert!(ready.starts_with("HTTP/1.1 200 "), "{ready}");
        let metrics = get(addr, "/metrics");
        assert!(metrics.starts_with("HTTP/1.1 200 "), "{metrics}");
        let egress = r#"{interface="s0",direction="egress"}"#;
        assert!(
            metrics.contains(&format!("\nshaper_packets_total{egress} 1\n")),
            "{metrics}"
        );
        assert!(
            metrics.contains("\nshaper_host_bytes_total{"),
            "the top hosts: {metrics}"
        );

        // Once the interface is let go, nothing of it is read, or held.
        drop(h);
        monitor.forget("s0");
        monitor.configured([]);
        let metrics = get(addr, "/metrics");
        assert!(!metrics.contains("shaper_packets_total{"), "{metrics}");
        assert!(get(addr, "/healthz").starts_with("HTTP/1.1 200 "));
    })
    .join()
    .unwrap();
}

/// A state file's content for the loaded data path (only its maps' ids are real).
fn state(maps: shaper::record::MapIds) -> State {
    State {
        pid: std::process::id(),
        iface: "s0".into(),
        ifindex: 2,
        rate_bps: 1_000_000,
        horizon_ns: 10_000_000_000,
        isolation: "triple-isolate".into(),
        diffserv: "besteffort".into(),
        started_unix_s: 0,
        starting: false,
        kept: false,
        attach: AttachMode::Tcx,
        clsact_added: false,
        original: Default::default(),
        original_gso: None,
        ingress: None,
        segmenter: None,
        maps,
    }
}
