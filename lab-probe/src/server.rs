//! The echo server: UDP datagrams back to their sender, TCP bytes back on their connection,
//! on one port. It runs until killed (the lab's runner ends it with the run's namespaces).

use std::{
    io::{self, Read, Write},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    thread,
};

pub fn run(port: u16) -> io::Result<()> {
    // UDP first: once the TCP port listens (what the runner waits for), both are ready.
    let udp = bind(port, UdpSocket::bind)?;
    let tcp = bind(port, TcpListener::bind)?;
    eprintln!("lab-probe: echoing UDP and TCP on port {port}");
    thread::spawn(move || udp_echo(&udp));
    for conn in tcp.incoming() {
        match conn {
            Ok(s) => {
                thread::spawn(move || {
                    if let Err(e) = tcp_echo(s) {
                        eprintln!("lab-probe: TCP connection: {e}");
                    }
                });
            }
            Err(e) => eprintln!("lab-probe: accept: {e}"),
        }
    }
    Ok(())
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
