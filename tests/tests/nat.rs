//! `--nat` in the running kernel: a router namespace masquerades a LAN of two machines onto its
//! WAN device, where the data path classifies its egress. With the conntrack layout set, each
//! LAN machine is a host of its own, as CAKE's `nat` makes it; without, the router's one
//! address is the only host. Needs root, conntrack and nft (the build machine's kernel has
//! conntrack built in; `cargo xtask bootstrap` installs nftables).

use std::{os::fd::AsRawFd, process::Command};

use shaper::{
    bpf::Datapath, conntrack, link::Interface, netlink::Socket, qdisc, record::AttachMode,
};
use shaper_common::{
    abi::{FlowKey, ShaperConfig},
    conntrack::ConntrackLayout,
    isolation::Isolation,
};
use shaper_tests::{TEST_STATE, config, veth::ip};

const LAN: &str = "shnat-lan";
const ROUTER: &str = "shnat-router";
const SERVER: &str = "shnat-srv";
const LAN_HOSTS: [&str; 2] = ["10.77.0.2", "10.77.0.3"];
const ROUTER_WAN: &str = "10.78.0.1";
const SERVER_ADDR: &str = "10.78.0.2";

/// Runs `f` in a thread inside the network namespace `ns`.
fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = std::fs::File::open(format!("/run/netns/{ns}")).expect("netns");
            // SAFETY: setns on this thread only, with a namespace file it holds open.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns {ns}");
            f()
        })
        .join()
        .unwrap()
    })
}

/// `ip -n NS ARGS`.
fn netns(ns: &str, args: &[&str]) {
    ip(&[&["-n", ns], args].concat());
}

/// LAN (two addresses) -- router (masquerading out of its WAN device) -- server.
fn topology() {
    for ns in [LAN, ROUTER, SERVER] {
        let _ = Command::new("ip").args(["netns", "del", ns]).status();
        ip(&["netns", "add", ns]);
    }
    ip(&[
        "link", "add", "shnat-l", "netns", LAN, "type", "veth", "peer", "name", "shnat-rl",
        "netns", ROUTER,
    ]);
    ip(&[
        "link", "add", "shnat-w", "netns", ROUTER, "type", "veth", "peer", "name", "shnat-s",
        "netns", SERVER,
    ]);
    for a in LAN_HOSTS {
        netns(LAN, &["addr", "add", &format!("{a}/24"), "dev", "shnat-l"]);
    }
    netns(LAN, &["link", "set", "shnat-l", "up"]);
    netns(LAN, &["route", "add", "default", "via", "10.77.0.1"]);
    netns(ROUTER, &["addr", "add", "10.77.0.1/24", "dev", "shnat-rl"]);
    netns(
        ROUTER,
        &["addr", "add", &format!("{ROUTER_WAN}/24"), "dev", "shnat-w"],
    );
    netns(ROUTER, &["link", "set", "shnat-rl", "up"]);
    netns(ROUTER, &["link", "set", "shnat-w", "up"]);
    netns(
        SERVER,
        &[
            "addr",
            "add",
            &format!("{SERVER_ADDR}/24"),
            "dev",
            "shnat-s",
        ],
    );
    netns(SERVER, &["link", "set", "shnat-s", "up"]);
    let run = |args: &[&str]| {
        let status = Command::new("ip")
            .args([&["netns", "exec", ROUTER], args].concat())
            .status()
            .expect("ip netns exec");
        assert!(status.success(), "{args:?}");
    };
    run(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    run(&["nft", "add table ip nat"]);
    run(&[
        "nft",
        "add chain ip nat post { type nat hook postrouting priority srcnat; }",
    ]);
    run(&["nft", "add rule ip nat post oifname shnat-w masquerade"]);
}

fn teardown() {
    for ns in [LAN, ROUTER, SERVER] {
        let _ = Command::new("ip").args(["netns", "del", ns]).status();
    }
}

/// Pings the server from each LAN machine's address.
fn traffic() {
    for a in LAN_HOSTS {
        let status = Command::new("ip")
            .args([
                "netns", "exec", LAN, "ping", "-c", "2", "-i", "0.2", "-W", "2", "-I", a,
            ])
            .arg(SERVER_ADDR)
            .status()
            .expect("ping");
        assert!(status.success(), "ping from {a} through the router");
    }
}

fn addr(a: &str) -> [u32; 4] {
    let v4: std::net::Ipv4Addr = a.parse().unwrap();
    [u32::from_ne_bytes(v4.octets()), 0, 0, 0]
}

/// The source hosts the router's WAN egress saw, with `layout` set.
fn hosts_seen(layout: Option<ConntrackLayout>) -> Vec<[u32; 4]> {
    topology();
    let hosts = in_netns(ROUTER, || {
        let mut datapath = Datapath::load(&TEST_STATE).unwrap();
        datapath
            .configure(&ShaperConfig {
                isolation: Isolation::SrcHost as u32,
                host_mask_v4: u32::MAX,
                ..config(100_000_000, 1_000_000_000)
            })
            .unwrap();
        datapath.set_conntrack(&layout.unwrap_or_default()).unwrap();
        let wan = Interface::lookup("shnat-w").unwrap();
        qdisc::add_clsact(&mut Socket::open().unwrap(), wan.ifindex).unwrap();
        datapath
            .attach_egress("shnat-w", AttachMode::Netlink)
            .unwrap();
        traffic();
        let hosts: Vec<FlowKey> = datapath
            .hosts()
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        datapath.detach().unwrap();
        hosts
    });
    teardown();
    // IPv4 only: the devices' own IPv6 chatter (MLD, router solicitations) comes and goes.
    let mut seen: Vec<[u32; 4]> = hosts
        .iter()
        .filter(|k| k.family == 4)
        .map(|k| k.src)
        .collect();
    seen.sort();
    seen.dedup();
    seen
}

#[test]
fn behind_a_masquerading_router_each_lan_machine_is_a_host() {
    let layout = conntrack::layout().expect("conntrack in the running kernel");
    let with = hosts_seen(Some(layout));
    let mut lan: Vec<[u32; 4]> = LAN_HOSTS.iter().map(|a| addr(a)).collect();
    lan.sort();
    assert_eq!(with, lan, "with --nat: the LAN machines, not the router");
    let without = hosts_seen(None);
    assert_eq!(
        without,
        vec![addr(ROUTER_WAN)],
        "without: the router's address alone"
    );
}
