//! A small rtnetlink client: just what shaper's qdiscs, filters, links and actions need (dump,
//! create, replace and delete them; read a link's attributes), with the kernel's extended-ack
//! messages surfaced in errors. Raw attributes are kept as bytes so any qdisc's configuration
//! can be saved and replayed exactly, whatever its kind.

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use tokio::io::unix::AsyncFd;

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_MULTI: u16 = 0x2;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
pub const NLM_F_REPLACE: u16 = 0x100;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
const NETLINK_EXT_ACK: libc::c_int = 11;
const NLMSGERR_ATTR_MSG: u16 = 1;
const NLM_F_ACK_TLVS: u16 = 0x200;
const NLA_TYPE_MASK: u16 = 0x3fff;

pub const RTM_NEWLINK: u16 = 16;
pub const RTM_DELLINK: u16 = 17;
pub const RTM_GETLINK: u16 = 18;
pub const RTM_NEWQDISC: u16 = 36;
pub const RTM_DELQDISC: u16 = 37;
pub const RTM_GETQDISC: u16 = 38;
pub const RTM_GETTCLASS: u16 = 42;
pub const RTM_NEWTFILTER: u16 = 44;
pub const RTM_DELTFILTER: u16 = 45;
pub const RTM_GETTFILTER: u16 = 46;
pub const RTM_NEWACTION: u16 = 48;

pub const TCA_KIND: u16 = 1;
pub const TCA_OPTIONS: u16 = 2;
pub const TCA_STAB: u16 = 8;
pub const IFLA_IFNAME: u16 = 3;
pub const IFLA_MTU: u16 = 4;
pub const IFLA_TXQLEN: u16 = 13;
pub const IFLA_LINKINFO: u16 = 18;
pub const IFLA_INFO_KIND: u16 = 1;
pub const IFLA_NUM_TX_QUEUES: u16 = 31;
pub const IFLA_GSO_MAX_SEGS: u16 = 40;
pub const IFLA_NUM_RX_QUEUES: u16 = 32;
pub const IFLA_GSO_MAX_SIZE: u16 = 41;
/// Linux 5.19+ (before, GRO is bounded by 64 KB only).
pub const IFLA_GRO_MAX_SIZE: u16 = 58;
/// Linux 6.3+: the IPv4 limit, which setting `IFLA_GRO_MAX_SIZE` at or below 64 KB also sets.
pub const IFLA_GRO_IPV4_MAX_SIZE: u16 = 64;

/// An error from the kernel: errno plus its extended-ack text when it gave one.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("netlink socket: {0}")]
    Io(#[from] io::Error),
    #[error("{}{}", io::Error::from_raw_os_error(*errno), extack.as_deref().map(|m| format!(" ({m})")).unwrap_or_default())]
    Kernel { errno: i32, extack: Option<String> },
    #[error("malformed netlink reply")]
    Malformed,
}

impl NetlinkError {
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Kernel { errno, .. } => Some(*errno),
            Self::Io(e) => e.raw_os_error(),
            Self::Malformed => None,
        }
    }
}

/// Appends netlink attributes (TLVs, 4-byte aligned) to a message body.
#[derive(Default, Clone)]
pub struct Attrs(pub Vec<u8>);

impl Attrs {
    pub fn put(&mut self, kind: u16, value: &[u8]) -> &mut Self {
        let len = 4 + value.len();
        self.0.extend_from_slice(&(len as u16).to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(value);
        self.pad();
        self
    }

    pub fn put_u32(&mut self, kind: u16, value: u32) -> &mut Self {
        self.put(kind, &value.to_ne_bytes())
    }

    pub fn put_u8(&mut self, kind: u16, value: u8) -> &mut Self {
        self.put(kind, &[value])
    }

    pub fn put_str(&mut self, kind: u16, value: &str) -> &mut Self {
        let mut bytes = value.as_bytes().to_vec();
        bytes.push(0);
        self.put(kind, &bytes)
    }

    fn pad(&mut self) {
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
    }
}

/// Iterates over the attributes in `buf` as (type without flag bits, raw type, payload).
pub fn parse_attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let raw_type = u16::from_ne_bytes([buf[2], buf[3]]);
        if len < 4 || len > buf.len() {
            return None;
        }
        let payload = &buf[4..len];
        let advance = (len + 3) & !3;
        buf = &buf[advance.min(buf.len())..];
        Some((raw_type & NLA_TYPE_MASK, raw_type, payload))
    })
}

pub struct Socket {
    fd: OwnedFd,
    seq: u32,
}

impl Socket {
    pub fn open() -> Result<Self, NetlinkError> {
        // SAFETY: plain socket(2) call; the result is checked before being wrapped.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error().into());
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let one: libc::c_int = 1;
        // Extended acks carry the kernel's own explanation ("Specified qdisc kind is unknown").
        // SAFETY: valid fd and option pointer/length.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_NETLINK,
                NETLINK_EXT_ACK,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        Ok(Self { fd, seq: 1 })
    }

    /// Sends one request and returns the bodies of the reply messages (after the netlink
    /// header). For a dump, all parts until NLMSG_DONE; otherwise, waits for the ack.
    pub fn request(
        &mut self,
        msg_type: u16,
        flags: u16,
        body: &[u8],
    ) -> Result<Vec<Vec<u8>>, NetlinkError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let flags = NLM_F_REQUEST | flags | if dump { 0 } else { NLM_F_ACK };
        let mut msg = Vec::with_capacity(NLMSG_HDRLEN + body.len());
        msg.extend_from_slice(&((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
        msg.extend_from_slice(&msg_type.to_ne_bytes());
        msg.extend_from_slice(&flags.to_ne_bytes());
        msg.extend_from_slice(&seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(body);
        // SAFETY: sending an initialised buffer on our own socket; the kernel is the peer
        // (a zeroed sockaddr_nl addresses it).
        let sent = unsafe {
            let mut addr: libc::sockaddr_nl = std::mem::zeroed();
            addr.nl_family = libc::AF_NETLINK as u16;
            libc::sendto(
                self.fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error().into());
        }

        let mut replies = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: receiving into a buffer we own, bounded by its length.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err.into());
            }
            let mut data = &buf[..n as usize];
            while data.len() >= NLMSG_HDRLEN {
                let len = u32::from_ne_bytes(data[0..4].try_into().unwrap()) as usize;
                let kind = u16::from_ne_bytes([data[4], data[5]]);
                let msg_flags = u16::from_ne_bytes([data[6], data[7]]);
                let msg_seq = u32::from_ne_bytes(data[8..12].try_into().unwrap());
                if len < NLMSG_HDRLEN || len > data.len() {
                    return Err(NetlinkError::Malformed);
                }
                let payload = &data[NLMSG_HDRLEN..len];
                data = &data[((len + 3) & !3).min(data.len())..];
                if msg_seq != seq {
                    continue;
                }
                match kind {
                    NLMSG_DONE => return Ok(replies),
                    NLMSG_ERROR => {
                        if payload.len() < 4 {
                            return Err(NetlinkError::Malformed);
                        }
                        let errno = -i32::from_ne_bytes(payload[0..4].try_into().unwrap());
                        if errno == 0 {
                            return Ok(replies);
                        }
                        let extack = (msg_flags & NLM_F_ACK_TLVS != 0)
                            .then(|| extack_message(payload))
                            .flatten();
                        return Err(NetlinkError::Kernel { errno, extack });
                    }
                    _ => {
                        replies.push(payload.to_vec());
                        if !dump && msg_flags & NLM_F_MULTI == 0 && flags & NLM_F_ACK == 0 {
                            return Ok(replies);
                        }
                    }
                }
            }
        }
    }

    pub fn dump(&mut self, msg_type: u16, body: &[u8]) -> Result<Vec<Vec<u8>>, NetlinkError> {
        self.request(msg_type, NLM_F_DUMP, body)
    }
}

/// A netlink socket subscribed to notification groups (`RTMGRP_*`). It only says *that*
/// something changed: the caller reads what changed again whole, so that a notification lost to
/// a full socket buffer costs nothing but a read.
pub struct Subscription {
    fd: AsyncFd<OwnedFd>,
}

impl Subscription {
    /// Subscribes to `groups` (within a tokio runtime).
    pub fn open(groups: u32) -> io::Result<Self> {
        // SAFETY: plain socket(2) call; the result is checked before being wrapped.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::NETLINK_ROUTE,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: binding our own socket to a zeroed-then-filled sockaddr_nl.
        let rc = unsafe {
            let mut addr: libc::sockaddr_nl = std::mem::zeroed();
            addr.nl_family = libc::AF_NETLINK as u16;
            addr.nl_groups = groups;
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: an OwnedFd always returns its own, open descriptor, owned here until the
        // AsyncFd is dropped.
        let fd = unsafe { AsyncFd::register(fd) }.map_err(io::Error::from)?;
        Ok(Self { fd })
    }

    /// Waits until something changed, then takes every notification waiting. Cancel-safe:
    /// notifications not yet read stay for the next call.
    pub async fn changed(&mut self) -> io::Result<()> {
        let mut guard = self.fd.readable_mut().await?;
        let mut buf = vec![0u8; 64 * 1024];
        let mut read = 0;
        loop {
            // SAFETY: receiving into a buffer we own, bounded by its length.
            let n = unsafe {
                libc::recv(
                    guard.get_inner().as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                )
            };
            if n >= 0 {
                read += 1;
                continue;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) => {
                    guard.clear_ready();
                    tracing::debug!("{read} netlink notifications");
                    return Ok(());
                }
                // Notifications were lost: the caller reads everything again anyway.
                Some(libc::ENOBUFS) | Some(libc::EINTR) => continue,
                _ => return Err(e),
            }
        }
    }
}

/// The extended-ack text after an error's echoed request header.
fn extack_message(payload: &[u8]) -> Option<String> {
    // nlmsgerr = error (4) + the original nlmsghdr (16); with NLM_F_CAPPED only the header is
    // echoed, which the kernel does when ext acks are on.
    let attrs = payload.get(4 + NLMSG_HDRLEN..)?;
    parse_attrs(attrs)
        .find(|(kind, _, _)| *kind == NLMSGERR_ATTR_MSG)
        .map(|(_, _, value)| {
            String::from_utf8_lossy(value)
                .trim_end_matches('\0')
                .to_string()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_round_trip_with_padding() {
        let mut attrs = Attrs::default();
        attrs.put_str(TCA_KIND, "fq").put_u32(5, 7).put_u8(6, 1);
        let parsed: Vec<_> = parse_attrs(&attrs.0).collect();
        assert_eq!(parsed.len(), 3);
        assert_eq!(parsed[0].0, TCA_KIND);
        assert_eq!(parsed[0].2, b"fq\0");
        assert_eq!(parsed[1].2, 7u32.to_ne_bytes());
        assert_eq!(parsed[2].2, [1]);
        assert_eq!(attrs.0.len() % 4, 0);
    }

    #[test]
    fn nested_flag_is_masked_but_kept_raw() {
        let mut attrs = Attrs::default();
        attrs.put(TCA_OPTIONS | 0x8000, &[]);
        let (kind, raw, _) = parse_attrs(&attrs.0).next().unwrap();
        assert_eq!(kind, TCA_OPTIONS);
        assert_eq!(raw, TCA_OPTIONS | 0x8000);
    }

    #[test]
    fn truncated_attributes_stop_cleanly() {
        let bytes = [8u8, 0, 1, 0, 1, 2];
        assert_eq!(parse_attrs(&bytes).count(), 0);
    }
}
