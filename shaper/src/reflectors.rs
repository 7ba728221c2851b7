//! Round trips to reflectors: ICMP echo requests to the addresses the user names
//! (`--autorate-reflectors`), sent in turn from the shaped interface every
//! [`PROBE_INTERVAL`], each timed from its sending to its reply. Autorate reads the samples
//! every tick (`autorate`).
//!
//! Raw sockets bound to the interface: the requests leave by it whatever the routes say, and
//! only the replies that came in by it are read. Every raw ICMP socket of the namespace sees
//! every echo reply, so a reply is taken only with this prober's identifier and a sequence
//! number it sent.

use std::{
    collections::VecDeque,
    io,
    net::{IpAddr, SocketAddr},
    os::fd::AsRawFd,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use shaper_common::autorate;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::{io::unix::AsyncFd, task::JoinHandle};
use tracing::{debug, warn};

/// Between two requests, to whichever reflector is next: four samples a control tick, of which
/// autorate takes the least delay, so that a tick reads as a queue only when every sample saw
/// one (40 echo requests a second: 9 kbit/s of IPv4 Ethernet frames each way).
pub const PROBE_INTERVAL: Duration = Duration::from_millis(25);

/// A request not answered within this is forgotten (its reply, if it comes, is ignored).
const ANSWER_WITHIN: Duration = Duration::from_secs(2);

const ICMP_ECHO_REQUEST: u8 = 8;
const ICMP_ECHO_REPLY: u8 = 0;
const ICMPV6_ECHO_REQUEST: u8 = 128;
const ICMPV6_ECHO_REPLY: u8 = 129;

/// One answered request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub reflector: IpAddr,
    pub rtt: Duration,
}

/// The prober: a task of the run's runtime, sending and reading until dropped.
pub struct Prober {
    samples: Arc<Mutex<Vec<Sample>>>,
    task: JoinHandle<()>,
}

impl Prober {
    /// Starts probing `reflectors` from interface `iface` (its name); needs a tokio runtime.
    pub fn start(iface: &str, ifindex: u32, reflectors: Vec<IpAddr>) -> io::Result<Self> {
        let open = |v6: bool| -> io::Result<Option<AsyncFd<Socket>>> {
            if !reflectors.iter().any(|r| r.is_ipv6() == v6) {
                return Ok(None);
            }
            let (domain, protocol) = if v6 {
                (Domain::IPV6, Protocol::ICMPV6)
            } else {
                (Domain::IPV4, Protocol::ICMPV4)
            };
            let socket = Socket::new(domain, Type::RAW, Some(protocol))?;
            socket.set_nonblocking(true)?;
            socket.bind_device(Some(iface.as_bytes()))?;
            // Past shaper's own queue: the probes measure the link's.
            socket.set_priority(autorate::PROBE_PRIORITY)?;
            set_timestamps(&socket)?;
            // SAFETY: a Socket always returns its own, open descriptor, owned here until the
            // AsyncFd is dropped.
            Ok(Some(
                unsafe { AsyncFd::register(socket) }.map_err(io::Error::from)?,
            ))
        };
        let sockets = Sockets {
            v4: open(false)?,
            v6: open(true)?,
        };
        let samples = Arc::new(Mutex::new(Vec::new()));
        let mut echo = Echo {
            // Told apart from the other probers of the namespace (one per shaped interface, and
            // ping's): the process and the interface.
            id: (std::process::id() as u16) ^ (ifindex as u16).rotate_left(8),
            next_seq: 0,
            pending: VecDeque::new(),
        };
        let iface = iface.to_string();
        let shared = samples.clone();
        let task = tokio::spawn(async move {
            let mut send = tokio::time::interval(PROBE_INTERVAL);
            send.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut turn = 0usize;
            let mut warned = false;
            loop {
                tokio::select! {
                    _ = send.tick() => {
                        let reflector = reflectors[turn % reflectors.len()];
                        turn = turn.wrapping_add(1);
                        if let Err(e) = echo.send(&sockets, reflector) {
                            // Once: a reflector unreachable from the interface stays so.
                            if !std::mem::replace(&mut warned, true) {
                                warn!("{iface}: autorate probe to {reflector}: {e}");
                            }
                        }
                    }
                    got = sockets.recv() => match got {
                        Ok(r) => {
                            if let Some(sample) = echo.answered(r.from, &r.bytes, r.at) {
                                shared.lock().unwrap_or_else(|e| e.into_inner()).push(sample);
                            }
                        }
                        Err(e) => debug!("{iface}: reading autorate replies: {e}"),
                    },
                }
            }
        });
        Ok(Self { samples, task })
    }

    /// The samples answered since the last call.
    pub fn take(&self) -> Vec<Sample> {
        std::mem::take(&mut *self.samples.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Sockets {
    v4: Option<AsyncFd<Socket>>,
    v6: Option<AsyncFd<Socket>>,
}

impl Sockets {
    /// The next ICMP message either socket reads: a v4 message without its IP header, as a v6
    /// one comes.
    async fn recv(&self) -> io::Result<Received> {
        tokio::select! {
            got = read(self.v4.as_ref()) => {
                let mut got = got?;
                // A raw IPv4 socket reads the IP header too.
                let header = got.bytes.first().map_or(0, |b| usize::from(b & 0x0f) * 4);
                got.bytes = got.bytes.get(header..).unwrap_or_default().to_vec();
                Ok(got)
            }
            got = read(self.v6.as_ref()) => got,
        }
    }
}

/// One datagram from `socket` and when the kernel received it; never, without a socket.
async fn read(socket: Option<&AsyncFd<Socket>>) -> io::Result<Received> {
    let Some(socket) = socket else {
        return std::future::pending().await;
    };
    loop {
        let mut guard = socket.readable().await?;
        match guard.try_io(|s| receive(s.get_ref())) {
            Ok(got) => return got,
            Err(_would_block) => continue,
        }
    }
}

/// A datagram, its sender, and the kernel's receive time (`SO_TIMESTAMPNS`, the realtime
/// clock): the reply's arrival, not when this process came to read it, which a control tick
/// running on the same thread delays by milliseconds.
struct Received {
    from: IpAddr,
    bytes: Vec<u8>,
    at: SystemTime,
}

fn receive(socket: &Socket) -> io::Result<Received> {
    let mut buf = [0u8; 1500];
    // Room for one timestamp message, 8-aligned as cmsghdr is.
    let mut control = [0u64; 8];
    let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: zeroed msghdr is valid; its pointers are set to live buffers below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&raw mut name).cast();
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1 as _;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: every pointer in msg refers to a buffer of the length it is given with.
    let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &raw mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let from = match i32::from(name.ss_family) {
        // SAFETY: the family says which address the storage holds.
        libc::AF_INET => {
            let a = unsafe { &*(&raw const name).cast::<libc::sockaddr_in>() };
            IpAddr::from(u32::from_be(a.sin_addr.s_addr).to_be_bytes())
        }
        libc::AF_INET6 => {
            let a = unsafe { &*(&raw const name).cast::<libc::sockaddr_in6>() };
            IpAddr::from(a.sin6_addr.s6_addr)
        }
        _ => return Err(io::Error::other("a reply from no IP address")),
    };
    let mut at = SystemTime::now();
    // SAFETY: the CMSG_* walk stays within msg_controllen of the control buffer.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&raw const msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::timespec>());
                at = SystemTime::UNIX_EPOCH + Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32);
            }
            c = libc::CMSG_NXTHDR(&raw const msg, c);
        }
    }
    Ok(Received {
        from,
        bytes: buf[..n as usize].to_vec(),
        at,
    })
}

/// Asks the kernel for each datagram's receive time (`SO_TIMESTAMPNS`).
fn set_timestamps(socket: &Socket) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: a valid descriptor and an int option of its size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&raw const on).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The requests in flight and the messages they are.
struct Echo {
    id: u16,
    next_seq: u16,
    /// Sequence number, reflector, and when it was sent (the realtime clock, as the kernel's
    /// receive times are).
    pending: VecDeque<(u16, IpAddr, SystemTime)>,
}

impl Echo {
    fn send(&mut self, sockets: &Sockets, to: IpAddr) -> io::Result<()> {
        let seq = self.next_seq;
        self.next_seq = seq.wrapping_add(1);
        let socket = match to {
            IpAddr::V4(_) => sockets.v4.as_ref(),
            IpAddr::V6(_) => sockets.v6.as_ref(),
        };
        let socket = socket.ok_or_else(|| io::Error::other("no socket of its family"))?;
        let message = request(to.is_ipv6(), self.id, seq);
        let sent_at = SystemTime::now();
        socket
            .get_ref()
            .send_to(&message, &SockAddr::from(SocketAddr::new(to, 0)))?;
        let now = SystemTime::now();
        while self
            .pending
            .front()
            .is_some_and(|(_, _, at)| now.duration_since(*at).unwrap_or_default() > ANSWER_WITHIN)
        {
            self.pending.pop_front();
        }
        self.pending.push_back((seq, to, sent_at));
        Ok(())
    }

    /// The sample `message` (an ICMP message from `from`, received `at`) answers, if it is the
    /// reply to one of this prober's requests in flight.
    fn answered(&mut self, from: IpAddr, message: &[u8], at: SystemTime) -> Option<Sample> {
        let (id, seq) = reply_of(from.is_ipv6(), message)?;
        if id != self.id {
            return None;
        }
        let found = self
            .pending
            .iter()
            .position(|(s, to, _)| *s == seq && *to == from)?;
        let (_, reflector, sent_at) = self.pending.remove(found)?;
        Some(Sample {
            reflector,
            // A clock stepped back between the two reads as no time.
            rtt: at.duration_since(sent_at).unwrap_or_default(),
        })
    }
}

/// An echo request: type, code, checksum, identifier, sequence number, no data. The kernel
/// fills ICMPv6's checksum (it covers the IPv6 pseudo-header); ICMP's is computed here.
fn request(v6: bool, id: u16, seq: u16) -> [u8; 8] {
    let kind = if v6 {
        ICMPV6_ECHO_REQUEST
    } else {
        ICMP_ECHO_REQUEST
    };
    let mut m = [kind, 0, 0, 0, 0, 0, 0, 0];
    m[4..6].copy_from_slice(&id.to_be_bytes());
    m[6..8].copy_from_slice(&seq.to_be_bytes());
    if !v6 {
        let sum = checksum(&m);
        m[2..4].copy_from_slice(&sum.to_be_bytes());
    }
    m
}

/// The identifier and sequence number of an echo reply.
fn reply_of(v6: bool, message: &[u8]) -> Option<(u16, u16)> {
    let reply = if v6 {
        ICMPV6_ECHO_REPLY
    } else {
        ICMP_ECHO_REPLY
    };
    if message.len() < 8 || message[0] != reply || message[1] != 0 {
        return None;
    }
    Some((
        u16::from_be_bytes([message[4], message[5]]),
        u16::from_be_bytes([message[6], message[7]]),
    ))
}

/// The Internet checksum (RFC 1071) of `data`, of even length.
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_carry_their_identifier_sequence_and_a_valid_checksum() {
        let m = request(false, 0x1234, 7);
        assert_eq!(&m[..2], &[8, 0]);
        assert_eq!(&m[4..], &[0x12, 0x34, 0, 7]);
        // A message with its checksum in place sums to zero.
        assert_eq!(checksum(&m), 0);
        let m6 = request(true, 1, 2);
        assert_eq!(m6, [128, 0, 0, 0, 0, 1, 0, 2]);
    }

    #[test]
    fn only_replies_to_this_probers_requests_in_flight_are_samples() {
        let mut echo = Echo {
            id: 9,
            next_seq: 0,
            pending: VecDeque::new(),
        };
        let reflector: IpAddr = "192.0.2.1".parse().unwrap();
        let sent = SystemTime::now();
        echo.pending.push_back((5, reflector, sent));
        let at = sent + Duration::from_millis(30);
        let reply = |id: u16, seq: u16| {
            let mut m = request(false, id, seq);
            m[0] = ICMP_ECHO_REPLY;
            m
        };
        // Another prober's, a request (our own, looped back), another sequence, another host.
        assert_eq!(echo.answered(reflector, &reply(8, 5), at), None);
        assert_eq!(echo.answered(reflector, &request(false, 9, 5), at), None);
        assert_eq!(echo.answered(reflector, &reply(9, 6), at), None);
        let elsewhere = "192.0.2.2".parse().unwrap();
        assert_eq!(echo.answered(elsewhere, &reply(9, 5), at), None);
        let sample = echo.answered(reflector, &reply(9, 5), at).unwrap();
        assert_eq!(sample.reflector, reflector);
        assert_eq!(sample.rtt, Duration::from_millis(30));
        // Answered once only.
        assert_eq!(echo.answered(reflector, &reply(9, 5), at), None);
    }
}
