//! What goes on the wire.
//!
//! The request/response probes' request: 64 bytes carrying its sequence number and its send
//! time, so the reply alone says which request it answers and how long the round trip took; no
//! table of outstanding requests is shared between the sending and the receiving thread.
//!
//! A transfer's request: one text line opening its connection (see `Transfer`).

use std::time::Duration;

/// The size of a request and of its echo: about a small RPC or a game update.
pub const SIZE: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub seq: u64,
    /// When it was sent, from the client's start (monotonic clock).
    pub sent: Duration,
}

impl Request {
    pub fn encode(&self) -> [u8; SIZE] {
        let mut b = [0u8; SIZE];
        b[..8].copy_from_slice(&self.seq.to_be_bytes());
        b[8..16].copy_from_slice(&(self.sent.as_nanos() as u64).to_be_bytes());
        b
    }

    /// None for anything but a whole request (a stray datagram).
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != SIZE {
            return None;
        }
        let seq = u64::from_be_bytes(b[..8].try_into().ok()?);
        let nanos = u64::from_be_bytes(b[8..16].try_into().ok()?);
        Some(Request {
            seq,
            sent: Duration::from_nanos(nanos),
        })
    }
}

/// A transfer, as its request line names it: `download N\n` (the server sends N bytes and
/// closes) or `upload N\n` followed by the N bytes (the server answers `DONE` once it has them
/// all). Text, so a packet capture shows what was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfer {
    Download(u64),
    Upload(u64),
}

/// The largest transfer a request may ask for: far above a "short transfer", low enough that a
/// corrupt request cannot keep a server sending for hours.
pub const MAX_TRANSFER: u64 = 1 << 30;
/// The longest request line the server reads before giving up on a connection.
pub const MAX_LINE: usize = 32;
/// The server's answer once an upload's last byte has arrived.
pub const DONE: u8 = b'.';

impl Transfer {
    pub fn bytes(self) -> u64 {
        match self {
            Transfer::Download(n) | Transfer::Upload(n) => n,
        }
    }

    pub fn line(self) -> String {
        match self {
            Transfer::Download(n) => format!("download {n}\n"),
            Transfer::Upload(n) => format!("upload {n}\n"),
        }
    }

    /// A request line, with or without its newline.
    pub fn parse(line: &str) -> Result<Self, String> {
        let bad = || format!("bad transfer request {line:?}: want `download N` or `upload N`");
        let (verb, n) = line
            .trim_end_matches('\n')
            .split_once(' ')
            .ok_or_else(bad)?;
        let n: u64 = n.parse().map_err(|_| bad())?;
        if n == 0 || n > MAX_TRANSFER {
            return Err(format!(
                "transfer request {line:?}: sizes are 1-{MAX_TRANSFER} bytes"
            ));
        }
        match verb {
            "download" => Ok(Transfer::Download(n)),
            "upload" => Ok(Transfer::Upload(n)),
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_requests() {
        for t in [Transfer::Download(10_240), Transfer::Upload(MAX_TRANSFER)] {
            assert!(t.line().len() <= MAX_LINE);
            assert_eq!(Transfer::parse(&t.line()), Ok(t));
        }
        assert_eq!(Transfer::parse("upload 7"), Ok(Transfer::Upload(7)));
        for bad in [
            "",
            "download",
            "download -1",
            "download 0",
            "download 1073741825",
            "fetch 10",
            "download 10 20",
            "download  10",
        ] {
            assert!(Transfer::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn round_trip() {
        let r = Request {
            seq: 7,
            sent: Duration::from_micros(12_345),
        };
        assert_eq!(Request::decode(&r.encode()), Some(r));
        assert_eq!(Request::decode(&[0u8; 10]), None);
    }
}
