//! `lab-probe blast`: many hosts sending UDP over many flows at once, for the scale benchmark
//! (tests/vm/bench-scale.sh): what a host-fair shaper must keep fair with thousands of hosts
//! and a flood of new flows, which iperf3 (a connection per flow, a process per host) cannot
//! produce.
//!
//! Host `h` is the `h`-th IPv4 address from `--from` (all of them local addresses), and its
//! flows are its sockets (`--sockets`, each its own source port) times the destination ports
//! `--port ..= --port + --ports - 1`: its packets cycle through them, destination port first,
//! so with `--sockets 1` each host has `--ports` flows that all stay active, and with many
//! sockets and ports every packet for a long time is a flow never seen before. Hosts offer
//! `--rate` between them in proportion to `--weights` (repeated over the hosts), paced on the
//! monotonic clock. Each round over the hosts, a host earns its weight over the heaviest one's
//! in packets and sends what it has earned whole (the heaviest one packet a round): every host
//! sends steadily, interleaved with the others, so none is favoured by its place in the order
//! and none sends in bursts (with a turn of 20 packets each, 1,000 hosts took 1.8 s a round and
//! each host was on for 100 ms and off for the rest, which no 100 ms control loop sees as the
//! steady load the benchmark means).

use std::{
    io,
    net::{Ipv4Addr, UdpSocket},
    os::fd::{AsRawFd, RawFd},
    time::{Duration, Instant},
};

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub first: Ipv4Addr,
    pub hosts: u32,
    pub sockets: u32,
    pub port: u16,
    pub ports: u16,
    /// Offered load of all hosts together, counted as Ethernet frames (bits per second).
    pub rate_bps: f64,
    /// UDP payload bytes per packet.
    pub size: usize,
    pub duration: Duration,
    /// From when (since the start) a second report counts what was sent: the window a receiver
    /// measures after its warm-up, when the emulated VM offers less late in a run than early.
    pub window: Duration,
    /// Relative offered load per host, repeated over the hosts.
    pub weights: Vec<f64>,
    pub target: Ipv4Addr,
}

/// Ethernet, IPv4 and UDP headers: what a packet of `size` payload costs on the wire as the
/// shaper counts it (blast sends IPv4 only; the sink counts frames the same way).
pub const HEADERS: usize = 14 + 20 + 8;
struct Host {
    sockets: Vec<UdpSocket>,
    /// Packets earned per round: its weight over the heaviest one's.
    per_round: f64,
    /// Earned and not yet sent.
    credit: f64,
    sent: u64,
}

/// Sends until the duration is over; prints what it sent and the rate it achieved (the
/// emulated VM may not keep up with what was asked, and the benchmark must know).
pub fn run(c: &Config) -> Result<(), String> {
    let heaviest = c.weights.iter().copied().fold(0.0, f64::max);
    let mut hosts = Vec::with_capacity(c.hosts as usize);
    for h in 0..c.hosts {
        let addr = Ipv4Addr::from(u32::from(c.first).wrapping_add(h));
        // Non-blocking: a socket whose buffer is full (its packets wait in the qdisc) must not
        // hold up the other hosts; its packet is counted as refused, as an application that
        // drops on EAGAIN would.
        let sockets = (0..c.sockets)
            .map(|_| {
                let s = UdpSocket::bind((addr, 0))?;
                s.set_nonblocking(true)?;
                Ok(s)
            })
            .collect::<io::Result<Vec<_>>>()
            .map_err(|e| format!("binding a socket to {addr} (is it a local address?): {e}"))?;
        let weight = c.weights[h as usize % c.weights.len()];
        hosts.push(Host {
            sockets,
            per_round: weight / heaviest,
            credit: 0.0,
            sent: 0,
        });
    }
    let payload = vec![0x5a_u8; c.size];
    let pps = c.rate_bps / 8.0 / (c.size + HEADERS) as f64;
    let start = Instant::now();
    let (mut sent, mut failed) = (0_u64, 0_u64);
    // The heaviest host earns a whole packet every round, so every round sends something.
    let mut turn: Vec<u32> = vec![0; hosts.len()];
    let mut next = hosts.len() - 1;
    let mut batch = Batch::new(&payload, c.target);
    let mut at_window = None;
    loop {
        let elapsed = start.elapsed();
        if elapsed >= c.duration {
            break;
        }
        if at_window.is_none() && elapsed >= c.window {
            at_window = Some((sent, elapsed));
        }
        let due = (elapsed.as_secs_f64() * pps) as u64;
        if sent + failed >= due {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        for _ in 0..(due - sent - failed).min(4096) {
            // The next host with a packet earned in this round; a new round when all are done
            // (the heaviest host earns one every round, so this ends).
            while turn[next] == 0 {
                next += 1;
                if next == hosts.len() {
                    next = 0;
                    for (t, h) in turn.iter_mut().zip(hosts.iter_mut()) {
                        h.credit += h.per_round;
                        *t = h.credit as u32;
                        h.credit -= f64::from(*t);
                    }
                }
            }
            turn[next] -= 1;
            let host = &mut hosts[next];
            let k = host.sent;
            host.sent += 1;
            let port = c.port + (k % u64::from(c.ports)) as u16;
            let socket =
                &host.sockets[((k / u64::from(c.ports)) % host.sockets.len() as u64) as usize];
            let (ok, refused) = batch.push(socket, port);
            sent += ok;
            failed += refused;
        }
        let (ok, refused) = batch.flush();
        sent += ok;
        failed += refused;
    }
    let end = start.elapsed();
    let secs = end.as_secs_f64();
    let frame_bits = ((c.size + HEADERS) * 8) as f64;
    println!(
        "blast: sent {sent} packets ({failed} refused by the socket) in {secs:.1} s: {:.0} packets/s, {:.1} Mbit/s of frames",
        sent as f64 / secs,
        sent as f64 * frame_bits / secs / 1e6
    );
    if let Some((before, from)) = at_window.filter(|_| !c.window.is_zero()) {
        let (n, secs) = (sent - before, (end - from).as_secs_f64());
        println!(
            "blast: window from {:.1} s: sent {n} packets in {secs:.1} s: {:.0} packets/s, {:.1} Mbit/s of frames",
            from.as_secs_f64(),
            n as f64 / secs,
            n as f64 * frame_bits / secs / 1e6
        );
    }
    Ok(())
}

/// Consecutive packets from one socket, sent with one `sendmmsg`: a flooding host's packets go
/// from one socket to many destination ports in a row, and one system call per packet kept the
/// emulated VM's flood at 60,000 new 5-tuples a second, short of the 100,000 the benchmark asks.
/// (The hosts' interleaved packets change socket every packet and gain nothing.)
struct Batch<'a> {
    payload: &'a [u8],
    target: Ipv4Addr,
    socket: RawFd,
    ports: Vec<u16>,
}

/// Packets per `sendmmsg` (the kernel's UIO_MAXIOV caps it at 1024).
const BATCH: usize = 64;

impl<'a> Batch<'a> {
    fn new(payload: &'a [u8], target: Ipv4Addr) -> Self {
        Batch {
            payload,
            target,
            socket: -1,
            ports: Vec::with_capacity(BATCH),
        }
    }

    /// Queues a packet from `socket` to `port`; returns what a flush this caused sent and what
    /// the socket refused.
    fn push(&mut self, socket: &UdpSocket, port: u16) -> (u64, u64) {
        let fd = socket.as_raw_fd();
        let flushed = if fd != self.socket || self.ports.len() == BATCH {
            self.flush()
        } else {
            (0, 0)
        };
        self.socket = fd;
        self.ports.push(port);
        flushed
    }

    /// Sends what is queued: (sent, refused). A full socket buffer (the emulated VM not keeping
    /// up) refuses the rest of the batch, which is counted, not fatal.
    fn flush(&mut self) -> (u64, u64) {
        if self.ports.is_empty() {
            return (0, 0);
        }
        let addresses: Vec<libc::sockaddr_in> = self
            .ports
            .iter()
            .map(|&port| libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: port.to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(self.target).to_be(),
                },
                sin_zero: [0; 8],
            })
            .collect();
        let mut iov = libc::iovec {
            iov_base: self.payload.as_ptr() as *mut libc::c_void,
            iov_len: self.payload.len(),
        };
        let mut messages: Vec<libc::mmsghdr> = addresses
            .iter()
            .map(|address| {
                // SAFETY: msghdr is plain data; zeroed is its empty value (musl has padding
                // fields that a struct literal cannot name).
                let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
                header.msg_name = address as *const libc::sockaddr_in as *mut libc::c_void;
                header.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
                header.msg_iov = &mut iov;
                header.msg_iovlen = 1;
                libc::mmsghdr {
                    msg_hdr: header,
                    msg_len: 0,
                }
            })
            .collect();
        let queued = messages.len() as u64;
        // SAFETY: every header points at `addresses` and `iov`, which outlive the call.
        let sent = unsafe {
            libc::sendmmsg(
                self.socket,
                messages.as_mut_ptr(),
                messages.len() as _,
                libc::MSG_DONTWAIT as _,
            )
        };
        self.ports.clear();
        let sent = u64::try_from(sent).unwrap_or(0);
        (sent, queued - sent)
    }
}
