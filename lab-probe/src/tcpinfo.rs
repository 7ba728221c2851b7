//! How many retransmission timeouts a connection's sender took, from the kernel's `tcp_info`:
//! the transfers' own, where the namespace's counters mix in every other connection of the same
//! side (a bulk flow's timeouts read as the transfers').

use std::{
    io,
    net::{IpAddr, TcpStream},
    os::fd::AsRawFd,
};

/// `struct tcp_info` (include/uapi/linux/tcp.h) up to `tcpi_total_rto_time`, which Linux 6.7
/// added. Only its layout matters here: the kernel copies what it has and says how much.
#[repr(C)]
#[derive(Default)]
#[allow(dead_code)] // Read by the kernel's layout, not field by field.
struct TcpInfo {
    /// state, ca_state, retransmits, probes, backoff, options, the window scales, and the
    /// app-limited and fastopen bits.
    bytes: [u8; 8],
    /// rto, ato, snd_mss, rcv_mss, unacked, sacked, lost, retrans, fackets, the last
    /// data/ack sent/received times, pmtu, rcv_ssthresh, rtt, rttvar, snd_ssthresh, snd_cwnd,
    /// advmss, reordering, rcv_rtt, rcv_space, total_retrans.
    words: [u32; 24],
    /// pacing_rate, max_pacing_rate, bytes_acked, bytes_received.
    rates: [u64; 4],
    /// segs_out, segs_in, notsent_bytes, min_rtt, data_segs_in, data_segs_out.
    segs: [u32; 6],
    /// delivery_rate, busy_time, rwnd_limited, sndbuf_limited.
    times: [u64; 4],
    delivered: [u32; 2],
    /// bytes_sent, bytes_retrans.
    sent: [u64; 2],
    /// dsack_dups, reord_seen, rcv_ooopack, snd_wnd, rcv_wnd, rehash.
    tail: [u32; 6],
    total_rto: u16,
    total_rto_recoveries: u16,
    total_rto_time: u32,
}

/// The connection's retransmission timeouts so far (SYN's included), or None where the kernel
/// does not count them per connection (before 6.7).
pub fn total_rtos(s: &TcpStream) -> io::Result<Option<u64>> {
    let mut info = TcpInfo::default();
    let mut len = size_of::<TcpInfo>() as libc::socklen_t;
    // SAFETY: the buffer and its length are ours; the kernel writes at most `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let has = std::mem::offset_of!(TcpInfo, total_rto) + size_of::<u16>();
    Ok((len as usize >= has).then_some(info.total_rto as u64))
}

/// The timeouts the sending side of a finished transfer to `peer` took, for the lab, where the
/// kernel counts them: `lab-probe: transfer to PEER: N rto` on stderr. The caller names the peer
/// (a socket whose peer has since reset it no longer knows it: the transfer has still completed).
pub fn report_rtos(s: &TcpStream, peer: IpAddr) -> io::Result<()> {
    if let Some(n) = total_rtos(s)? {
        eprintln!("lab-probe: transfer to {}: {n} rto", peer.to_canonical());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn the_layout_is_the_kernels() {
        // Offsets from include/uapi/linux/tcp.h: tcpi_total_retrans at 100, tcpi_pacing_rate
        // at 104, tcpi_rehash at 236, tcpi_total_rto at 240; 248 bytes up to
        // tcpi_total_rto_time.
        assert_eq!(std::mem::offset_of!(TcpInfo, rates), 104);
        assert_eq!(std::mem::offset_of!(TcpInfo, total_rto), 240);
        assert_eq!(size_of::<TcpInfo>(), 248);
    }

    #[test]
    fn a_fresh_connection_has_taken_no_timeout() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        // Zero where the kernel counts them, nothing claimed where it does not.
        assert!(matches!(total_rtos(&c).unwrap(), None | Some(0)));
    }
}
