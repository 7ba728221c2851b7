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
use shaper_tests::{
    Harness, PASS,
    caps::{CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON, CAP_SYS_ADMIN, effective, keep_only},
    config, packet,
    skb::SkbContext,
};

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
