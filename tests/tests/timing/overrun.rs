//! The dequeue observer in the running kernel: a real qdisc (tbf) releases packets after their
//! departure time, as fq does after a stall or on a busy CPU. What leaves ahead of the rate the
//! data path is configured for, beyond the meter's burst, is charged to the calendar; what
//! leaves late but no faster than the rate is not.

use std::{
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    os::fd::AsRawFd,
    process::Command,
    sync::{Mutex, MutexGuard},
    thread::sleep,
    time::Duration,
};

use shaper::{bpf::monotonic_now_ns, link::Interface};
use shaper_common::{edt, overrun};
use shaper_tests::{Harness, config, with_short_bins};

const RATE_BPS: u64 = 1_000_000;
const DEV: &str = "shlate0";
const PEER: &str = "shlate1";
const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 1);
const REMOTE: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 2);
const PAYLOAD: usize = 1_000;
/// What the qdisc counts of such a datagram: Ethernet, IPv4 and UDP headers with it.
const FRAME: u64 = PAYLOAD as u64 + 14 + 20 + 8;
/// `SO_TXTIME` / `SCM_TXTIME` (asm-generic/socket.h).
const SO_TXTIME: libc::c_int = 61;

/// A veth pair whose first end sends through a tbf at a given rate. The tests share its name,
/// so one holds it at a time.
struct SlowLink {
    _only: MutexGuard<'static, ()>,
}

static LINK: Mutex<()> = Mutex::new(());

impl SlowLink {
    fn new(tbf_rate: &str) -> Self {
        let only = LINK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // Left by an interrupted run.
        delete_link();
        let link = Self { _only: only };
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
                "qdisc", "replace", "dev", DEV, "root", "tbf", "rate", tbf_rate, "burst", "1600",
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

/// The data path at 1 Mbit/s watching a link whose tbf releases at `tbf_rate`, and a socket
/// whose datagrams carry departure times. `behind_bottleneck`: as the ingress direction's IFB.
fn watched(tbf_rate: &str, behind_bottleneck: bool) -> (Harness, SlowLink, UdpSocket, u64) {
    let config = with_short_bins(config(RATE_BPS, 1_000_000_000));
    let mut h = Harness::new(config);
    let link = SlowLink::new(tbf_rate);
    h.datapath
        .watch_dequeue(link.ifindex(), behind_bottleneck)
        .expect("attach the dequeue observer");
    let tx = edt::tx_time_ns(FRAME, config.ns_per_byte_fp);
    (h, link, timed_socket(), tx)
}

#[test]
fn packets_released_late_but_no_faster_than_the_rate_are_not_charged() {
    // Just under the data path's rate: a 1,042-byte frame every 8.4 ms.
    let (h, _link, sock, _) = watched("990kbit", false);
    // All due now: tbf releases them one by one, the last 160 ms after its departure time,
    // as fq's timer does on a busy CPU. The device never sent faster than the rate.
    for _ in 0..20 {
        send_at(&sock, monotonic_now_ns());
    }
    sleep(Duration::from_millis(300));
    nothing_charged(&h, "late departures at the rate were charged");
}

#[test]
fn a_clump_released_ahead_of_the_rate_is_charged_what_it_sent_beyond_the_burst() {
    // A hundred times the data path's rate: the clump leaves within 2 ms.
    let (h, _link, sock, tx) = watched("100mbit", false);
    let config = h.datapath.config();
    let burst = overrun::burst_ns(config.calendar_bin_ns);

    // Spaced wider than their wire time at the rate: nothing to charge.
    for _ in 0..3 {
        send_at(&sock, monotonic_now_ns());
        sleep(Duration::from_millis(25));
    }
    nothing_charged(&h, "packets that left at the rate were charged");

    // Idle long enough for the meter to hold its whole burst, then a clump.
    sleep(Duration::from_millis(100));
    clump_due_now_is_charged_beyond_the_burst(&h, &sock, tx, burst);
}

/// Checks that the meter has charged nothing so far; `why` names what would have been wrongly
/// charged.
fn nothing_charged(h: &Harness, why: &str) {
    let stats = h.view().stats;
    assert_eq!((stats.overrun_packets, stats.overrun_ns), (0, 0), "{why}");
}

/// Sends 20 frames all due now, which leave together, and checks that what they sent beyond
/// the meter's burst (the device idle before them) is charged.
fn clump_due_now_is_charged_beyond_the_burst(h: &Harness, sock: &UdpSocket, tx: u64, burst: u64) {
    let before = h.view().stats;
    let clump = 20;
    for _ in 0..clump {
        send_at(sock, monotonic_now_ns());
    }
    sleep(Duration::from_millis(100));
    let stats = h.view().stats;
    let (charged_ns, charged_packets) = (
        stats.overrun_ns - before.overrun_ns,
        stats.overrun_packets - before.overrun_packets,
    );
    let expected = clump * tx - burst;
    assert!(
        charged_ns <= expected && charged_ns + tx / 2 >= expected,
        "charged {charged_ns} ns for a clump of {clump} frames of {tx} ns with a {burst} ns burst",
    );
    assert!(
        charged_packets >= clump - burst / tx - 1,
        "{charged_packets} of {clump} frames charged",
    );
}

#[test]
fn behind_the_bottleneck_a_stalls_clump_is_charged_only_what_left_ahead_of_its_departure_times() {
    let (h, _link, sock, tx) = watched("100mbit", true);
    let config = h.datapath.config();
    let burst = overrun::burst_ns(config.calendar_bin_ns);
    let clump = 20;
    // Booked at the rate and due over the last 170 ms, held by a stall, released together:
    // each leaves after its departure time, and nothing is charged.
    sleep(Duration::from_millis(100));
    let base = monotonic_now_ns() - clump * tx - 2 * burst;
    for i in 0..clump {
        send_at(&sock, base + i * tx);
    }
    sleep(Duration::from_millis(100));
    nothing_charged(
        &h,
        "packets that left after their departure times were charged",
    );
    // The same clump all due now leaves ahead of the rate as from an idle device: charged
    // beyond the burst, as in front of the bottleneck.
    sleep(Duration::from_millis(250));
    clump_due_now_is_charged_beyond_the_burst(&h, &sock, tx, burst);
}
