//! `shaper run --metrics ADDR`: the counters of `shaper stats`, the control loop's timing and
//! the process's health over HTTP, for Prometheus and for a service manager's probes.
//!
//! - `text`: the exposition format, a pure function of a [`status::Scrape`];
//! - `status`: what the run loop publishes (its states, ticks, health checks) and the scrape
//!   built from it and the data path's maps;
//! - `http`: the server, on a thread of its own: a slow or stuck client never delays a tick.
//!
//! Nothing listens unless `--metrics` (or `metrics` in the config file) asks for it.

pub mod histogram;
pub mod http;
pub mod status;
pub mod text;

use std::net::{Ipv4Addr, SocketAddr};

/// Which way a shaped direction's traffic goes on the configured interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Egress,
    /// Arriving traffic, shaped on the interface's IFB (`--ingress-rate`).
    Ingress,
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Direction::Egress => "egress",
            Direction::Ingress => "ingress",
        }
    }
}

/// The address `--metrics` listens on: `HOST:PORT` (`[v6]:PORT` for IPv6), or a bare port on
/// the loopback address, so that exposing the endpoint beyond the machine is always explicit.
pub fn parse_listen_addr(text: &str) -> Option<SocketAddr> {
    let text = text.trim();
    match text.parse::<u16>() {
        Ok(port) => Some(SocketAddr::from((Ipv4Addr::LOCALHOST, port))),
        Err(_) => text.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_port_listens_on_loopback_only() {
        assert_eq!(
            parse_listen_addr("9101"),
            Some("127.0.0.1:9101".parse().unwrap())
        );
        assert_eq!(
            parse_listen_addr("0.0.0.0:9101"),
            Some("0.0.0.0:9101".parse().unwrap())
        );
        assert_eq!(
            parse_listen_addr("[::1]:9101"),
            Some("[::1]:9101".parse().unwrap())
        );
        for bad in [
            "",
            "localhost:9101",
            "127.0.0.1",
            "65536",
            "::1:9101",
            "127.0.0.1:x",
        ] {
            assert_eq!(parse_listen_addr(bad), None, "{bad:?}");
        }
    }
}
