//! The request: 64 bytes carrying its sequence number and its send time, so the reply alone
//! says which request it answers and how long the round trip took; no table of outstanding
//! requests is shared between the sending and the receiving thread.

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

#[cfg(test)]
mod tests {
    use super::*;

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
