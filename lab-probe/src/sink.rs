//! `lab-probe sink`: the receiving end of `blast`: counts what arrives from each source
//! address on a range of UDP ports over a window, so the scale benchmark can tell how the link
//! was shared between thousands of hosts.
//!
//! A thread per port blocks on its socket (std has no poll, and a hundred threads cost nothing
//! next to the packets); each counts into its own map and the maps are merged at the end, so
//! no lock sits on the receive path. Packets are counted as the frames they came in (payload
//! and headers), the unit of the shaper's rate.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    sync::Arc,
    time::{Duration, Instant},
};

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub port: u16,
    pub ports: u16,
    /// Packets before this are not counted (the shaper's levels settle).
    pub warmup: Duration,
    pub duration: Duration,
}

/// (packets, frame bytes) per source address.
type Counts = BTreeMap<Ipv4Addr, (u64, u64)>;

/// Receives until the duration is over, then prints a line per source address:
/// `ADDRESS PACKETS BYTES`, after a comment line with the window.
pub fn run(c: &Config) -> Result<(), String> {
    let start = Arc::new(Instant::now());
    let sockets = (0..c.ports)
        .map(|i| {
            let port = c.port + i;
            let s = UdpSocket::bind(("0.0.0.0", port)).map_err(|e| format!("port {port}: {e}"))?;
            s.set_read_timeout(Some(Duration::from_millis(100)))
                .map_err(|e| e.to_string())?;
            Ok(s)
        })
        .collect::<Result<Vec<_>, String>>()?;
    let threads: Vec<_> = sockets
        .into_iter()
        .map(|s| {
            let (start, c) = (start.clone(), c.clone());
            std::thread::spawn(move || receive(&s, &start, &c))
        })
        .collect();
    let mut all = Counts::new();
    for t in threads {
        for (addr, (p, b)) in t.join().map_err(|_| "a receiving thread panicked")? {
            let e = all.entry(addr).or_default();
            e.0 += p;
            e.1 += b;
        }
    }
    println!(
        "# sink: from {:.1} s to {:.1} s, {} sources",
        c.warmup.as_secs_f64(),
        c.duration.as_secs_f64(),
        all.len()
    );
    for (addr, (p, b)) in all {
        println!("{addr} {p} {b}");
    }
    Ok(())
}

fn receive(s: &UdpSocket, start: &Instant, c: &Config) -> Counts {
    let mut counts = Counts::new();
    let mut buf = vec![0_u8; 65536];
    loop {
        let result = s.recv_from(&mut buf);
        let t = start.elapsed();
        if t >= c.duration {
            return counts;
        }
        let Ok((n, SocketAddr::V4(from))) = result else {
            continue;
        };
        if t >= c.warmup {
            let e = counts.entry(*from.ip()).or_default();
            e.0 += 1;
            e.1 += (n + crate::blast::HEADERS) as u64;
        }
    }
}
