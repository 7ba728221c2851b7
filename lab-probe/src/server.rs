//! The server: UDP datagrams back to their sender and TCP bytes back on their connection, on
//! one port, for the request/response probes; and, on a port of their own, the transfers'
//! downloads and uploads. It runs until killed (the lab's runner ends it with the run's
//! namespaces).

use std::{
    io::{self, BufRead, BufReader, Read, Write},
    net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket},
    thread,
    time::Duration,
};

use crate::{
    tcpinfo::report_rtos,
    wire::{DONE, MAX_LINE, Transfer},
};

/// How long a transfer's connection may sit silent before the server gives up on it, so a
/// client that vanished does not keep a thread forever.
const IDLE: Duration = Duration::from_secs(120);

pub fn run(port: u16, transfers_port: Option<u16>) -> io::Result<()> {
    // Everything is bound before anything is served: once one port listens (what the runner
    // waits for), all are ready.
    let udp = bind(port, UdpSocket::bind)?;
    let transfers = transfers_port
        .map(|p| bind(p, TcpListener::bind))
        .transpose()?;
    let tcp = bind(port, TcpListener::bind)?;
    eprintln!("lab-probe: echoing UDP and TCP on port {port}");
    thread::spawn(move || udp_echo(&udp));
    if let (Some(listener), Some(p)) = (transfers, transfers_port) {
        eprintln!("lab-probe: serving transfers on TCP port {p}");
        thread::spawn(move || serve(&listener, "transfer", transfer));
    }
    serve(&tcp, "TCP connection", tcp_echo);
    Ok(())
}

/// A thread per connection: few at a time, each short or idle.
fn serve(listener: &TcpListener, what: &'static str, f: fn(TcpStream) -> io::Result<()>) {
    for conn in listener.incoming() {
        match conn {
            Ok(s) => {
                thread::spawn(move || {
                    if let Err(e) = f(s) {
                        eprintln!("lab-probe: {what}: {e}");
                    }
                });
            }
            Err(e) => eprintln!("lab-probe: accept: {e}"),
        }
    }
}

/// Dual-stack `[::]:port` (IPv4 arrives mapped), or `0.0.0.0:port` where IPv6 is off.
fn bind<T>(port: u16, f: impl Fn(SocketAddr) -> io::Result<T>) -> io::Result<T> {
    f((Ipv6Addr::UNSPECIFIED, port).into()).or_else(|_| f((Ipv4Addr::UNSPECIFIED, port).into()))
}

fn udp_echo(sock: &UdpSocket) {
    let mut buf = [0u8; 2048];
    loop {
        // A failed exchange (the client gone: ICMP unreachable) must not end the server.
        match sock.recv_from(&mut buf) {
            Ok((n, from)) => {
                if let Err(e) = sock.send_to(&buf[..n], from) {
                    eprintln!("lab-probe: UDP reply to {from}: {e}");
                }
            }
            Err(e) => eprintln!("lab-probe: UDP receive: {e}"),
        }
    }
}

fn tcp_echo(mut s: TcpStream) -> io::Result<()> {
    // Each reply leaves at once, not when Nagle would let it.
    s.set_nodelay(true)?;
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        s.write_all(&buf[..n])?;
    }
}

/// One transfer: its request line, then the bytes asked for, either way.
fn transfer(s: TcpStream) -> io::Result<()> {
    let peer = s.peer_addr()?.ip();
    // The last segment leaves with the rest instead of waiting for an ACK (Nagle), as a web
    // server's would.
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(IDLE))?;
    s.set_write_timeout(Some(IDLE))?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    (&mut r).take(MAX_LINE as u64).read_line(&mut line)?;
    let t = Transfer::parse(&line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    match t {
        Transfer::Download(n) => {
            let mut s = r.into_inner();
            let buf = [0u8; 64 * 1024];
            let mut left = n;
            while left > 0 {
                let k = left.min(buf.len() as u64) as usize;
                s.write_all(&buf[..k])?;
                left -= k as u64;
            }
            // The FIN follows the data: the client reads to the last byte, not to the FIN, and
            // then closes. Its FIN acknowledges everything, so no timeout of this transfer is
            // still to come when it arrives.
            s.shutdown(Shutdown::Write)?;
            io::copy(&mut s, &mut io::sink())?;
            report_rtos(&s, peer)
        }
        Transfer::Upload(n) => {
            // The reader may already hold the first bytes after the line.
            let got = io::copy(&mut (&mut r).take(n), &mut io::sink())?;
            if got < n {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("upload ended after {got} of {n} bytes"),
                ));
            }
            r.into_inner().write_all(&[DONE])
        }
    }
}

/// A TCP port free now on loopback, for a test's server. Ports derived from the process id fell
/// in the ephemeral range, where an earlier run's clients leave TIME_WAIT sockets (a transfer's
/// client closes first) that a listener cannot bind over.
#[cfg(test)]
pub fn free_port() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a free loopback port");
    l.local_addr().expect("its address").port()
}
