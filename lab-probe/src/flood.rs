//! `lab-probe flood`: IPv4 packets with spoofed source addresses, for the flood tests
//! (tests/vm/e2e-floods.sh) and the memory figures (tests/vm/memory.sh): a SYN flood from
//! random hosts and ports, a flood of more hosts than the shaper keeps, a flood of tiny UDP
//! packets, or a fixed number of distinct 5-tuples. A raw socket (`IPPROTO_RAW`) sends headers
//! built here, so the packets leave through the sender's own egress, where the shaper is.
//!
//! Tuple `j` has source address `--from + j % S` (`--sources S`), source port
//! `1024 + (j / S) % 64000` and destination port `--port + j / (S * 64000)`. With `--tuples T`
//! (T > 0) packet `i` is tuple `i % T`: exactly `min(T, ...)` distinct tuples, each recurring
//! every T packets. Without it every packet draws its source among the S and its source port
//! at random (xorshift from `--seed`), to `--port`: nearly every packet a host and a flow never
//! seen before.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// TCP SYNs (no options, no payload).
    Syn,
    /// UDP datagrams of `--size` payload bytes.
    Udp,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub kind: Kind,
    pub from: Ipv4Addr,
    pub sources: u32,
    /// 0: random tuples.
    pub tuples: u64,
    pub port: u16,
    pub size: usize,
    /// Packets per second; 0: as fast as the socket takes them.
    pub pps: u64,
    pub duration: Duration,
    pub seed: u64,
    pub target: Ipv4Addr,
}

/// Ethernet, IPv4 and TCP or UDP headers: the frame as a shaper counts it.
pub fn frame_bytes(kind: Kind, size: usize) -> usize {
    14 + 20
        + match kind {
            Kind::Syn => 20,
            Kind::Udp => 8 + size,
        }
}

/// Packets per `sendmmsg`.
const BATCH: usize = 64;

/// Source ports per source address before the destination port moves on.
const PORTS_PER_SOURCE: u64 = 64_000;

pub fn run(c: &Config) -> Result<(), String> {
    // SAFETY: plain socket(2).
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
    if fd < 0 {
        return Err(format!(
            "raw socket (needs CAP_NET_RAW): {}",
            std::io::Error::last_os_error()
        ));
    }
    let len = frame_bytes(c.kind, c.size) - 14;
    let mut packets = vec![[0_u8; 1500]; BATCH];
    let dst = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(c.target).to_be(),
        },
        sin_zero: [0; 8],
    };
    let mut rng = c.seed.max(1);
    let start = Instant::now();
    let (mut sent, mut refused, mut i) = (0_u64, 0_u64, 0_u64);
    while start.elapsed() < c.duration {
        if c.pps != 0 {
            let due = (start.elapsed().as_secs_f64() * c.pps as f64) as u64;
            if sent + refused >= due {
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
        }
        for p in packets.iter_mut() {
            let (src, sport, dport) = if c.tuples == 0 {
                let r = xorshift(&mut rng);
                let src = (r >> 32) as u32 % c.sources;
                (src, 1024 + (r as u32 % 64_000) as u16, c.port)
            } else {
                let j = i % c.tuples;
                let per = u64::from(c.sources);
                let dport = u64::from(c.port) + j / (per * PORTS_PER_SOURCE);
                (
                    (j % per) as u32,
                    1024 + ((j / per) % PORTS_PER_SOURCE) as u16,
                    dport as u16,
                )
            };
            i += 1;
            let src = Ipv4Addr::from(u32::from(c.from).wrapping_add(src));
            build(&mut p[..len], c.kind, src, c.target, sport, dport, i as u32);
        }
        let mut iov: Vec<libc::iovec> = packets
            .iter_mut()
            .map(|p| libc::iovec {
                iov_base: p.as_mut_ptr().cast(),
                iov_len: len,
            })
            .collect();
        let mut msgs: Vec<libc::mmsghdr> = iov
            .iter_mut()
            .map(|v| {
                // SAFETY: all-zero msghdr is valid; the pointers outlive the call.
                let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
                h.msg_name = (&raw const dst).cast_mut().cast();
                h.msg_namelen = size_of::<libc::sockaddr_in>() as u32;
                h.msg_iov = v;
                h.msg_iovlen = 1;
                libc::mmsghdr {
                    msg_hdr: h,
                    msg_len: 0,
                }
            })
            .collect();
        // SAFETY: `msgs` holds BATCH valid headers.
        let n =
            unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), BATCH as _, libc::MSG_DONTWAIT as _) };
        // A full queue refuses the batch's rest (ENOBUFS, EAGAIN): counted, not retried, as a
        // flood does not care.
        let n = n.max(0) as u64;
        sent += n;
        refused += BATCH as u64 - n;
        if n == 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let frame_bits = (frame_bytes(c.kind, c.size) * 8) as f64;
    println!(
        "flood: sent {sent} packets ({refused} refused) in {secs:.1} s: {:.0} packets/s, {:.2} Mbit/s of frames",
        sent as f64 / secs,
        sent as f64 * frame_bits / secs / 1e6
    );
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    Ok(())
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Writes an IPv4 packet of `p.len()` bytes: header (the kernel fills in its checksum), then a
/// TCP SYN or a UDP header and zero payload, with a valid transport checksum.
fn build(p: &mut [u8], kind: Kind, src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, id: u32) {
    let len = p.len();
    p.fill(0);
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(len as u16).to_be_bytes());
    p[4..6].copy_from_slice(&(id as u16).to_be_bytes());
    p[8] = 64;
    p[9] = match kind {
        Kind::Syn => 6,
        Kind::Udp => 17,
    };
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    let l4 = &mut p[20..];
    l4[0..2].copy_from_slice(&sport.to_be_bytes());
    l4[2..4].copy_from_slice(&dport.to_be_bytes());
    let at = match kind {
        Kind::Syn => {
            l4[4..8].copy_from_slice(&id.to_be_bytes());
            l4[12] = 5 << 4;
            l4[13] = 0x02;
            l4[14..16].copy_from_slice(&64240_u16.to_be_bytes());
            16
        }
        Kind::Udp => {
            l4[4..6].copy_from_slice(&((len - 20) as u16).to_be_bytes());
            6
        }
    };
    let sum = checksum(src, dst, p[9], &p[20..]);
    p[20 + at..22 + at].copy_from_slice(&sum.to_be_bytes());
}

/// The TCP/UDP checksum over the pseudo-header and `l4` (its checksum field zero).
fn checksum(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, l4: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for w in b.chunks(2) {
            sum += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
        }
    };
    add(&src.octets());
    add(&dst.octets());
    add(&[0, proto]);
    add(&(l4.len() as u16).to_be_bytes());
    add(l4);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    match !(sum as u16) {
        0 if proto == 17 => 0xffff,
        s => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_verify() {
        let (src, dst) = (Ipv4Addr::new(10, 128, 0, 7), Ipv4Addr::new(10, 9, 0, 5));
        for kind in [Kind::Syn, Kind::Udp] {
            let mut p = [0_u8; 1500];
            let len = frame_bytes(kind, 3) - 14;
            build(&mut p[..len], kind, src, dst, 4000, 80, 9);
            // Summing a packet with its checksum in place gives all ones.
            let mut sum: u32 = 0;
            for w in [
                &src.octets()[..],
                &dst.octets(),
                &[0, p[9]],
                &((len - 20) as u16).to_be_bytes(),
            ]
            .into_iter()
            .chain([&p[20..len]])
            {
                for c in w.chunks(2) {
                    sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
                }
            }
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            assert_eq!(sum, 0xffff, "{kind:?}");
        }
    }
}
