//! The dequeue observer in the running kernel: a real qdisc (tbf, slower than the rate the data
//! path is configured for) releases packets after their departure time, as fq does after a
//! stall, and what leaves later than the calendar's own burst is charged to the calendar.

use std::{
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    os::fd::AsRawFd,
    process::Command,
    thread::sleep,
    time::Duration,
};

use shaper::{bpf::monotonic_now_ns, link::Interface};
use shaper_common::edt;
use shaper_tests::{Harness, config, with_short_bins};

const RATE_BPS: u64 = 100_000_000;
const DEV: &str = "shlate0";
const PEER: &str = "shlate1";
const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 1);
const REMOTE: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 2);
const PAYLOAD: usize = 1_000;
/// What the qdisc counts of such a datagram: Ethernet, IPv4 and UDP headers with it.
const FRAME: u64 = PAYLOAD as u64 + 14 + 20 + 8;
/// `SO_TXTIME` / `SCM_TXTIME` (asm-generic/socket.h).
const SO_TXTIME: libc::c_int = 61;

/// A veth pair whose first end sends through a 1 Mbit/s tbf: a 1,042-byte frame every 8.3 ms.
struct SlowLink;

impl SlowLink {
    fn new() -> Self {
        // Left by an interrupted run.
        delete_link();
        let link = Self;
        for args in [
            &["link", "add", DEV, "type", "veth", "peer", "name", PEER][..],
            &["addr", "add", "10.213.0.1/30", "dev", DEV],
            &["link", "set", PEER, "up"],
            &["link", "set", DEV, "up"],
            &[
                "neigh",
                "replace",
                "10.213.0.2",
                "lladdr",
                "02:00:00:00:00:02",
                "dev",
                DEV,
            ],
        ] {
            run("ip", args);
        }
        run(
            "tc",
            &[
                "qdisc", "replace", "dev", DEV, "root", "tbf", "rate", "1mbit", "burst", "1600",
                "limit", "100000",
            ],
        );
        link
    }

    fn ifindex(&self) -> u32 {
        Interface::lookup(DEV).expect("the slow link").ifindex
    }
}

impl Drop for SlowLink {
    fn drop(&mut self) {
        delete_link();
    }
}

fn delete_link() {
    let _ = Command::new("ip")
        .args(["link", "del", DEV])
        .stderr(std::process::Stdio::null())
        .status();
}

fn run(cmd: &str, args: &[&str]) {
    let status = Command::new(cmd).args(args).status().expect(cmd);
    assert!(status.success(), "{cmd} {args:?}: {status}");
}

/// A UDP socket whose datagrams carry a departure time in `skb->tstamp`, as shaper's stamps do.
fn timed_socket() -> UdpSocket {
    let sock = UdpSocket::bind(SocketAddrV4::new(LOCAL, 0)).expect("bind");
    let txtime = libc::sock_txtime {
        clockid: libc::CLOCK_MONOTONIC,
        flags: 0,
    };
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_TXTIME,
            (&txtime as *const libc::sock_txtime).cast(),
            size_of::<libc::sock_txtime>() as u32,
        )
    };
    assert_eq!(rc, 0, "SO_TXTIME: {}", std::io::Error::last_os_error());
    sock
}

/// Sends one datagram stamped to leave at `at_ns`.
fn send_at(sock: &UdpSocket, at_ns: u64) {
    let payload = [0u8; PAYLOAD];
    let mut dst = libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: 9u16.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(REMOTE).to_be(),
        },
        sin_zero: [0; 8],
    };
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut _,
        iov_len: payload.len(),
    };
    let space = unsafe { libc::CMSG_SPACE(size_of::<u64>() as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&mut dst as *mut libc::sockaddr_in).cast();
    msg.msg_namelen = size_of::<libc::sockaddr_in>() as u32;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space;
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = SO_TXTIME;
        (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<u64>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u64>(), at_ns);
    }
    let sent = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, 0) };
    assert_eq!(
        sent,
        PAYLOAD as isize,
        "{}",
        std::io::Error::last_os_error()
    );
}

#[test]
fn packets_a_qdisc_releases_late_are_charged_to_the_calendar() {
    let config = with_short_bins(config(RATE_BPS, 1_000_000_000));
    let mut h = Harness::new(config);
    let link = SlowLink::new();
    h.datapath
        .watch_dequeue(link.ifindex())
        .expect("attach the dequeue observer");
    let sock = timed_socket();

    // Spaced wider than tbf's 8.3 ms per frame: each leaves when it is due.
    for _ in 0..5 {
        send_at(&sock, monotonic_now_ns());
        sleep(Duration::from_millis(25));
    }
    let spaced = h.view().stats;
    assert_eq!(
        (spaced.late_packets, spaced.late_ns),
        (0, 0),
        "packets that left on time were charged"
    );

    // A clump, all due now: tbf releases one frame per 8.3 ms, so all but the first leave
    // later than two bins (bins of about a millisecond at this rate).
    let clump = 20;
    for _ in 0..clump {
        send_at(&sock, monotonic_now_ns());
    }
    sleep(Duration::from_millis(300));
    let stats = h.view().stats;
    assert!(
        (clump - 2..clump).contains(&stats.late_packets),
        "{} of {clump} counted late",
        stats.late_packets
    );
    let tx = edt::tx_time_ns(FRAME, config.ns_per_byte_fp);
    assert_eq!(
        stats.late_ns,
        stats.late_packets * tx,
        "each late frame owes its wire time"
    );
}
