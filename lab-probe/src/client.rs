//! The client: a request every interval on a schedule of its own (not waiting for replies, so
//! a slow reply delays no later request), a thread that takes the replies as they come, and
//! one line per reply in `ping -D`'s format:
//!
//! ```text
//! [1795394521.508878] 64 bytes from 10.1.1.2: seq=2 time=0.360 ms
//! ...
//! --- 10.1.1.2 udp-rr statistics ---
//! 2300 packets transmitted, 2297 received, 0.1304% packet loss, 1 late
//! ```
//!
//! The time in brackets is the wall clock when the reply arrived (as ping's), the round trip
//! is measured on the monotonic clock. A request without a reply within the timeout is lost;
//! a reply later than that is counted `late` and lost too, as ping would have given up.

use std::{
    io::{self, Read, Write},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant, SystemTime},
};

use crate::wire::{Request, SIZE};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Udp,
    Tcp,
}

impl Proto {
    /// The probe kind the lab calls it.
    fn kind(self) -> &'static str {
        match self {
            Proto::Udp => "udp-rr",
            Proto::Tcp => "tcp-rr",
        }
    }
}

#[derive(Debug)]
pub struct Config {
    pub proto: Proto,
    pub server: SocketAddr,
    pub interval: Duration,
    /// How long requests are sent; replies are awaited up to the timeout after that.
    pub duration: Duration,
    pub timeout: Duration,
}

/// How often the receiving thread looks up from its socket to see whether it may stop.
const POLL: Duration = Duration::from_millis(50);

/// What the sending thread tells the receiving one.
#[derive(Default)]
struct Progress {
    /// Requests sent so far (the next sequence number).
    sent: AtomicU64,
    /// No more requests will be sent.
    done: AtomicBool,
}

#[derive(Default)]
struct Tally {
    on_time: u64,
    late: u64,
    /// Why receiving stopped early (the TCP connection broke).
    error: Option<String>,
}

/// What a run measured, as its closing line says.
#[derive(Debug, PartialEq, Eq)]
pub struct Summary {
    pub sent: u64,
    pub received: u64,
    pub late: u64,
}

pub fn run(c: &Config) -> Result<Summary, String> {
    let (conn, rx) = connect(c).map_err(|e| format!("{} to {}: {e}", c.proto.kind(), c.server))?;
    println!(
        "LAB-PROBE {} {} port {}: {SIZE}-byte requests every {} s for {} s",
        c.proto.kind(),
        c.server.ip(),
        c.server.port(),
        c.interval.as_secs_f64(),
        c.duration.as_secs_f64()
    );
    let progress = Arc::new(Progress::default());
    let start = Instant::now();
    let receiver = {
        let progress = Arc::clone(&progress);
        let (timeout, from) = (c.timeout, c.server.ip().to_string());
        thread::spawn(move || receive(rx, start, &progress, timeout, &from))
    };
    let send_error = send(conn, c, start, &progress);
    progress.done.store(true, Ordering::Release);
    let tally = receiver
        .join()
        .map_err(|_| "the receiving thread failed".to_string())?;

    let sent = progress.sent.load(Ordering::Acquire);
    let loss = if sent == 0 {
        0.0
    } else {
        100.0 * (sent - tally.on_time) as f64 / sent as f64
    };
    println!(
        "\n--- {} {} statistics ---\n{sent} packets transmitted, {} received, {loss:.4}% packet loss, {} late",
        c.server.ip(),
        c.proto.kind(),
        tally.on_time,
        tally.late
    );
    match send_error.or(tally.error) {
        Some(e) => Err(e),
        None => Ok(Summary {
            sent,
            received: tally.on_time,
            late: tally.late,
        }),
    }
}

/// The sending side and the receiving side of one socket.
enum Conn {
    Udp(UdpSocket),
    Tcp(TcpStream),
}

fn connect(c: &Config) -> io::Result<(Conn, Receiver)> {
    let (tx, rx) = match c.proto {
        Proto::Udp => {
            let local: SocketAddr = match c.server {
                SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
                SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
            };
            let s = UdpSocket::bind(local)?;
            s.connect(c.server)?;
            let rx = s.try_clone()?;
            rx.set_read_timeout(Some(POLL))?;
            (Conn::Udp(s), Conn::Udp(rx))
        }
        Proto::Tcp => {
            let s = TcpStream::connect_timeout(&c.server, c.timeout)?;
            s.set_nodelay(true)?;
            let rx = s.try_clone()?;
            rx.set_read_timeout(Some(POLL))?;
            (Conn::Tcp(s), Conn::Tcp(rx))
        }
    };
    Ok((
        tx,
        Receiver {
            conn: rx,
            buf: [0; SIZE],
            filled: 0,
        },
    ))
}

/// Sends on schedule until the duration is over; returns why it stopped early, if it did.
fn send(mut conn: Conn, c: &Config, start: Instant, progress: &Progress) -> Option<String> {
    let end = start + c.duration;
    let mut next = start;
    let mut seq = 0u64;
    while next < end {
        let now = Instant::now();
        if next > now {
            thread::sleep(next - now);
        }
        // Counted before it leaves, so its reply can never look like a stray.
        progress.sent.store(seq + 1, Ordering::Release);
        let req = Request {
            seq,
            sent: start.elapsed(),
        }
        .encode();
        let result = match &mut conn {
            Conn::Udp(s) => s.send(&req).map(drop),
            Conn::Tcp(s) => s.write_all(&req),
        };
        match result {
            Ok(()) => {}
            // A datagram that could not leave (an ICMP error on the connected socket) is lost,
            // like a ping that got no reply; the next one may go.
            Err(_) if matches!(conn, Conn::Udp(_)) => {}
            Err(e) => return Some(format!("sending on the TCP connection: {e}")),
        }
        seq += 1;
        // After a stall (a busy emulated CPU) go on from now instead of sending a burst.
        next = (next + c.interval).max(Instant::now());
    }
    None
}

struct Receiver {
    conn: Conn,
    /// A TCP reply is read in pieces when the poll interval splits it.
    buf: [u8; SIZE],
    filled: usize,
}

impl Receiver {
    /// The next reply, or None when none came within the poll interval.
    fn next(&mut self) -> io::Result<Option<Request>> {
        let waited = |e: &io::Error| {
            matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
            )
        };
        match &mut self.conn {
            Conn::Udp(s) => {
                let mut buf = [0u8; 2048];
                match s.recv(&mut buf) {
                    Ok(n) => Ok(Request::decode(&buf[..n])),
                    // The server's port not (yet) open: that request is lost, not the probe.
                    Err(e) if waited(&e) || e.kind() == io::ErrorKind::ConnectionRefused => {
                        Ok(None)
                    }
                    Err(e) => Err(e),
                }
            }
            Conn::Tcp(s) => match s.read(&mut self.buf[self.filled..]) {
                Ok(0) => Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                )),
                Ok(n) => {
                    self.filled += n;
                    if self.filled < SIZE {
                        return Ok(None);
                    }
                    self.filled = 0;
                    Ok(Request::decode(&self.buf))
                }
                Err(e) if waited(&e) => Ok(None),
                Err(e) => Err(e),
            },
        }
    }
}

/// Takes replies until every request has one or the last has had its timeout.
fn receive(
    mut rx: Receiver,
    start: Instant,
    progress: &Progress,
    timeout: Duration,
    from: &str,
) -> Tally {
    let mut tally = Tally::default();
    // Replies seen, by sequence number: a duplicate is neither a sample nor a loss.
    let mut seen: Vec<bool> = Vec::new();
    let mut replies = 0u64;
    let mut deadline = None;
    let mut stdout = io::stdout();
    loop {
        if progress.done.load(Ordering::Acquire) {
            let d = *deadline.get_or_insert_with(|| Instant::now() + timeout);
            if replies >= progress.sent.load(Ordering::Acquire) || Instant::now() >= d {
                return tally;
            }
        }
        let reply = match rx.next() {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(e) => {
                tally.error = Some(format!("receiving: {e}"));
                return tally;
            }
        };
        let arrived = start.elapsed();
        let Ok(i) = usize::try_from(reply.seq) else {
            continue;
        };
        if reply.seq >= progress.sent.load(Ordering::Acquire) {
            continue;
        }
        if seen.len() <= i {
            seen.resize(i + 1, false);
        }
        if std::mem::replace(&mut seen[i], true) {
            continue;
        }
        replies += 1;
        let rtt = arrived.saturating_sub(reply.sent);
        if rtt > timeout {
            tally.late += 1;
            continue;
        }
        tally.on_time += 1;
        let wall = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        // A closed stdout (the runner gone) leaves nothing to report to; keep the count.
        let _ = writeln!(
            stdout,
            "[{}.{:06}] {SIZE} bytes from {from}: seq={} time={:.3} ms",
            wall.as_secs(),
            wall.subsec_micros(),
            reply.seq,
            rtt.as_secs_f64() * 1e3
        );
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    /// Both protocols against the echo server on loopback: every request answered.
    #[test]
    fn round_trips_over_loopback() {
        let port = crate::server::free_port();
        thread::spawn(move || crate::server::run(port, None));
        // Once TCP listens, UDP is bound too.
        let server: SocketAddr = (Ipv4Addr::LOCALHOST, port).into();
        for _ in 0..100 {
            if TcpStream::connect(server).is_ok() {
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        for proto in [Proto::Udp, Proto::Tcp] {
            let s = run(&Config {
                proto,
                server,
                interval: Duration::from_millis(10),
                duration: Duration::from_millis(200),
                timeout: Duration::from_secs(1),
            })
            .unwrap();
            assert!(s.sent >= 10, "{proto:?}: {s:?}");
            assert_eq!((s.received, s.late), (s.sent, 0), "{proto:?}");
        }
    }
}
